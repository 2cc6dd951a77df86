"""The timeline of a run, accumulated piece by piece: :class:`Intervals` keeps per-interval
sums (:mod:`simulator.results.binning`) and each interval's responses until the engine's
watermark has passed it, then its exact p50 and p99, and gives the timeline's rows
(:data:`simulator.results.timeline.COLUMNS`) at the end. The summary builder
(:class:`simulator.results.reduce.Reduction`) holds one.
"""

from __future__ import annotations

import numpy as np

from simulator.ledger import BatchLog
from simulator.results.binning import (
    BATCH_ITEMS,
    BATCHES,
    COMPLETED,
    DEGRADED,
    FAILED,
    IN_FLIGHT,
    OFFERED,
    QUEUE,
    REJECTED,
    TIMED_OUT,
    Bins,
    group_sort,
    timeline_sums,
)
from simulator.results.records import Records
from simulator.results.stats import grouped_percentiles
from simulator.results.timeline import COLUMNS, LLM_COLUMNS, POOL_COLUMNS, _workers
from simulator.scenario.config import Scenario
from simulator.serving.lives import FleetLog


class Intervals:
    """The timeline's accumulator: intervals of ``interval_s`` over a run of ``scenario``."""

    def __init__(self, scenario: Scenario, interval_s: float):
        self.s = scenario
        self.interval_ms = interval_s * 1000.0
        self.bins = Bins(self.interval_ms)
        # responses not closed: (count per interval, their e2e grouped by interval, each group sorted)
        self._open: list[tuple[np.ndarray, np.ndarray]] = []
        self._closed: dict[int, tuple[float, float]] = {}  # interval -> (p50, p99)

    def add(self, r: Records, done: np.ndarray, watermark_ms: float, batches: BatchLog) -> None:
        """Take one piece: its records, which of them completed, the time before which no
        later record responds, and the batches that started."""
        b, s = self.bins, self.s
        times = (r.arrival, r.t_response, r.t_preprocessed, r.t_dispatch, r.t_dropped, batches.start)
        upto = max((float(np.fmax.reduce(t)) for t in times if len(t)), default=np.nan)
        if upto == upto:  # every finite time gets an interval (NaN: no time at all)
            b._grow(upto)
        needed = s.caches.result or s.caches.feature or s.router.canary or r.output_tokens is not None
        sums, ka, kr, e2e_grouped = timeline_sums(b.edges, b.w, r, done, batches, intervals=bool(needed))
        for name, row in (
            ("offered", OFFERED),
            ("rejected", REJECTED),
            ("timed_out", TIMED_OUT),
            ("failed", FAILED),
            ("degraded", DEGRADED),
            ("completed", COMPLETED),
            ("batches", BATCHES),
            ("batch_items", BATCH_ITEMS),
        ):
            b._accumulate(name, 0, sums[row])
        b.add_sums("queue_depth", sums[QUEUE : QUEUE + 4])
        b.add_sums("in_flight", sums[IN_FLIGHT : IN_FLIGHT + 4])
        if s.caches.result is not None:
            b.add_indexed("result_hits", ka[r.result_hit])
        if s.caches.feature is not None:
            b.add_indexed("feature_lookups", ka[~r.result_hit])
            b.add_indexed("feature_hits", ka[r.feature_hit])
        if s.router.canary is not None:
            b.add_indexed("canary", ka[r.version == 1])
        if r.output_tokens is not None:
            b.add_level("running", r.t_dispatch[done], r.t_inferred[done])
            b.add_indexed("output_tokens", kr, r.output_tokens[done].astype(float))
        self._open.append((sums[COMPLETED].astype(np.int64), e2e_grouped))
        self.close(watermark_ms)

    def close(self, watermark_ms: float) -> None:
        """Percentiles of the intervals that end at or before the watermark. The
        responses not closed yet are kept grouped by interval, each group sorted (as
        counts per interval and the values), so a run held whole closes without a sort."""
        if not self._open:
            return
        if len(self._open) > 1:  # a later piece's responses join the open intervals: regroup
            k = np.concatenate([np.repeat(np.arange(len(c)), c) for c, _ in self._open])
            self._open = [group_sort(k, np.concatenate([x for _, x in self._open]))]
        counts, xs = self._open[0]
        edges = self.bins.edges
        n_closed = min(len(counts), int(np.searchsorted(edges[1:], watermark_ms, side="right")))
        if n_closed:
            m = int(counts[:n_closed].sum())
            kc, values = grouped_percentiles(counts[:n_closed], xs[:m], (50.0, 99.0))
            self._closed.update(zip(kc.tolist(), map(tuple, values.tolist()), strict=True))
            rest = np.zeros_like(counts)
            rest[n_closed:] = counts[n_closed:]
            self._open = [(rest, xs[m:])]

    def rows(self, fleet_log: FleetLog | None, last_response_ms: float) -> list[dict[str, float]]:
        """The timeline's rows, one per interval (columns: :data:`timeline.COLUMNS`) up to the
        run's end or its last response (``last_response_ms``), whichever is later; a dynamic
        fleet's workers from ``fleet_log``."""
        self.close(np.inf)
        s, w = self.s, self.interval_ms
        end_ms = max(s.duration_s * 1000.0, last_response_ms)
        n = len(np.arange(0.0, end_ms + w, w)) - 1
        col = self.bins.column
        dt = w / 1000.0
        p = np.full((n, 2), np.nan)
        for k, v in self._closed.items():
            if k < n:
                p[k] = v
        shadow_rps = col("shadow", n) / dt if s.router.shadow is not None else np.full(n, np.nan)
        nan = np.full(n, np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            offered = col("offered", n)
            cols = {
                "t_s": np.arange(n) * w / 1000.0,
                "offered_rps": offered / dt,
                "completed_rps": col("completed", n) / dt,
                "rejected": col("rejected", n),
                "timed_out": col("timed_out", n),
                "failed": col("failed", n),
                "degraded": col("degraded", n),
                **_workers(fleet_log, s.workers.count, np.arange(0.0, end_ms + w, w)[: n + 1]),
                "queue_depth": col("queue_depth", n) / w,
                "in_flight": col("in_flight", n) / w,
                "mean_batch_size": col("batch_items", n) / col("batches", n),
                "p50_ms": p[:, 0],
                "p99_ms": p[:, 1],
                "log_backlog_mb": col("log_backlog", n) / w * s.logging.record_kb / 1e3 if s.logging else nan,
                "result_hit_ratio": col("result_hits", n) / offered if s.caches.result else nan,
                "feature_hit_ratio": col("feature_hits", n) / col("feature_lookups", n) if s.caches.feature else nan,
                "shadow_rps": shadow_rps,
                "canary_share": col("canary", n) / np.maximum(offered, 1) if s.router.canary is not None else nan,
            }
        names = [c for c in COLUMNS if c not in LLM_COLUMNS and (c not in POOL_COLUMNS or c in cols)]
        if s.traffic.tokens is not None:  # KV use over the replicas there (an autoscaler's: serving or draining)
            replicas = s.workers.count if fleet_log is None else cols["active_workers"] + cols["draining_workers"]
            cols |= {
                "running": col("running", n) / w,
                "kv_usage": col("kv_area", n) / (w * replicas),
                "output_tokens_per_s": col("output_tokens", n) / dt,
            }
            names = [c for c in COLUMNS if c not in POOL_COLUMNS or c in cols]
        rows = np.column_stack([np.asarray(cols[name], dtype=float) for name in names])
        return [dict(zip(names, map(float, row), strict=True)) for row in rows]
