"""The fleet of a dynamic pool: each worker's life, from request to gone.

A worker is billed from the moment it is requested; it serves once provisioning, image
pull, model load and warm-up are over (the first two skipped on a warm-pool node).
Scale-down drains: the worker gets no new requests, finishes its queue and its batches,
then leaves (workers not yet ready are cancelled first). A crash loses the worker's
queued and in-flight requests; a replacement serves ``mttr_s`` later.

:class:`Fleet` keeps the workers and its own queue of scheduled :class:`Transition`\\ s;
the pool's control process (:mod:`simulator.serving.pool`) asks it to apply what is due,
to scale, and which workers serve.
"""

from __future__ import annotations

import heapq
import math
from enum import StrEnum

import numpy as np
import simpy

from simulator.scenario.config import Batching, Workers
from simulator.scenario.distributions import Sampler
from simulator.serving.lives import FleetEvent, FleetLog, Worker
from simulator.serving.scheduler import batch_queue
from simulator.serving.workers import Feed, ServiceModel, schedule

INF = math.inf


class Transition(StrEnum):
    """What happens to a worker at a scheduled time (the fleet's own event queue)."""

    READY = "ready"  # its cold start is over: it serves from now
    CRASH = "crash"  # a random failure (mean time between failures)
    SCHEDULED_CRASH = "scheduled_crash"  # a failure the scenario names (workers.failures.crashes)


class Fleet:
    """The workers of a dynamic pool, their cold starts, crashes and scaling.

    ``cfg`` is the scenario's ``workers`` section, ``batching`` its batch queue settings;
    every draw (cold-start stages, times to failure) comes from ``rng``.
    """

    def __init__(
        self, env: simpy.Environment, cfg: Workers, batching: Batching, service: ServiceModel, rng: np.random.Generator
    ):
        self.env = env
        self.cfg = cfg
        self.batching = batching
        self.service = service
        self.rng = rng
        self.workers: list[Worker] = []
        self.log = FleetLog(self.workers)
        self.transitions: list[tuple[float, int, Transition, int]] = []  # heap of (time, seq, kind, worker)
        self.seq = 0
        self.warm_free = cfg.cold_start.warm_pool
        cs = cfg.cold_start
        self.cold = [Sampler(d, rng) if d else None for d in (cs.provision, cs.image_pull)]
        self.load = [Sampler(d, rng) if d else None for d in (cs.model_load, cs.warmup)]

    def push(self, t: float, kind: Transition, arg: int) -> None:
        """Schedule a transition of worker ``arg`` (or, for a scheduled crash, the ``arg``-th serving worker)."""
        self.seq += 1
        heapq.heappush(self.transitions, (t, self.seq, kind, arg))

    def next_transition(self) -> float:
        """When the next scheduled transition is due (inf if none)."""
        return self.transitions[0][0] if self.transitions else INF

    def start(self, t: float, *, ready_at: float | None = None) -> Worker:
        """Request a worker at ``t``: it serves at ``ready_at``, or after a drawn cold start."""
        wid = len(self.workers)
        warm = ready_at is None and self.warm_free > 0
        if ready_at is None:
            stages = self.load + ([] if warm else self.cold)
            ready_at = t + sum(float(smp.draw(1)[0]) for smp in stages if smp is not None)
        if warm:
            self.warm_free -= 1
        per = self.cfg.instances
        queue = batch_queue(self.batching, np.zeros(0), closed=False)
        feed = Feed(self.env, queue, list(range(wid * per, (wid + 1) * per)), start_at=ready_at)
        w = Worker(wid, t, ready_at, feed)
        self.workers.append(w)
        self.push(ready_at, Transition.READY, wid)
        return w

    def _crash_time(self, w: Worker) -> None:
        f = self.cfg.failures
        if f is not None and f.mtbf_s is not None:
            self.push(w.ready_at + self.rng.exponential(f.mtbf_s * 1000.0), Transition.CRASH, w.wid)

    def apply(self, t: float) -> None:
        """Carry out every transition due by ``t``: readiness, random and scheduled crashes."""
        while self.transitions and self.transitions[0][0] <= t:
            at, _, kind, arg = heapq.heappop(self.transitions)
            if kind is Transition.SCHEDULED_CRASH:
                serving = self.serving(at)
                if arg < len(serving):
                    self._crash(serving[arg], at)
                continue
            w = self.workers[arg]
            if kind is Transition.READY and w.gone_at == INF and w.drain_at == INF:
                # its own batch-time stream (the order SimPy runs two workers at one instant
                # draws nothing differently); the pool's speed path, as platform.speed's scope says
                service = self.service.feed(w.wid, path=self.service.queue)
                self.env.process(schedule(self.env, w.feed, service))
                self._crash_time(w)
                self.log.events.append((at, FleetEvent.READY, f"worker {arg}"))
            elif kind is Transition.CRASH and w.serving(at):
                self._crash(w, at)

    def _crash(self, w: Worker, at: float) -> None:
        w.crashed_at = w.feed.crashed_at = at
        w.feed.close(at)
        if w.feed.waiting is not None:
            w.feed.waiting.succeed()
            w.feed.waiting = None
        mttr = self.cfg.failures.mttr_s * 1000.0
        self.start(at, ready_at=at + mttr)
        self.log.events.append(
            (at, FleetEvent.CRASH, f"worker {w.wid}; replacement serves at {(at + mttr) / 1000:g} s")
        )

    def serving(self, t: float) -> list[Worker]:
        """The workers serving at ``t``, in the order they were requested."""
        return [w for w in self.workers if w.serving(t)]

    def counting(self) -> list[Worker]:
        """Workers the autoscaler counts as replicas: serving or starting, not draining."""
        return [w for w in self.workers if w.drain_at == INF and w.gone_at == INF and w.crashed_at == INF]

    def scale(self, t: float, desired: int) -> None:
        """Start workers, or cancel those still starting (newest first) and drain the newest serving ones."""
        current = self.counting()
        n = len(current)
        if desired > n:
            for _ in range(desired - n):
                self.start(t)
            self.log.events.append((t, FleetEvent.SCALE_UP, f"{n} -> {desired}"))
        elif desired < n:
            victims = sorted(current, key=lambda w: (w.ready_at <= t, -w.wid))[: n - desired]
            for w in victims:
                if w.ready_at > t:
                    w.gone_at = t
                else:
                    w.drain_at = t
                    w.feed.close(t)
                self.warm_free = min(self.warm_free + 1, self.cfg.cold_start.warm_pool)  # the node goes back
            self.log.events.append((t, FleetEvent.SCALE_DOWN, f"{n} -> {desired}"))

    def close(self, t: float) -> None:
        """No more arrivals for any worker."""
        for w in self.workers:
            if not w.feed.queue.closed:
                w.feed.close(t)

    def working(self, t: float) -> bool:
        """Whether any live worker still has requests queued or in service at ``t``."""
        return any(
            w.feed.queue.unfinished(t) or w.feed.busy for w in self.workers if w.crashed_at > t and w.gone_at > t
        )

    def settle(self, w: Worker, last_batch_end: float, end_ms: float) -> None:
        """After the run: when ``w``, if still up, left (its drain and last batch, or the end of traffic)."""
        if w.drain_at < INF:
            w.gone_at = max(w.drain_at, last_batch_end)
        elif w.gone_at == INF and w.crashed_at == INF:
            w.gone_at = max(end_ms, last_batch_end, w.requested_at)  # still up when the traffic ended
