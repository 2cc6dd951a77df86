"""Reading a vLLM-compatible server's ``/metrics``: what the LLM twin
(:mod:`calibrate.watch_llm`) works on.

A :class:`Scrape` is one page: every sample summed over its label sets (one engine or
several), the histograms as cumulative buckets, and ``vllm:cache_config_info``'s labels
(the KV block budget). :func:`connect` checks that a server exports vLLM's metrics before
a twin starts; :func:`length_sample` turns a token-length histogram into lengths to
simulate; :func:`scrapes_of` gives what such a server would have shown of simulated
records, to check the twin against an engine whose step time is known.
"""

from __future__ import annotations

import math
import time
import urllib.error
from dataclasses import dataclass, field

import numpy as np

from calibrate.prometheus import samples
from calibrate.watch import WatchError, _get

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
    values: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    info: dict[str, str] = {}
    for s in samples(text):
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
    from reference_server.llm.metrics import ITL_BUCKETS, TTFT_BUCKETS, buckets_1_2_5

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


__all__ = ["LENGTH_SAMPLE", "Scrape", "connect", "length_sample", "parse", "scrape", "scrapes_of"]
