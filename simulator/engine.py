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
from dataclasses import dataclass

import numpy as np

from simulator.arrivals import arrivals as make_arrivals
from simulator.batcher import BatchQueue, Outcome
from simulator.config import Batching, Scenario
from simulator.distributions import Distribution, Sampler
from simulator.features import fetch
from simulator.predlog import ship
from simulator.recorder import Records
from simulator.stations import fcfs_multiserver
from simulator.workers import BatchLog, ServiceModel, run_pool

STREAMS = (
    "arrivals",
    "network_in",
    "network_out",
    "router",
    "features",
    "preprocess",
    "service",
    "postprocess",
    "routing",
)


@dataclass
class Run:
    """One simulation run: its inputs, per-request records, batch log and cost of running."""

    scenario: Scenario
    seed: int
    records: Records
    batches: BatchLog
    wall_s: float


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
        for order, queue, (start, end, sz, inst) in zip(groups, queues, results, strict=True):
            t_dispatch[order], t_done[order], size[order], instance[order] = start, end, sz, inst
            outcome[order] = queue.outcome
            dropped[order] = queue.drop_time
    return t_dispatch, t_done, size, instance, outcome, dropped, batches


def _preprocess(s: Scenario, t_feat: np.ndarray, svc: np.ndarray) -> np.ndarray:
    """CPU preprocessing end times: a pure delay, or an FCFS pool of ``cpu_workers``."""
    if s.preprocess.cpu_workers is None:
        return t_feat + svc
    return _in_order(t_feat, lambda st, o: fcfs_multiserver(st, svc[o], s.preprocess.cpu_workers)[0] + svc[o])


def _widen(x: np.ndarray, idx: np.ndarray, n: int, fill) -> np.ndarray:
    """Scatter the values of the ``idx`` subset into a length-``n`` array of ``fill``."""
    out = np.full(n, fill, dtype=x.dtype)
    out[idx] = x
    return out


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

    f = s.features
    feat_sampler = Sampler(f.round_trip, rng["features"]) if f.round_trip is not None else None
    t_feat, degraded, failed = fetch(f, t_router, feat_sampler)

    # requests whose feature fetch failed go no further; the rest continue
    pre_svc = np.broadcast_to(_delay(s.preprocess.service, n, rng["preprocess"]), (n,))
    assign = assign_workers(s, n, rng["routing"])
    live = np.flatnonzero(~failed) if failed.any() else slice(None)
    t_pre = _preprocess(s, t_feat[live], pre_svc[live])
    service = ServiceModel(s.workers, s.batching.max_batch_size, rng["service"])
    served = serve(t_pre, None if assign is None else assign[live], s, service)
    if failed.any():
        *per_request, batches = served
        fills = (np.nan, np.nan, 0, -1, Outcome.FAILED, np.nan)
        per_request = [_widen(x, live, n, fill) for x, fill in zip(per_request, fills, strict=True)]
        served = (*per_request, batches)
        t_pre = _widen(t_pre, live, n, np.nan)
    t_dispatch, t_inferred, batch_size, instance, outcome, t_dropped, batches = served
    if failed.any():
        t_dropped[failed] = t_feat[failed]
        t_feat = np.where(failed, np.nan, t_feat)

    t_post = t_inferred + _delay(s.postprocess.service, n, rng["postprocess"])
    t_resp = (
        t_post
        + _delay(s.network.api_to_client, n, rng["network_out"])
        + _transfer_ms(s.traffic.response_kb, s.network.bandwidth_gbps)
    )
    t_logged = ship(s.logging, np.where(np.isnan(t_resp), t_dropped, t_resp)) if s.logging else np.full(n, np.nan)
    records = Records(
        arrival=t0,
        t_api=t_api,
        t_router=t_router,
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
        batch_size=batch_size,
        instance=instance,
    )
    return Run(scenario=s, seed=seed, records=records, batches=batches, wall_s=time.perf_counter() - wall0)


__all__ = ["STREAMS", "Outcome", "Run", "simulate", "streams"]
