"""The shape of a run's summary: what ``servesim run --json`` writes, and what the report,
sampling, the dashboard and ``explain`` read.

A :class:`Summary` is a plain dict (so the JSON is exactly it), typed section by section
here, so that every reader and writer names the same keys with the same meaning.
Percentile tables (``latency_ms``) map a stage to its p50, p95, p99, p999 and mean (ms).
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class ScenarioId(TypedDict):
    name: str
    hash: str  # of the validated scenario; with the seed it identifies the run


class Requests(TypedDict):
    """Counts over the measurement window (arrivals after warm-up)."""

    arrived: int
    completed: int
    rejected: int  # queue full, no worker, or the activator's timeout
    timed_out: int  # in a batch queue (batching.timeout_ms / deadline_ms)
    failed: int  # the feature fetch gave up
    crashed: int  # lost with a crashed worker
    errors: int  # the canary's errors
    degraded: int  # completed with default features
    throughput_rps: float  # completed per second of the window
    window_s: float


class Latency(TypedDict):
    e2e: dict[str, float]  # percentile -> ms
    stages: dict[str, dict[str, float]]  # stage -> percentile -> ms


class SLAVerdict(TypedDict):
    percentile: float
    target_ms: float
    attained_ms: float  # the percentile of the completed requests' latency
    met: bool
    attainment: float  # share of requests within the target (dropped ones count as misses)
    # met: the percentile within the target, and at least percentile% of all requests within it


class Utilization(TypedDict):
    workers: float  # busy share of the serving workers' time
    per_worker: list[float]
    of_peak_capacity: float  # GPU-served requests over what full batches could serve


class BatchSizes(TypedDict):
    mean: float
    counts: dict[int, int]  # batch size -> batches started in the window


class Fleet(TypedDict, total=False):
    active_mean: float
    billed_mean: float
    active_max: int
    events: list[dict[str, Any]]
    pools: dict[str, float]  # prefill and decode apart: each pool's replicas serving on average
    billed_by_type: dict[str, float]  # a mixed fleet that scaled: each GPU type's replicas billed on average


class Workers(TypedDict):
    count: int
    instances: int
    instance_type: str
    mix: dict[str, int]  # replicas of other GPU types within count (workers.mix)


class Cost(TypedDict):
    per_hour_usd: float
    per_million_requests_usd: float
    price_per_worker_hour_usd: float
    experiment_pools_per_hour_usd: float  # the canary's, the own-pool shadow's, own-pool classes'
    experiments_per_hour_usd: float  # what the shadow and the canary cost, shared or own pool
    experiments_fraction: float
    gpu_hours_per_day: float
    market: str  # on_demand, spot, or override


class CacheStats(TypedDict):
    hit_ratio: float
    lookups: int


class Sim(TypedDict):
    wall_s: float  # the simulation and its summary
    requests: int  # simulated, warm-up included
    requests_per_wall_s: float
    seed: int
    start_s: NotRequired[float]  # numba's start, once per process, outside wall_s (simulator.jit)
    simulate_s: NotRequired[float]  # of wall_s, the simulation's (the rest: its summary); a run held whole


class Summary(TypedDict):
    """Every headline number of a run."""

    scenario: ScenarioId
    requests: Requests
    latency_ms: Latency
    sla: SLAVerdict
    utilization: Utilization
    batch_size: BatchSizes
    fleet: Fleet
    workers: Workers
    cost: Cost
    logging: dict[str, Any] | None  # the prediction-log pipeline, when modelled
    experiments: dict[str, Any] | None  # versions (canary) and the shadow, when there are any
    classes: dict[str, dict[str, Any]] | None  # per traffic class, when there are any
    caches: dict[str, CacheStats]  # result / feature, those modelled
    llm: dict[str, Any] | None  # TTFT, TPOT, tokens, goodput (batching.kind continuous)
    timeline: list[dict[str, float]]  # one row per interval; columns in timeline.COLUMNS
    sim: Sim
