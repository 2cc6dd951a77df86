"""The scenario: frozen pydantic models validated once at load.

A scenario describes one serving system end to end, in the order a request sees it:
traffic → network → router → features → preprocess → batching → workers →
postprocess → network back. Units are in the field names; every field is described,
so ``servesim schema`` doubles as the reference. Nothing here does I/O: files named
by a scenario are read by :mod:`simulator.scenario.loader` after validation.

The sections live by area (:mod:`~simulator.scenario.traffic`, :mod:`~simulator.scenario.path`,
:mod:`~simulator.scenario.fleet`); this module assembles them into :class:`Scenario`, with the
checks that span sections, and exports every section under one name.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from simulator.scenario.distributions import (
    Deterministic,
    Empirical,
    Exponential,
    Gamma,
    LogNormal,
    Uniform,
)
from simulator.scenario.fleet import Batching, ColdStart, Cost, Crash, Failures, Workers
from simulator.scenario.frozen import Frozen
from simulator.scenario.path import (
    Activator,
    Cache,
    Caches,
    Features,
    KVStore,
    Network,
    Postprocess,
    PredictionLog,
    Preprocess,
    Router,
    Slowdown,
    Window,
)
from simulator.scenario.servicetime import Affine, ServiceTime, Table
from simulator.scenario.traffic import SLA, Traffic, TrafficClass


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


__all__ = [
    "SLA",
    "Activator",
    "Batching",
    "Cache",
    "Caches",
    "ColdStart",
    "Cost",
    "Crash",
    "Failures",
    "Features",
    "KVStore",
    "Napkin",
    "Network",
    "Postprocess",
    "PredictionLog",
    "Preprocess",
    "Router",
    "Scenario",
    "Slowdown",
    "Traffic",
    "TrafficClass",
    "Window",
    "Workers",
]
