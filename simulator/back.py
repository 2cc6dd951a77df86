"""The back of the request path, as the scenario asks for it (:func:`serving_of`), over
the engine's ledger as :mod:`simulator.front` is its front.

Either a front end that is one event loop, or several front ends and their hub, with the
batch queue and the instances they feed (:class:`LoopPath`); or a pool: the traffic
classes' (:class:`~simulator.serving.classes.ClassesPool`), a canary's and a shadow's
beside the primary's (:class:`~simulator.serving.versions.VersionsPool`), or the
primary's alone, of Triton-style batching or LLM replicas. And the router, where the
engine routes (a dynamic pool routes by itself). :mod:`simulator.engine` runs them chunk
by chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.columns import Ledger, rows_of
from simulator.ledger import BatchLog
from simulator.rng import Streams, child
from simulator.scenario.config import Scenario
from simulator.serving.classes import ClassesPool
from simulator.serving.continuous import LLMService
from simulator.serving.event_loop import Loop
from simulator.serving.frontends import Frontends
from simulator.serving.router import Router
from simulator.serving.streamed import Horizon
from simulator.serving.versions import VersionsPool, primary_pool
from simulator.serving.workers import ServiceModel
from simulator.stages.network import delay
from simulator.stages.speed import SpeedProcess


class LoopPath:
    """A front end's event loop (``preprocess.event_loop``), or several front ends and
    their hub (``preprocess.relay``), with the instances they feed, chunk by chunk: the
    requests ready for it wait behind a horizon, then the loop runs up to it."""

    def __init__(self, s: Scenario, rng: Streams, speed: SpeedProcess | None):
        service = ServiceModel(s.workers, s.batching.max_batch_size, rng.service, speed).feed(0)
        frontend = None if speed is None else speed.frontend
        instances = s.workers.count * s.workers.instances
        if s.preprocess.relay is not None:  # the front ends, their hub, and the instances it feeds
            self.server = Frontends(
                s.preprocess.relay, s.batching, s.preprocess.cpu_workers, instances, service, frontend
            )
        else:  # the front end's one event loop, and the instances it feeds
            loop = s.preprocess.event_loop
            late = delay(loop.timer_late, child(rng.preprocess, 1))
            back = delay(loop.return_time, child(rng.preprocess, 2))
            self.server = Loop(loop, s.batching, instances, service, frontend, late, back)
        self.wait = Horizon(by_id=True)

    def run(self, ledger: Ledger, hub, ids: np.ndarray, t: np.ndarray, horizon: float) -> tuple[np.ndarray, BatchLog]:
        """Requests ``ids`` ready for the loop at ``t`` join those waiting; the loop runs up
        to ``horizon`` (``hub``: the preprocessing's hub, drawn for each request that
        reaches several front ends). Records when each settled request was enqueued and
        answered in ``ledger``; returns its rows (answered, or refused at the door), and the
        batches answered."""
        c = ledger.cols
        rows = ids - ledger.lo
        if isinstance(self.server, Frontends):  # several front ends and their hub
            self.wait.push(t, ids, rows_of(c.svc, rows))
            t, ids, cost = self.wait.ready(horizon)
            self.server.push(ids, t, cost, np.asarray(hub.draw(len(ids)), dtype=float))
            ids, t_enq, served, t_resp, batches = self.server.run(horizon)
            rows = ids - ledger.lo
            c.t_preprocessed[rows] = t_enq
            c.t_answered[rows] = t_resp
            return ledger.settle(ids, served), batches
        if self.server.resume >= 0:  # the handler starts before its fetch and awaits it off the loop
            t_api = c.t_api[rows]
            self.wait.push(t_api, ids, rows_of(c.svc, rows), t - t_api)
        else:
            self.wait.push(t, ids, rows_of(c.svc, rows), None)
        t, ids, cost, wait = self.wait.ready(horizon)
        self.server.push(ids, t, cost, wait)
        ids, t_enq, served, t_resp, t_back, batches = self.server.run(horizon)
        rows = ids - ledger.lo
        if self.server.resume >= 0:  # the fetch ran after the handler's read, off the loop
            c.t_features[rows] = t_back
        c.t_preprocessed[rows] = t_enq
        c.t_answered[rows] = t_resp
        return ledger.settle(ids, served), batches


@dataclass
class Serving:
    """What serves a run's requests: a loop path, or a pool (the classes' or the
    versions', which are also named apart, or the primary's); and the engine's router."""

    loop: LoopPath | None
    pool: object | None
    versions: VersionsPool | None
    classes: ClassesPool | None
    router: Router | None


def serving_of(s: Scenario, seed: int, rng: Streams, speed: SpeedProcess | None, by_id: bool) -> Serving:
    """The serving side of scenario ``s`` (``by_id``: requests reach it out of request
    order, past a cache)."""
    loop = pool = versions = classes = None
    if s.preprocess.event_loop is not None or s.preprocess.relay is not None:
        loop = LoopPath(s, rng, speed)
    if s.traffic.classes:
        pool = classes = ClassesPool(s, rng, speed, by_id=by_id)
    elif loop is None:
        if s.router.canary is not None or s.router.shadow is not None:
            pool = versions = VersionsPool(s, seed, rng, speed, by_id=by_id)
        else:
            if s.traffic.tokens is not None:  # LLM replicas: their step time, limits and noise
                service = LLMService.of(s.batching, s.workers.instance_type, rng.steps, s.router, speed, s.workers)
            else:
                service = ServiceModel(s.workers, s.batching.max_batch_size, rng.service, speed)
            pool = primary_pool(s, service, rng, by_id)
    # a dynamic pool routes by itself (the traffic classes' pools excepted); the others are routed here
    dynamic = (s.workers.dynamic or bool(s.autoscaled)) and not s.traffic.classes
    router = None if dynamic else Router(s.router.balancing, rng.routing)
    return Serving(loop, pool, versions, classes, router)
