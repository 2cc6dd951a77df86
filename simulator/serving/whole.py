"""Serving that sees a run's requests all at once: the traffic classes' pools.

The engine (:mod:`simulator.engine`) feeds every other pool chunk by chunk
(:mod:`simulator.serving.streamed`, :mod:`simulator.serving.versions`,
:class:`simulator.serving.event_loop.Loop`). The classes' shared pool is still written
over a whole run: a scenario with traffic classes is *held*
(:func:`simulator.chunks.held`): its requests wait in the engine's ledger until the last
chunk, which hands them here in request order. The records are the same for any chunk
length; the memory is the whole run's.
"""

from __future__ import annotations

import numpy as np

from simulator.ledger import Served
from simulator.rng import Streams
from simulator.scenario.config import Scenario
from simulator.serving.classes import serve_by_class
from simulator.serving.served import ServingLog
from simulator.stages.speed import SpeedProcess


def serve_whole(
    s: Scenario,
    rng: Streams,
    speed: SpeedProcess | None,
    *,
    t_pre: np.ndarray,
    klass: np.ndarray,
    live: np.ndarray,
    assign: np.ndarray | None,
    deadlines: np.ndarray | None,
) -> tuple[np.ndarray, Served, ServingLog]:
    """The traffic classes' pools over a whole run, for the ``live`` requests (indices,
    request order) of all ``len(t_pre)``: the requests served (their indices), their
    serving columns, and what else serving leaves (the batch logs by class).
    ``assign``: every request's worker in the shared pool (None: one shared queue);
    ``deadlines``: every request's end-to-end deadline, or None."""
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
    log = ServingLog(np.zeros(len(t_pre), np.int8), classes.batches, classes.pools, None, None, None)
    return live, classes.served, log


__all__ = ["serve_whole"]
