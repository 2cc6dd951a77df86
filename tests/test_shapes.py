"""Traffic shapes: thinned non-homogeneous Poisson arrivals against their rate functions.

Per 1 s interval the count is Poisson with mean ∫λ; each interval's z-score and the
chi-square over all intervals must be plausible (bounds from the statistics, not pins).
"""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError

from simulator.scenario.config import Traffic
from simulator.scenario.loader import load_scenario
from simulator.scenario.shapes import MMPP, Shape, rate_function
from simulator.stages.arrivals import arrivals

DURATION_S = 200.0


def expected_counts(rate, edges_s):
    fine = np.linspace(edges_s[0], edges_s[-1], (len(edges_s) - 1) * 400 + 1)
    lam = rate(fine)
    cum = np.concatenate([[0.0], np.cumsum((lam[1:] + lam[:-1]) / 2 * np.diff(fine))])
    return np.diff(np.interp(edges_s, fine, cum))


def assert_poisson_counts(times_ms, expected, edges_s):
    counts, _ = np.histogram(times_ms / 1000.0, bins=edges_s)
    live = expected > 0
    assert counts[~live].sum() == 0
    z = (counts[live] - expected[live]) / np.sqrt(expected[live])
    dof = live.sum()
    chi2 = float((z**2).sum())
    assert np.abs(z).max() < 5.5, f"an interval is off by {np.abs(z).max():.1f} sd"
    assert abs(chi2 - dof) < 6 * np.sqrt(2 * dof), f"chi2 {chi2:.0f} for {dof} intervals"


SHAPES = {
    "constant": ({"rate_rps": 300}, {"kind": "constant"}),
    "diurnal": ({"rate_rps": 300}, {"kind": "diurnal", "peak_to_mean": 1.8, "period_s": 80, "peak_at_s": 10}),
    "bursts": (
        {"rate_rps": 200},
        {
            "kind": "bursts",
            "bursts": [
                {"start_s": 50, "duration_s": 20, "multiplier": 3},
                {"start_s": 60, "duration_s": 30, "multiplier": 0.5},
            ],
        },
    ),
    "steps": (
        {},
        {
            "kind": "steps",
            "steps": [{"at_s": 0, "rate_rps": 100}, {"at_s": 70.5, "rate_rps": 900}, {"at_s": 120, "rate_rps": 0}],
        },
    ),
    "ramp": ({}, {"kind": "ramp", "from_rps": 50, "to_rps": 800, "start_s": 20, "end_s": 150}),
    "rate_trace": ({}, {"kind": "rate_trace", "times_s": [0, 30, 31, 100], "rates_rps": [100, 2000, 300, 600]}),
}


@pytest.mark.parametrize("name", SHAPES)
def test_nhpp_counts_match_the_rate_function(name):
    base, shape = SHAPES[name]
    traffic = Traffic(**base, shape=shape)
    edges = np.arange(0, DURATION_S + 1, 1.0)
    rate = rate_function(traffic.shape, traffic.rate_rps, DURATION_S, rng=np.random.default_rng(0))
    expected = expected_counts(rate, edges)
    t, _ = arrivals(traffic, DURATION_S * 1000, rng=np.random.default_rng(42))
    assert (np.diff(t) >= 0).all()
    assert_poisson_counts(t, expected, edges)


def test_mmpp_mean_rate_and_burstiness():
    shape = MMPP(high_multiplier=5, mean_low_s=8, mean_high_s=2)
    traffic = Traffic(rate_rps=100, shape=shape)
    counts = []
    for seed in range(20):
        t, _ = arrivals(traffic, 200_000, rng=np.random.default_rng(seed))
        counts.append(np.histogram(t, bins=np.arange(0, 200_001, 1000))[0])
    counts = np.concatenate(counts)
    mean = 100 * (8 + 5 * 2) / 10
    assert counts.mean() == pytest.approx(mean, rel=0.05)
    assert counts.var() > 3 * counts.mean()  # far burstier than Poisson (dispersion 1)


@pytest.mark.parametrize(
    ("traffic", "message"),
    [
        ({"rate_rps": 10, "shape": {"kind": "steps", "steps": [{"at_s": 0, "rate_rps": 1}]}}, "sets its own rates"),
        ({"shape": {"kind": "diurnal", "peak_to_mean": 1.5}}, "needs rate_rps"),
        ({"rate_rps": 10, "shape": {"kind": "diurnal", "peak_to_mean": 3}}, "less than or equal to 2"),
        ({"shape": {"kind": "steps", "steps": [{"at_s": 5, "rate_rps": 1}]}}, "first step"),
        ({"shape": {"kind": "ramp", "from_rps": 1, "to_rps": 2, "start_s": 5, "end_s": 5}}, "after start_s"),
    ],
)
def test_invalid_shapes(traffic, message):
    with pytest.raises(ValidationError, match=message):
        Traffic(**traffic)


def test_rate_trace_file_relative_to_the_scenario(tmp_path):
    (tmp_path / "rates.csv").write_text("time_s,rate_rps\n0,100\n10,400\n")
    scn = tmp_path / "s.yaml"
    scn.write_text(
        "name: t\nduration_s: 20\nsla: {target_ms: 10}\n"
        "traffic: {shape: {kind: rate_trace, file: rates.csv}}\n"
        "workers: {count: 8, service_time: {kind: exponential, mean_ms: 1}}\n"
    )
    s = load_scenario(scn)
    assert s.traffic.shape.rates_rps == (100.0, 400.0)
    (tmp_path / "one.csv").write_text("100\n200\n300\n")
    one = TypeAdapter(Shape).validate_python({"kind": "rate_trace", "file": "one.csv"}).resolve_files(tmp_path)
    assert one.times_s == (0.0, 1.0, 2.0)
