"""Metrics: pure functions of the per-request records and the batch log.

Nothing here simulates, prints or writes. The measurement window is the arrivals in
``[warmup_s, duration_s)``; requests are followed to completion even after the last
arrival, so the tail is not truncated.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.ledger import DROPS, BatchLog
from simulator.results import summary
from simulator.results.experiments import classes_summary, versions_summary
from simulator.results.records import STAGES, Records
from simulator.results.run import Run
from simulator.results.stats import overlap, sla_verdict, summary_stats, window
from simulator.results.timeline import timeline
from simulator.scenario.config import Scenario
from simulator.scenario.loader import scenario_hash
from simulator.serving.fleet import WorkerState
from simulator.serving.workers import mean_service_ms

# the window and the SLA verdict live in stats.py; readers have always found them here
__all__ = [
    "batch_size_counts",
    "cost",
    "deploy_events",
    "extra_workers",
    "fleet_summary",
    "latency_table",
    "logging_summary",
    "peak_throughput_rps",
    "sla_verdict",
    "summarize",
    "summary_stats",
    "utilization",
    "window",
    "worker_price",
]


def latency_table(records: Records, mask: np.ndarray) -> pd.DataFrame:
    """One row per stage plus ``e2e``: p50, p95, p99, p999, mean (ms) of completed requests."""
    done = mask & records.completed
    rows = {name: summary_stats(records.stage_ms(name)[done]) for name, _, _ in STAGES}
    rows["e2e"] = summary_stats((records.t_response - records.arrival)[done])
    df = pd.DataFrame.from_dict(rows, orient="index")
    df.index.name = "stage"
    return df


def utilization(batches: BatchLog, instances: int, t0_ms: float, t1_ms: float) -> np.ndarray:
    """Busy fraction of each instance over ``[t0_ms, t1_ms)``."""
    busy = np.clip(np.minimum(batches.end, t1_ms) - np.maximum(batches.start, t0_ms), 0.0, None)
    per_instance = np.bincount(batches.instance, weights=busy, minlength=instances)
    return per_instance / (t1_ms - t0_ms)


def peak_throughput_rps(scenario: Scenario) -> float:
    """Most requests/s the pool can complete: every instance busy with full batches."""
    w, b = scenario.workers, scenario.batching.max_batch_size
    return w.count * w.instances * b / mean_service_ms(w, b) * 1000.0


def batch_size_counts(batches: BatchLog, t0_ms: float, t1_ms: float) -> pd.Series:
    """How many batches of each size started inside the window."""
    inside = (batches.start >= t0_ms) & (batches.start < t1_ms)
    counts = np.bincount(batches.size[inside])
    sizes = np.flatnonzero(counts)
    return pd.Series(counts[sizes], index=pd.Index(sizes, name="batch_size"), name="batches")


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


def logging_summary(records: Records, scenario: Scenario, mask: np.ndarray) -> dict | None:
    """Prediction-log volume against pipeline capacity, the lag of records, and the backlog."""
    cfg = scenario.logging
    if cfg is None:
        return None
    emitted = np.where(np.isnan(records.t_response), records.t_dropped, records.t_response)
    sel = mask & np.isfinite(records.t_logged)
    lag = (records.t_logged - emitted)[sel]
    end = scenario.duration_s * 1000.0
    behind = np.count_nonzero((emitted <= end) & (records.t_logged > end))
    return logging_figures(scenario, int(np.count_nonzero(sel)), summary_stats(lag), int(behind))


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
    return {
        "active_mean": float(active.sum()),
        "billed_mean": float((overlap(b0, b1, t0, t1) / span).sum()),
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


def _requests(rec: Records, mask: np.ndarray, done: np.ndarray, span_s: float) -> summary.Requests:
    outcome = rec.outcome[mask]
    n_done = int(np.count_nonzero(done))
    return {
        "arrived": int(np.count_nonzero(mask)),
        "completed": n_done,
        **{name: int(np.count_nonzero(outcome == code)) for name, code in DROPS.items()},
        "degraded": int(np.count_nonzero(rec.degraded[done])),
        "throughput_rps": n_done / span_s,
        "window_s": span_s,
    }


def _cost(s: Scenario, fleet: dict, experiments: dict | None, completed_rps: float) -> summary.Cost:
    price = worker_price(s)
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


def _caches(s: Scenario, rec: Records, mask: np.ndarray) -> dict[str, summary.CacheStats]:
    return {
        name: {
            "hit_ratio": float(hits[looked].mean()) if looked.any() else float("nan"),
            "lookups": int(looked.sum()),
        }
        for name, cfg, hits, looked in (
            ("result", s.caches.result, rec.result_hit, mask),
            ("feature", s.caches.feature, rec.feature_hit, mask & ~rec.result_hit),
        )
        if cfg is not None
    }


def _sim(run: Run) -> summary.Sim:
    n = len(run.records)
    return {
        "wall_s": run.wall_s,
        "requests": n,
        "requests_per_wall_s": n / run.wall_s if run.wall_s > 0 else float("inf"),
        "seed": run.seed,
    }


def summarize(run: Run, *, interval_s: float | None = 1.0) -> summary.Summary:
    """Every headline number of a run, as the nested dict that ``--json`` writes.

    Counted over the requests that arrived in ``[warmup_s, duration_s)``, each followed to
    its end (the tail after the last arrival is not cut off).

    Parameters
    ----------
    run : Run
        A finished run (:func:`simulator.simulate`).
    interval_s : float or None
        Width of the timeline's intervals, s; None leaves the timeline out (an empty list).

    Returns
    -------
    Summary
        A typed dict (:class:`simulator.results.summary.Summary`): requests and
        throughput (req/s), latency per stage and end to end (ms), the SLA verdict,
        utilization, workers, batch sizes, cost (USD), caches, experiments, the fleet,
        and ``timeline``, one record per ``interval_s`` (see
        :func:`simulator.results.timeline.timeline`). Pure: it reads no file.
    """
    s, rec = run.scenario, run.records
    mask = window(rec, s)
    t0, t1 = s.warmup_s * 1000.0, s.duration_s * 1000.0
    span_s = (t1 - t0) / 1000.0
    done = mask & rec.completed
    requests = _requests(rec, mask, done, span_s)
    n_dropped = sum(requests[k] for k in DROPS)
    table = latency_table(rec, mask)
    e2e = (rec.t_response - rec.arrival)[done]
    fleet = fleet_summary(run, t0, t1)
    n_workers = len(run.fleet.workers) if run.fleet else s.workers.count
    busy = utilization(run.batches, n_workers * s.workers.instances, t0, t1)
    busy = busy.reshape(n_workers, s.workers.instances).mean(axis=1)  # fraction of the window, per worker
    per_worker = busy / np.maximum(fleet["active_fraction"], 1e-12)
    sizes = batch_size_counts(run.batches, t0, t1)
    classes = classes_summary(run, mask, worker_price(s))
    if classes:  # each model's load over its own peak, on the shared pool
        of_peak = sum(c["load_of_peak_capacity"] for c in classes.values() if c["pool"] == "shared")
    else:
        of_peak = float((sizes.index * sizes).sum()) / span_s / peak_throughput_rps(s)
    experiments = versions_summary(run, mask, worker_price(s), fleet["billed_mean"])
    return {
        "scenario": {"name": s.name, "hash": scenario_hash(s)},
        "requests": requests,
        "latency_ms": {
            "e2e": table.loc["e2e"].to_dict(),
            "stages": {name: table.loc[name].to_dict() for name in table.index if name != "e2e"},
        },
        "sla": sla_verdict(e2e, s.sla.percentile, s.sla.target_ms, n_dropped if s.sla.count_dropped else 0),
        "utilization": {
            "workers": float((busy.sum()) / max(fleet["active_fraction"].sum(), 1e-12)),
            "per_worker": per_worker.tolist(),
            "of_peak_capacity": of_peak,  # GPU-served requests over what full batches could serve
        },
        "batch_size": {
            "mean": float((sizes.index * sizes).sum() / sizes.sum()) if len(sizes) else float("nan"),
            "counts": {int(k): int(v) for k, v in sizes.items()},
        },
        "fleet": {k: v for k, v in fleet.items() if k != "active_fraction"},
        "workers": {
            "count": s.workers.count,
            "instances": s.workers.instances,
            "instance_type": s.workers.instance_type,
        },
        "cost": _cost(s, fleet, experiments, requests["completed"] / span_s),
        "logging": logging_summary(rec, s, mask),
        "experiments": experiments,
        "classes": classes,
        "caches": _caches(s, rec, mask),
        "timeline": []
        if interval_s is None
        else timeline(rec, run.batches, s, interval_s=interval_s, fleet=run.fleet, shadow=run.shadow).to_dict(
            orient="records"
        ),
        "sim": _sim(run),
    }
