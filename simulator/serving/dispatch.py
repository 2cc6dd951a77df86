"""Serving: the batch queues and GPU workers of every version's pool.

Given when each request reaches the batching stage, compute when it is dispatched and
done, in which batch and on which instance. A fixed fleet runs the schedulers of
:mod:`simulator.serving.workers` (or, with batching off, the exact FCFS recursion); a changing
fleet runs :class:`simulator.serving.pool.DynamicPool`. With a canary or a shadow, each version
gets its own pool, and a shared-pool shadow joins the primary's queues. A fixed pool's
queues are scheduled by the compiled loop of :mod:`simulator.serving.compiled` where it
covers the batching (the SimPy schedulers' results, bit for bit, much faster).
"""

from __future__ import annotations

import numpy as np

from simulator.ledger import BatchLog, Outcome, Served
from simulator.rng import Streams, streams
from simulator.scenario.config import Batching, Scenario, Workers
from simulator.scenario.config import Router as RouterConfig
from simulator.serving.pool import DynamicPool
from simulator.serving.router import Router
from simulator.serving.scheduler import build, queues_of
from simulator.serving.served import PoolRun, ServingLog, VersionsRun
from simulator.serving.workers import ServiceModel
from simulator.stages.canary import on_canary


def route(balancing: str, count: int, n: int, rng: np.random.Generator) -> np.ndarray | None:
    """Worker of each of ``n`` requests (arrival order) among ``count``, or None when the
    pool shares one queue (``balancing``: the router section's)."""
    return Router(balancing, rng).pick(n, count)


def assign_workers(scenario: Scenario, n: int, rng: np.random.Generator) -> np.ndarray | None:
    """The primary pool's :func:`route`, from the scenario (the engine's entry)."""
    return route(scenario.router.balancing, scenario.workers.count, n, rng)


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


def serve_primary(
    workers: Workers,
    batching: Batching,
    router: RouterConfig,
    t_pre: np.ndarray,
    assign,
    service: ServiceModel,
    rng: Streams,
    deadlines=None,
) -> PoolRun:
    """The primary's pool, fixed or dynamic: its requests, its batch log, and its fleet log
    (None for a fixed pool)."""
    if workers.dynamic:
        return DynamicPool(workers, batching, router, t_pre, service, rng, deadlines).run()
    return serve(t_pre, assign, workers, batching, service, deadlines)


def serve_versions(
    router: RouterConfig,
    workers: Workers,
    batching: Batching,
    seed: int,
    t_router,
    t_pre,
    live,
    assign,
    service,
    rng,
    deadlines=None,
):
    """Route live requests to the primary or the canary (sticky by user), copy a share to
    the shadow, and serve each pool: the served live requests (their indices and their
    :class:`Served` columns) and a :class:`ServingLog` (versions, the primary's batch and
    fleet logs, the other pools' logs, the shadow copies, and the primary's completion
    times without the shared shadow, or None)."""
    n = len(t_router)
    r = router
    version = np.zeros(n, dtype=np.int8)
    if r.canary is None and r.shadow is None:  # one version: no copies of the columns
        primary = serve_primary(
            workers, batching, router, t_pre[live], sub(assign, live), service, rng, sub(deadlines, live)
        )
        return VersionsRun(live, primary.served, ServingLog(version, primary.batches, {}, primary.fleet, None, None))
    if r.canary is not None:
        users = rng.versions.integers(0, r.users, n)
        version[on_canary(r.canary, users, t_router)] = 1
    prim = live[version[live] == 0]
    cand = live[version[live] == 1]
    copies = prim[rng.shadow_copies.random(len(prim)) < r.shadow.percent / 100] if r.shadow else prim[:0]
    shared = r.shadow is not None and r.shadow.pool == "shared"
    t_in = np.concatenate([t_pre[prim], t_pre[copies]]) if shared else t_pre[prim]
    a_in = sub(assign, prim)
    if shared and a_in is not None:
        a_in = np.concatenate([a_in, route(r.balancing, workers.count, len(copies), rng.shadow_routing)])
    d_in = sub(deadlines, np.concatenate([prim, copies]) if shared else prim)
    primary = serve_primary(workers, batching, router, t_in, a_in, service, rng, d_in)
    per = primary.served
    served = Served.empty(n)
    served.scatter(prim, per.take(slice(None, len(prim))))
    pools: dict[str, BatchLog] = {}
    shadow = counterfactual = None
    if r.shadow is not None:
        if shared:
            sh = per.take(slice(len(prim), None))
        else:
            own = (rng.shadow_service, rng.shadow_routing)
            run = _own_pool(
                r.shadow, r.balancing, workers, batching, t_pre[copies], own, sub(deadlines, copies), service.speed
            )
            sh, pools["shadow"] = run.served, run.batches
        if shared and r.shadow.measure_impact:
            counterfactual = np.full(n, np.nan)
            counterfactual[prim] = _without_shadow(
                workers, batching, router, seed, t_pre[prim], sub(assign, prim), sub(deadlines, prim), service.speed
            )
        shadow = {
            "request": copies,
            "t_preprocessed": t_pre[copies],
            "t_dispatch": sh.t_dispatch,
            "t_inferred": sh.t_done,
            "outcome": sh.outcome,
        }
    if r.canary is not None:
        own = (rng.canary_service, rng.canary_routing)
        run = _own_pool(r.canary, r.balancing, workers, batching, t_pre[cand], own, sub(deadlines, cand), service.speed)
        on_canary_pool, pools["canary"] = run.served, run.batches
        errors = rng.canary_errors.random(len(cand)) < r.canary.error_rate
        on_canary_pool.outcome[errors & (on_canary_pool.outcome == Outcome.COMPLETED)] = Outcome.ERROR
        served.scatter(cand, on_canary_pool)
    served_idx = np.concatenate([prim, cand])
    log = ServingLog(version, primary.batches, pools, primary.fleet, shadow, counterfactual)
    return VersionsRun(served_idx, served.take(served_idx), log)


def _own_pool(
    version, balancing: str, workers: Workers, batching: Batching, t_pre, streams_of, deadlines, speed=None
) -> PoolRun:
    """A version's own fixed pool, the canary's or a shadow's with ``pool: own``: its
    ``workers`` and ``service_time``, the primary's batching and balancing, and the
    version's own (service, routing) streams ``streams_of``."""
    service_rng, routing_rng = streams_of
    pw = pool_workers(workers, version.workers, version.service_time)
    model = ServiceModel(pw, batching.max_batch_size, service_rng, speed)
    return serve(t_pre, route(balancing, pw.count, len(t_pre), routing_rng), pw, batching, model, deadlines)


def _without_shadow(
    workers: Workers, batching: Batching, router: RouterConfig, seed: int, t_pre, assign, deadlines, speed=None
):
    """The primary's completion times had the shared-pool shadow sent nothing: the same
    requests served again from fresh streams of the same seed (``measure_impact``)."""
    fresh = streams(seed)
    service = ServiceModel(workers, batching.max_batch_size, fresh.service, speed)
    return serve_primary(workers, batching, router, t_pre, assign, service, fresh, deadlines).served.t_done
