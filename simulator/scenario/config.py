"""The scenario: frozen pydantic models validated once at load.

A scenario describes one serving system end to end, in the order a request sees it:
traffic → network → router → features → preprocess → batching → workers →
postprocess → network back. Units are in the field names; every field is described,
so ``servesim schema`` doubles as the reference. Nothing here does I/O: files named
by a scenario are read by :mod:`simulator.scenario.loader` after validation.
"""

from __future__ import annotations

import contextlib
from typing import Literal

from pydantic import Field, model_validator

from simulator.scenario.distributions import (
    Deterministic,
    Distribution,
    Empirical,
    Exponential,
    Gamma,
    LogNormal,
    Uniform,
    _Dist,
)
from simulator.scenario.frozen import Frozen
from simulator.scenario.servicetime import Affine, ServiceTime, Table
from simulator.scenario.shapes import Constant, Shape
from simulator.serving.autoscaler import Autoscaler
from simulator.stages.canary import Canary, Shadow


class SLA(Frozen):
    """The latency objective the run is judged against."""

    percentile: float = Field(99.0, gt=0, lt=100, description="Latency percentile the SLA is set on, e.g. 99.")
    target_ms: float = Field(gt=0, description="End-to-end latency target at that percentile, in ms.")
    count_dropped: bool = Field(
        True, description="Rejected, timed-out and failed requests count as SLA misses (false: ignored)."
    )


class TrafficClass(Frozen):
    """A tenant or model sharing the platform: its own traffic, model, SLA and latency class.

    Its requests go through the same network, router, features and preprocessing as
    everyone's, then to their own batch queue: the model's. On the shared pool every
    worker hosts every class's model and serves one batch at a time from whichever queue
    goes first (realtime before bulk, then the oldest waiting request); ``max_instances``
    caps how many of the pool's model instances one class may hold at once. With
    ``workers`` the class gets a dedicated pool instead.
    """

    rate_rps: float | None = Field(
        None, gt=0, description="Poisson arrival rate, requests per second (relative shapes multiply it)."
    )
    shape: Shape = Field(Constant(), description="How this class's rate changes over time (default: constant).")
    payload_kb: float | None = Field(None, ge=0, description="Request payload, KB (default: traffic.payload_kb).")
    response_kb: float | None = Field(None, ge=0, description="Response payload, KB (default: traffic.response_kb).")
    priority: Literal["realtime", "bulk"] = Field(
        "realtime", description="realtime batches go before bulk ones when both are ready (non-preemptive)."
    )
    service_time: ServiceTime | None = Field(
        None, description="Batch service time of this class's model (default: workers.service_time)."
    )
    sla: SLA | None = Field(None, description="This class's latency objective (default: the scenario's).")
    workers: int | None = Field(
        None, ge=1, description="A dedicated pool of this many workers (default: the shared pool, workers.count)."
    )
    max_instances: int | None = Field(
        None, ge=1, description="Quota: most shared-pool model instances serving this class at once (none: no cap)."
    )

    @model_validator(mode="after")
    def _rate_and_pool(self) -> TrafficClass:
        if self.shape.absolute:
            if self.rate_rps is not None:
                raise ValueError(f"a {self.shape.kind} shape sets its own rates: drop rate_rps")
        elif self.rate_rps is None:
            raise ValueError("a traffic class needs rate_rps (or a steps/ramp/rate_trace shape)")
        if self.workers is not None and self.max_instances is not None:
            raise ValueError("max_instances is a quota on the shared pool; a class with its own workers has none")
        return self


class Traffic(Frozen):
    """Open-loop arrivals: Poisson at ``rate_rps`` shaped over time by ``shape``, or replayed
    timestamps from ``arrivals_file``, or the sum of several traffic ``classes``."""

    rate_rps: float | None = Field(
        None, gt=0, description="Base Poisson arrival rate, requests per second (relative shapes multiply it)."
    )
    shape: Shape = Field(Constant(), description="How the rate changes over time (default: constant).")
    arrivals_file: str | None = Field(
        None, description="File of arrival timestamps in seconds, one per line (replaces rate_rps and shape)."
    )
    payload_kb: float = Field(0.0, ge=0, description="Request payload size, KB (1 KB = 1000 bytes).")
    response_kb: float = Field(0.0, ge=0, description="Response payload size, KB.")
    classes: dict[str, TrafficClass] = Field(
        {}, description="Tenants or models by name, each with its own rate (replaces rate_rps and shape)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> Traffic:
        if self.classes:
            if self.rate_rps is not None or self.arrivals_file is not None or not isinstance(self.shape, Constant):
                raise ValueError("traffic.classes set each class's rate: drop traffic.rate_rps, shape, arrivals_file")
            if len(self.classes) > 127:
                raise ValueError("at most 127 traffic classes")
        elif self.arrivals_file is not None:
            if self.rate_rps is not None or not isinstance(self.shape, Constant):
                raise ValueError("traffic.arrivals_file replays timestamps: drop rate_rps and shape")
        elif self.shape.absolute:
            if self.rate_rps is not None:
                raise ValueError(f"a {self.shape.kind} shape sets its own rates: drop traffic.rate_rps")
        elif self.rate_rps is None:
            raise ValueError("traffic needs rate_rps (or arrivals_file, or a steps/ramp/rate_trace shape)")
        return self


class Network(Frozen):
    """Client ↔ API hops: a latency per direction plus payload transfer over a bandwidth."""

    client_to_api: Distribution | None = Field(None, description="One-way latency client → API, ms.")
    api_to_client: Distribution | None = Field(None, description="One-way latency API → client, ms.")
    bandwidth_gbps: float | None = Field(
        None, gt=0, description="Per-connection bandwidth, Gbit/s, for payload transfer time (none: no transfer time)."
    )


class Activator(Frozen):
    """Knative's activator: while no worker serves, requests wait here instead of failing."""

    capacity: int | None = Field(None, ge=1, description="Most requests buffered at once (none: unbounded).")
    timeout_ms: float = Field(60_000.0, gt=0, description="A request buffered this long gets an error (rejected), ms.")


class Router(Frozen):
    """API layer and traffic router: auth, schema normalisation, version choice."""

    overhead: Distribution | None = Field(None, description="Per-request API/router processing time, ms.")
    balancing: Literal["random", "round_robin", "shared"] = Field(
        "random",
        description=(
            "How requests reach workers: random (uniform, like kube-proxy) or round_robin to per-worker batch "
            "queues, or shared: one queue feeding every instance of the pool (an M/M/c-style central queue)."
        ),
    )
    users: int = Field(100_000, ge=1, description="User population; a user's id fixes its canary bucket.")
    canary: Canary | None = Field(None, description="A candidate version on its own pool, sticky per user.")
    shadow: Shadow | None = Field(None, description="Mirror a share of primary requests to a shadow version.")
    activator: Activator | None = Field(
        None,
        description="Buffer requests while no worker serves (scale from zero, all crashed); none: reject them (503).",
    )


class KVStore(Frozen):
    """A remote KV store of finite capacity: each round trip holds one server thread."""

    threads: int = Field(ge=1, description="Server threads serving round trips concurrently.")
    per_op_ms: float = Field(0.0, ge=0, description="Thread time per round trip, ms.")
    per_key_ms: float = Field(0.0, ge=0, description="Thread time per key in a round trip, ms.")


class Window(Frozen):
    """A time window of the run."""

    start_s: float = Field(ge=0, description="Window start, s.")
    duration_s: float = Field(gt=0, description="Window length, s.")


class Slowdown(Window):
    """A window in which something takes ``multiplier`` times longer."""

    multiplier: float = Field(gt=0, description="Latency multiplier inside the window.")


class Features(Frozen):
    """Online feature fetch from a remote KV store, in batched round trips.

    ``lookups_per_request`` keys are fetched in ``ceil(lookups / batch_size)`` round trips,
    ``parallelism`` in flight at a time. ``batch_size: 1`` is one GET per key; a large
    batch is an MGET.
    """

    lookups_per_request: int = Field(0, ge=0, description="Keys fetched per request (0: no feature fetch).")
    batch_size: int = Field(1, ge=1, description="Keys per round trip (MGET size).")
    parallelism: int = Field(1, ge=1, description="Round trips in flight at once per request.")
    round_trip: Distribution | None = Field(
        None, description="Network + client latency of one round trip, ms (excludes store thread time)."
    )
    per_key_ms: float = Field(
        0.0, ge=0, description="Extra round-trip latency per key carried, ms (uncontended store)."
    )
    store: KVStore | None = Field(None, description="Finite store capacity; none means the store never queues.")
    timeout_ms: float | None = Field(
        None, gt=0, description="Client timeout of the whole fetch, ms; then on_timeout applies."
    )
    on_timeout: Literal["default", "fail"] = Field(
        "default", description="default: go on with default features (flagged degraded); fail: the request fails."
    )
    outages: tuple[Window, ...] = Field((), description="Store outages: round trips overlapping one never return.")
    slowdowns: tuple[Slowdown, ...] = Field((), description="Windows where round trips take `multiplier` times longer.")

    @model_validator(mode="after")
    def _needs_latency(self) -> Features:
        if self.lookups_per_request > 0 and self.round_trip is None and self.store is None:
            raise ValueError("features with lookups_per_request > 0 need round_trip or store")
        if self.outages and self.timeout_ms is None:
            raise ValueError("features.outages need features.timeout_ms (how long a request waits)")
        if (self.outages or self.slowdowns) and self.store is not None:
            raise ValueError("outage and slowdown windows are modelled for the uncontended store only (no store:)")
        return self


class Cache(Frozen):
    """A cache in front of a stage: Zipf key popularity, TTL, optional LRU capacity."""

    keys: int = Field(1_000_000, ge=1, description="Size of the key space (distinct inputs or entities).")
    zipf_s: float = Field(1.0, ge=0, description="Zipf exponent of key popularity (0: uniform).")
    hit_rate: float | None = Field(
        None, ge=0, le=1, description="Override: hits are independent coin flips with this probability."
    )
    ttl_s: float | None = Field(None, gt=0, description="Entry lifetime from insertion, s (none: no expiry).")
    capacity: int | None = Field(None, ge=1, description="LRU capacity in entries (none: unbounded).")
    invalidate_at_s: tuple[float, ...] = Field((), description="Times the whole cache is flushed (deploys), s.")
    hit: Distribution | None = Field(None, description="Latency of a hit, ms.")
    miss: Distribution | None = Field(None, description="Latency of the lookup on a miss, ms (before the work).")


class Caches(Frozen):
    """Optional caches: results (skip the model on a hit) and features (skip the fetch)."""

    result: Cache | None = Field(None, description="Result cache after the router, keyed by model version and input.")
    feature: Cache | None = Field(None, description="Feature cache in front of the KV store, keyed by entity.")


class Preprocess(Frozen):
    """CPU preprocessing (decode, resize, tokenise) on a pool of CPU workers, FCFS."""

    service: Distribution | None = Field(None, description="CPU time per request, ms.")
    cpu_workers: int | None = Field(
        None, ge=1, description="CPU workers in the pool (none: unlimited, preprocessing never queues)."
    )


class Batching(Frozen):
    """Dynamic batching with Triton's semantics.

    A batch forms when a model instance is free. It closes at once with
    ``max_batch_size`` requests, or with the largest preferred size available; otherwise
    it waits until the oldest queued request has waited ``max_queue_delay_ms``.
    """

    max_batch_size: int = Field(1, ge=1, description="Most requests in one batch.")
    max_queue_delay_ms: float = Field(0.0, ge=0, description="Batching window from the oldest queued request, ms.")
    preferred_batch_sizes: tuple[int, ...] = Field((), description="Sizes sent at once when reachable.")
    max_queue_size: int | None = Field(None, ge=1, description="Queued requests beyond which arrivals are rejected.")
    timeout_ms: float | None = Field(None, gt=0, description="A request queued this long is dropped (timed out), ms.")
    deadline_ms: float | None = Field(
        None,
        gt=0,
        description="End-to-end budget from the client's send, ms: a queued request past it is dropped "
        "(timed out) when a batch forms instead of being served, since nobody waits for its answer.",
    )

    @model_validator(mode="after")
    def _preferred_ok(self) -> Batching:
        bad = [b for b in self.preferred_batch_sizes if not 1 <= b <= self.max_batch_size]
        if bad:
            raise ValueError(f"preferred_batch_sizes {bad} must lie in 1..max_batch_size")
        return self


class ColdStart(Frozen):
    """What a new worker goes through before it serves (each stage a distribution, ms)."""

    provision: Distribution | None = Field(None, description="Node provisioning, ms (skipped from the warm pool).")
    image_pull: Distribution | None = Field(None, description="Container image pull, ms (skipped from the warm pool).")
    model_load: Distribution | None = Field(None, description="Loading the model onto the GPU, ms.")
    warmup: Distribution | None = Field(None, description="Warm-up requests, compilation, ms.")
    warm_pool: int = Field(
        0,
        ge=0,
        description="Pre-provisioned nodes with the image: a worker started on one "
        "skips provisioning and image pull. A removed worker's node returns to the pool.",
    )


class Crash(Frozen):
    """A scheduled worker crash."""

    at_s: float = Field(ge=0, description="When, s.")
    worker: int = Field(0, ge=0, description="Which worker (the n-th of those serving at that time).")


class Failures(Frozen):
    """Worker crashes: random (MTBF) and scheduled. Queued and in-flight requests on a
    crashed worker are lost; a replacement serves after ``mttr_s``."""

    mtbf_s: float | None = Field(None, gt=0, description="Mean time between failures of one worker, s.")
    mttr_s: float = Field(60.0, ge=0, description="Time until a crashed worker is replaced and serving, s.")
    crashes: tuple[Crash, ...] = Field((), description="Scheduled crashes.")


class Workers(Frozen):
    """The GPU worker pool: ``count`` workers, each running ``instances`` model instances."""

    count: int = Field(ge=1, description="GPU workers (one GPU each).")
    instances: int = Field(1, ge=1, description="Model instances per worker, each serving one batch at a time.")
    instance_type: str = Field(
        "a100",
        description="GPU type, a key of the instance catalog (t4, l4, a100, h100): its price, and its speed "
        "relative to measured_on.",
    )
    measured_on: str | None = Field(
        None,
        description="GPU type the service times were measured on (default: the instance_type the scenario file "
        "names); another instance_type rescales them by the catalog's relative throughput.",
    )
    service_time: ServiceTime = Field(
        description="Batch service time: affine, table, or a plain distribution (batch-size independent)."
    )
    autoscaler: Autoscaler | None = Field(None, description="Scale the fleet over time (count is the start).")
    cold_start: ColdStart = Field(ColdStart(), description="What a new worker goes through before it serves.")
    failures: Failures | None = Field(None, description="Worker crashes.")

    @model_validator(mode="after")
    def _serves(self) -> Workers:
        mean = None
        if isinstance(self.service_time, _Dist):  # a plain distribution (an unread file has no mean yet)
            with contextlib.suppress(Exception):
                mean = self.service_time.mean
        if mean is not None and not mean > 0:
            raise ValueError("workers.service_time has a mean of 0: a batch must take some time")
        a = self.autoscaler
        if a is not None and self.count > a.max_replicas:
            raise ValueError(
                f"workers.count ({self.count}) exceeds workers.autoscaler.max_replicas ({a.max_replicas}): "
                "the fleet starts above what the autoscaler may keep"
            )
        return self

    @property
    def dynamic(self) -> bool:
        """Whether the fleet changes during the run."""
        return self.autoscaler is not None or self.failures is not None


class Postprocess(Frozen):
    """Postprocessing and response serialisation."""

    service: Distribution | None = Field(None, description="Per-request time, ms.")


class PredictionLog(Frozen):
    """Asynchronous prediction logging: one record per request into a pipeline of finite bandwidth."""

    record_kb: float = Field(gt=0, description="Log record size per request, KB (input + output + metadata).")
    bandwidth_gbps: float = Field(gt=0, description="Pipeline throughput, Gbit/s.")


class Cost(Frozen):
    """How worker-hours are priced."""

    catalog: str | None = Field(None, description="Instance catalog YAML (default: the one shipped with servesim).")
    price_per_hour_usd: float | None = Field(
        None, gt=0, description="Override: price of one worker-hour, USD (ignores the catalog)."
    )
    market: Literal["on_demand", "spot"] = Field(
        "on_demand", description="Catalog price to use: on_demand, or spot (indicative; reclaimable capacity)."
    )


class Napkin(Frozen):
    """The back-of-envelope assumptions that ``servesim explain`` writes out, then checks."""

    batch_size: int | None = Field(
        None, ge=1, description="Batch size the per-worker throughput is read at (default: batching.max_batch_size)."
    )
    headroom: float = Field(0.3, ge=0, description="Fraction added on top of rate / per-worker throughput.")


class Scenario(Frozen):
    """One serving system and the traffic it sees."""

    name: str = Field(description="Short name of the scenario.")
    description: str = Field("", description="What question the scenario answers.")
    seed: int = Field(0, ge=0, description="Root seed; every random stream derives from it.")
    duration_s: float = Field(gt=0, description="Simulated seconds of arrivals.")
    warmup_s: float = Field(0.0, ge=0, description="Arrivals before this time are excluded from metrics, s.")
    sla: SLA = Field(description="Latency objective.")
    traffic: Traffic = Field(description="Arrivals and payload sizes.")
    network: Network = Field(Network(), description="Client ↔ API network hops.")
    router: Router = Field(Router(), description="API/router overhead.")
    caches: Caches = Field(Caches(), description="Result and feature caches.")
    features: Features = Field(Features(), description="Online feature fetch.")
    preprocess: Preprocess = Field(Preprocess(), description="CPU preprocessing.")
    batching: Batching = Field(Batching(), description="Dynamic batching queue.")
    workers: Workers = Field(description="GPU worker pool.")
    postprocess: Postprocess = Field(Postprocess(), description="Postprocessing and serialisation.")
    logging: PredictionLog | None = Field(None, description="Prediction logging pipeline (none: not modelled).")
    cost: Cost = Field(Cost(), description="Pricing.")
    napkin: Napkin = Field(Napkin(), description="Back-of-envelope assumptions checked by `servesim explain`.")

    @model_validator(mode="after")
    def _napkin_batch_fits(self) -> Scenario:
        b = self.napkin.batch_size
        if b is not None and b > self.batching.max_batch_size:
            raise ValueError(
                f"napkin.batch_size ({b}) exceeds batching.max_batch_size ({self.batching.max_batch_size})"
            )
        return self

    @model_validator(mode="after")
    def _activator_needs_a_changing_fleet(self) -> Scenario:
        if self.router.activator is not None and not self.workers.dynamic:
            raise ValueError("router.activator buffers while no worker serves: it needs workers.autoscaler or failures")
        return self

    @model_validator(mode="after")
    def _dynamic_fleet_needs_worker_queues(self) -> Scenario:
        if self.workers.dynamic and self.router.balancing == "shared":
            raise ValueError("autoscaling and failures need per-worker queues: router.balancing random or round_robin")
        return self

    @model_validator(mode="after")
    def _classes_supported(self) -> Scenario:
        if not self.traffic.classes:
            return self
        if self.workers.dynamic:
            raise ValueError("traffic.classes run on fixed pools: drop workers.autoscaler and workers.failures")
        if self.router.canary is not None or self.router.shadow is not None:
            raise ValueError("traffic.classes and router.canary/shadow cannot be combined yet")
        if all(c.workers is not None for c in self.traffic.classes.values()):
            raise ValueError(
                "every traffic class has its own workers: leave one on the shared pool (workers), "
                "which is then that class's dedicated pool"
            )
        slots = self.workers.count * self.workers.instances
        for name, c in self.traffic.classes.items():
            if c.max_instances is not None and c.max_instances > slots:
                raise ValueError(
                    f"traffic.classes.{name}.max_instances ({c.max_instances}) exceeds the shared pool's "
                    f"{slots} model instances"
                )
        return self

    @model_validator(mode="after")
    def _window_inside(self) -> Scenario:
        delay = self.batching.max_queue_delay_ms
        if delay >= self.duration_s * 1000:
            raise ValueError(
                f"batching.max_queue_delay_ms ({delay:g}) is not shorter than the run ({self.duration_s:g} s): "
                "a batching window is milliseconds (Triton's default is 0)"
            )
        return self

    @model_validator(mode="after")
    def _warmup_inside(self) -> Scenario:
        if self.warmup_s >= self.duration_s:
            raise ValueError(f"warmup_s ({self.warmup_s:g}) must be smaller than duration_s ({self.duration_s:g})")
        return self


__all__ = [
    "SLA",
    "Affine",
    "Batching",
    "Cost",
    "Deterministic",
    "Empirical",
    "Exponential",
    "Features",
    "Gamma",
    "KVStore",
    "LogNormal",
    "Napkin",
    "Network",
    "Postprocess",
    "Preprocess",
    "Router",
    "Scenario",
    "ServiceTime",
    "Table",
    "Traffic",
    "TrafficClass",
    "Uniform",
    "Workers",
]
