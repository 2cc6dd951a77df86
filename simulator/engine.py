"""Wiring and run loop: scenario + seed → per-request records.

Stages run in request order, each from the previous stage's output times:

    arrivals → network in → router → features → preprocess → batching queue
             → GPU workers → postprocess → network out

Delays nothing contends for are drawn in bulk. The CPU pool is an exact FCFS
recursion. The KV store, when it has finite capacity, and the batcher with its workers
are simulated with SimPy, with events per round trip and per batch. When batching is
off (``max_batch_size: 1``, no queue limits) the worker pool is itself an FCFS
multi-server station and takes the exact recursion too.

Every random stream derives from the one seed with ``SeedSequence.spawn``, one stream
per stage, so variants of a scenario share their random inputs (common random numbers).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from simulator.arrivals import arrivals as make_arrivals
from simulator.batcher import BatchQueue, Outcome
from simulator.caches import lookup
from simulator.config import Batching, Cache, Scenario
from simulator.distributions import Distribution, Sampler
from simulator.features import fetch
from simulator.pool import DynamicPool, FleetLog
from simulator.predlog import ship
from simulator.recorder import Records
from simulator.stations import fcfs_multiserver
from simulator.versions import on_canary
from simulator.workers import BatchLog, ServiceModel, run_pool

STREAMS = (  # append only: a stream's position fixes its seed
    "arrivals",
    "network_in",
    "network_out",
    "router",
    "features",
    "preprocess",
    "service",
    "postprocess",
    "routing",
    "result_cache",
    "feature_cache",
    "fleet",
    "versions",
    "canary_service",
    "shadow_service",
)


@dataclass
class Run:
    """One simulation run: its inputs, per-request records, batch log and cost of running."""

    scenario: Scenario
    seed: int
    records: Records
    batches: BatchLog
    wall_s: float
    fleet: FleetLog | None = None  # when the fleet changes during the run
    pools: dict[str, BatchLog] = field(default_factory=dict)  # batch logs of the canary and own shadow pools
    shadow: dict[str, np.ndarray] | None = None  # the shadow copies: source request, times, outcome
    response_without_shadow: np.ndarray | None = None  # primary responses in a run without shared shadow copies


def streams(seed: int) -> dict[str, np.random.Generator]:
    """One independent generator per stage, all from ``seed``."""
    children = np.random.SeedSequence(seed).spawn(len(STREAMS))
    return {name: np.random.default_rng(s) for name, s in zip(STREAMS, children, strict=True)}


def _delay(dist: Distribution | None, n: int, rng: np.random.Generator) -> np.ndarray | float:
    return 0.0 if dist is None else Sampler(dist, rng).draw(n)


def _transfer_ms(kb: float, bandwidth_gbps: float | None) -> float:
    # 1 KB = 8,000 bits; 1 Gbit/s = 1e6 bits per ms
    return 0.0 if bandwidth_gbps is None else kb * 8000.0 / (bandwidth_gbps * 1e6)


def fast_path(cfg: Batching) -> bool:
    """Batching off and no queue limits: the pool is a plain FCFS multi-server station."""
    return cfg.max_batch_size == 1 and cfg.max_queue_size is None and cfg.timeout_ms is None


def _in_order(start: np.ndarray, fn) -> np.ndarray:
    """Apply an order-dependent stage to unsorted start times; results in request order."""
    order = np.argsort(start, kind="stable")
    out = np.empty_like(start)
    out[order] = fn(start[order], order)
    return out


def assign_workers(scenario: Scenario, n: int, rng: np.random.Generator) -> np.ndarray | None:
    """Worker of each request (arrival order), or None when the pool shares one queue."""
    count = scenario.workers.count
    match scenario.router.balancing:
        case "shared":
            return None
        case "round_robin":
            return np.arange(n) % count
        case "random":
            return rng.integers(0, count, n)


def serve(t_pre: np.ndarray, assign: np.ndarray | None, s: Scenario, service: ServiceModel):
    """Batching queues and GPU workers: per-request dispatch/finish times, batch size,
    instance, outcome and drop time (request order), and the batch log."""
    n = len(t_pre)
    per_worker = s.workers.instances
    if assign is None:
        groups = [np.argsort(t_pre, kind="stable")]
        ids = [list(range(s.workers.count * per_worker))]
    else:
        by_worker = np.lexsort((t_pre, assign))  # worker, then time
        cuts = np.searchsorted(assign[by_worker], np.arange(1, s.workers.count))
        groups = np.split(by_worker, cuts)
        ids = [list(range(w * per_worker, (w + 1) * per_worker)) for w in range(s.workers.count)]
    t_dispatch = np.full(n, np.nan)
    t_done = np.full(n, np.nan)
    size = np.zeros(n, dtype=np.int64)
    instance = np.full(n, -1, dtype=np.int64)
    outcome = np.zeros(n, dtype=np.int8)
    dropped = np.full(n, np.nan)
    if fast_path(s.batching):
        # service draws go to requests in queue-arrival order: the dispatch order of a shared queue
        svc_all = np.empty(n)
        svc_all[np.argsort(t_pre, kind="stable")] = service.draw(n, 1)
        logs = []
        for order, inst_ids in zip(groups, ids, strict=True):
            svc = svc_all[order]
            start, k = fcfs_multiserver(t_pre[order], svc, len(inst_ids))
            t_dispatch[order], t_done[order], size[order] = start, start + svc, 1
            instance[order] = np.asarray(inst_ids)[k] if len(order) else k
            logs.append((start, start + svc, instance[order]))
        batches = BatchLog(
            start=np.concatenate([g[0] for g in logs]),
            end=np.concatenate([g[1] for g in logs]),
            size=np.ones(n, dtype=np.int64),
            instance=np.concatenate([g[2] for g in logs]),
        )
    else:
        queues = [BatchQueue(t_pre[order], s.batching) for order in groups]
        results, batches = run_pool(queues, ids, service)
        for order, columns in zip(groups, results, strict=True):
            for full, part in zip((t_dispatch, t_done, size, instance, outcome, dropped), columns, strict=True):
                full[order] = part
    return t_dispatch, t_done, size, instance, outcome, dropped, batches


def _preprocess(s: Scenario, t_feat: np.ndarray, svc: np.ndarray) -> np.ndarray:
    """CPU preprocessing end times: a pure delay, or an FCFS pool of ``cpu_workers``."""
    if s.preprocess.cpu_workers is None:
        return t_feat + svc
    return _in_order(t_feat, lambda st, o: fcfs_multiserver(st, svc[o], s.preprocess.cpu_workers)[0] + svc[o])


def _cache(cfg: Cache | None, t: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Hits of a cache looked up at ``t``, and when each lookup is done."""
    if cfg is None:
        return np.zeros(len(t), dtype=bool), t
    hit = lookup(cfg, t, rng=rng)
    lat = np.where(hit, _delay(cfg.hit, len(t), rng), _delay(cfg.miss, len(t), rng))
    return hit, t + lat


def _feature_stage(s: Scenario, start: np.ndarray, need: np.ndarray, rng: dict) -> tuple[np.ndarray, ...]:
    """Feature stage for the requests that ``need`` it: end times, degraded, failed, cache hits."""
    n = len(start)
    end = start.copy()
    degraded, failed = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    hit = np.zeros(n, dtype=bool)
    idx = np.flatnonzero(need)
    c_hit, c_end = _cache(s.caches.feature, start[idx], rng["feature_cache"])
    hit[idx] = c_hit
    end[idx] = c_end
    go = idx[~c_hit]
    f = s.features
    sampler = Sampler(f.round_trip, rng["features"]) if f.round_trip is not None else None
    end[go], degraded[go], failed[go] = fetch(f, end[go], sampler)
    return end, degraded, failed, hit


def _pool_scenario(s: Scenario, count: int, service_time) -> Scenario:
    """The scenario of a version's own fixed pool: the primary's, with its own size and model."""
    w = s.workers.model_copy(
        update={
            "count": count,
            "service_time": service_time or s.workers.service_time,
            "autoscaler": None,
            "failures": None,
        }
    )
    return s.model_copy(update={"workers": w})


def _serve_primary(s: Scenario, t_pre: np.ndarray, assign, service: ServiceModel, rng: dict):
    if s.workers.dynamic:
        return DynamicPool(s, t_pre, service, rng).run()
    *per_request, batches = serve(t_pre, assign, s, service)
    return per_request, batches, None


def _serve_versions(s: Scenario, seed: int, t_router, t_pre, live, assign, service, rng):
    """Route live requests to the primary or the canary (sticky by user), copy a share to
    the shadow, and serve each pool. Returns versions, shadow copies, the extra pools'
    logs, the primary fleet and batch log, per-request columns of the live requests,
    and primary completion times without the shared shadow (or None)."""
    n = len(t_router)
    r = s.router
    vr = rng["versions"]
    version = np.zeros(n, dtype=np.int8)
    if r.canary is None and r.shadow is None:  # one version: no copies of the columns
        per, batches, fleet = _serve_primary(s, t_pre[live], None if assign is None else assign[live], service, rng)
        return version, None, {}, fleet, batches, (live, per), None
    if r.canary is not None:
        users = vr.integers(0, r.users, n)
        version[on_canary(r.canary, users, t_router)] = 1
    prim = live[version[live] == 0]
    cand = live[version[live] == 1]
    copies = prim[vr.random(len(prim)) < r.shadow.percent / 100] if r.shadow else prim[:0]
    shared = r.shadow is not None and r.shadow.pool == "shared"
    t_in = np.concatenate([t_pre[prim], t_pre[copies]]) if shared else t_pre[prim]
    a_in = None if assign is None else assign[prim]
    if shared and a_in is not None:
        a_in = np.concatenate([a_in, assign_workers(s, len(copies), vr)])
    per, batches, fleet = _serve_primary(s, t_in, a_in, service, rng)
    cols = [np.empty(n, dtype=c.dtype) for c in per]
    for c, v in zip(cols, per, strict=True):
        c[prim] = v[: len(prim)]
    pools: dict[str, BatchLog] = {}
    shadow = counterfactual = None
    if r.shadow is not None:
        if shared:
            sh = [v[len(prim) :] for v in per]
        if shared and r.shadow.measure_impact:
            fresh = streams(seed)
            cf, _, _ = _serve_primary(
                s,
                t_pre[prim],
                None if assign is None else assign[prim],
                ServiceModel(s.workers, s.batching.max_batch_size, fresh["service"]),
                fresh,
            )
            counterfactual = np.full(n, np.nan)
            counterfactual[prim] = cf[1]
        elif not shared:
            ps = _pool_scenario(s, r.shadow.workers, r.shadow.service_time)
            model = ServiceModel(ps.workers, s.batching.max_batch_size, rng["shadow_service"])
            *sh, pools["shadow"] = serve(t_pre[copies], assign_workers(ps, len(copies), vr), ps, model)
        shadow = {
            "request": copies,
            "t_preprocessed": t_pre[copies],
            "t_dispatch": sh[0],
            "t_inferred": sh[1],
            "outcome": sh[4],
        }
    if r.canary is not None:
        pc = _pool_scenario(s, r.canary.workers, r.canary.service_time)
        model = ServiceModel(pc.workers, s.batching.max_batch_size, rng["canary_service"])
        *pc_cols, pools["canary"] = serve(t_pre[cand], assign_workers(pc, len(cand), vr), pc, model)
        errors = (vr.random(len(cand)) < r.canary.error_rate) & (pc_cols[4] == Outcome.COMPLETED)
        pc_cols[4] = np.where(errors, Outcome.ERROR, pc_cols[4])
        for c, v in zip(cols, pc_cols, strict=True):
            c[cand] = v
    served_idx = np.concatenate([prim, cand])
    return version, shadow, pools, fleet, batches, (served_idx, [c[served_idx] for c in cols]), counterfactual


def simulate(scenario: Scenario, *, seed: int | None = None) -> Run:
    """Run one scenario; ``seed`` overrides the scenario's own."""
    wall0 = time.perf_counter()
    seed = scenario.seed if seed is None else seed
    rng = streams(seed)
    s = scenario
    t0 = make_arrivals(s.traffic, s.duration_s * 1000.0, rng=rng["arrivals"])
    n = len(t0)

    t_api = (
        t0
        + _delay(s.network.client_to_api, n, rng["network_in"])
        + _transfer_ms(s.traffic.payload_kb, s.network.bandwidth_gbps)
    )
    t_router = t_api + _delay(s.router.overhead, n, rng["router"])

    # result cache: a hit skips features, preprocessing and the model
    result_hit, t_cache = _cache(s.caches.result, t_router, rng["result_cache"])
    need = ~result_hit
    t_feat, degraded, failed, feature_hit = _feature_stage(s, t_cache, need, rng)

    pre_svc = np.broadcast_to(_delay(s.preprocess.service, n, rng["preprocess"]), (n,))
    assign = assign_workers(s, n, rng["routing"])
    service = ServiceModel(s.workers, s.batching.max_batch_size, rng["service"])
    live = need & ~failed
    everyone = bool(live.all())
    idx = slice(None) if everyone else np.flatnonzero(live)
    if everyone:
        t_pre = _preprocess(s, t_feat, pre_svc)
    else:
        t_pre = t_feat.copy()
        t_pre[idx] = _preprocess(s, t_feat[idx], pre_svc[idx])
    del pre_svc
    version, shadow, pools, fleet, batches, served, counterfactual = _serve_versions(
        s, seed, t_router, t_pre, np.arange(n) if everyone else idx, assign, service, rng
    )
    live_idx, per_request = served
    if everyone and len(live_idx) == n and np.array_equal(live_idx, np.arange(n)):
        t_dispatch, t_inferred, batch_size, instance, outcome, t_dropped = per_request
    else:
        # requests served from the result cache take zero time in the later stages
        t_dispatch, t_inferred = t_feat.copy(), t_feat.copy()
        batch_size = np.zeros(n, dtype=np.int64)
        instance = np.full(n, -1, dtype=np.int64)
        outcome = np.zeros(n, dtype=np.int8)
        t_dropped = np.full(n, np.nan)
        for column, values in zip(
            (t_dispatch, t_inferred, batch_size, instance, outcome, t_dropped), per_request, strict=True
        ):
            column[live_idx] = values
    del per_request, served
    if failed.any():  # they gave up on their features and go no further
        outcome[failed] = Outcome.FAILED
        t_dropped[failed] = t_feat[failed]
        for column in (t_feat, t_pre, t_dispatch, t_inferred):
            column[failed] = np.nan

    post = _delay(s.postprocess.service, n, rng["postprocess"])
    back = _delay(s.network.api_to_client, n, rng["network_out"]) + _transfer_ms(
        s.traffic.response_kb, s.network.bandwidth_gbps
    )
    t_post = t_inferred + post
    t_resp = t_post + back
    if counterfactual is not None:  # primary responses had the shadow not shared their queues
        counterfactual = counterfactual + post + back
    t_logged = ship(s.logging, np.where(np.isnan(t_resp), t_dropped, t_resp)) if s.logging else np.full(n, np.nan)
    records = Records(
        arrival=t0,
        t_api=t_api,
        t_router=t_router,
        t_cache=t_cache,
        t_features=t_feat,
        t_preprocessed=t_pre,
        t_dispatch=t_dispatch,
        t_inferred=t_inferred,
        t_postprocessed=t_post,
        t_response=t_resp,
        t_dropped=t_dropped,
        t_logged=t_logged,
        outcome=outcome,
        degraded=degraded,
        result_hit=result_hit,
        feature_hit=feature_hit,
        batch_size=batch_size,
        instance=instance,
        version=version,
    )
    return Run(
        scenario=s,
        seed=seed,
        records=records,
        batches=batches,
        wall_s=time.perf_counter() - wall0,
        fleet=fleet,
        pools=pools,
        shadow=shadow,
        response_without_shadow=counterfactual,
    )


__all__ = ["STREAMS", "Outcome", "Run", "simulate", "streams"]
