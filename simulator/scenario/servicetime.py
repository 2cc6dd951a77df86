"""Batch service-time models of a GPU worker: how long a batch of B requests takes.

``affine`` (base + per item × B) and ``table`` (measured per batch size) scale with B and
take a mean-one multiplicative noise: log-normal with ``noise_cv``, or the measured ratios
of a calibration (``noise_ratios``), resampled, whose right tail a log-normal fitted to the
body misses (on the reference server, the 99th percentile ratio was 1.44 against the 1.20
of a log-normal with the same robust spread). Any plain distribution is batch-size
independent.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from simulator.scenario.distributions import Deterministic, Empirical, Exponential, Gamma, LogNormal, Uniform
from simulator.scenario.frozen import Frozen


def check_after_idle(
    table: dict[float, float] | None, name: str = "after_idle", key: str = "idle ms", keys: str = "idle times"
) -> None:
    """An ``after_idle`` table ({idle ms: factor}; or another ``name``'d table of factors by
    ``key``, its ``keys``) that can run: two points or more, keys finite and >= 0, factors
    finite and > 0 (a ValueError naming it otherwise)."""
    if table is None:
        return
    if len(table) < 2:
        raise ValueError(f"{name}: at least two ({key}: factor) points")
    if any(not np.isfinite(k) or k < 0 for k in table):
        raise ValueError(f"{name}: {keys} must be finite and >= 0 {key.split()[-1]}")
    if any(not np.isfinite(v) or v <= 0 for v in table.values()):
        raise ValueError(f"{name}: factors must be finite and > 0")


class _Noisy(Frozen):
    """The mean-one noise factor of a batch-size dependent service time."""

    noise_cv: float = Field(0.0, ge=0, description="cv of the log-normal multiplicative noise (0: deterministic).")
    noise_ratios: tuple[float, ...] | None = Field(
        None,
        description=(
            "Measured ratios of batch time to the mean (averaging 1), resampled with replacement instead of the "
            "log-normal: a calibration's residuals, their tail included."
        ),
    )

    after_idle: dict[float, float] | None = Field(
        None,
        description=(
            "Batch time factor by how long the instance sat idle before the batch (idle ms: factor), "
            "interpolated, flat beyond the ends: a host whose caches and clocks cool while its instance "
            "waits runs the next batch slower (fitted by servesim calibrate; none: every batch alike)."
        ),
    )

    by_rate: dict[float, float] | None = Field(
        None,
        description=(
            "Batch time factor by the instance's recent throughput (requests/s: factor), interpolated, flat "
            "beyond the ends: the requests it took into batches, an exponential average over rate_window_ms "
            "before the batch. A host that has been busy runs a batch faster than one coming out of a quiet "
            "spell, beyond the idle just before it (fitted by servesim calibrate; none: every batch alike)."
        ),
    )
    rate_window_ms: float = Field(
        500.0, gt=0, allow_inf_nan=False, description="Time constant of by_rate's average of the throughput, ms."
    )
    rate_of: Literal["batches", "arrivals"] = Field(
        "batches",
        description=(
            "What by_rate's average counts: the requests the instance took into batches (batches, the default), "
            "or its share of the requests that reached its batch queue (arrivals: the queue's arrivals over the "
            "pool's instances). The arrivals are the load the host is given; its own fast spells cannot raise "
            "them, so a short rate_window_ms follows the load without feeding the host's speed back on itself."
        ),
    )
    rate_initial_rps: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description=(
            "Each instance's recent throughput when the run starts (requests/s), as if it had run at that rate "
            "before: a run that continues a busy spell (a calibration's slice after the one before it) rather than "
            "an instance idle until then (0, the default). Read by by_rate."
        ),
    )
    after_batch: dict[float, float] | None = Field(
        None,
        description=(
            "Batch time factor by the size of the batch its instance ran before it (requests: factor), "
            "interpolated, flat beyond the ends; an instance's first batch takes none. A big batch leaves the "
            "next one slower (a CPU ResNet: a batch of one 10% slower after a batch of 8 than after one; "
            "fitted by servesim calibrate; none: every batch alike)."
        ),
    )

    by_queue: dict[float, float] | None = Field(
        None,
        description=(
            "Batch time factor by the requests waiting in the batch queue as the batch is taken, its own "
            "included (requests: factor), interpolated, flat beyond the ends: a host runs faster while a backlog "
            "waits, beyond its recent throughput (by_rate). Measured against the load generator's schedule, "
            "which the host cannot move (fitted by servesim calibrate; none: every batch alike)."
        ),
    )

    @model_validator(mode="after")
    def _idle(self):
        check_after_idle(self.after_idle)
        check_after_idle(self.by_rate, "by_rate", "requests/s", "rates")
        check_after_idle(self.after_batch, "after_batch", "requests", "sizes")
        check_after_idle(self.by_queue, "by_queue", "requests", "counts")
        if self.rate_of != "batches" and not self.by_rate:
            raise ValueError("rate_of says what by_rate's average counts: give by_rate with it")
        if self.rate_initial_rps > 0 and not self.by_rate:
            raise ValueError("rate_initial_rps is the throughput by_rate reads: give by_rate with it")
        return self

    @model_validator(mode="after")
    def _noise(self):
        if self.noise_ratios is None:
            return self
        r = np.asarray(self.noise_ratios, dtype=float)
        if len(r) < 10 or not np.isfinite(r).all() or (r <= 0).any():
            raise ValueError("noise_ratios: at least 10 positive, finite ratios")
        if abs(float(r.mean()) - 1.0) > 0.01:
            raise ValueError(f"noise_ratios must average 1 (a mean-one factor); these average {r.mean():.4f}")
        if self.noise_cv:
            raise ValueError("give noise_cv or noise_ratios, not both")
        return self


class Affine(_Noisy):
    """Batch service time base_ms + per_item_ms × B, times a mean-one noise factor."""

    kind: Literal["affine"] = "affine"
    base_ms: float = Field(ge=0, description="Fixed cost of a batch (launch, transfer), ms.")
    per_item_ms: float = Field(ge=0, description="Marginal cost per request in the batch, ms.")

    @model_validator(mode="after")
    def _takes_time(self) -> Affine:
        if self.base_ms + self.per_item_ms <= 0:
            raise ValueError("base_ms and per_item_ms are both 0: a batch must take some time")
        return self


class Table(_Noisy):
    """Measured batch service time per batch size, linearly interpolated (and extrapolated at the ends)."""

    kind: Literal["table"] = "table"
    batch_ms: dict[int, float] = Field(description="Mean service time in ms, keyed by batch size.")

    @model_validator(mode="after")
    def _valid(self) -> Table:
        if not self.batch_ms:
            raise ValueError("table batch_ms is empty")
        if min(self.batch_ms) < 1 or min(self.batch_ms.values()) <= 0:
            raise ValueError("table batch sizes must be >= 1 and times > 0")
        return self


class ProfileRef(Frozen):
    """The batch service time fitted by ``servesim calibrate``: a profile.json's ``service_time``.

    The loader reads the file and puts the fitted affine or table model in its place.
    """

    kind: Literal["profile"] = "profile"
    path: str = Field(description="Calibration profile (JSON), relative to the scenario file.")

    def resolve(self, base_dir) -> Affine | Table:
        """The fitted model (raises OSError, ValueError)."""
        import json
        from pathlib import Path

        target = Path(base_dir) / self.path
        doc = json.loads(target.read_text())
        if not isinstance(doc, dict) or doc.get("schema_version") != 1 or "service_time" not in doc:
            raise ValueError(f"{target}: not a servesim calibration profile (schema_version 1)")
        model = Table if doc["service_time"].get("kind") == "table" else Affine
        # the fit's quality (R², batch count, stalls, residuals) rides along in the profile
        return model.model_validate({k: v for k, v in doc["service_time"].items() if k in model.model_fields})


ServiceTime = Annotated[
    Affine | Table | ProfileRef | Deterministic | Exponential | LogNormal | Gamma | Uniform | Empirical,
    Field(discriminator="kind"),
]
