"""The timeline: per-interval metrics of a run, as a tidy table.

Pure functions of the records and the batch log. Offered load and drops are binned by
arrival time, completions and their latency percentiles by response time, batches by
start time. Time-averaged levels (requests waiting in batch queues, in flight) are
exact integrals of the step functions, computed from prefix sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from simulator.ledger import BatchLog, Outcome
from simulator.results.records import Records
from simulator.scenario.config import Caches, PredictionLog, Scenario
from simulator.serving.fleet import FleetLog, WorkerState


@dataclass(frozen=True)
class Column:
    """One timeline column: its unit, what it means, and whether it is a sum over the fleet
    (rates, counts and levels that grow with the number of workers) or a per-request or
    per-worker figure (percentiles, ratios, mean batch size)."""

    unit: str
    description: str
    fleet_wide: bool = False


COLUMNS: dict[str, Column] = {
    "t_s": Column("s", "start of the interval"),
    "offered_rps": Column("req/s", "arrivals", fleet_wide=True),
    "completed_rps": Column("req/s", "responses", fleet_wide=True),
    "rejected": Column("requests", "rejected arrivals (queue full, no worker)", fleet_wide=True),
    "timed_out": Column("requests", "arrivals that timed out in a batch queue", fleet_wide=True),
    "failed": Column("requests", "arrivals that failed (features, crashes, errors)", fleet_wide=True),
    "degraded": Column("requests", "responses served degraded (feature defaults)", fleet_wide=True),
    "active_workers": Column("workers", "time-average of workers serving", fleet_wide=True),
    "warming_workers": Column("workers", "time-average of workers starting (cold start)", fleet_wide=True),
    "draining_workers": Column("workers", "time-average of workers draining", fleet_wide=True),
    "queue_depth": Column("requests", "time-average of requests waiting in batch queues", fleet_wide=True),
    "in_flight": Column("requests", "time-average of requests in the system", fleet_wide=True),
    "mean_batch_size": Column("requests", "mean size of the batches started"),
    "p50_ms": Column("ms", "median end-to-end latency of the responses"),
    "p99_ms": Column("ms", "p99 end-to-end latency of the responses"),
    "log_backlog_mb": Column("MB", "time-average of prediction-log records not yet shipped"),
    "result_hit_ratio": Column("ratio", "result-cache hits per lookup"),
    "feature_hit_ratio": Column("ratio", "feature-cache hits per lookup"),
    "shadow_rps": Column("req/s", "copies sent to the shadow", fleet_wide=True),
    "canary_share": Column("ratio", "share of arrivals routed to the canary"),
}

# the columns that are sums over the fleet: a sampled run scales them back up
FLEET_WIDE = frozenset(name for name, c in COLUMNS.items() if c.fleet_wide)


def time_average_level(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Time-average of N(t) = #{i: starts_i <= t < ends_i} over each interval of ``edges``.

    ∫₀ˣ N(t) dt = Σ_{a_i ≤ x} (x − a_i) − Σ_{d_i ≤ x} (x − d_i), from sorted prefix sums.
    """
    keep = np.isfinite(starts) & np.isfinite(ends)  # a request that never got there is never counted
    a, d = np.sort(starts[keep]), np.sort(ends[keep])
    ca, cd = np.concatenate(([0.0], np.cumsum(a))), np.concatenate(([0.0], np.cumsum(d)))
    na, nd = np.searchsorted(a, edges, side="right"), np.searchsorted(d, edges, side="right")
    area = edges * na - ca[na] - (edges * nd - cd[nd])
    return np.diff(area) / np.diff(edges)


def _binned_percentiles(t: np.ndarray, x: np.ndarray, edges: np.ndarray, qs: list[float]) -> np.ndarray:
    """Percentiles ``qs`` of x grouped by the interval of t (NaN for empty intervals)."""
    out = np.full((len(edges) - 1, len(qs)), np.nan)
    if len(t) == 0:
        return out
    order = np.argsort(t, kind="stable")
    t, x = t[order], x[order]
    cuts = np.searchsorted(t, edges)
    for k in range(len(edges) - 1):
        chunk = x[cuts[k] : cuts[k + 1]]
        if len(chunk):
            out[k] = np.percentile(chunk, qs)
    return out


def timeline(
    records: Records,
    batches: BatchLog,
    scenario: Scenario,
    *,
    interval_s: float = 1.0,
    fleet: FleetLog | None = None,
    shadow: dict | None = None,
) -> pd.DataFrame:
    """One row per interval of ``interval_s`` over the run (the tail after the last arrival included).

    The columns are :data:`COLUMNS`, in that order; those of parts the scenario does not
    model (caches, logging) are NaN.

    Parameters
    ----------
    records : Records
        The run's per-request records (times in ms).
    batches : BatchLog
        The run's batches.
    scenario : Scenario
        The scenario run: its duration, worker count, and which parts it models.
    interval_s : float
        Width of an interval, s.
    fleet : FleetLog, optional
        A dynamic fleet's life cycle; without it the fleet is ``workers.count`` throughout.
    shadow : dict, optional
        The shadow copies' columns (``t_preprocessed``, ms).
    """
    if interval_s <= 0:
        raise ValueError("interval_s must be positive")
    r = records
    done = r.completed
    last = np.nanmax(r.t_response) if done.any() else 0.0
    end_ms = max(scenario.duration_s * 1000.0, float(last))
    edges = np.arange(0.0, end_ms + interval_s * 1000.0, interval_s * 1000.0)
    offered = np.histogram(r.arrival, bins=edges)[0]
    e2e = _binned_percentiles(r.t_response[done], (r.t_response - r.arrival)[done], edges, [50.0, 99.0])
    cols = {
        "t_s": edges[:-1] / 1000.0,
        **_outcomes(r, edges, interval_s),
        **_workers(fleet, scenario.workers.count, edges),
        **_levels(r, edges, scenario.logging),
        "mean_batch_size": _mean_batch(batches, edges),
        "p50_ms": e2e[:, 0],
        "p99_ms": e2e[:, 1],
        **_hit_ratios(r, edges, scenario.caches),
        "shadow_rps": np.histogram(shadow["t_preprocessed"], bins=edges)[0] / interval_s
        if shadow is not None
        else np.nan,
        "canary_share": np.histogram(r.arrival[r.version == 1], bins=edges)[0] / np.maximum(offered, 1)
        if scenario.router.canary is not None
        else np.nan,
    }
    return pd.DataFrame({name: cols[name] for name in COLUMNS})


def _outcomes(r: Records, edges: np.ndarray, dt_s: float) -> dict[str, np.ndarray]:
    """Arrivals and responses per second; drops and degraded responses per interval."""
    done = r.completed
    return {
        "offered_rps": np.histogram(r.arrival, bins=edges)[0] / dt_s,
        "completed_rps": np.histogram(r.t_response[done], bins=edges)[0] / dt_s,
        "rejected": np.histogram(r.arrival[r.outcome == Outcome.REJECTED], bins=edges)[0],
        "timed_out": np.histogram(r.arrival[r.outcome == Outcome.TIMED_OUT], bins=edges)[0],
        "failed": np.histogram(r.arrival[r.outcome == Outcome.FAILED], bins=edges)[0],
        "degraded": np.histogram(r.arrival[done & r.degraded], bins=edges)[0],
    }


def _workers(fleet: FleetLog | None, workers: int, edges: np.ndarray) -> dict[str, np.ndarray]:
    """Time-averages of the workers serving, starting and draining."""
    if fleet is None:
        active, warming, draining = (np.full(len(edges) - 1, float(v)) for v in (workers, 0, 0))
    else:
        active, warming, draining = (
            time_average_level(*fleet.intervals(k), edges)
            for k in (WorkerState.ACTIVE, WorkerState.WARMING, WorkerState.DRAINING)
        )
    return {"active_workers": active, "warming_workers": warming, "draining_workers": draining}


def _levels(r: Records, edges: np.ndarray, logging: PredictionLog | None) -> dict[str, np.ndarray]:
    """Time-averages of the requests waiting in batch queues (from reaching the queue until
    dispatch or drop) and in the system, and of the prediction log's backlog."""
    done = r.completed
    left_queue = np.where(done, r.t_dispatch, r.t_dropped)
    shipped = np.isfinite(r.t_logged)
    emitted = np.where(done, r.t_response, r.t_dropped)
    return {
        "queue_depth": time_average_level(r.t_preprocessed, left_queue, edges),
        "in_flight": time_average_level(r.arrival[done], r.t_response[done], edges),
        "log_backlog_mb": time_average_level(emitted[shipped], r.t_logged[shipped], edges) * logging.record_kb / 1e3
        if logging
        else np.full(len(edges) - 1, np.nan),
    }


def _mean_batch(batches: BatchLog, edges: np.ndarray) -> np.ndarray:
    """Mean size of the batches started in each interval (NaN where none started)."""
    n_batches = np.histogram(batches.start, bins=edges)[0]
    batch_items = np.histogram(batches.start, bins=edges, weights=batches.size)[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        return batch_items / n_batches


def _hit_ratios(r: Records, edges: np.ndarray, caches: Caches) -> dict[str, np.ndarray | float]:
    """Result-cache hits per lookup (every arrival looks up), feature-cache hits per lookup
    (every result-cache miss looks up); NaN where the scenario has no such cache."""
    lookups = np.histogram(r.arrival, bins=edges)[0]
    result_hits = np.histogram(r.arrival[r.result_hit], bins=edges)[0]
    feature_lookups = np.histogram(r.arrival[~r.result_hit], bins=edges)[0]
    feature_hits = np.histogram(r.arrival[r.feature_hit], bins=edges)[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "result_hit_ratio": result_hits / lookups if caches.result else np.nan,
            "feature_hit_ratio": feature_hits / feature_lookups if caches.feature else np.nan,
        }
