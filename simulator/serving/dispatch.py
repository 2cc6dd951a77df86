"""A fixed pool served in one part, for checks that feed a scheduler a whole run; and the
workers of a version's or a class's own pool.

Given when each request reaches the batching stage, compute when it is dispatched and
done, in which batch and on which instance, with the scheduler that
:func:`~simulator.serving.scheduler.build` picks (the compiled loop of
:mod:`simulator.serving.compiled` where it covers the batching, the SimPy schedulers'
results bit for bit; with batching off, the exact FCFS recursion). The engine feeds
every other pool chunk by chunk (:mod:`simulator.serving.streamed`,
:mod:`simulator.serving.versions`).
"""

from __future__ import annotations

import numpy as np

from simulator.ledger import Served
from simulator.scenario.config import Batching, Workers
from simulator.serving.scheduler import build, queues_of
from simulator.serving.served import PoolRun
from simulator.serving.workers import ServiceModel


def sub(column: np.ndarray | None, idx) -> np.ndarray | None:
    """An optional per-request column (deadlines, workers) of a subset of requests; None
    stays None."""
    return None if column is None else column[idx]


def serve(
    t_pre: np.ndarray,
    assign: np.ndarray | None,
    workers: Workers,
    batching: Batching,
    service: ServiceModel,
    deadlines=None,
    *,
    compiled: bool | None = None,
) -> PoolRun:
    """Batching queues and a fixed pool of GPU workers: the requests (in the order of
    ``t_pre``) and the batch log. ``assign``: each request's worker, or None for one shared
    queue; ``deadlines``: each request's end-to-end deadline, with ``batching.deadline_ms``;
    ``compiled``: schedule with :mod:`simulator.serving.compiled` (default: where it covers
    the batching) or with the SimPy schedulers (the same results)."""
    instances = queues_of(workers.count, workers.instances, shared=assign is None)
    order = np.argsort(t_pre, kind="stable")
    pool = build(batching, instances, service, compiled=compiled)
    pool.extend(t_pre[order], order, sub(assign, order), sub(deadlines, order), np.inf)
    pool.close()
    got = pool.run()
    served = Served.empty(len(t_pre))
    served.scatter(got.ids, got.served)
    batches = got.batches
    return PoolRun(served, batches)


def pool_workers(workers: Workers, count: int, service_time) -> Workers:
    """The workers of a version's (or a class's) own fixed pool: the primary's, with its own
    size and model, and neither autoscaler nor failures."""
    return workers.model_copy(
        update={
            "count": count,
            "service_time": service_time or workers.service_time,
            "autoscaler": None,
            "failures": None,
        }
    )
