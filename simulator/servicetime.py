"""Batch service-time models of a GPU worker: how long a batch of B requests takes.

``affine`` (base + per item × B) and ``table`` (measured per batch size) scale with B and
take a mean-one log-normal noise; any plain distribution is batch-size independent.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.distributions import Deterministic, Empirical, Exponential, Gamma, LogNormal, Uniform


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Affine(_Frozen):
    """Batch service time base_ms + per_item_ms × B, times a mean-one log-normal noise factor."""

    kind: Literal["affine"] = "affine"
    base_ms: float = Field(ge=0, description="Fixed cost of a batch (launch, transfer), ms.")
    per_item_ms: float = Field(ge=0, description="Marginal cost per request in the batch, ms.")
    noise_cv: float = Field(0.0, ge=0, description="cv of the multiplicative noise (0: deterministic).")


class Table(_Frozen):
    """Measured batch service time per batch size, linearly interpolated (and extrapolated at the ends)."""

    kind: Literal["table"] = "table"
    batch_ms: dict[int, float] = Field(description="Mean service time in ms, keyed by batch size.")
    noise_cv: float = Field(0.0, ge=0, description="cv of the multiplicative noise (0: deterministic).")

    @model_validator(mode="after")
    def _valid(self) -> Table:
        if not self.batch_ms:
            raise ValueError("table batch_ms is empty")
        if min(self.batch_ms) < 1 or min(self.batch_ms.values()) <= 0:
            raise ValueError("table batch sizes must be >= 1 and times > 0")
        return self


ServiceTime = Annotated[
    Affine | Table | Deterministic | Exponential | LogNormal | Gamma | Uniform | Empirical,
    Field(discriminator="kind"),
]
