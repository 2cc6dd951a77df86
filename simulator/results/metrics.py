"""Metrics: pure functions of the per-request records and the batch log, which the summary
builder (:mod:`simulator.results.reduce`) and the planners use.

Nothing here simulates, prints or writes. The measurement window is the arrivals in
``[warmup_s, duration_s)``; requests are followed to completion even after the last
arrival, so the tail is not truncated.
"""

from __future__ import annotations

import numpy as np

from simulator.ledger import BatchLog
from simulator.results import summary
from simulator.results.run import Run
from simulator.results.stats import overlap, sla_verdict, summary_stats, window
from simulator.scenario.config import Scenario
from simulator.serving.lives import WorkerState
from simulator.serving.workers import mean_service_ms

# the window and the SLA verdict live in stats.py; readers have always found them here
__all__ = [
    "cost",
    "deploy_events",
    "extra_workers",
    "fleet_summary",
    "peak_throughput_rps",
    "sla_verdict",
    "summary_stats",
    "utilization",
    "window",
    "worker_price",
]


def utilization(batches: BatchLog, instances: int, t0_ms: float, t1_ms: float) -> np.ndarray:
    """Busy fraction of each instance over ``[t0_ms, t1_ms)``."""
    busy = overlap(batches.start, batches.end, t0_ms, t1_ms)
    per_instance = np.bincount(batches.instance, weights=busy, minlength=instances)
    return per_instance / (t1_ms - t0_ms)


def peak_throughput_rps(scenario: Scenario) -> float:
    """Most requests/s the pool can complete: every instance busy with full batches."""
    w, b = scenario.workers, scenario.batching.max_batch_size
    return w.count * w.instances * b / mean_service_ms(w, b) * 1000.0


def worker_price(scenario: Scenario) -> float:
    """Price of one worker-hour in USD, resolved when the scenario was loaded: the override,
    or the catalog's row (:attr:`Scenario.price_per_worker_hour_usd`)."""
    return scenario.price_per_worker_hour_usd


def cost(workers: int, price_per_hour_usd: float, completed_rps: float) -> dict[str, float]:
    """Fleet cost per hour and per million completed requests."""
    per_hour = workers * price_per_hour_usd
    per_million = per_hour / (completed_rps * 3600.0) * 1e6 if completed_rps > 0 else float("inf")
    return {
        "per_hour_usd": per_hour,
        "per_million_requests_usd": per_million,
        "price_per_worker_hour_usd": price_per_hour_usd,
    }


def logging_figures(scenario: Scenario, logged: int, lag_ms: dict[str, float], behind: int) -> dict:
    """The prediction-log section from its counts: ``logged`` records of the window shipped,
    their lag's statistics, and ``behind`` records emitted by the end but not yet shipped."""
    cfg = scenario.logging
    span_s = scenario.duration_s - scenario.warmup_s
    offered = logged * cfg.record_kb * 1e3 / span_s  # bytes/s
    capacity = cfg.bandwidth_gbps * 1e9 / 8
    return {
        "offered_gb_per_s": offered / 1e9,
        "capacity_gb_per_s": capacity / 1e9,
        "utilization": offered / capacity,
        "tb_per_day": offered * 86400 / 1e12,
        "lag_ms": lag_ms,
        "backlog_mb_at_end": behind * cfg.record_kb / 1e3,
        "falling_behind": bool(offered >= capacity),
    }


def deploy_events(s: Scenario) -> list[dict]:
    """Configured changes: canary rollout steps and rollback, cache flushes."""
    out = []
    c = s.router.canary
    if c is not None:
        steps = c.schedule or ((0.0, c.percent),)
        for step in steps:
            at, pct = (step.at_s, step.percent) if not isinstance(step, tuple) else step
            out.append({"t_s": at, "event": "canary", "detail": f"{c.name} at {pct:g}% of users"})
        if c.rollback_at_s is not None:
            out.append({"t_s": c.rollback_at_s, "event": "rollback", "detail": f"{c.name} to 0%"})
    for name, cache in (("result", s.caches.result), ("feature", s.caches.feature)):
        for t in cache.invalidate_at_s if cache else ():
            out.append({"t_s": t, "event": "deploy", "detail": f"{name} cache flushed"})
    return sorted(out, key=lambda e: e["t_s"])


def fleet_summary(run: Run, t0: float, t1: float) -> dict:
    """Workers over the window [t0, t1) ms: mean active and billed, peak, and each worker's
    active fraction of the window (1 for a fixed fleet). Dynamic fleets add their events."""
    s = run.scenario
    if run.fleet is None:
        n = s.workers.count
        return {
            "active_mean": float(n),
            "billed_mean": float(n),
            "active_max": n,
            "events": deploy_events(s),
            "active_fraction": np.ones(n),
        }
    span = t1 - t0
    a0, a1 = run.fleet.intervals(WorkerState.ACTIVE)
    b0, b1 = run.fleet.intervals(WorkerState.BILLED)
    active = overlap(a0, a1, t0, t1) / span
    times = np.concatenate([a0, a1])
    steps = np.concatenate([np.ones(len(a0)), -np.ones(len(a1))])
    order = np.lexsort((steps, times))  # at equal times, leave before arriving
    pool = np.array([w.pool for w in run.fleet.workers])
    pools = {name: float(active[pool == name].sum()) for name in dict.fromkeys(pool.tolist()) if name}
    billed = overlap(b0, b1, t0, t1) / span
    gpu = np.array([w.gpu for w in run.fleet.workers])
    by_type = {t: float(billed[gpu == t].sum()) for t in dict.fromkeys(gpu.tolist())} if s.workers.mix else {}
    return {
        **({"pools": pools} if pools else {}),  # prefill and decode apart: each pool's mean serving
        **({"billed_by_type": by_type} if by_type else {}),  # a mixed fleet: each GPU type's mean billed
        "active_mean": float(active.sum()),
        "billed_mean": float(billed.sum()),
        "active_max": int(np.cumsum(steps[order]).max()) if len(order) else 0,
        "events": [{"t_s": t / 1000.0, "event": str(kind), "detail": d} for t, kind, d in run.fleet.events]
        + deploy_events(s),
        "active_fraction": active,
    }


def extra_workers(s: Scenario) -> int:
    """Workers of the canary's and the shadow's own pools, and of classes with their own pool."""
    r = s.router
    own = sum(c.workers or 0 for c in s.traffic.classes.values())
    return (
        (r.canary.workers if r.canary else 0) + (r.shadow.workers if r.shadow and r.shadow.pool == "own" else 0) + own
    )


def _cost(s: Scenario, fleet: dict, experiments: dict | None, completed_rps: float) -> summary.Cost:
    price = worker_price(s)
    by_type = fleet.get("billed_by_type")
    if by_type and fleet["billed_mean"] > 0:  # a mixed fleet that scaled: each type billed its price
        price = sum(n * s.price_of(t) for t, n in by_type.items()) / fleet["billed_mean"]
    fleet_cost = cost(fleet["billed_mean"] + extra_workers(s), price, completed_rps)
    shadow = (experiments or {}).get("shadow")
    shadow_cost = shadow["gpu_cost_per_hour_usd"] if shadow else 0.0
    canary_cost = s.router.canary.workers * price if s.router.canary else 0.0
    return {
        **fleet_cost,
        "experiment_pools_per_hour_usd": extra_workers(s) * price,
        # what the shadow and the canary cost: their own pools, or the shadow's share of the primary's
        "experiments_per_hour_usd": shadow_cost + canary_cost,
        "experiments_fraction": (shadow_cost + canary_cost) / fleet_cost["per_hour_usd"]
        if fleet_cost["per_hour_usd"]
        else 0.0,
        "gpu_hours_per_day": (fleet["billed_mean"] + extra_workers(s)) * 24.0,
        "market": "override" if s.cost.price_per_hour_usd is not None else s.cost.market,
    }
