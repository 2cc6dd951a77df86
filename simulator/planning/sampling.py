"""Fleet sampling: simulate k of N identical workers with k/N of the traffic.

Why it is exact in law. With random routing, each request picks a worker uniformly and
independently, so the arrivals at one worker are the scenario's arrival process thinned
with probability 1/N: for a Poisson process of rate λ (or any shape that multiplies one)
each worker sees a Poisson process of rate λ/N. When workers do not interact (a fixed
fleet with one queue per worker, stages before the queue that delay each request
independently), the N worker subsystems are statistically identical, and a random request's
latency has the same distribution as a request at any one worker. Simulating k workers
with k/N of the traffic gives each of them the same λ/N, hence the same per-worker queueing
and the same latency distribution; what is lost is only the number of samples (k/N of the
requests), which widens the confidence interval of a percentile: replications measure that.

It would be wrong where workers interact or the fleet is not a set of independent
queues: one shared queue or least-loaded routing (a request's wait depends on every
worker), round-robin (each worker sees every N-th arrival, a smoother process than every
k-th), autoscaling and failures (decisions over the whole fleet), finite shared stations
before the queue (a CPU pool, a feature store of finite capacity), a shared cache (its hit
ratio depends on the whole key stream), canary and shadow pools, traffic classes, replayed
arrival files and absolute rate shapes (their rates are not scaled here). The prediction-log
pipeline is shared but off the request path: it is left out of a sampled run.
"""

from __future__ import annotations

import math

from simulator.results.timeline import FLEET_WIDE
from simulator.scenario.config import Scenario


def sampling_refusal(s: Scenario) -> str | None:
    """Why fleet sampling would be wrong for ``s``, or None when it is exact in law."""
    reasons = []
    if s.router.balancing != "random":
        reasons.append(f"router.balancing is {s.router.balancing!r} (needs random)")
    if s.workers.autoscaler is not None:
        reasons.append("workers.autoscaler decides over the whole fleet")
    if s.workers.failures is not None:
        reasons.append("workers.failures redistribute load across the fleet")
    if s.router.canary is not None or s.router.shadow is not None or s.router.activator is not None:
        reasons.append("a canary, shadow or activator pool is sized on its own")
    if s.traffic.classes:
        reasons.append("traffic.classes share quotas across the pool")
    if s.traffic.arrivals_file is not None:
        reasons.append("traffic.arrivals_file is replayed as is")
    if getattr(s.traffic.shape, "absolute", False):
        reasons.append(f"traffic.shape {s.traffic.shape.kind!r} carries absolute rates")
    if s.preprocess.cpu_workers is not None:
        reasons.append("preprocess.cpu_workers is a CPU pool shared by all traffic")
    if s.features.store is not None:
        reasons.append("features.store has finite capacity shared by all traffic")
    if s.caches.result is not None or s.caches.feature is not None:
        reasons.append("a cache's hit ratio depends on the whole key stream")
    return "; ".join(reasons) or None


def auto_sample_size(s: Scenario, target_requests: float = 100_000.0, minimum: int = 4) -> int:
    """Workers to simulate so the measured window holds about ``target_requests``; all of
    them where sampling would be wrong (:func:`sampling_refusal`)."""
    n = s.workers.count
    if sampling_refusal(s):
        return n
    rate = s.traffic.rate_rps or 0.0
    window = max(s.duration_s - s.warmup_s, 1e-9)
    if rate * window <= target_requests:
        return n
    return min(n, max(minimum, math.ceil(n * target_requests / (rate * window))))


def sample_fleet(s: Scenario, k: int) -> Scenario:
    """The scenario with ``k`` of its ``N`` workers and ``k/N`` of its traffic.

    Raises ValueError when sampling would not be exact (see :func:`sampling_refusal`).
    """
    n = s.workers.count
    if not 1 <= k <= n:
        raise ValueError(f"sample of {k} workers: must lie in 1..{n} (workers.count)")
    if k == n:
        return s
    why = sampling_refusal(s)
    if why:
        raise ValueError(f"fleet sampling would be wrong here: {why}")
    traffic = s.traffic.model_copy(update={"rate_rps": s.traffic.rate_rps * k / n})
    workers = s.workers.model_copy(update={"count": k})
    return s.model_copy(update={"traffic": traffic, "workers": workers, "logging": None})


def scale_summary(summary: dict, n: int, k: int) -> dict:
    """A sampled run's summary restated for the whole fleet of ``n``: latency, utilization
    and batch sizes stand as measured; throughput, workers and cost scale by ``n / k``."""
    f = n / k
    out = {**summary}
    out["requests"] = {**summary["requests"], "throughput_rps": summary["requests"]["throughput_rps"] * f}
    out["workers"] = {**summary["workers"], "count": n, "sampled": k}
    fleet = summary.get("fleet") or {}
    scaled = {key: fleet[key] * f for key in ("active_mean", "billed_mean", "active_max") if key in fleet}
    out["fleet"] = {**fleet, **scaled}
    c = summary["cost"]
    out["cost"] = {**c, "per_hour_usd": c["per_hour_usd"] * f, "gpu_hours_per_day": c["gpu_hours_per_day"] * f}
    out["timeline"] = [{k: v * f if k in FLEET_WIDE else v for k, v in row.items()} for row in summary["timeline"]]
    return out
