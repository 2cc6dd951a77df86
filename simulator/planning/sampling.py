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

**Autoscaled fleets** are sampled one worker in every f = N/k: the sample starts with k
workers, its replica bounds are the fleet's divided by f, and its HPA decides from the
sample's own metric: a per-worker average (in flight, queue depth, utilization) or a
windowed p99, which the sample measures of the fleet without bias; each worker's cold start
is its own. So the sampled fleet follows the full one at f times coarser steps, not
exactly: a decision is rounded up to whole sample workers (f full ones), and the HPA's "+4
pods per period" allows a small fleet more relative growth. Measured on the autoscaling
scenario at 4 times its size against 1 worker in 4 (6 replications each): p50 22.70 and
22.31 ms, p99 1,057.4 and 1,057.6 ms, 12.5% of requests dropped in both, 39.2 and 39.6
workers serving on average (at 1 in 10: p50 −1.4%, workers +0.7%); ``tests/test_plan.py``
keeps that check (slow). A Knative KPA is refused: its panic mode reads the fleet's total,
which the sample sees f times noisier (13.3% dropped against 14.8%, 4 replications).

It would be wrong where workers interact or the fleet is not a set of independent
queues: one shared queue or least-loaded routing (a request's wait depends on every
worker), round-robin (each worker sees every N-th arrival, a smoother process than every
k-th), failures (a crashed worker's load moves to the others), finite shared stations
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
    if s.workers.failures is not None:
        reasons.append("workers.failures redistribute load across the fleet")
    if s.router.canary is not None or s.router.shadow is not None or s.router.activator is not None:
        reasons.append("a canary, shadow or activator pool is sized on its own")
    if s.traffic.classes:
        reasons.append("traffic.classes share quotas across the pool")
    if s.workers.mix:
        reasons.append("workers.mix: the replicas are not alike, so a few of them do not stand for the fleet")
    if getattr(s.batching, "disaggregation", None) is not None:
        reasons.append("batching.disaggregation hands each prompt to the least-loaded decode replica of the fleet")
    if s.traffic.arrivals_file is not None:
        reasons.append("traffic.arrivals_file is replayed as is")
    if getattr(s.traffic.shape, "absolute", False):
        reasons.append(f"traffic.shape {s.traffic.shape.kind!r} carries absolute rates")
    if s.preprocess.cpu_workers is not None:
        reasons.append("preprocess.cpu_workers is a CPU pool shared by all traffic")
    if s.features.store is not None:
        reasons.append("features.store has finite capacity shared by all traffic")
    if s.platform.speed is not None and s.platform.speed.scope == "host":
        reasons.append("platform.speed (scope: host) slows the whole fleet at once")
    if s.caches.result is not None or s.caches.feature is not None:
        reasons.append("a cache's hit ratio depends on the whole key stream")
    return "; ".join(reasons) or None


def _autoscaled_refusal(s: Scenario, k: int) -> str | None:
    """Why ``k`` of an autoscaled fleet cannot stand for it, or None: the sample must be
    one worker in every f (an integer), and the replica bounds whole multiples of f."""
    a = s.workers.autoscaler
    if a is None:
        return None
    if a.policy != "hpa":
        return (
            "a Knative autoscaler's panic mode reads the fleet's total, which a sample sees f times noisier "
            "(measured at 1 worker in 4: 13.3% of requests dropped against the full fleet's 14.8%)"
        )
    n = s.workers.count
    ok = [
        j for j in range(1, n + 1) if n % j == 0 and a.min_replicas % (n // j) == 0 and a.max_replicas % (n // j) == 0
    ]
    if n % k == 0 and k in ok:
        return None
    return (
        f"an autoscaled fleet is sampled one worker in every f: K must divide workers.count ({n}) and leave "
        f"min_replicas ({a.min_replicas}) and max_replicas ({a.max_replicas}) whole multiples of f; "
        f"K = {', '.join(map(str, ok))}"
    )


def auto_sample_size(s: Scenario, target_requests: float = 100_000.0, minimum: int = 4) -> int:
    """Workers to simulate so the measured window holds about ``target_requests``; all of
    them where sampling would be wrong (:func:`sampling_refusal`)."""
    n = s.workers.count
    if sampling_refusal(s) or s.autoscaled:  # plan and explain: fixed fleets only
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
    why = sampling_refusal(s) or _autoscaled_refusal(s, k)
    if why:
        raise ValueError(f"fleet sampling would be wrong here: {why}")
    traffic = s.traffic.model_copy(update={"rate_rps": s.traffic.rate_rps * k / n})
    update: dict = {"count": k}
    a = s.workers.autoscaler
    if a is not None:  # the sample's autoscaler reads the sample's own metric, with its bounds scaled
        f = n // k
        update["autoscaler"] = a.model_copy(
            update={"min_replicas": a.min_replicas // f, "max_replicas": a.max_replicas // f}
        )
    workers = s.workers.model_copy(update=update)
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
