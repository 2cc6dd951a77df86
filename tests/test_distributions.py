"""Distributions: parameter validation and samples against their exact moments."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError
from scipy import stats

from simulator.scenario.distributions import Distribution, Empirical, LogNormal, Sampler

ADAPTER = TypeAdapter(Distribution)

CASES = [
    {"kind": "deterministic", "value_ms": 3.0},
    {"kind": "exponential", "mean_ms": 2.0},
    {"kind": "lognormal", "mean_ms": 5.0, "cv": 0.8},
    {"kind": "lognormal", "p50_ms": 4.0, "p99_ms": 20.0},
    {"kind": "gamma", "mean_ms": 3.0, "cv": 0.5},
    {"kind": "gamma", "mean_ms": 3.0, "cv": 2.0},
    {"kind": "uniform", "low_ms": 1.0, "high_ms": 4.0},
    {"kind": "empirical", "samples_ms": [1.0, 2.0, 2.0, 7.5]},
]


@pytest.mark.parametrize("spec", CASES, ids=lambda c: c["kind"])
def test_sample_mean_and_variance_match_exact_moments(spec):
    d = ADAPTER.validate_python(spec)
    n = 400_000
    x = d.sample(n, rng=np.random.default_rng(12345))
    assert x.shape == (n,)
    assert (x >= 0).all()
    if d.variance == 0:
        assert np.all(x == d.mean)
        return
    # the sample mean is within 5 standard errors; the variance within 5 of its own (via the 4th moment)
    assert abs(x.mean() - d.mean) < 5 * math.sqrt(d.variance / n)
    m4 = np.mean((x - x.mean()) ** 4)
    assert abs(x.var() - d.variance) < 5 * math.sqrt((m4 - x.var() ** 2) / n)


def test_lognormal_quantile_form_hits_its_quantiles():
    d = LogNormal(p50_ms=4.0, p99_ms=20.0)
    mu, sigma = d.mu_sigma
    dist = stats.lognorm(s=sigma, scale=math.exp(mu))
    assert dist.median() == pytest.approx(4.0)
    assert dist.ppf(0.99) == pytest.approx(20.0)
    assert d.mean == pytest.approx(dist.mean())
    assert d.variance == pytest.approx(dist.var())


def test_sequential_empirical_replays_in_order_and_cycles():
    s = Sampler(Empirical(samples_ms=(1.0, 2.0, 3.0), order="sequential"), np.random.default_rng(0))
    assert s.draw(2).tolist() == [1.0, 2.0]
    assert s.draw(4).tolist() == [3.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    "spec",
    [
        {"kind": "exponential", "mean_ms": 0},
        {"kind": "exponential", "mean_ms": -1},
        {"kind": "lognormal", "mean_ms": 1.0},
        {"kind": "lognormal", "mean_ms": 1.0, "cv": 0.5, "p50_ms": 1.0},
        {"kind": "lognormal", "p50_ms": 5.0, "p99_ms": 4.0},
        {"kind": "gamma", "mean_ms": 1.0, "cv": 0.0},
        {"kind": "uniform", "low_ms": 3.0, "high_ms": 1.0},
        {"kind": "empirical", "samples_ms": []},
        {"kind": "empirical", "samples_ms": [1.0, -2.0]},
        {"kind": "weibull", "mean_ms": 1.0},
        {"kind": "exponential", "mean_ms": 1.0, "rate": 2.0},
    ],
)
def test_invalid_parameters_are_rejected(spec):
    with pytest.raises(ValidationError):
        ADAPTER.validate_python(spec)
