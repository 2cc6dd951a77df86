"""Serving that sees a run's requests all at once: the traffic classes' pools, and a canary
or a shadow.

The engine (:mod:`simulator.engine`) feeds every other pool chunk by chunk
(:mod:`simulator.serving.streamed`, :class:`simulator.serving.event_loop.Loop`). These
two are still written over a whole run: a
scenario that uses one is *held* (:func:`simulator.chunks.held`): its requests wait in the
engine's ledger until the last chunk, which hands them here in request order. The records
are the same for any chunk length; the memory is the whole run's.
"""

from __future__ import annotations

import numpy as np

from simulator.ledger import Served
from simulator.rng import Streams
from simulator.scenario.config import Scenario
from simulator.serving.classes import serve_by_class
from simulator.serving.dispatch import serve_versions
from simulator.serving.served import ServingLog
from simulator.serving.workers import ServiceModel
from simulator.stages.speed import SpeedProcess


def serve_whole(
    s: Scenario,
    seed: int,
    rng: Streams,
    speed: SpeedProcess | None,
    *,
    t_router: np.ndarray,
    t_pre: np.ndarray,
    klass: np.ndarray,
    live: np.ndarray,
    assign: np.ndarray | None,
    deadlines: np.ndarray | None,
) -> tuple[np.ndarray, Served, ServingLog]:
    """The batching stage and the pools of a whole run, for the ``live`` requests (indices,
    request order) of all ``len(t_router)``: the requests served (their indices), their
    serving columns, and what else serving leaves (versions, batch logs, fleet, shadow).
    ``assign``: every request's worker in the primary pool (None: it routes by itself, or
    one shared queue); ``deadlines``: every request's end-to-end deadline, or None."""
    if s.traffic.classes:
        classes = serve_by_class(
            s.traffic.classes,
            s.workers,
            s.batching,
            s.router,
            t_pre[live],
            klass[live],
            None if assign is None else assign[live],
            rng,
            None if deadlines is None else deadlines[live],
            speed,
        )
        log = ServingLog(np.zeros(len(t_router), np.int8), classes.batches, classes.pools, None, None, None)
        return live, classes.served, log
    service = ServiceModel(s.workers, s.batching.max_batch_size, rng.service, speed)
    versions = serve_versions(
        s.router, s.workers, s.batching, seed, t_router, t_pre, live, assign, service, rng, deadlines
    )
    return versions.idx, versions.served, versions.log


__all__ = ["serve_whole"]
