"""``servesim calibrate watch --openai``: a live twin of a running vLLM (or any server that
exports vLLM's metrics: ``servesim serve-llm`` does).

Every interval the twin reads ``/metrics`` and works on the differences since the
interval before, pooled over a rolling window of intervals:

* **the rate**: ``vllm:request_success_total`` per second;
* **the lengths**: the ``vllm:request_prompt_tokens`` and ``vllm:request_generation_tokens``
  histograms, as an empirical sample of their buckets (each bucket's requests at a length
  inside it, scaled so that the mean is the histogram's exact ``_sum / _count``);
* **the KV block budget**: ``vllm:cache_config_info``'s ``num_gpu_blocks`` and
  ``block_size`` (and, where exported as servesim's engine does, ``max_num_seqs`` and
  ``max_num_batched_tokens``);
* **running and waiting requests** and **KV usage**, the gauges, reported;
* **the step time**, a rolling fit: the scenario's step-time model (``--scenario``: a
  ``calibrate llm`` scenario, or any LLM scenario for a real vLLM: a fitted profile or a
  roofline) times one speed factor, fitted so that the simulated mean inter-token latency
  at the window's rate and lengths equals the measured one (``vllm:inter_token_latency_seconds``'s
  exact ``_sum / _count``: the mean step time a decoded token waited), by bisection in
  the factor. The factor holds the window's mean of the host's speed process (the
  scenario's ``platform.speed``), so the twin simulates each component with only the
  variance left about that mean (:func:`calibrate.speed.conditioned_speed`: a component slower than the
  window is nearly all in the factor, and is not simulated again on top of it).

It then simulates the current rate (TTFT and TPOT percentiles, against the measured
ones from the TTFT and ``request_time_per_output_token`` histograms) and bisects the rate
at which the SLA's TTFT percentile (and TPOT, with ``--tpot-sla``) breaks, the percentile
taken as a window of ``--sla-window-s`` measures it (the median window's: near the knee a
percentile over a long span holds more of the host's slow spells than one window does,
and a twin judged on windows must predict windows): the headroom,
and the replicas the current rate needs. It prints a row per interval and appends the same
as JSON lines with ``--json``.

Each interval's searches start from the last one's: the factor from the last factor, by
Newton steps on the slope where the last fit ended, and the breaking rate from the last
one scaled by the change of the factor (capacity goes as its inverse), widening by 4, 8,
16% until bracketed; where the host's speed and the traffic drifted little, an update is
about six simulations, against twelve for a cold search (calibrate/README, "The update"). On the command line
(:class:`calibrate.watch_rolling.Rolling`) the fit runs on a thread beside the scrapes: a row waits for its own
window's fit until 90% of the interval, and past it carries the newest fit finished, with
its age, so that the rows keep the interval whatever a fit costs.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from calibrate.headroom import highest_holding
from calibrate.llm_sim import scaled_step_time
from calibrate.speed import conditioned_speed
from calibrate.vllm_metrics import Scrape, length_sample
from calibrate.watch import WatchError, histogram_quantile

FALLING_BEHIND_MS = 10_000.0  # a simulation whose window's first tokens come this long after its end fell behind


class FitCancelled(Exception):
    """A fit stopped by its twin's ``cancel`` event (the watch ended while it ran)."""


@dataclass
class LLMTwin:
    """The rolling fit and the predictions; :meth:`update` takes one scrape at a time."""

    base: dict  # an LLM scenario (parsed YAML): the step-time model, the platform, the network
    cache_info: dict
    ttft_sla: tuple[float, float] = (99.0, 300.0)  # (percentile, ms)
    tpot_sla: tuple[float, float] | None = None
    window: int = 6
    sim_s: float = 60.0
    # the simulations a prediction pools: two, each at least speed_spans of the slowest
    # correlation time its window leaves (calibrate/README, "Two seeds a prediction": a
    # third narrows no error that shows in the announcement and costs half as much again)
    seeds: tuple[int, ...] = (1, 2)
    speed_spans: int = 20
    # the SLA's percentile over windows of this many seconds (the median window's), as a
    # dashboard or a load test measures it; None: over the whole simulated span
    sla_window_s: float | None = None
    last: Scrape | None = None
    deltas: list[dict] = field(default_factory=list)
    factor: float = 1.0
    slope: float = 1.0  # d log(simulated ITL) / d log(factor) where the last fit ended
    last_break: tuple[float, float] | None = None  # the last breaking rate and the factor it was found at
    span_s: float | None = None  # the span of the window being fitted (None: the deltas')
    cancel: threading.Event | None = None  # set: the fit in progress stops at its next simulation

    def __post_init__(self):
        b = self.base.get("batching") or {}
        if b.get("kind") != "continuous":
            raise WatchError("--scenario must be an LLM scenario (batching.kind: continuous)")
        if not isinstance(b.get("step_time", {}), dict):
            raise WatchError("--scenario: batching.step_time must be a mapping (linear or roofline)")
        self.base = {**self.base, "batching": {**b, "step_time": b.get("step_time", {"kind": "roofline"})}}
        try:
            scaled_step_time(self.base["batching"]["step_time"], 1.0)
        except ValueError as e:
            raise WatchError(f"the scenario's {e}") from None

    def update(self, scrape: Scrape) -> dict | None:
        """The twin's row for the interval that ends with ``scrape`` (None for the first):
        :meth:`measure`, then :meth:`fit` on its window."""
        got = self.measure(scrape)
        if got is None:
            return None
        row, job = got
        return row if job is None else {**row, **self.fit(job)}

    def measure(self, scrape: Scrape) -> tuple[dict, dict | None] | None:
        """What the interval that ends with ``scrape`` measured (the row's measured half;
        None for the first scrape) and the window's fit to make (None: no traffic yet),
        for :meth:`fit`, which may run on another thread while the next scrapes come in:
        the job holds all it needs of the window."""
        prev, self.last = self.last, scrape
        if prev is None:
            return None
        dt = scrape.t - prev.t

        def d(name: str) -> float:
            return scrape.values.get(name, 0.0) - prev.values.get(name, 0.0)

        def hist(name: str) -> dict[float, float]:
            now, before = scrape.buckets.get(name, {}), prev.buckets.get(name, {})
            return {le: c - before.get(le, 0.0) for le, c in now.items()}

        delta = {"dt": dt, "requests": d("vllm:request_success_total")}
        for name in ("prompt", "generation"):
            key = f"vllm:request_{name}_tokens"
            delta[name] = (hist(key), d(f"{key}_sum"), d(f"{key}_count"))
        delta["itl"] = (d("vllm:inter_token_latency_seconds_sum"), d("vllm:inter_token_latency_seconds_count"))
        delta["ttft"] = hist("vllm:time_to_first_token_seconds")
        delta["tpot"] = hist("vllm:request_time_per_output_token_seconds") or hist("vllm:time_per_output_token_seconds")
        self.deltas = [*self.deltas, delta][-self.window :]
        v = scrape.values
        span = sum(x["dt"] for x in self.deltas)
        rate = sum(x["requests"] for x in self.deltas) / span if span > 0 else 0.0
        qt, qp = self.ttft_sla[0], (self.tpot_sla or (99.0, 0.0))[0]
        ttft_b, tpot_b = self._pooled("ttft"), self._pooled("tpot")
        row = {
            "time": round(time.time(), 3),
            "rate_rps": rate,
            "interval_rate_rps": delta["requests"] / dt if dt > 0 else 0.0,
            "running": v.get("vllm:num_requests_running"),
            "waiting": v.get("vllm:num_requests_waiting"),
            "kv_usage": v.get("vllm:kv_cache_usage_perc"),
            "measured_ttft_p50_ms": histogram_quantile(ttft_b, 0.5),
            f"measured_ttft_p{qt:g}_ms": histogram_quantile(ttft_b, qt / 100),
            "measured_tpot_p50_ms": histogram_quantile(tpot_b, 0.5),
            f"measured_tpot_p{qp:g}_ms": histogram_quantile(tpot_b, qp / 100),
        }
        itl_sum = sum(x["itl"][0] for x in self.deltas)
        itl_n = sum(x["itl"][1] for x in self.deltas)
        lengths = self._lengths()
        if rate <= 0 or itl_n <= 0 or lengths is None:
            return {**row, "note": "no finished requests yet: waiting for traffic"}, None
        row["measured_itl_mean_ms"] = itl_sum / itl_n * 1e3
        row["prompt_mean"] = float(np.mean(lengths[0]))
        row["output_mean"] = float(np.mean(lengths[1]))
        job = {
            "rate": rate,
            "lengths": lengths,
            "itl_ms": row["measured_itl_mean_ms"],
            "span_s": span,
            "at": row["time"],
        }
        return row, job

    def fit(self, job: dict) -> dict:
        """The rolling fit on a window :meth:`measure` gave: the speed factor, the predicted
        percentiles at the window's rate, the breaking rate, the headroom and the replicas."""
        rate, lengths = job["rate"], job["lengths"]
        self.span_s = job["span_s"]
        self.factor, pred = self.fit_factor(rate, lengths, job["itl_ms"])
        row: dict = {"speed_factor": self.factor}
        row.update({f"predicted_{k}": val for k, val in pred.items() if k != "itl_mean_ms"})
        # where the last interval's answer would be at this factor: capacity goes as 1 / factor
        guess = None
        if self.last_break and math.isfinite(self.last_break[0]) and self.last_break[0] > 0:
            guess = self.last_break[0] * self.last_break[1] / self.factor
        breaking = self.breaking_rate(rate, lengths, self.factor, at_rate=pred, guess=guess)
        self.last_break = (breaking, self.factor)
        row["breaking_rate_rps"] = breaking
        row["headroom_pct"] = (breaking / rate - 1) * 100 if breaking > 0 else float("nan")
        row["replicas_needed"] = math.ceil(rate / breaking) if breaking > 0 else None
        return row

    def _pooled(self, name: str) -> dict[float, float]:
        out: dict[float, float] = {}
        for x in self.deltas:
            for le, c in x[name].items():
                out[le] = out.get(le, 0.0) + c
        return out

    def _lengths(self) -> tuple[list[int], list[int]] | None:
        got = []
        for name in ("prompt", "generation"):
            buckets: dict[float, float] = {}
            total = count = 0.0
            for x in self.deltas:
                h, s, n = x[name]
                total, count = total + s, count + n
                for le, c in h.items():
                    buckets[le] = buckets.get(le, 0.0) + c
            got.append(length_sample(buckets, total, count))
        return None if any(g is None for g in got) else (got[0], got[1])

    def scenario(self, rate: float, lengths: tuple[list[int], list[int]], factor: float):
        from simulator.scenario.config import Scenario

        doc = dict(self.base)
        info = self.cache_info
        b = dict(doc["batching"])
        b["num_blocks"] = int(info["num_gpu_blocks"])
        b["block_size"] = int(info["block_size"])
        for k in ("max_num_seqs", "max_num_batched_tokens"):
            if info.get(k):
                b[k] = int(info[k])
        b["step_time"] = scaled_step_time(b["step_time"], factor)
        doc["batching"] = b
        traffic = {
            k: v for k, v in (doc.get("traffic") or {}).items() if k not in ("classes", "shape", "arrivals_file")
        }
        traffic["rate_rps"] = float(rate)
        traffic["tokens"] = {"prompt": {"values": lengths[0]}, "output": {"values": lengths[1]}}
        doc["traffic"] = traffic
        slowest = 0.0
        speed = (doc.get("platform") or {}).get("speed")
        if speed and speed.get("components"):
            span_s = self.span_s if self.span_s is not None else sum(x["dt"] for x in self.deltas)
            components, slowest = conditioned_speed(speed["components"], span_s)
            platform = {k: v for k, v in doc["platform"].items() if k != "speed"}
            if components:
                platform["speed"] = {**speed, "components": components}
            doc["platform"] = platform
        doc["duration_s"] = max(self.sim_s, self.speed_spans * slowest)
        doc["warmup_s"] = min(5.0, doc["duration_s"] / 10)
        doc.pop("autoscaler", None)
        return Scenario.model_validate(doc)

    def predict(self, rate: float, lengths, factor: float) -> dict:
        """TTFT and TPOT percentiles (ms) and the token-weighted mean ITL, simulated with
        the step time ``factor`` times the scenario's, pooled over the seeds."""
        from simulator import simulate
        from simulator.results.metrics import window
        from simulator.results.tokens import tpot_ms, ttft_ms

        s = self.scenario(rate, lengths, factor)
        ttft, tpot, gaps, tokens, offered, done, late = [], [], 0.0, 0.0, 0, 0, 0
        windows: dict[str, list[list[float]]] = {"ttft": [], "tpot": []}  # per SLA window: its values
        for seed in self.seeds:
            if self.cancel is not None and self.cancel.is_set():
                raise FitCancelled
            r = simulate(s, seed=seed).records
            w = window(r, s)
            keep = w & np.isfinite(r.t_response)
            offered, done = offered + int(w.sum()), done + int(keep.sum())
            # a first token more than FALLING_BEHIND_MS past the span's end: the queue was still
            # growing (the first token, not the last: a long answer may end well after the span)
            late += int((keep & (r.t_first_token > s.duration_s * 1000.0 + FALLING_BEHIND_MS)).sum())
            ttft.append(ttft_ms(r)[keep])
            per = tpot_ms(r)[keep]
            tpot.append(per[np.isfinite(per)])
            if self.sla_window_s:
                # the arrivals' windows of sla_window_s from the end of the warm-up
                k = np.floor((r.arrival[keep] - s.warmup_s * 1000.0) / (self.sla_window_s * 1000.0)).astype(int)
                for name, v in (("ttft", ttft[-1]), ("tpot", per)):
                    for j in np.unique(k):
                        got_j = v[(k == j) & np.isfinite(v)]
                        if len(got_j) >= 10:
                            windows[name].append(got_j)
            out = r.output_tokens[keep].astype(float)
            many = out > 1
            gaps += float(np.sum((r.t_inferred - r.t_first_token)[keep][many]))
            tokens += float(np.sum(out[many] - 1))
        ttft_all, tpot_all = np.concatenate(ttft), np.concatenate(tpot)
        got = {"itl_mean_ms": gaps / tokens if tokens else float("nan")}
        if done < 0.99 * offered or late > 0.01 * offered or len(ttft_all) == 0:  # not keeping up: past any SLA
            for q in self.quantiles:
                got[f"ttft_p{q:g}_ms"] = got[f"tpot_p{q:g}_ms"] = float("inf")
            return got
        for q in self.quantiles:
            got[f"ttft_p{q:g}_ms"] = float(np.percentile(ttft_all, q))
            got[f"tpot_p{q:g}_ms"] = float(np.percentile(tpot_all, q)) if len(tpot_all) else float("nan")
            if self.sla_window_s and q != 50.0:  # the SLA's percentile as its window measures it: the median window's
                for name in ("ttft", "tpot"):
                    if windows[name]:
                        got[f"{name}_p{q:g}_ms"] = float(np.median([np.percentile(v, q) for v in windows[name]]))
        return got

    def fit_factor(self, rate: float, lengths, measured_itl_ms: float, rel_tol: float = 0.02) -> tuple[float, dict]:
        """The speed factor at which the simulated mean ITL meets the measured one (within
        ``rel_tol / 2``), from the last interval's factor: the gap ``g = log(simulated /
        measured)`` grows with ``log factor`` about one for one (faster near saturation:
        slower steps also make batches larger), so each step moves ``log factor`` by
        ``-g / slope`` (the slope where the last fit ended, 1 at first), at most a
        doubling, until a root is bracketed; then secant steps inside the
        bracket (kept a tenth of its width from either end, so that it shrinks), or halving
        where an end did not keep up. Two or three simulations where the speed drifts slowly between
        intervals; the factor returned is one simulated, and its prediction is returned with it.

        The measured engine served ``rate``: a factor at which the simulation does not keep
        up with it is too slow, whatever ITL its finished requests show; the search goes no
        further than a doubling past the last factor that kept up (an overloaded simulation
        grows its queue for the whole span: minutes each, an hour for the doublings up to 20)."""
        floor, ceil = math.log(0.05), math.log(20.0)
        tried: dict[float, tuple[float, dict]] = {}  # log factor: (gap, prediction)

        def gap(x: float) -> float:
            got = self.predict(rate, lengths, math.exp(x))
            sim = got["itl_mean_ms"]
            g = math.log(sim / measured_itl_ms) if math.isfinite(sim) and sim > 0 else math.inf
            if not math.isfinite(got[f"ttft_p{self.quantiles[0]:g}_ms"]):
                g = math.inf  # not keeping up (or nothing finished): slower than the engine measured
            tried[x] = (g, got)
            return g

        x = float(np.clip(math.log(max(self.factor, 1e-9)), floor, ceil))
        g = gap(x)
        lo = hi = None  # (log factor, gap) with the gap below and above 0
        for _ in range(40):
            if abs(g) <= rel_tol / 2:
                break
            if g < 0:
                lo = (x, g)
            else:
                hi = (x, g)
            if lo is None or hi is None:  # not bracketed: a Newton step on the last fit's slope, at most a doubling
                step = float(np.clip(-g / self.slope, -math.log(2), math.log(2))) if math.isfinite(g) else -math.log(2)
                nxt = float(np.clip(x + step, floor, ceil))
                if nxt == x:  # at the bracket's edge (0.05 or 20) and still short of the root
                    break
                x = nxt
            else:
                if hi[0] - lo[0] <= rel_tol:
                    break
                if math.isfinite(hi[1]):
                    x = lo[0] - lo[1] * (hi[0] - lo[0]) / (hi[1] - lo[1])
                    x = min(max(x, lo[0] + 0.1 * (hi[0] - lo[0])), hi[0] - 0.1 * (hi[0] - lo[0]))
                else:
                    x = (lo[0] + hi[0]) / 2
            g = gap(x)
        # the slope between the two closest factors that kept up: the next fit's first step
        near = sorted((k for k in tried if math.isfinite(tried[k][0])), key=lambda k: abs(tried[k][0]))[:2]
        if len(near) == 2 and near[0] != near[1]:
            slope = (tried[near[0]][0] - tried[near[1]][0]) / (near[0] - near[1])
            self.slope = float(np.clip(slope, 0.5, 5.0)) if math.isfinite(slope) else self.slope
        # the simulated factor whose ITL came closest, among those that kept up
        best = min(tried, key=lambda k: (not math.isfinite(tried[k][0]), abs(tried[k][0])))
        if not math.isfinite(tried[best][0]):
            best = min(tried)  # none kept up: the fastest tried
        return math.exp(best), tried[best][1]

    @property
    def quantiles(self) -> list[float]:
        """The percentiles a prediction holds: the median and the SLAs'."""
        return sorted({50.0, self.ttft_sla[0], (self.tpot_sla or (99.0, 0))[0]})

    def breaks(self, pred: dict) -> bool:
        q, ms = self.ttft_sla
        if pred[f"ttft_p{q:g}_ms"] > ms:
            return True
        if self.tpot_sla is not None:
            q, ms = self.tpot_sla
            return pred[f"tpot_p{q:g}_ms"] > ms
        return False

    def breaking_rate(
        self,
        rate: float,
        lengths,
        factor: float,
        rel_tol: float = 0.01,
        *,
        at_rate: dict | None = None,
        guess: float | None = None,
    ) -> float:
        """The highest rate found not to break the SLA, to ``rel_tol`` of the lowest found
        to break it (:func:`calibrate.headroom.highest_holding`: the same seeds at every
        rate); ``at_rate``: the prediction at ``rate`` when already made. Without ``guess``
        the bracket grows from ``rate`` by doublings; with one (the last interval's answer,
        scaled by the change of the factor) it starts there and widens by 4, 8, 16% ...:
        four simulations where the answer moved less than 4%, against seven or eight from
        the rate."""
        return highest_holding(
            lambda r: self.breaks(self.predict(r, lengths, factor)),
            rate,
            self.breaks(at_rate if at_rate is not None else self.predict(rate, lengths, factor)),
            rel_tol=rel_tol,
            guess=guess,
        )
