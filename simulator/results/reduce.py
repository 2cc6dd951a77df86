"""The summary of a run, built once: :class:`Reduction` reads a run's records piece by
piece and keeps only what the summary needs, and :func:`summarize` is a run held whole
read as one piece.

What it keeps: counters, the percentiles of each stage (an
:class:`~simulator.results.stats.ExactSample` for a run held whole, a
:class:`~simulator.results.sketch.LatencySketch` within 0.5% for a streamed one),
per-instance busy time, batch-size counts, cache lookups, and the timeline's
per-interval sums. The timeline's windowed p50 and p99 are exact either way, because an
interval is closed only once the engine's watermark has passed it (every later record
responds after the watermark), and its rows are then computed from the interval's own
responses. The traffic classes' and the versions' sections are read piece by piece too
(:mod:`simulator.results.experiments`).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np

from simulator.ledger import DROPS, BatchLog
from simulator.results import summary
from simulator.results.experiments import Classes, Versions
from simulator.results.intervals import Intervals
from simulator.results.metrics import _cost, fleet_summary, logging_figures, peak_throughput_rps, worker_price
from simulator.results.records import STAGES, Records
from simulator.results.sketch import LatencySketch
from simulator.results.stats import PERCENTILES, ExactSample, overlap
from simulator.results.timeline import COLUMNS
from simulator.results.tokens import Tokens
from simulator.scenario.config import Scenario
from simulator.scenario.loader import scenario_hash
from simulator.serving.lives import FleetLog

if TYPE_CHECKING:
    import pandas as pd

    from simulator.results.run import Run


class Reduction:
    """What a run's summary needs, accumulated from its pieces.

    Parameters
    ----------
    scenario : Scenario
        The scenario simulated.
    seed : int
        The seed it ran with.
    interval_s : float or None
        Width of the timeline's intervals, s; None keeps no timeline.
    exact : bool
        Keep every latency (exact percentiles, for a run held whole) rather than a sketch.
    """

    def __init__(self, scenario: Scenario, seed: int, *, interval_s: float | None = 1.0, exact: bool = False):
        if interval_s is not None and interval_s <= 0:
            raise ValueError("interval_s must be positive")
        s = scenario
        self.s, self.seed = s, seed
        self.t0, self.t1 = s.warmup_s * 1000.0, s.duration_s * 1000.0
        self.counts = dict.fromkeys(("arrived", "completed", "degraded", *DROPS), 0)
        self.exact = exact
        sample = ExactSample if exact else LatencySketch
        self.stages = {name: sample() for name, _, _ in STAGES}
        self.e2e = sample()
        self.within = 0  # completed in the window within the SLA target
        self.busy = np.zeros(s.workers.count * s.workers.instances)  # per instance; grows with a dynamic fleet
        self.fleet_log: FleetLog | None = None
        self.sizes = np.zeros(s.batching.max_batch_size + 1, dtype=np.int64)
        self.lookups = dict.fromkeys(("result", "result_hits", "feature", "feature_hits"), 0)
        self.lag = sample()
        self.logged = 0
        self.behind = 0
        self.simulated = 0
        self.last_response = 0.0
        self.intervals = None if interval_s is None else Intervals(s, interval_s)
        self.bins = None if self.intervals is None else self.intervals.bins
        r = s.router
        self.versions = Versions(s, sample) if r.canary is not None or r.shadow is not None else None
        self.classes = Classes(s, sample) if s.traffic.classes else None
        self.tokens = Tokens(s, sample) if s.traffic.tokens is not None else None

    def add(
        self,
        records: Records,
        batches: BatchLog,
        watermark_ms: float,
        *,
        last: bool = False,
        shadow: dict[str, np.ndarray] | None = None,
        alone: np.ndarray | None = None,
        pools: dict[str, BatchLog] | None = None,
    ) -> None:
        """Take one piece: its records (all settled), the batches that started, and the
        time before which no later record responds; the shadow copies it settled, the
        records' responses without them (``measure_impact``), and the other pools' batches
        that started (each traffic class's, by name). ``last``: no piece
        follows (an exact reduction then summarizes each stage's latencies at once and
        lets them go)."""
        r = records
        self.simulated += len(r)
        mask = (r.arrival >= self.t0) & (r.arrival < self.t1)
        done_all = r.completed
        done = mask & done_all
        outcome = r.outcome[mask]
        c = self.counts
        c["arrived"] += int(np.count_nonzero(mask))
        c["completed"] += int(np.count_nonzero(done))
        c["degraded"] += int(np.count_nonzero(r.degraded[done]))
        for name, code in DROPS.items():
            c[name] += int(np.count_nonzero(outcome == code))
        seal = last and self.exact
        n_done = int(np.count_nonzero(done))
        # the window's completed requests: a run of rows when they are (requests in arrival
        # order, none dropped), read through views instead of copied out by the mask
        first = int(np.argmax(done)) if n_done else 0
        rows = slice(first, first + n_done) if done[first : first + n_done].all() else done
        for (_, begin, end), sample in zip(STAGES, self.stages.values(), strict=True):
            a, b = getattr(r, begin), getattr(r, end)
            # a stage the scenario leaves out passes its input on (the same column): 0 ms
            if a is b:
                sample.add(np.broadcast_to(0.0, (n_done,)))
            else:
                sample.add(b[rows] - a[rows] if isinstance(rows, slice) else (b - a)[done], give=True)
            if seal:
                sample.seal()
        e2e = r.t_response[rows] - r.arrival[rows] if isinstance(rows, slice) else (r.t_response - r.arrival)[done]
        self.e2e.add(e2e, give=True)  # e2e is only counted after this
        if seal:
            self.e2e.seal((self.s.sla.percentile,))
        self.within += int(np.count_nonzero(e2e <= self.s.sla.target_ms))
        self._batches(batches)
        if self.versions is not None:
            self.versions.add(r, mask, batches, shadow, alone)
            if seal:
                self.versions.seal()
        if self.classes is not None:
            self.classes.add(r, mask, pools or {})
            if seal:
                self.classes.seal()
        if self.tokens is not None:
            self.tokens.add(r, done)
            if seal:
                self.tokens.seal()
        self._caches(r, mask)
        if self.s.logging:
            self._logging(r, mask, done_all, last)
        if done_all.any():
            self.last_response = max(self.last_response, float(np.nanmax(r.t_response[done_all])))
        if self.intervals is not None:
            self.intervals.add(r, done_all, watermark_ms, batches)
            if shadow is not None:
                self.bins.add("shadow", shadow["t_preprocessed"][np.isfinite(shadow["t_preprocessed"])])

    def _batches(self, b: BatchLog) -> None:
        """Busy time per instance and batch sizes in the window (the timeline counts the
        batches by interval: :class:`~simulator.results.intervals.Intervals`)."""
        inside_ms = overlap(b.start, b.end, self.t0, self.t1)
        if b.prefill_share is not None and self.tokens is not None:  # an LLM's steps: the prompts' share
            self.tokens.add_steps(inside_ms, b.prefill_share)
        if b.gaps is not None and self.tokens is not None:  # the gaps between tokens made in the window
            g = b.gaps
            inside = (g.end >= self.t0) & (g.end < self.t1)
            self.tokens.add_gaps(g.ms[inside], g.tokens[inside])
        add = np.bincount(b.instance, weights=inside_ms, minlength=len(self.busy))
        if len(add) > len(self.busy):  # a dynamic fleet's new workers
            self.busy = np.concatenate([self.busy, np.zeros(len(add) - len(self.busy))])
        self.busy += add
        inside = (b.start >= self.t0) & (b.start < self.t1)
        self.sizes += np.bincount(b.size[inside], minlength=len(self.sizes))[: len(self.sizes)]
        if self.bins is not None and b.kv_usage is not None:  # an LLM step's KV use over its time, by its start
            self.bins.add("kv_area", b.start, b.kv_usage * (b.end - b.start))

    def _caches(self, r: Records, mask: np.ndarray) -> None:
        """Lookups in the window: every arrival looks up the result cache, every
        result-cache miss the feature cache."""
        caches, n = self.s.caches, self.lookups
        if caches.result is not None:
            n["result"] += int(np.count_nonzero(mask))
            n["result_hits"] += int(np.count_nonzero(r.result_hit[mask]))
        if caches.feature is not None:
            looked = mask & ~r.result_hit
            n["feature"] += int(np.count_nonzero(looked))
            n["feature_hits"] += int(np.count_nonzero(r.feature_hit[looked]))

    def _logging(self, r: Records, mask: np.ndarray, done: np.ndarray, last: bool) -> None:
        emitted = np.where(np.isnan(r.t_response), r.t_dropped, r.t_response)
        sel = mask & np.isfinite(r.t_logged)
        self.logged += int(np.count_nonzero(sel))
        self.lag.add((r.t_logged - emitted)[sel])
        if self.exact and last:
            self.lag.seal()
        self.behind += int(np.count_nonzero((emitted <= self.t1) & (r.t_logged > self.t1)))
        if self.bins is not None:
            shipped = np.isfinite(r.t_logged)
            emitted_tl = np.where(done, r.t_response, r.t_dropped)
            self.bins.add_level("log_backlog", emitted_tl[shipped], r.t_logged[shipped])

    def summary(self, wall_s: float, fleet: FleetLog | None = None) -> summary.Summary:
        """The run's summary (:class:`simulator.results.summary.Summary`); ``fleet``: a
        dynamic pool's log (the last piece's)."""
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
        attained = self.e2e.percentile(s.sla.percentile)
        attainment = self.within / total if total else float("nan")
        classes = experiments = None
        if self.classes is not None:
            classes = self.classes.summary(worker_price(s))
        if self.versions is not None:
            experiments = self.versions.summary(worker_price(s), fleet["billed_mean"])
        if classes:  # each model's load over its own peak, on the shared pool
            of_peak = sum(v["load_of_peak_capacity"] for v in classes.values() if v["pool"] == "shared")
        elif self.tokens is not None:  # an LLM replica has no fixed batch time to read a peak from
            of_peak = float("nan")
        else:
            of_peak = items / span_s / peak_throughput_rps(s)
        cost = _cost(s, fleet, experiments, c["completed"] / span_s)
        return {
            "scenario": {"name": s.name, "hash": scenario_hash(s)},
            "requests": requests,
            "latency_ms": {
                "e2e": self.e2e.summary(PERCENTILES),
                "stages": {name: sample.summary(PERCENTILES) for name, sample in self.stages.items()},
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
                "of_peak_capacity": of_peak,  # GPU-served requests over what full batches could serve
            },
            "batch_size": {"mean": items / n_batches if n_batches else float("nan"), "counts": sizes},
            "fleet": fleet,
            "workers": {
                "count": n,
                "instances": s.workers.instances,
                "instance_type": s.workers.instance_type,
                "mix": dict(s.workers.mix),
            },
            "cost": cost,
            "logging": self._logging_summary(),
            "experiments": experiments,
            "classes": classes,
            "caches": self._caches_summary(),
            "llm": None if self.tokens is None else self.tokens.summary(span_s, cost["per_hour_usd"], n_dropped),
            "timeline": [] if self.intervals is None else self.intervals.rows(self.fleet_log, self.last_response),
            "sim": {
                "wall_s": wall_s,
                "requests": self.simulated,
                "requests_per_wall_s": self.simulated / wall_s if wall_s > 0 else float("inf"),
                "seed": self.seed,
            },
        }

    def _caches_summary(self) -> dict[str, summary.CacheStats]:
        n = self.lookups
        return {
            name: {
                "hit_ratio": n[name + "_hits"] / n[name] if n[name] else float("nan"),
                "lookups": n[name],
            }
            for name, cfg in (("result", self.s.caches.result), ("feature", self.s.caches.feature))
            if cfg is not None
        }

    def _logging_summary(self) -> dict | None:
        if self.s.logging is None:
            return None
        return logging_figures(self.s, self.logged, self.lag.summary(PERCENTILES), self.behind)


def summarize(run: Run, *, interval_s: float | None = 1.0) -> summary.Summary:
    """Every headline number of a run held whole, as the nested dict that ``--json`` writes.

    Counted over the requests that arrived in ``[warmup_s, duration_s)``, each followed to
    its end (the tail after the last arrival is not cut off). The run is read as one
    piece by :class:`Reduction`, the builder of every summary, with exact percentiles.

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
        and ``timeline``, one record per ``interval_s`` (columns
        :data:`simulator.results.timeline.COLUMNS`). Pure: it reads no file.
    """
    red = Reduction(run.scenario, run.seed, interval_s=interval_s, exact=True)
    red.add(
        run.records,
        run.batches,
        np.inf,
        last=True,
        shadow=run.shadow,
        alone=run.response_without_shadow,
        pools=run.pools,
    )
    return red.summary(run.wall_s, run.fleet)


def timeline(run: Run, *, interval_s: float = 1.0) -> pd.DataFrame:
    """The timeline of a run held whole as a frame: one row per interval of
    ``interval_s`` over the run (the tail after the last arrival included); the columns
    are :data:`simulator.results.timeline.COLUMNS`, those of parts the scenario does not
    model NaN."""
    import pandas as pd

    return pd.DataFrame(summarize(run, interval_s=interval_s)["timeline"], columns=list(COLUMNS))
