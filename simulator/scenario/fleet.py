"""The GPU side of a scenario: the batching queue, the workers (cold starts, failures) and
their cost."""

from __future__ import annotations

import contextlib
from typing import Annotated, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from simulator.scenario.autoscaling import Autoscaler
from simulator.scenario.distributions import (
    Distribution,
    _Dist,
)
from simulator.scenario.frozen import Frozen
from simulator.scenario.llm import ContinuousBatching
from simulator.scenario.servicetime import ServiceTime


class TritonBatching(Frozen):
    """Dynamic batching with Triton's semantics (``kind: triton``, the default).

    A batch forms when a model instance is free. It closes at once with
    ``max_batch_size`` requests, or with the largest preferred size available; otherwise
    it waits until the oldest queued request has waited ``max_queue_delay_ms``.
    """

    kind: Literal["triton"] = Field("triton", description="triton: a request-level dynamic batcher (the default).")
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
    def _preferred_ok(self) -> TritonBatching:
        bad = [b for b in self.preferred_batch_sizes if not 1 <= b <= self.max_batch_size]
        if bad:
            raise ValueError(f"preferred_batch_sizes {bad} must lie in 1..max_batch_size")
        return self


def _batching_kind(value) -> str:
    """The ``kind`` of a batching section (``triton`` when left out)."""
    kind = value.get("kind", "triton") if isinstance(value, dict) else getattr(value, "kind", "triton")
    return kind if isinstance(kind, str) else repr(kind)


BATCHING_KINDS = ("triton", "continuous")  # the first is the default

# A discriminated union on ``kind``: a new scheduler adds its section here and its module
# to simulator/serving/scheduler.py's factory (the LLM issue adds ``continuous``).
Batching = Annotated[
    Annotated[TritonBatching, Tag("triton")] | Annotated[ContinuousBatching, Tag("continuous")],
    Discriminator(
        _batching_kind,
        custom_error_type="batching_kind",
        custom_error_message=f"batching.kind must be one of: {', '.join(BATCHING_KINDS)}",
    ),
]


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
    service_time: ServiceTime | None = Field(
        None,
        description="Batch service time: affine, table, or a plain distribution (batch-size independent); "
        "an LLM engine (batching.kind continuous) has a step time instead.",
    )
    mix: dict[str, int] = Field(
        {},
        description="Replicas of other GPU types within count, by type: the last ones, in the order given "
        "(LLM replicas; each steps and holds KV as its GPU does, and is priced as its type; an autoscaler "
        "adds replicas of instance_type).",
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
        if self.mix:
            bad = [t for t, n in self.mix.items() if n < 1]
            if bad:
                raise ValueError(f"workers.mix.{bad[0]}: a count of at least 1")
            if sum(self.mix.values()) >= self.count:
                raise ValueError(
                    f"workers.mix ({sum(self.mix.values())} replicas) leaves none of workers.instance_type "
                    f"{self.instance_type!r} in workers.count {self.count}: name the main type there"
                )
            if self.instance_type in self.mix:
                raise ValueError(f"workers.mix.{self.instance_type} is workers.instance_type: count it there")
        a = self.autoscaler
        if a is not None and self.count > a.max_replicas:
            raise ValueError(
                f"workers.count ({self.count}) exceeds workers.autoscaler.max_replicas ({a.max_replicas}): "
                "the fleet starts above what the autoscaler may keep"
            )
        return self

    def types(self) -> list[str]:
        """Each worker's GPU type: ``instance_type``, then ``mix``'s in the order given."""
        rest = [t for t, n in self.mix.items() for _ in range(n)]
        return [self.instance_type] * (self.count - len(rest)) + rest

    @property
    def dynamic(self) -> bool:
        """Whether the fleet changes during the run."""
        return self.autoscaler is not None or self.failures is not None


class Cost(Frozen):
    """How worker-hours are priced."""

    catalog: str | None = Field(None, description="Instance catalog YAML (default: the one shipped with servesim).")
    price_per_hour_usd: float | None = Field(
        None, gt=0, description="Override: price of one worker-hour, USD (ignores the catalog)."
    )
    market: Literal["on_demand", "spot"] = Field(
        "on_demand", description="Catalog price to use: on_demand, or spot (indicative; reclaimable capacity)."
    )
