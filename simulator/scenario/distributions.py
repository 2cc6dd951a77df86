"""Latency distributions: small validated value objects with exact moments.

Every delay in a scenario (a network hop, a KV round trip, a forward pass) is one
of these. Each validates its parameters at load time, samples vectorised with an
explicit ``numpy.random.Generator`` and knows its exact mean and variance, so the
tests can check samples against theory. All values are in milliseconds.

The union :data:`Distribution` is discriminated on ``kind``.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from simulator.scenario.frozen import Frozen

_Z99 = NormalDist().inv_cdf(0.99)


class _Dist(Frozen):
    @property
    def mean(self) -> float:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def variance(self) -> float:  # pragma: no cover - overridden
        raise NotImplementedError

    def sample(self, size: int, *, rng: np.random.Generator) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError


class Deterministic(_Dist):
    """A constant delay."""

    kind: Literal["deterministic"] = "deterministic"
    value_ms: float = Field(ge=0, description="The constant value, in ms.")

    @property
    def mean(self) -> float:
        return self.value_ms

    @property
    def variance(self) -> float:
        return 0.0

    def sample(self, size: int, *, rng: np.random.Generator) -> np.ndarray:
        return np.full(size, self.value_ms)


class Exponential(_Dist):
    """Exponential delay (memoryless), parameterised by its mean."""

    kind: Literal["exponential"] = "exponential"
    mean_ms: float = Field(gt=0, description="Mean, in ms.")

    @property
    def mean(self) -> float:
        return self.mean_ms

    @property
    def variance(self) -> float:
        return self.mean_ms**2

    def sample(self, size: int, *, rng: np.random.Generator) -> np.ndarray:
        return rng.exponential(self.mean_ms, size)


class LogNormal(_Dist):
    """Log-normal delay, given either by mean and cv or by its p50 and p99.

    The p50/p99 form is what dashboards show; the mean/cv form is what a fit gives.
    """

    kind: Literal["lognormal"] = "lognormal"
    mean_ms: float | None = Field(None, gt=0, description="Mean, in ms (with cv).")
    cv: float | None = Field(None, gt=0, description="Coefficient of variation, std/mean (with mean_ms).")
    p50_ms: float | None = Field(None, gt=0, description="Median, in ms (with p99_ms).")
    p99_ms: float | None = Field(None, gt=0, description="99th percentile, in ms (with p50_ms).")

    @model_validator(mode="after")
    def _one_form(self) -> LogNormal:
        by_moments = self.mean_ms is not None and self.cv is not None
        by_quantiles = self.p50_ms is not None and self.p99_ms is not None
        given = [f for f in ("mean_ms", "cv", "p50_ms", "p99_ms") if getattr(self, f) is not None]
        if by_moments == by_quantiles or len(given) != 2:
            raise ValueError("lognormal needs exactly one of (mean_ms, cv) or (p50_ms, p99_ms)")
        if by_quantiles and self.p99_ms <= self.p50_ms:
            raise ValueError("lognormal p99_ms must exceed p50_ms")
        return self

    @property
    def mu_sigma(self) -> tuple[float, float]:
        """Parameters of the underlying normal (log-space mean and std)."""
        if self.mean_ms is not None:
            sigma2 = math.log1p(self.cv**2)
            return math.log(self.mean_ms) - sigma2 / 2, math.sqrt(sigma2)
        sigma = math.log(self.p99_ms / self.p50_ms) / _Z99
        return math.log(self.p50_ms), sigma

    @property
    def mean(self) -> float:
        mu, sigma = self.mu_sigma
        return math.exp(mu + sigma**2 / 2)

    @property
    def variance(self) -> float:
        mu, sigma = self.mu_sigma
        return math.expm1(sigma**2) * math.exp(2 * mu + sigma**2)

    def sample(self, size: int, *, rng: np.random.Generator) -> np.ndarray:
        mu, sigma = self.mu_sigma
        return rng.lognormal(mu, sigma, size)


class Gamma(_Dist):
    """Gamma delay by mean and cv (cv < 1 is more regular than exponential)."""

    kind: Literal["gamma"] = "gamma"
    mean_ms: float = Field(gt=0, description="Mean, in ms.")
    cv: float = Field(gt=0, description="Coefficient of variation, std/mean.")

    @property
    def mean(self) -> float:
        return self.mean_ms

    @property
    def variance(self) -> float:
        return (self.cv * self.mean_ms) ** 2

    def sample(self, size: int, *, rng: np.random.Generator) -> np.ndarray:
        shape = 1.0 / self.cv**2
        return rng.gamma(shape, self.mean_ms / shape, size)


class Uniform(_Dist):
    """Uniform delay on [low_ms, high_ms]."""

    kind: Literal["uniform"] = "uniform"
    low_ms: float = Field(ge=0, description="Lower bound, in ms.")
    high_ms: float = Field(ge=0, description="Upper bound, in ms.")

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.high_ms < self.low_ms:
            raise ValueError("uniform high_ms must be >= low_ms")
        return self

    @property
    def mean(self) -> float:
        return (self.low_ms + self.high_ms) / 2

    @property
    def variance(self) -> float:
        return (self.high_ms - self.low_ms) ** 2 / 12

    def sample(self, size: int, *, rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(self.low_ms, self.high_ms, size)


class Empirical(_Dist):
    """Measured samples, inline or from a file (one value in ms per line).

    ``order: random`` resamples with replacement; ``order: sequential`` replays the
    samples in order (cycling), which lets a test feed identical inputs to the model
    and to an exact recursion. A ``file`` is read by the loader, which fills
    ``samples_ms``; relative paths are resolved against the scenario's folder.
    """

    kind: Literal["empirical"] = "empirical"
    samples_ms: tuple[float, ...] | None = Field(None, description="Sample values, in ms.")
    file: str | None = Field(None, description="File of samples in ms, one per line (or first CSV column).")
    order: Literal["random", "sequential"] = Field(
        "random", description="random: i.i.d. resampling; sequential: replay in order, cycling."
    )

    @model_validator(mode="after")
    def _has_samples(self) -> Empirical:
        if self.samples_ms is None and self.file is None:
            raise ValueError("empirical needs samples_ms or file")
        if self.samples_ms is not None:
            if len(self.samples_ms) == 0:
                raise ValueError("empirical samples_ms is empty")
            if min(self.samples_ms) < 0 or not all(math.isfinite(v) for v in self.samples_ms):
                raise ValueError("empirical samples_ms must be finite and >= 0")
        return self

    def resolve_files(self, base_dir: Path) -> Empirical:
        """Return a copy with ``samples_ms`` read from ``file`` (raises OSError/ValueError)."""
        if self.file is None or self.samples_ms is not None:
            return self
        values = read_numbers(base_dir / self.file)
        return Empirical(samples_ms=tuple(values.tolist()), file=self.file, order=self.order)

    @property
    def _values(self) -> np.ndarray:
        if self.samples_ms is None:
            raise ValueError(f"empirical file {self.file!r} was not loaded")
        return np.asarray(self.samples_ms, dtype=float)

    @property
    def mean(self) -> float:
        return float(self._values.mean())

    @property
    def variance(self) -> float:
        return float(self._values.var())

    def sample(self, size: int, *, rng: np.random.Generator) -> np.ndarray:
        return rng.choice(self._values, size)


def read_rows(path: Path) -> np.ndarray:
    """Numeric CSV rows (a header line and '#' comments skipped), as a 2-D float array."""
    rows = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        cells = [c.strip() for c in line.split("#", 1)[0].split(",") if c.strip()]
        if not cells:
            continue
        try:
            rows.append([float(c) for c in cells])
        except ValueError:
            if rows:
                raise ValueError(f"{path}:{lineno}: not a number in {line.strip()!r}") from None
    if not rows or len({len(r) for r in rows}) != 1:
        raise ValueError(f"{path}: expected rows with the same number of numeric columns")
    return np.asarray(rows, dtype=float)


def read_numbers(path: Path) -> np.ndarray:
    """The first column of a numeric CSV (see :func:`read_rows`), each value finite and >= 0."""
    values = read_rows(path)[:, 0]
    if not np.isfinite(values).all() or (values < 0).any():
        raise ValueError(f"{path}: values must be finite and >= 0")
    return values


Distribution = Annotated[
    Deterministic | Exponential | LogNormal | Gamma | Uniform | Empirical,
    Field(discriminator="kind"),
]


class Sampler:
    """Draws from one distribution with one stream; keeps the cursor of sequential replay."""

    __slots__ = ("_dist", "_pos", "_rng")

    def __init__(self, dist: _Dist, rng: np.random.Generator):
        self._dist = dist
        self._rng = rng
        self._pos = 0

    def draw(self, size: int) -> np.ndarray:
        d = self._dist
        if isinstance(d, Empirical) and d.order == "sequential":
            values = d._values
            idx = (self._pos + np.arange(size)) % len(values)
            self._pos += size
            return values[idx]
        return d.sample(size, rng=self._rng)
