"""Model versions as a scenario sets them: a sticky canary with a rollout schedule, and
shadow (mirror) traffic (``router.canary``, ``router.shadow``). Where each request goes is
decided in :mod:`simulator.stages.canary`."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from simulator.scenario.frozen import Frozen
from simulator.scenario.servicetime import ServiceTime


class RolloutStep(Frozen):
    at_s: float = Field(ge=0, description="From this time on, s.")
    percent: float = Field(ge=0, le=100, description="Canary share of users, percent.")


class Canary(Frozen):
    """A candidate version taking a sticky share of users."""

    name: str = Field("canary", description="Version name in reports.")
    percent: float = Field(0.0, ge=0, le=100, description="Share of users, percent (ignored with a schedule).")
    schedule: tuple[RolloutStep, ...] = Field((), description="Rollout steps, e.g. 1% -> 5% -> 25% -> 100%.")
    rollback_at_s: float | None = Field(None, ge=0, description="From this time on, everyone is on the primary.")
    workers: int = Field(1, ge=1, description="Workers of the canary's own pool.")
    service_time: ServiceTime | None = Field(None, description="Batch service time (default: the primary's).")
    error_rate: float = Field(0.0, ge=0, le=1, description="Fraction of its responses that are errors.")

    @model_validator(mode="after")
    def _ordered(self) -> Canary:
        times = [s.at_s for s in self.schedule]
        if times != sorted(times):
            raise ValueError("canary schedule must be in time order")
        return self

    def share(self, t_s: np.ndarray) -> np.ndarray:
        """Canary share of users (0..1) at each time."""
        if self.schedule:
            at = np.array([s.at_s for s in self.schedule])
            pct = np.array([0.0] + [s.percent for s in self.schedule])
            share = pct[np.searchsorted(at, t_s, side="right")] / 100.0
        else:
            share = np.full(np.shape(t_s), self.percent / 100.0)
        if self.rollback_at_s is not None:
            share = np.where(t_s >= self.rollback_at_s, 0.0, share)
        return share


class Shadow(Frozen):
    """Mirror a share of requests to a shadow version; nobody waits for the copies."""

    name: str = Field("shadow", description="Version name in reports.")
    percent: float = Field(gt=0, le=100, description="Share of requests copied, percent.")
    pool: Literal["own", "shared"] = Field(
        "own", description="own: a separate pool of `workers`; shared: the copies join the primary's queues."
    )
    workers: int = Field(1, ge=1, description="Workers of the shadow's own pool.")
    service_time: ServiceTime | None = Field(None, description="Batch service time (default: the primary's).")
    measure_impact: bool = Field(
        True,
        description="shared pool: also simulate the primary without the copies (same inputs) to report the p99 "
        "the shadow adds; costs a second pass of the serving stage.",
    )
