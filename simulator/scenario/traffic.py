"""Traffic: the SLA, arrivals and traffic classes of a scenario."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from simulator.scenario.frozen import Frozen
from simulator.scenario.servicetime import ServiceTime
from simulator.scenario.shapes import Constant, Shape
from simulator.scenario.tokens import Tokens


class SLA(Frozen):
    """The latency objective the run is judged against."""

    percentile: float = Field(99.0, gt=0, lt=100, description="Latency percentile the SLA is set on, e.g. 99.")
    target_ms: float = Field(gt=0, description="End-to-end latency target at that percentile, in ms.")
    count_dropped: bool = Field(
        True, description="Rejected, timed-out and failed requests count as SLA misses (false: ignored)."
    )
    ttft_ms: float | None = Field(
        None, gt=0, description="LLM: time to first token at the percentile, ms, client to client (none: not judged)."
    )
    tpot_ms: float | None = Field(
        None, gt=0, description="LLM: time per output token after the first at the percentile, ms (none: not judged)."
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
    tokens: Tokens | None = Field(
        None, description="LLM requests: prompt and output token lengths (with batching.kind continuous)."
    )
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
        elif self.users is not None:
            if self.rate_rps is not None or not isinstance(self.shape, Constant):
                raise ValueError(
                    "traffic.tokens.sessions.users sets its own rate (users wait for their answers): drop "
                    "traffic.rate_rps and shape"
                )
        elif self.shape.absolute:
            if self.rate_rps is not None:
                raise ValueError(f"a {self.shape.kind} shape sets its own rates: drop traffic.rate_rps")
        elif self.rate_rps is None:
            raise ValueError("traffic needs rate_rps (or arrivals_file, or a steps/ramp/rate_trace shape)")
        return self

    @property
    def users(self) -> int | None:
        """A fixed population of users (``tokens.sessions.users``), where there is one."""
        ses = self.tokens.sessions if self.tokens is not None else None
        return None if ses is None else ses.users
