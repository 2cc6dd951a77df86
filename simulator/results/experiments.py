"""The summary sections of experiments: the canary's and the shadow's traffic, latency and
cost (:class:`Versions`), and each traffic class's (:class:`Classes`), both read piece by
piece."""

from __future__ import annotations

import numpy as np

from simulator.ledger import BatchLog, Outcome
from simulator.results.records import Records
from simulator.results.stats import PERCENTILES, overlap
from simulator.scenario.config import Scenario
from simulator.serving.workers import mean_service_ms


class Versions:
    """The canary's and the shadow's sections, accumulated piece by piece: per-version
    traffic share, latency and errors; the shadow's load, latency, cost and the primary
    p99 it costs when it shares the primary's queues. ``sample`` keeps each latency
    (:class:`~simulator.results.stats.ExactSample` or a sketch)."""

    def __init__(self, s: Scenario, sample: type):
        self.s, r = s, s.router
        self.t0, self.t1 = s.warmup_s * 1000.0, s.duration_s * 1000.0
        self.codes = [(0, "primary", None)] + ([(1, r.canary.name, r.canary)] if r.canary is not None else [])
        self.requests = [0] * len(self.codes)
        self.errors = [0] * len(self.codes)
        self.latency = [sample() for _ in self.codes]
        self.arrived = 0
        self.items = 0  # the primary pool's batch items, the whole run's
        self.copies = self.copies_in = self.copies_dropped = 0
        self.served = sample()  # a copy's time in the shadow's pool, batching to done
        impact = r.shadow is not None and r.shadow.pool == "shared" and r.shadow.measure_impact
        self.with_shadow, self.without_shadow = (sample(), sample()) if impact else (None, None)

    def add(self, rec: Records, mask: np.ndarray, batches: BatchLog, shadow: dict | None, alone: np.ndarray | None):
        """One piece: its records (``mask``: in the window), the primary's batches, the
        shadow copies settled and the records' responses without the copies."""
        self.arrived += int(np.count_nonzero(mask))
        self.items += int(batches.size.sum())
        e2e = rec.t_response - rec.arrival
        done = mask & rec.completed
        for i, (code, _, _) in enumerate(self.codes):
            sel = mask & (rec.version == code)
            self.requests[i] += int(np.count_nonzero(sel))
            self.errors[i] += int(np.count_nonzero(rec.outcome[sel] == Outcome.ERROR))
            self.latency[i].add(e2e[sel & rec.completed])
        if shadow is not None:
            inside = (shadow["arrival"] >= self.t0) & (shadow["arrival"] < self.t1)
            ok = inside & (shadow["outcome"] == Outcome.COMPLETED)
            self.copies += len(inside)
            self.copies_in += int(np.count_nonzero(inside))
            self.copies_dropped += int(np.count_nonzero(inside & ~ok))
            self.served.add((shadow["t_inferred"] - shadow["t_preprocessed"])[ok])
        if self.with_shadow is not None and alone is not None:
            prim = done & (rec.version == 0)
            self.with_shadow.add(e2e[prim])
            without = (alone - rec.arrival)[prim]
            self.without_shadow.add(without[np.isfinite(without)])

    def seal(self) -> None:
        """No piece follows: exact samples summarize and let their values go."""
        for sample in (*self.latency, self.served, self.with_shadow, self.without_shadow):
            if sample is not None and hasattr(sample, "seal"):
                sample.seal()

    def summary(self, price: float, billed_workers: float) -> dict:
        s, r = self.s, self.s.router
        out: dict = {"versions": {}}
        for i, (_, name, cfg) in enumerate(self.codes):
            out["versions"][name] = {
                "requests": self.requests[i],
                "share": float(self.requests[i] / max(self.arrived, 1)),
                "errors": self.errors[i],
                "latency_ms": self.latency[i].summary(PERCENTILES),
                "workers": cfg.workers if cfg else s.workers.count,
            }
        if r.shadow is not None:
            span_s = s.duration_s - s.warmup_s
            if r.shadow.pool == "own":
                gpu_cost = r.shadow.workers * price
            else:  # its share of the primary pool's batch items
                gpu_cost = (self.copies / self.items if self.items else 0.0) * billed_workers * price
            shadow = {
                "copies": self.copies_in,
                "copies_per_s": float(self.copies_in / span_s),
                "dropped": self.copies_dropped,
                "server_latency_ms": self.served.summary(PERCENTILES),
                "gpu_cost_per_hour_usd": gpu_cost,
                "pool": r.shadow.pool,
            }
            if self.with_shadow is not None:
                with_p99 = self.with_shadow.percentile(99.0) if self.with_shadow.count else float("nan")
                without_p99 = self.without_shadow.percentile(99.0) if self.without_shadow.count else float("nan")
                shadow["primary_p99_ms"] = {
                    "with_shadow": with_p99,
                    "without_shadow": without_p99,
                    "added": with_p99 - without_p99,
                }
            out["shadow"] = shadow
        return out


class Classes:
    """Each traffic class's section, accumulated piece by piece: outcomes, latency, its
    own SLA verdict, and its share of the GPUs. ``sample`` keeps each latency
    (:class:`~simulator.results.stats.ExactSample` or a sketch).

    ``gpu_share`` is the class's busy instance-time over its pool's instance-time in the
    window; a class on the shared pool is charged its share of the shared pool's busy time.
    """

    def __init__(self, s: Scenario, sample: type):
        self.s = s
        self.t0, self.t1 = s.warmup_s * 1000.0, s.duration_s * 1000.0
        self.names = list(s.traffic.classes)
        k = len(self.names)
        self.requests, self.completed, self.rejected, self.timed_out, self.dropped, self.within, self.items = (
            [0] * k for _ in range(7)
        )
        self.latency = [sample() for _ in range(k)]
        self.queue = [sample() for _ in range(k)]
        self.busy = dict.fromkeys(self.names, 0.0)

    def _sla(self, code: int):
        return self.s.traffic.classes[self.names[code]].sla or self.s.sla

    def add(self, rec: Records, mask: np.ndarray, pools: dict[str, BatchLog]) -> None:
        """One piece: its records (``mask``: in the window) and each class's batches that
        started in it, by name."""
        for name, log in pools.items():
            self.busy[name] += float(overlap(log.start, log.end, self.t0, self.t1).sum())
        e2e_all = rec.t_response - rec.arrival
        queue = rec.stage_ms("queue")
        for code in range(len(self.names)):
            sel = mask & (rec.traffic_class == code)
            done = sel & rec.completed
            outcome = rec.outcome[sel]
            e2e = e2e_all[done]
            self.requests[code] += int(np.count_nonzero(sel))
            self.completed[code] += int(np.count_nonzero(done))
            self.rejected[code] += int(np.count_nonzero(outcome == Outcome.REJECTED))
            self.timed_out[code] += int(np.count_nonzero(outcome == Outcome.TIMED_OUT))
            self.dropped[code] += int(np.count_nonzero(outcome != Outcome.COMPLETED))
            self.within[code] += int(np.count_nonzero(e2e <= self._sla(code).target_ms))
            self.items[code] += int(rec.batch_size[done].sum())
            self.latency[code].add(e2e)
            self.queue[code].add(queue[done])

    def seal(self) -> None:
        """No piece follows: exact samples summarize and let their values go."""
        for code in range(len(self.names)):
            for sample, extra in ((self.latency[code], (self._sla(code).percentile,)), (self.queue[code], ())):
                if hasattr(sample, "seal"):
                    sample.seal(extra)

    def summary(self, price: float) -> dict:
        s = self.s
        span_s = (self.t1 - self.t0) / 1000.0
        inst = s.workers.instances
        shared_busy = sum(self.busy[n] for n, c in s.traffic.classes.items() if c.workers is None)
        out = {}
        for code, (name, cfg) in enumerate(s.traffic.classes.items()):
            done, latency = self.completed[code], self.latency[code]
            sla = self._sla(code)
            own = cfg.workers is not None
            workers = cfg.workers if own else s.workers.count
            if own:
                cost_h = workers * price
            else:
                cost_h = s.workers.count * price * (self.busy[name] / shared_busy if shared_busy else 0.0)
            b = s.batching.max_batch_size
            w = s.workers.model_copy(update={"service_time": cfg.service_time or s.workers.service_time})
            peak = workers * inst * b / mean_service_ms(w, b) * 1000.0
            attained = latency.percentile(sla.percentile) if done else float("nan")
            total = done + (self.dropped[code] if sla.count_dropped else 0)
            attainment = self.within[code] / total if total else float("nan")
            out[name] = {
                "priority": cfg.priority,
                "pool": "own" if own else "shared",
                "workers": workers,
                "max_instances": cfg.max_instances,
                "requests": self.requests[code],
                "completed": done,
                "rejected": self.rejected[code],
                "timed_out": self.timed_out[code],
                "throughput_rps": float(done / span_s),
                "latency_ms": latency.summary(PERCENTILES),
                "queue_ms": self.queue[code].summary(PERCENTILES),
                "mean_batch_size": self.items[code] / done if done else float("nan"),
                "sla": {
                    "percentile": sla.percentile,
                    "target_ms": sla.target_ms,
                    "attained_ms": attained,
                    "met": bool(done) and attained <= sla.target_ms and attainment >= sla.percentile / 100,
                    "attainment": attainment,
                },
                "gpu_share": self.busy[name] / (workers * inst * (self.t1 - self.t0)),
                "load_of_peak_capacity": float(done / span_s / peak),
                "cost_per_hour_usd": cost_h,
            }
        return out
