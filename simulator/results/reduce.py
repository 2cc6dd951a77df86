"""A streamed run's summary, reduced piece by piece: the records are read once and dropped.

:class:`Reduction` takes the pieces of :func:`simulator.streaming.stream` and keeps only
what the summary needs: counters, one :class:`~simulator.results.sketch.LatencySketch`
per stage, per-instance busy time, batch-size counts, and the timeline's per-interval
sums. Its :meth:`Reduction.summary` has the shape of
:func:`simulator.results.metrics.summarize`'s, with the same counts, the percentiles
within the sketch's 0.5%, and the same timeline: the timeline's windowed p50 and p99 are
exact, because an interval is closed only once the engine's watermark has passed it
(every later record responds after the watermark), and its rows are then computed from
the interval's own responses.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np

from simulator.ledger import DROPS, BatchLog
from simulator.results import summary
from simulator.results.metrics import _cost, fleet_summary, logging_figures, peak_throughput_rps
from simulator.results.records import STAGES, Records
from simulator.results.sketch import LatencySketch
from simulator.results.stats import PERCENTILES
from simulator.results.timeline import COLUMNS, _workers
from simulator.scenario.config import Scenario
from simulator.scenario.loader import scenario_hash
from simulator.serving.fleet import FleetLog


class _Bins:
    """Per-interval sums over ``[k w, (k + 1) w)`` ms, growing as later times come."""

    def __init__(self, width_ms: float):
        self.w = width_ms
        self.edges = np.arange(0.0, 2 * width_ms, width_ms)
        self.sums: dict[str, np.ndarray] = {}
        self.levels: set[str] = set()

    def _grow(self, upto: float) -> None:
        """Edges past ``upto``: ``k w`` as ``np.arange`` computes them for the whole run."""
        if upto >= self.edges[-1]:
            n = max(int(upto // self.w) + 2, 2 * (len(self.edges) - 1))
            self.edges = np.arange(0.0, (n + 0.5) * self.w, self.w)

    def index(self, t: np.ndarray) -> np.ndarray:
        """The interval of each time (as ``np.histogram`` over the run's edges bins it)."""
        if len(t):
            self._grow(float(t.max()))
        return np.searchsorted(self.edges, t, side="right") - 1

    def add(self, name: str, t: np.ndarray, weights: np.ndarray | None = None) -> None:
        if not len(t):
            self.sums.setdefault(name, np.zeros(0))
            return
        k = self.index(t)
        counts = np.bincount(k, weights=weights)
        self._accumulate(name, 0, counts)

    def _accumulate(self, name: str, first: int, values: np.ndarray) -> None:
        cur = self.sums.get(name, np.zeros(0))
        need = first + len(values)
        if len(cur) < need:
            cur = np.concatenate([cur, np.zeros(need - len(cur))])
        cur[first:need] += values
        self.sums[name] = cur

    def add_level(self, name: str, starts: np.ndarray, ends: np.ndarray) -> None:
        """Add to the level N(t) = #{i: starts_i ≤ t < ends_i}, whose integral over each
        interval ``timeline.time_average_level`` divides by the width.

        Without sorting: a start at p in interval j adds (edge_{j+1} − p) there and the
        whole width to every later interval (an end subtracts the same), so each interval
        keeps a partial sum and a signed count, and :meth:`column` adds the width times the
        count of the intervals before it."""
        keep = np.isfinite(starts) & np.isfinite(ends)
        for points, sign in ((starts[keep], 1.0), (ends[keep], -1.0)):
            if not len(points):
                continue
            k = self.index(points)
            self._accumulate(name + ":partial", 0, sign * np.bincount(k, weights=self.edges[k + 1] - points))
            self._accumulate(name + ":count", 0, sign * np.bincount(k).astype(float))
        self.levels.add(name)

    def column(self, name: str, n: int) -> np.ndarray:
        if name in self.levels:
            counts = np.cumsum(self.column(name + ":count", n))
            return self.column(name + ":partial", n) + self.w * np.concatenate([[0.0], counts[:-1]])
        cur = self.sums.get(name, np.zeros(0))[:n]
        return np.concatenate([cur, np.zeros(n - len(cur))])


class Reduction:
    """What a streamed run's summary needs, accumulated from its pieces."""

    def __init__(self, scenario: Scenario, seed: int, *, interval_s: float = 1.0):
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        s = scenario
        self.s, self.seed = s, seed
        self.t0, self.t1 = s.warmup_s * 1000.0, s.duration_s * 1000.0
        self.counts = dict.fromkeys(("arrived", "completed", "degraded", *DROPS), 0)
        self.stages = {name: LatencySketch() for name, _, _ in STAGES}
        self.e2e = LatencySketch()
        self.within = 0  # completed in the window within the SLA target
        self.busy = np.zeros(s.workers.count * s.workers.instances)  # per instance; grows with a dynamic fleet
        self.fleet_log: FleetLog | None = None
        self.sizes = np.zeros(s.batching.max_batch_size + 1, dtype=np.int64)
        self.lag = LatencySketch()
        self.logged = 0
        self.behind = 0
        self.simulated = 0
        self.last_response = 0.0
        self.interval_ms = interval_s * 1000.0
        self.bins = _Bins(self.interval_ms)
        self._open: list[tuple[np.ndarray, np.ndarray]] = []  # (t_response, e2e) of intervals not closed
        self._closed: dict[int, tuple[float, float]] = {}  # interval -> (p50, p99)

    def add(self, records: Records, batches: BatchLog, watermark_ms: float) -> None:
        """Take one piece: its records (all settled), the batches that started, and the
        time before which no later record responds."""
        r = records
        self.simulated += len(r)
        mask = (r.arrival >= self.t0) & (r.arrival < self.t1)
        done_all = r.completed
        done = mask & done_all
        e2e_all = r.t_response - r.arrival
        outcome = r.outcome[mask]
        c = self.counts
        c["arrived"] += int(np.count_nonzero(mask))
        c["completed"] += int(np.count_nonzero(done))
        c["degraded"] += int(np.count_nonzero(r.degraded[done]))
        for name, code in DROPS.items():
            c[name] += int(np.count_nonzero(outcome == code))
        for name, sketch in self.stages.items():
            sketch.add(r.stage_ms(name)[done])
        e2e = e2e_all[done]
        self.e2e.add(e2e)
        self.within += int(np.count_nonzero(e2e <= self.s.sla.target_ms))
        self._batches(batches)
        if self.s.logging:
            self._logging(r, mask, done_all)
        if done_all.any():
            self.last_response = max(self.last_response, float(np.nanmax(r.t_response[done_all])))
        self._timeline(r, done_all, e2e_all, watermark_ms)

    def _batches(self, b: BatchLog) -> None:
        busy = np.clip(np.minimum(b.end, self.t1) - np.maximum(b.start, self.t0), 0.0, None)
        add = np.bincount(b.instance, weights=busy, minlength=len(self.busy))
        if len(add) > len(self.busy):  # a dynamic fleet's new workers
            self.busy = np.concatenate([self.busy, np.zeros(len(add) - len(self.busy))])
        self.busy += add
        inside = (b.start >= self.t0) & (b.start < self.t1)
        self.sizes += np.bincount(b.size[inside], minlength=len(self.sizes))[: len(self.sizes)]
        self.bins.add("batches", b.start)
        self.bins.add("batch_items", b.start, b.size.astype(float))

    def _logging(self, r: Records, mask: np.ndarray, done: np.ndarray) -> None:
        emitted = np.where(np.isnan(r.t_response), r.t_dropped, r.t_response)
        sel = mask & np.isfinite(r.t_logged)
        self.logged += int(np.count_nonzero(sel))
        self.lag.add((r.t_logged - emitted)[sel])
        self.behind += int(np.count_nonzero((emitted <= self.t1) & (r.t_logged > self.t1)))
        shipped = np.isfinite(r.t_logged)
        emitted_tl = np.where(done, r.t_response, r.t_dropped)
        self.bins.add_level("log_backlog", emitted_tl[shipped], r.t_logged[shipped])

    def _timeline(self, r: Records, done: np.ndarray, e2e: np.ndarray, watermark_ms: float) -> None:
        b = self.bins
        b.add("offered", r.arrival)
        b.add("completed", r.t_response[done])
        for name in ("rejected", "timed_out", "failed"):
            b.add(name, r.arrival[r.outcome == DROPS[name]])
        b.add("degraded", r.arrival[done & r.degraded])
        left_queue = np.where(done, r.t_dispatch, r.t_dropped)
        b.add_level("queue_depth", r.t_preprocessed, left_queue)
        b.add_level("in_flight", r.arrival[done], r.t_response[done])
        self._open.append((r.t_response[done], e2e[done]))
        self._close(watermark_ms)

    def _close(self, watermark_ms: float) -> None:
        """Percentiles of the intervals that end at or before the watermark."""
        t = np.concatenate([p[0] for p in self._open])
        x = np.concatenate([p[1] for p in self._open])
        k = self.bins.index(t)
        closed = self.bins.edges[k + 1] <= watermark_ms
        kc, xc = k[closed], x[closed]
        order = np.argsort(kc, kind="stable")
        kc, xc = kc[order], xc[order]
        bounds = [*np.flatnonzero(np.r_[True, kc[1:] != kc[:-1]]).tolist(), len(kc)] if len(kc) else [0]
        for lo, hi in itertools.pairwise(bounds):
            self._closed[int(kc[lo])] = tuple(np.percentile(xc[lo:hi], [50.0, 99.0]))
        self._open = [(t[~closed], x[~closed])]

    def summary(self, wall_s: float, fleet: FleetLog | None = None) -> summary.Summary:
        """The run's summary, shaped as :func:`simulator.results.metrics.summarize`'s;
        ``fleet``: a dynamic pool's log (the last piece's)."""
        s = self.s
        self.fleet_log = fleet
        span_s = (self.t1 - self.t0) / 1000.0
        c = self.counts
        n_dropped = sum(c[k] for k in DROPS)
        requests: summary.Requests = {
            "arrived": c["arrived"],
            "completed": c["completed"],
            **{k: c[k] for k in DROPS},
            "degraded": c["degraded"],
            "throughput_rps": c["completed"] / span_s,
            "window_s": span_s,
        }
        n = s.workers.count
        fleet = fleet_summary(SimpleNamespace(scenario=s, fleet=self.fleet_log), self.t0, self.t1)
        n_workers = len(self.fleet_log.workers) if self.fleet_log else n
        busy = np.zeros(n_workers * s.workers.instances)
        busy[: len(self.busy)] = self.busy
        busy = (busy / (self.t1 - self.t0)).reshape(n_workers, s.workers.instances).mean(axis=1)
        per_worker = busy / np.maximum(fleet["active_fraction"], 1e-12)
        active = fleet.pop("active_fraction")
        sizes = {int(k): int(v) for k, v in enumerate(self.sizes) if v}
        n_batches = sum(sizes.values())
        items = sum(k * v for k, v in sizes.items())
        total = self.e2e.count + (n_dropped if s.sla.count_dropped else 0)
        attained = self.e2e.quantile(s.sla.percentile / 100.0)
        attainment = self.within / total if total else float("nan")
        return {
            "scenario": {"name": s.name, "hash": scenario_hash(s)},
            "requests": requests,
            "latency_ms": {
                "e2e": self.e2e.summary(PERCENTILES),
                "stages": {name: sk.summary(PERCENTILES) for name, sk in self.stages.items()},
            },
            "sla": {
                "percentile": s.sla.percentile,
                "target_ms": s.sla.target_ms,
                "attained_ms": attained,
                "met": bool(self.e2e.count and attained <= s.sla.target_ms and attainment >= s.sla.percentile / 100),
                "attainment": attainment,
            },
            "utilization": {
                "workers": float(busy.sum() / max(active.sum(), 1e-12)),
                "per_worker": per_worker.tolist(),
                "of_peak_capacity": items / span_s / peak_throughput_rps(s),
            },
            "batch_size": {"mean": items / n_batches if n_batches else float("nan"), "counts": sizes},
            "fleet": fleet,
            "workers": {"count": n, "instances": s.workers.instances, "instance_type": s.workers.instance_type},
            "cost": _cost(s, fleet, None, c["completed"] / span_s),
            "logging": self._logging_summary(),
            "experiments": None,
            "classes": None,
            "caches": {},
            "timeline": self.timeline(),
            "sim": {
                "wall_s": wall_s,
                "requests": self.simulated,
                "requests_per_wall_s": self.simulated / wall_s if wall_s > 0 else float("inf"),
                "seed": self.seed,
            },
        }

    def _logging_summary(self) -> dict | None:
        if self.s.logging is None:
            return None
        return logging_figures(self.s, self.logged, self.lag.summary(PERCENTILES), self.behind)

    def timeline(self) -> list[dict[str, float]]:
        """The timeline's rows, as ``timeline.timeline`` gives them."""
        self._close(np.inf)
        s, w = self.s, self.interval_ms
        end_ms = max(s.duration_s * 1000.0, self.last_response)
        n = len(np.arange(0.0, end_ms + w, w)) - 1
        col = self.bins.column
        dt = w / 1000.0
        p = np.full((n, 2), np.nan)
        for k, v in self._closed.items():
            if k < n:
                p[k] = v
        with np.errstate(invalid="ignore", divide="ignore"):
            cols = {
                "t_s": np.arange(n) * w / 1000.0,
                "offered_rps": col("offered", n) / dt,
                "completed_rps": col("completed", n) / dt,
                "rejected": col("rejected", n),
                "timed_out": col("timed_out", n),
                "failed": col("failed", n),
                "degraded": col("degraded", n),
                **_workers(self.fleet_log, s.workers.count, np.arange(0.0, end_ms + w, w)[: n + 1]),
                "queue_depth": col("queue_depth", n) / w,
                "in_flight": col("in_flight", n) / w,
                "mean_batch_size": col("batch_items", n) / col("batches", n),
                "p50_ms": p[:, 0],
                "p99_ms": p[:, 1],
                "log_backlog_mb": col("log_backlog", n) / w * s.logging.record_kb / 1e3
                if s.logging
                else np.full(n, np.nan),
                "result_hit_ratio": np.full(n, np.nan),
                "feature_hit_ratio": np.full(n, np.nan),
                "shadow_rps": np.full(n, np.nan),
                "canary_share": np.full(n, np.nan),
            }
        rows = np.column_stack([np.asarray(cols[name], dtype=float) for name in COLUMNS])
        return [dict(zip(COLUMNS, map(float, row), strict=True)) for row in rows]
