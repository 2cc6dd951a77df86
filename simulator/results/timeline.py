"""The timeline: per-interval metrics of a run, as a tidy table, one row per interval.

Its columns are declared here (:data:`COLUMNS`); the summary builder
(:class:`simulator.results.reduce.Reduction`) fills them. Offered load and drops are
binned by arrival time, completions and their latency percentiles by response time,
batches by start time. Time-averaged levels (requests waiting in batch queues, in
flight, workers in each state) are exact integrals of the step functions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.serving.lives import FleetLog, WorkerState


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
    # prefill and decode apart, under their autoscalers; left out of the rows of other runs
    "prefill_workers": Column("workers", "time-average of prefill replicas serving", fleet_wide=True),
    "decode_workers": Column("workers", "time-average of decode replicas serving", fleet_wide=True),
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
    # LLM replicas (batching.kind continuous); left out of the rows of other runs
    "running": Column(
        "sequences", "time-average of sequences in LLM replicas' steps (first step to last token)", fleet_wide=True
    ),
    "kv_usage": Column("ratio", "time-average share of the LLM replicas' KV blocks in use"),
    "output_tokens_per_s": Column("tokens/s", "output tokens of the responses", fleet_wide=True),
}
LLM_COLUMNS = ("running", "kv_usage", "output_tokens_per_s")
POOL_COLUMNS = ("prefill_workers", "decode_workers")

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


def _workers(fleet: FleetLog | None, workers: int, edges: np.ndarray) -> dict[str, np.ndarray]:
    """Time-averages of the workers serving, starting and draining; and of each pool's
    serving, where prefill and decode are apart (:data:`POOL_COLUMNS`)."""
    if fleet is None:
        active, warming, draining = (np.full(len(edges) - 1, float(v)) for v in (workers, 0, 0))
        return {"active_workers": active, "warming_workers": warming, "draining_workers": draining}
    active, warming, draining = (
        time_average_level(*fleet.intervals(k), edges)
        for k in (WorkerState.ACTIVE, WorkerState.WARMING, WorkerState.DRAINING)
    )
    out = {"active_workers": active, "warming_workers": warming, "draining_workers": draining}
    pool = np.array([w.pool for w in fleet.workers])
    if (pool != "").any():
        a0, a1 = fleet.intervals(WorkerState.ACTIVE)
        for name in ("prefill", "decode"):
            out[f"{name}_workers"] = time_average_level(a0[pool == name], a1[pool == name], edges)
    return out
