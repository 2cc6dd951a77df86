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
  variance left about that mean (:func:`conditioned_speed`: a component slower than the
  window is nearly all in the factor, and is not simulated again on top of it).

It then simulates the current rate (TTFT and TPOT percentiles, against the measured
ones from the TTFT and ``request_time_per_output_token`` histograms) and bisects the rate
at which the SLA's TTFT percentile (and TPOT, with ``--tpot-sla``) breaks, the percentile
taken as a window of ``--sla-window-s`` measures it (the median window's: near the knee a
percentile over a long span holds more of the host's slow spells than one window does,
and a twin judged on windows must predict windows): the headroom,
and the replicas the current rate needs. It prints a row per interval and appends the same
as JSON lines with ``--json``.
"""

from __future__ import annotations

import math
import time
import urllib.error
from dataclasses import dataclass, field

import numpy as np

from calibrate.watch import WatchError, _get, histogram_quantile

SPEED_SPANS = 20  # with a speed process, simulate at least this many of its slowest correlation times
FALLING_BEHIND_MS = 10_000.0  # a simulation whose window's first tokens come this long after its end fell behind
LENGTH_SAMPLE = 400  # values drawn to stand for a window's length histogram


@dataclass
class Scrape:
    t: float
    values: dict[str, float]  # counters, gauges, _sum and _count, summed over label sets
    buckets: dict[str, dict[float, float]]  # histogram name -> {le: cumulative count}
    cache_info: dict[str, str] = field(default_factory=dict)


def parse(text: str) -> Scrape:
    """A vLLM ``/metrics`` page: every sample summed over its label sets (one engine or
    several), histograms as cumulative buckets, ``vllm:cache_config_info``'s labels."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    info: dict[str, str] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "vllm:cache_config_info":
                info = dict(s.labels)
            elif s.name.endswith("_bucket") and "le" in s.labels:
                b = buckets.setdefault(s.name.removesuffix("_bucket"), {})
                le = float(s.labels["le"])
                b[le] = b.get(le, 0.0) + s.value
            else:
                values[s.name] = values.get(s.name, 0.0) + s.value
    return Scrape(time.monotonic(), values, buckets, info)


def _cum(values: np.ndarray, bounds) -> dict[float, float]:
    return {float(b): float(np.count_nonzero(values <= b)) for b in bounds}


def scrapes_of(records, interval_s: float, count: int, info: dict) -> list[Scrape]:
    """What vLLM's /metrics would have shown of simulated ``records`` every ``interval_s``
    from time 0, ``count`` intervals: the finished requests' histograms and totals (as the
    engine observes them when a request finishes), and the running (first token out, not
    finished) and waiting (arrived, no first token) gauges. For checking the twin against
    a simulated engine whose step time is known."""
    # the engine's own buckets (its module loads torch: for tests and experiments, not the live twin)
    from reference_server.llm.api import ITL_BUCKETS, TTFT_BUCKETS, buckets_1_2_5

    longest = int(max(records.prompt_tokens.max(initial=1), records.output_tokens.max(initial=1)))
    ttft_b, tpot_b, token_b = ((*b, math.inf) for b in (TTFT_BUCKETS, ITL_BUCKETS, buckets_1_2_5(longest)))
    out = []
    done_ms = records.t_inferred
    for k in range(count + 1):
        t = k * interval_s * 1000.0
        fin = np.isfinite(done_ms) & (done_ms <= t)
        n_out = records.output_tokens[fin].astype(float)
        ttft = (records.t_first_token - records.arrival)[fin] / 1e3
        many = n_out > 1
        gaps = (records.t_inferred - records.t_first_token)[fin]
        tpot = gaps[many] / (n_out[many] - 1) / 1e3
        prompt = records.prompt_tokens[fin].astype(float)
        started = records.t_first_token <= t
        values = {
            "vllm:request_success_total": float(fin.sum()),
            "vllm:request_prompt_tokens_sum": float(prompt.sum()),
            "vllm:request_prompt_tokens_count": float(fin.sum()),
            "vllm:request_generation_tokens_sum": float(n_out.sum()),
            "vllm:request_generation_tokens_count": float(fin.sum()),
            "vllm:inter_token_latency_seconds_sum": float(gaps[many].sum() / 1e3),
            "vllm:inter_token_latency_seconds_count": float((n_out[many] - 1).sum()),
            "vllm:num_requests_running": float(np.count_nonzero(started & ~fin)),
            "vllm:num_requests_waiting": float(np.count_nonzero((records.arrival <= t) & ~started)),
        }
        buckets = {
            "vllm:time_to_first_token_seconds": _cum(ttft, ttft_b),
            "vllm:request_time_per_output_token_seconds": _cum(tpot, tpot_b),
            "vllm:request_prompt_tokens": _cum(prompt, token_b),
            "vllm:request_generation_tokens": _cum(n_out, token_b),
        }
        out.append(Scrape(t / 1000.0, values, buckets, info))
    return out


def monotone_crossing(rows: list[tuple[float, float]], sla_ms: float) -> float:
    """Where a ramp's measured percentile crosses ``sla_ms``: ``rows`` of (rate, percentile
    in ms) in rising rate, on their monotone (isotonic, least squares in log) fit,
    interpolated in log between the steps around the crossing (a short step's p99 is
    noisy, and the first raw crossing would take the first spike for it). The first rate
    when the fit starts above the SLA; NaN when it never crosses."""
    from scipy.optimize import isotonic_regression

    rates = np.array([r for r, _ in rows])
    fitted = np.exp(isotonic_regression(np.log([p for _, p in rows])).x)
    target = math.log(sla_ms)
    for i in range(len(rows) - 1):
        p0, p1 = math.log(fitted[i]), math.log(fitted[i + 1])
        if p1 > target >= p0:
            return float(rates[i] + (target - p0) / (p1 - p0) * (rates[i + 1] - rates[i]))
    return float(rates[0]) if fitted[0] > sla_ms else math.nan


def scrape(url: str) -> Scrape:
    return parse(_get(url.rstrip("/") + "/metrics").decode())


def connect(url: str) -> dict:
    """Check that ``url`` serves vLLM's metrics; its ``cache_config_info`` labels."""
    try:
        got = scrape(url)
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise WatchError(f"cannot reach {url}/metrics: {getattr(err, 'reason', err)}") from None
    if "vllm:request_success_total" not in got.values and not any(k.startswith("vllm:") for k in got.values):
        raise WatchError(f"{url}/metrics has no vllm: metrics (not a vLLM-compatible server)")
    if not got.cache_info.get("num_gpu_blocks") or not got.cache_info.get("block_size"):
        raise WatchError(f"{url}/metrics: vllm:cache_config_info gives no num_gpu_blocks and block_size")
    return got.cache_info


def length_sample(buckets: dict[float, float], total: float, count: float, n: int = LENGTH_SAMPLE) -> list[int] | None:
    """``n`` lengths standing for a token-length histogram (cumulative ``buckets``, exact
    ``total`` and ``count``): each bucket's share of the draws at the middle of its range,
    then scaled so that their mean is ``total / count``."""
    if count <= 0:
        return None
    bounds = sorted(buckets)
    lo, mids, counts = 0.0, [], []
    prev = 0.0
    for b in bounds:
        c = buckets[b] - prev
        prev = buckets[b]
        if c > 0:
            top = b if math.isfinite(b) else max(2 * lo, lo + 1)
            mids.append((lo + top) / 2 if lo > 0 else top / 2 + 0.5)
            counts.append(c)
        lo = b if math.isfinite(b) else lo
    if not counts:
        return None
    share = np.asarray(counts) / sum(counts)
    reps = np.maximum(np.rint(share * n).astype(int), 0)
    x = np.repeat(np.asarray(mids), reps)
    if len(x) == 0:
        x = np.asarray(mids)
    x = x * (total / count) / x.mean()
    return [max(int(np.rint(v)), 1) for v in x]


def _scaled_step_time(step: dict, factor: float) -> dict:
    """The scenario's step time ``step`` run ``factor`` times slower."""
    from simulator.scenario.llm import step_kind

    kind = step_kind(step)
    if kind == "linear":
        out = dict(step)
        for k in (
            "c0_ms",
            "prefill_ms_per_token",
            "attention_ms_per_token2",
            "decode_ms_per_seq",
            "kv_ms_per_token",
            "decode_ms_per_seq_above",
        ):
            if k in out:
                out[k] = out[k] * factor
        return out
    if kind == "roofline":
        from simulator.scenario.llm import Roofline

        defaults = Roofline()
        out = {**step, "kind": "roofline", "overhead_ms": step.get("overhead_ms", defaults.overhead_ms) * factor}
        for k in ("mfu", "mbu"):  # a share of the datasheet's peak: at most all of it
            out[k] = min(step.get(k, getattr(defaults, k)) / factor, 1.0)
        return out
    raise WatchError(f"the scenario's batching.step_time kind {kind!r} cannot be scaled (linear or roofline)")


def window_share(window_s: float, correlation_time_s: float) -> float:
    """The share of a stationary AR(1)'s variance that its mean over ``window_s`` carries:
    ``2/x (1 - (1 - e^-x)/x)`` with ``x = window_s / correlation_time_s`` (1 for a window
    short against the correlation time, ``2 tau / window`` for a long one)."""
    x = window_s / correlation_time_s
    if x <= 0:
        return 0.0
    if x < 1e-4:
        return 1.0 - x / 3.0
    return float(np.clip(2.0 / x * (1.0 - -math.expm1(-x) / x), 0.0, 1.0))


def conditioned_speed(components: list[dict], window_s: float) -> tuple[list[dict], float]:
    """The host's speed process as the twin simulates it once its factor is fitted on a
    window of ``window_s``: the factor already holds the window's mean of every component,
    so each keeps only the variance about that mean, ``sigma * sqrt(1 - share)``
    (:func:`window_share`); a component slower than the window is nearly all in the factor.
    Components left below 0.001 are dropped. Also the slowest correlation time among the
    components no slower than the window (the simulated span covers ``SPEED_SPANS`` of it;
    the slower ones, left small, take one draw a seed)."""
    out, slowest = [], 0.0
    for c in components:
        tau = float(c["correlation_time_s"])
        sigma = float(c["sigma"]) * math.sqrt(1.0 - window_share(window_s, tau))
        if sigma >= 1e-3:
            out.append({**c, "sigma": round(sigma, 6)})
            if tau <= window_s or window_s <= 0:
                slowest = max(slowest, tau)
    return out, slowest


@dataclass
class LLMTwin:
    """The rolling fit and the predictions; :meth:`update` takes one scrape at a time."""

    base: dict  # an LLM scenario (parsed YAML): the step-time model, the platform, the network
    cache_info: dict
    ttft_sla: tuple[float, float] = (99.0, 300.0)  # (percentile, ms)
    tpot_sla: tuple[float, float] | None = None
    window: int = 6
    sim_s: float = 60.0
    seeds: tuple[int, ...] = (1, 2, 3)
    # the SLA's percentile over windows of this many seconds (the median window's), as a
    # dashboard or a load test measures it; None: over the whole simulated span
    sla_window_s: float | None = None
    last: Scrape | None = None
    deltas: list[dict] = field(default_factory=list)
    factor: float = 1.0

    def __post_init__(self):
        b = self.base.get("batching") or {}
        if b.get("kind") != "continuous":
            raise WatchError("--scenario must be an LLM scenario (batching.kind: continuous)")
        if not isinstance(b.get("step_time", {}), dict):
            raise WatchError("--scenario: batching.step_time must be a mapping (linear or roofline)")
        self.base = {**self.base, "batching": {**b, "step_time": b.get("step_time", {"kind": "roofline"})}}
        _scaled_step_time(self.base["batching"]["step_time"], 1.0)

    def update(self, scrape: Scrape) -> dict | None:
        """The twin's row for the interval that ends with ``scrape`` (None for the first)."""
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
            return {**row, "note": "no finished requests yet: waiting for traffic"}
        row["measured_itl_mean_ms"] = itl_sum / itl_n * 1e3
        row["prompt_mean"] = float(np.mean(lengths[0]))
        row["output_mean"] = float(np.mean(lengths[1]))
        self.factor = self.fit_factor(rate, lengths, row["measured_itl_mean_ms"])
        row["speed_factor"] = self.factor
        pred = self.predict(rate, lengths, self.factor)
        row.update({f"predicted_{k}": val for k, val in pred.items() if k != "itl_mean_ms"})
        breaking = self.breaking_rate(rate, lengths, self.factor, at_rate=pred)
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
        b["step_time"] = _scaled_step_time(b["step_time"], factor)
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
            span_s = sum(x["dt"] for x in self.deltas)
            components, slowest = conditioned_speed(speed["components"], span_s)
            platform = {k: v for k, v in doc["platform"].items() if k != "speed"}
            if components:
                platform["speed"] = {**speed, "components": components}
            doc["platform"] = platform
        doc["duration_s"] = max(self.sim_s, SPEED_SPANS * slowest)
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

    def fit_factor(self, rate: float, lengths, measured_itl_ms: float, rel_tol: float = 0.02) -> float:
        """The speed factor at which the simulated mean ITL meets the measured one: the
        simulated ITL grows with the factor, faster than in proportion near saturation
        (slower steps also make batches larger), so a plain ratio overshoots; bisection in
        log factor within a bracket found from the last interval's factor.

        The measured engine served ``rate``: a factor at which the simulation does not keep
        up with it is too slow, whatever ITL its finished requests show. The bracket stops
        growing there (an overloaded simulation at many times the factor grows its queue
        for the whole span: minutes each, an hour for the doublings up to 20)."""

        def gap(f: float) -> float:
            got = self.predict(rate, lengths, f)
            sim = got["itl_mean_ms"]
            if not math.isfinite(got[f"ttft_p{self.quantiles[0]:g}_ms"]) or not math.isfinite(sim):
                return math.inf  # not keeping up (or nothing finished): slower than the engine measured
            return math.log(sim / measured_itl_ms)

        lo = hi = float(np.clip(self.factor, 0.05, 20.0))
        g = gap(lo)
        if abs(g) < rel_tol:
            return lo
        if g > 0:  # too slow: step down until the simulated ITL is below the measured
            while g > 0 and lo > 0.05:
                hi, lo = lo, max(lo / 2, 0.05)
                g = gap(lo)
            if g > 0:
                return lo
        else:
            while g < 0 and hi < 20.0:
                lo, hi = hi, min(hi * 2, 20.0)
                g = gap(hi)
            if g < 0:
                return hi
        while math.log(hi / lo) > rel_tol:
            mid = math.sqrt(lo * hi)
            if gap(mid) > 0:
                hi = mid
            else:
                lo = mid
        return math.sqrt(lo * hi)

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
        self, rate: float, lengths, factor: float, rel_tol: float = 0.01, *, at_rate: dict | None = None
    ) -> float:
        """The rate at which the SLA breaks (bisection, the same seeds at every rate);
        ``at_rate``: the prediction at ``rate`` when already made."""
        lo, hi = 0.0, max(rate, 0.1)
        if self.breaks(at_rate if at_rate is not None else self.predict(rate, lengths, factor)):
            hi = rate
        else:
            while not self.breaks(self.predict(hi * 2, lengths, factor)):
                hi *= 2
                if hi > 1e6:
                    return float("inf")
            lo, hi = hi, hi * 2
        while hi - lo > rel_tol * hi:
            mid = (lo + hi) / 2
            if self.breaks(self.predict(mid, lengths, factor)):
                hi = mid
            else:
                lo = mid
        return lo
