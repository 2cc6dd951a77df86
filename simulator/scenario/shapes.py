"""Traffic shapes: how the arrival rate changes over time.

A shape is a rate function λ(t) over the run. Non-homogeneous Poisson arrivals are
drawn exactly by thinning: a homogeneous Poisson stream at an upper bound λ_max, each
candidate kept with probability λ(t)/λ_max.

Two families:

* relative shapes multiply ``traffic.rate_rps``: ``constant``, ``diurnal`` (a sinusoid
  with ``peak_to_mean``), ``bursts`` (windows with a multiplier), ``mmpp`` (two-state
  Markov-modulated Poisson: a base and a bursty state with exponential sojourns);
* absolute shapes carry their own rates: ``steps`` (a list of time and rate), ``ramp``
  (linear between two rates), ``rate_trace`` (per-second rates from a CSV).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from simulator.scenario.distributions import read_rows
from simulator.scenario.frozen import Frozen

RateFn = Callable[[np.ndarray], np.ndarray]  # seconds -> requests per second


class _Shape(Frozen):
    absolute: ClassVar[bool] = False


class Constant(_Shape):
    """The base rate throughout."""

    kind: Literal["constant"] = "constant"


class Step(Frozen):
    at_s: float = Field(ge=0, description="From this time on, s.")
    rate_rps: float = Field(ge=0, description="Arrival rate, requests per second.")


class Steps(_Shape):
    """Piecewise-constant rates: each step holds from its time to the next."""

    kind: Literal["steps"] = "steps"
    steps: tuple[Step, ...] = Field(min_length=1, description="Steps in time order; the first at 0 s.")
    absolute: ClassVar[bool] = True

    @model_validator(mode="after")
    def _ordered(self) -> Steps:
        times = [s.at_s for s in self.steps]
        if times[0] != 0:
            raise ValueError("the first step must be at_s: 0")
        if any(b <= a for a, b in itertools.pairwise(times)):
            raise ValueError("steps must be in strictly increasing time order")
        return self


class Ramp(_Shape):
    """``from_rps`` until ``start_s``, linear to ``to_rps`` at ``end_s``, then flat."""

    kind: Literal["ramp"] = "ramp"
    from_rps: float = Field(ge=0, description="Rate before the ramp, requests per second.")
    to_rps: float = Field(ge=0, description="Rate after the ramp, requests per second.")
    start_s: float = Field(0.0, ge=0, description="Ramp start, s.")
    end_s: float = Field(gt=0, description="Ramp end, s.")
    absolute: ClassVar[bool] = True

    @model_validator(mode="after")
    def _ordered(self) -> Ramp:
        if self.end_s <= self.start_s:
            raise ValueError("ramp end_s must be after start_s")
        return self


class Diurnal(_Shape):
    """rate_rps × (1 + (peak_to_mean − 1) cos(2π (t − peak_at_s) / period_s))."""

    kind: Literal["diurnal"] = "diurnal"
    peak_to_mean: float = Field(
        ge=1, le=2, description="Peak rate over mean rate (1..2; 2 reaches zero at the trough)."
    )
    period_s: float = Field(86400.0, gt=0, description="Period, s (a day by default).")
    peak_at_s: float = Field(0.0, description="Time of the peak, s.")


class Burst(Frozen):
    start_s: float = Field(ge=0, description="Burst start, s.")
    duration_s: float = Field(gt=0, description="Burst length, s.")
    multiplier: float = Field(ge=0, description="Rate multiplier during the burst.")


class Bursts(_Shape):
    """The base rate, multiplied during each burst window (overlapping bursts multiply)."""

    kind: Literal["bursts"] = "bursts"
    bursts: tuple[Burst, ...] = Field(min_length=1, description="Burst windows.")


class MMPP(_Shape):
    """Two-state Markov-modulated Poisson: base rate, and rate × high_multiplier in bursts.

    The state alternates with exponential sojourns of mean ``mean_low_s`` and
    ``mean_high_s``, starting in the base state. Long-run mean rate:
    rate_rps × (mean_low_s + high_multiplier × mean_high_s) / (mean_low_s + mean_high_s).
    """

    kind: Literal["mmpp"] = "mmpp"
    high_multiplier: float = Field(gt=0, description="Rate multiplier in the bursty state.")
    mean_low_s: float = Field(gt=0, description="Mean sojourn in the base state, s.")
    mean_high_s: float = Field(gt=0, description="Mean sojourn in the bursty state, s.")


class RateTrace(_Shape):
    """Per-second rates from a CSV: one rate per line (second 0, 1, …) or ``time_s,rate_rps`` rows.

    Rates hold until the next row; the loader reads the file into ``times_s``/``rates_rps``.
    """

    kind: Literal["rate_trace"] = "rate_trace"
    file: str | None = Field(None, description="CSV of rates (relative to the scenario).")
    times_s: tuple[float, ...] | None = Field(None, description="Row start times, s (filled from file).")
    rates_rps: tuple[float, ...] | None = Field(None, description="Rates, requests per second (filled from file).")
    absolute: ClassVar[bool] = True

    @model_validator(mode="after")
    def _has_rates(self) -> RateTrace:
        if self.rates_rps is None and self.file is None:
            raise ValueError("rate_trace needs file (or times_s and rates_rps)")
        if self.rates_rps is not None:
            times = self.times_s if self.times_s is not None else tuple(range(len(self.rates_rps)))
            if len(times) != len(self.rates_rps) or not self.rates_rps:
                raise ValueError("rate_trace times_s and rates_rps must have the same, non-zero length")
            if min(self.rates_rps) < 0 or any(b <= a for a, b in itertools.pairwise(times)):
                raise ValueError("rate_trace rates must be >= 0 and times increasing")
        return self

    def resolve_files(self, base_dir: Path) -> RateTrace:
        """Return a copy with the rates read from ``file`` (raises OSError/ValueError)."""
        if self.file is None or self.rates_rps is not None:
            return self
        rows = read_rows(base_dir / self.file)
        if rows.shape[1] == 1:
            times, rates = np.arange(len(rows), dtype=float), rows[:, 0]
        else:
            times, rates = rows[:, 0], rows[:, 1]
        return RateTrace(file=self.file, times_s=tuple(times.tolist()), rates_rps=tuple(rates.tolist()))


Shape = Annotated[Constant | Steps | Ramp | Diurnal | Bursts | MMPP | RateTrace, Field(discriminator="kind")]


def rate_function(shape: _Shape, base_rps: float | None, duration_s: float, *, rng: np.random.Generator) -> RateFn:
    """λ(t) in requests per second for t in seconds (MMPP draws its state path from ``rng``)."""
    match shape:
        case Constant():
            return lambda t: np.full(np.shape(t), base_rps, dtype=float)
        case Steps():
            at = np.array([s.at_s for s in shape.steps])
            rates = np.array([s.rate_rps for s in shape.steps])
            return lambda t: rates[np.searchsorted(at, t, side="right") - 1]
        case Ramp():
            return lambda t: np.interp(t, [shape.start_s, shape.end_s], [shape.from_rps, shape.to_rps])
        case Diurnal():
            amp = shape.peak_to_mean - 1
            return lambda t: (
                base_rps * (1 + amp * np.cos(2 * math.pi * (np.asarray(t) - shape.peak_at_s) / shape.period_s))
            )
        case Bursts():

            def bursts(t):
                m = np.ones(np.shape(t))
                for b in shape.bursts:
                    m = np.where((t >= b.start_s) & (t < b.start_s + b.duration_s), m * b.multiplier, m)
                return base_rps * m

            return bursts
        case MMPP():
            edges, high = _mmpp_path(shape, duration_s, rng)
            levels = np.where(high, base_rps * shape.high_multiplier, base_rps)
            return lambda t: levels[np.searchsorted(edges, t, side="right") - 1]
        case RateTrace():
            at = np.asarray(shape.times_s if shape.times_s is not None else range(len(shape.rates_rps)), dtype=float)
            rates = np.asarray(shape.rates_rps)
            return lambda t: np.where(t < at[0], 0.0, rates[np.clip(np.searchsorted(at, t, side="right") - 1, 0, None)])
    raise TypeError(f"unknown shape {shape!r}")  # pragma: no cover


def rate_bound(shape: _Shape, base_rps: float | None) -> float:
    """An upper bound of λ(t) over all t (for thinning)."""
    match shape:
        case Constant():
            return base_rps
        case Steps():
            return max(s.rate_rps for s in shape.steps)
        case Ramp():
            return max(shape.from_rps, shape.to_rps)
        case Diurnal():
            return base_rps * shape.peak_to_mean
        case Bursts():
            return base_rps * math.prod(max(1.0, b.multiplier) for b in shape.bursts)
        case MMPP():
            return base_rps * max(1.0, shape.high_multiplier)
        case RateTrace():
            return max(shape.rates_rps)
    raise TypeError(f"unknown shape {shape!r}")  # pragma: no cover


def _mmpp_path(shape: MMPP, duration_s: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """State-change times (starting at 0) and whether each segment is the bursty state."""
    edges, high, t, state = [0.0], [False], 0.0, False
    while t < duration_s:
        t += rng.exponential(shape.mean_high_s if state else shape.mean_low_s)
        state = not state
        edges.append(t)
        high.append(state)
    return np.asarray(edges), np.asarray(high)
