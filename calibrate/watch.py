"""``servesim calibrate watch``: a live twin of a running Open Inference Protocol server.

Every interval the twin reads what any Triton exposes, ``/metrics`` (the cumulative
``nv_inference_*`` counters and durations) and ``/v2/models/{m}/stats`` (with its
``batch_stats``), and works on the differences since the interval before:

* **the rate**: successful requests per second;
* **the batch service time** per batch size: the compute (and, on servesim's server,
  hand-off) nanoseconds of each size over its executions, summed over a rolling window of
  intervals, so one quiet interval does not erase a size;
* **the per-request overheads**: the server's request time less its queueing and batch
  compute, per request; where the server exports its process CPU
  (``process_cpu_seconds_total``, as servesim's does), that CPU per request is the front
  end's station and the rest a pure delay;
* **the calibrated model** (``--profile DIR``, a ``calibrate run`` folder): the batch
  times' noise, the platform-speed process and the front end's service-time shape come
  from the profile; the batch-time table and the front end's CPU per request stay live
  (sizes the window has not seen take the profile's table, scaled to the live ones), so
  the twin follows the machine's speed of the hour. The hand-off to the instance's process
  is in the batch time (as the calibration fits it) and taken out of the per-request
  overhead, so it is counted once;
* **the prediction**: the simulator runs the server so fitted at the current rate, and
  bisects the rate at which the SLA percentile breaks: the **headroom** is how much the
  traffic can grow before it does.

It prints a live table and, with ``--json``, one JSON line per interval. Measured
percentiles come from servesim's per-stage histogram where the server has one (Triton's
counters carry only sums). Latencies are the server's, from receipt to response: the
client's network is outside what the server can report.

This is the seed's question, asked before it happens: p95 went from 200 to 800 ms after
15% growth: the twin would have said the headroom was under 15%.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import numpy as np

from calibrate.headroom import highest_holding
from calibrate.prometheus import NotMetrics, samples
from calibrate.scenario import episodes_mean, scenario_dict
from simulator.engine import simulate
from simulator.results.metrics import window
from simulator.scenario.config import Scenario

BATCH_PARTS = ("compute_input", "compute_infer", "compute_output", "handoff")
NOISE_CV = 0.08  # counters carry sums only; the batch noise a calibration run measured here (0.06-0.11)
SPEED_SPANS = 20  # with a speed process, simulate at least this many of its slowest correlation times
MIN_EXECUTIONS = 5  # a batch size needs this many executions in the window to enter the table


class WatchError(Exception):
    """The server cannot be watched (down, not a v2 server, no such model)."""


def _get(url: str, timeout_s: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return r.read()


def parse_metrics(text: str, model: str) -> dict:
    """Counters of ``model`` summed over versions, the process CPU, and the request-time
    histogram's cumulative buckets (servesim's server), from Prometheus text."""
    sums: dict[str, float] = {}
    buckets: dict[float, float] = {}
    try:
        page = samples(text)
    except NotMetrics as err:
        raise WatchError(f"/metrics: {err}") from None
    for sample in page:
        name, labels, v = sample.name, sample.labels, sample.value
        if labels.get("model", model) != model:
            continue
        if name == "servesim_stage_duration_seconds_bucket" and labels.get("stage") == "request":
            le = float(labels["le"])
            buckets[le] = buckets.get(le, 0.0) + v
        elif name.startswith("nv_inference_") and not name.endswith("_created"):
            # Triton exports counters bare; prometheus_client (servesim's server) adds _total
            key = name.removesuffix("_total")
            sums[key] = sums.get(key, 0.0) + v
        elif name == "process_cpu_seconds_total":
            sums[name] = sums.get(name, 0.0) + v
    return {"counters": sums, "buckets": dict(sorted(buckets.items()))}


def batch_counts(stats: dict, model: str) -> dict[int, tuple[int, int]]:
    """Per batch size: executions and total batch ns (compute, plus hand-off where reported)."""
    return {b: (n, ns) for b, (n, ns, _) in _batch_stats(stats, model).items()}


def handoff_ns(stats: dict, model: str) -> dict[int, int]:
    """Per batch size: total hand-off ns (servesim's server; none on a Triton)."""
    return {b: h for b, (_, _, h) in _batch_stats(stats, model).items()}


def _batch_stats(stats: dict, model: str) -> dict[int, tuple[int, int, int]]:
    entry = next((m for m in stats.get("model_stats", []) if m.get("name") == model), None)
    if entry is None:
        raise WatchError(f"the statistics hold no model {model!r}")
    out = {}
    for b in entry.get("batch_stats", []):
        n = int(b["compute_infer"]["count"])
        ns = sum(int(b[k]["ns"]) for k in BATCH_PARTS if k in b)
        out[int(b["batch_size"])] = (n, ns, int(b["handoff"]["ns"]) if "handoff" in b else 0)
    return out


def histogram_quantile(buckets: dict[float, float], q: float) -> float:
    """The ``q`` quantile (ms) of a cumulative histogram by linear interpolation within its
    bucket, as Prometheus' ``histogram_quantile``; nan when empty or beyond the last bound."""
    bounds = [b for b in buckets if math.isfinite(b)]
    total = buckets.get(math.inf, max(buckets.values(), default=0.0))
    if total <= 0 or not bounds:
        return float("nan")
    rank = q * total
    prev_b, prev_c = 0.0, 0.0
    for b in bounds:
        c = buckets[b]
        if c >= rank:
            frac = 0.0 if c == prev_c else (rank - prev_c) / (c - prev_c)
            return (prev_b + frac * (b - prev_b)) * 1e3
        prev_b, prev_c = b, c
    return float("nan")


@dataclass
class Scrape:
    t: float
    counters: dict[str, float]
    buckets: dict[float, float]
    batches: dict[int, tuple[int, int]]
    handoff: dict[int, int] = field(default_factory=dict)  # per batch size, cumulative ns


@dataclass
class Twin:
    """The rolling fit and the predictions; :meth:`update` takes one scrape at a time."""

    config: dict
    model: str
    percentile: float = 99.0
    target_ms: float = 100.0
    window: int = 6
    sim_s: float = 20.0
    profile: dict | None = None  # a calibration's profile.json: noise, speed process, front-end shape
    last: Scrape | None = None
    deltas: list[dict] = field(default_factory=list)

    def update(self, scrape: Scrape) -> dict | None:
        """The twin's row for the interval that ends with ``scrape`` (None for the first)."""
        prev, self.last = self.last, scrape
        if prev is None:
            return None
        dt = scrape.t - prev.t
        c0, c1 = prev.counters, scrape.counters

        def d(name: str) -> float:
            return c1.get(name, 0.0) - c0.get(name, 0.0)

        batches = {
            b: (n - prev.batches.get(b, (0, 0))[0], ns - prev.batches.get(b, (0, 0))[1])
            for b, (n, ns) in scrape.batches.items()
        }
        delta = {
            "dt": dt,
            "requests": d("nv_inference_request_success"),
            "request_us": d("nv_inference_request_duration_us"),
            "queue_us": d("nv_inference_queue_duration_us"),
            "compute_us": sum(
                d(f"nv_inference_{p}_duration_us") for p in ("compute_input", "compute_infer", "compute_output")
            ),
            "cpu_s": d("process_cpu_seconds_total") if "process_cpu_seconds_total" in c1 else float("nan"),
            # every request of a batch waited through its hand-off: b requests × the batch's
            "handoff_us": sum(b * (h - prev.handoff.get(b, 0)) for b, h in scrape.handoff.items()) / 1e3,
            "batches": batches,
            "buckets": {le: scrape.buckets.get(le, 0.0) - prev.buckets.get(le, 0.0) for le in scrape.buckets},
        }
        self.deltas = [*self.deltas, delta][-self.window :]
        rate = delta["requests"] / dt if dt > 0 else 0.0
        row = {
            "time": round(time.time(), 3),
            "rate_rps": rate,
            "measured_p50_ms": histogram_quantile(delta["buckets"], 0.5),
            f"measured_p{self.percentile:g}_ms": histogram_quantile(delta["buckets"], self.percentile / 100),
        }
        fit = self.fit()
        row.update({k: v for k, v in fit.items() if k != "batch_ms"})
        if fit.get("batch_ms") is None or rate <= 0:
            return {**row, "note": "no batches yet: waiting for traffic"}
        p50, pq = self._percentiles(fit, rate)
        breaking = self.breaking_rate(fit, rate, at_rate=pq)
        row.update({"predicted_p50_ms": p50, f"predicted_p{self.percentile:g}_ms": pq})
        row["breaking_rate_rps"] = breaking
        row["headroom_pct"] = (breaking / rate - 1) * 100 if math.isfinite(breaking) else float("nan")
        return row

    def fit(self) -> dict:
        """Batch time per size and per-request overheads over the window."""
        counts: dict[int, list[float]] = {}
        for delta in self.deltas:
            for b, (n, ns) in delta["batches"].items():
                acc = counts.setdefault(b, [0.0, 0.0])
                acc[0] += n
                acc[1] += ns
        table = {b: ns / n / 1e6 for b, (n, ns) in sorted(counts.items()) if n >= MIN_EXECUTIONS}
        if not table and counts:  # too few of each size: the sizes pooled, as one mean per item
            n = sum(v[0] for v in counts.values())
            if n:
                per_batch = sum(v[1] for v in counts.values()) / n / 1e6
                table = {round(sum(b * v[0] for b, v in counts.items()) / n) or 1: per_batch}
        reqs = sum(x["requests"] for x in self.deltas)
        out: dict = {"batch_ms": table or None, "batch_sizes_seen": len(table)}
        if reqs > 0:
            # the request's time in the server outside the queue and the batch (compute and
            # hand-off: the batch time holds the hand-off, so the overhead must not)
            other = (
                sum(x["request_us"] - x["queue_us"] - x["compute_us"] - x.get("handoff_us", 0.0) for x in self.deltas)
                / reqs
                / 1e3
            )
            out["overhead_ms"] = max(other, 0.0)
            cpu = [x["cpu_s"] for x in self.deltas]
            if all(math.isfinite(v) for v in cpu):
                out["frontend_cpu_ms"] = sum(cpu) / reqs * 1e3
        return out

    def scenario(self, fit: dict, rate: float) -> Scenario:
        cfg = self.config
        cpu = fit.get("frontend_cpu_ms")
        overhead = fit.get("overhead_ms", 0.0)
        doc = {
            "name": f"twin-{self.model}",
            "seed": 0,
            "duration_s": self.sim_s,
            "warmup_s": min(2.0, self.sim_s / 10),
            "sla": {"percentile": self.percentile, "target_ms": self.target_ms},
            "traffic": {"rate_rps": rate},
            "router": {
                "overhead": {"kind": "deterministic", "value_ms": max(overhead - (cpu or 0.0), 0.0)},
                "balancing": "shared",
            },
            "batching": {
                "max_batch_size": max(int(cfg.get("max_batch_size") or 1), 1),
                "max_queue_delay_ms": (cfg.get("dynamic_batching") or {}).get("max_queue_delay_microseconds", 0) / 1000,
                "max_queue_size": ((cfg.get("dynamic_batching") or {}).get("default_queue_policy") or {}).get(
                    "max_queue_size"
                )
                or None,
            },
            "workers": {
                "count": 1,
                "instances": self.instances,
                "service_time": {"kind": "table", "batch_ms": fit["batch_ms"], "noise_cv": NOISE_CV},
            },
            "cost": {"price_per_hour_usd": 1.0},
        }
        if cpu:  # the front end's CPU is a station: one event loop
            doc["preprocess"] = {"service": {"kind": "exponential", "mean_ms": cpu}, "cpu_workers": 1}
        if self.profile is not None:
            calibrated(doc, self.profile, fit)
            slowest = max(
                (c["correlation_time_s"] for c in doc.get("platform", {}).get("speed", {}).get("components", [])),
                default=0.0,
            )
            if SPEED_SPANS * slowest > doc["duration_s"]:  # a percentile over many of the speed's swings, not one
                doc["duration_s"] = SPEED_SPANS * slowest
                doc["warmup_s"] = min(2.0, doc["duration_s"] / 10)
        return Scenario.model_validate(doc)

    def _percentiles(self, fit: dict, rate: float) -> tuple[float, float]:
        s = self.scenario(fit, rate)
        rec = simulate(s).records
        done = window(rec, s) & rec.completed
        lat = (rec.t_response - rec.arrival)[done]
        served = done.sum() / max(window(rec, s).sum(), 1)
        if len(lat) == 0 or served < 0.99:  # rejecting: past any SLA
            return float("inf"), float("inf")
        p50, pq = np.percentile(lat, [50, self.percentile])
        return float(p50), float(pq)

    @property
    def instances(self) -> int:
        return sum(int(g.get("count", 1)) for g in self.config.get("instance_group", [{"count": 1}]))

    def breaking_rate(self, fit: dict, rate: float, rel_tol: float = 0.01, *, at_rate: float | None = None) -> float:
        """The rate at which the predicted SLA percentile crosses the target (bisection; the
        same seed at every rate, so the curve is smooth); ``at_rate``: the percentile at
        ``rate`` when already simulated."""
        bmax = max(fit["batch_ms"])
        peak = self.instances * bmax / fit["batch_ms"][bmax] * 1e3
        if fit.get("frontend_cpu_ms"):
            peak = min(peak, 1e3 / fit["frontend_cpu_ms"])
        broke = (self._percentiles(fit, rate)[1] if at_rate is None else at_rate) > self.target_ms
        return highest_holding(
            lambda r: self._percentiles(fit, r)[1] > self.target_ms, rate, broke, rel_tol=rel_tol, ceiling=1.2 * peak
        )


def calibrated(doc: dict, profile: dict, fit: dict) -> None:
    """Put a calibration's model into the twin's scenario ``doc``: the batch noise and the
    speed process as the calibration's scenario has them, the profile's batch table for
    the sizes the live window lacks (scaled by the live / profile ratio on those it has),
    and the front end's service-time shape at the live CPU per request. The live times,
    like the profile's, hold the speed process's episodes on average, which it adds on
    top: they are divided out as :func:`calibrate.scenario.scenario_dict` does."""
    ref = scenario_dict(profile, 1.0, duration_s=1.0, warmup_s=0.0)
    front_mean, workers_mean = episodes_mean(profile) or (1.0, 1.0)
    st = dict(ref["workers"]["service_time"])
    live = {int(b): v for b, v in fit["batch_ms"].items()}
    if st["kind"] == "table":
        mine = {int(b): v for b, v in st["batch_ms"].items()}
        common = [b for b in live if b in mine]
        scale = float(np.exp(np.mean([np.log(live[b] / mine[b]) for b in common]))) if common else 1.0
        top = int(doc["batching"]["max_batch_size"])
        live = {b: live.get(b, mine[b] * scale) for b in sorted(set(live) | {b for b in mine if b <= top})}
    live = {b: v / workers_mean for b, v in live.items()}
    st.update(kind="table", batch_ms=live)
    st.pop("base_ms", None)
    st.pop("per_item_ms", None)
    doc["workers"]["service_time"] = st
    if "platform" in ref:
        doc["platform"] = ref["platform"]
    shape = (ref.get("preprocess") or {}).get("service")
    cpu = fit.get("frontend_cpu_ms")
    if cpu and shape and shape.get("kind") == "empirical":
        x = np.asarray(shape["samples_ms"], dtype=float)
        samples = x * cpu / front_mean / x.mean()
        doc["preprocess"]["service"] = {"kind": "empirical", "samples_ms": samples.round(5).tolist()}


def connect(url: str, model: str | None) -> tuple[str, dict]:
    """The model to watch and its configuration; raises WatchError with a reason."""
    base = url.rstrip("/")
    try:
        _get(base + "/v2/health/live")
    except urllib.error.HTTPError as err:
        if err.code == 404:
            raise WatchError(f"{base} is not an Open Inference Protocol (v2) server: /v2/health/live is 404") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise WatchError(f"cannot reach {base}: {getattr(err, 'reason', err)}") from None
    if model is None:  # the repository's only model
        index = []
        try:
            req = urllib.request.Request(base + "/v2/repository/index", data=b"{}", method="POST")
            with urllib.request.urlopen(req, timeout=5) as r:
                index = json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError):
            pass
        names = [m.get("name") for m in index if isinstance(m, dict) and m.get("name")]
        if len(names) != 1:
            raise WatchError(f"name the model with --model (the server lists {names or 'none'})")
        model = names[0]
    try:
        config = json.loads(_get(f"{base}/v2/models/{model}/config"))
    except urllib.error.HTTPError as err:
        detail = err.read()[:200].decode(errors="replace")
        raise WatchError(f"model {model!r} on {base}: HTTP {err.code} {detail}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise WatchError(f"model {model!r} on {base}: {err}") from None
    return model, config


def scrape(url: str, model: str) -> Scrape:
    base = url.rstrip("/")
    t = time.monotonic()
    m = parse_metrics(_get(base + "/metrics").decode(errors="replace"), model)
    stats = json.loads(_get(f"{base}/v2/models/{model}/stats"))
    # a counter not exported yet (prometheus_client shows a labelled series only once it
    # has counted) is zero: an idle server is waiting for traffic, not failing
    return Scrape(t, m["counters"], m["buckets"], batch_counts(stats, model), handoff_ns(stats, model))
