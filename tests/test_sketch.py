"""Percentiles of streamed runs: the sketch's stated error, merging, and the reduced summary.

The sketch's guarantee is relative to the value of rank ⌊q (n − 1)⌋ (``method="lower"``);
``np.percentile``'s default interpolates between two ranks, which in a sparse tail can
differ from either by more than 0.5%, so the checks compare against the rank value.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from simulator import load_scenario, simulate
from simulator.results.records import STAGES
from simulator.results.reduce import Reduction, summarize
from simulator.results.sketch import RELATIVE_ACCURACY, LatencySketch
from simulator.results.stats import window
from simulator.streaming import stream
from tests.helpers import ROOT

QS = (0.5, 0.9, 0.95, 0.99, 0.999)
NOISY = [
    "duration_s=8",
    "warmup_s=1",
    "traffic.classes.tagger.shape={kind: bursts, bursts: [{start_s: 2, duration_s: 4, multiplier: 4}]}",
]
BOUND = RELATIVE_ACCURACY * (1 + 1e-9)


def _rel(est: float, exact: float) -> float:
    return abs(est - exact) / abs(exact) if exact else abs(est)


@pytest.mark.parametrize(
    "draw",
    [
        lambda g: g.lognormal(2.0, 1.0, 400_000),  # latency-like, heavy right tail
        lambda g: g.exponential(8.0, 200_000),
        lambda g: g.gamma(0.2, 5.0, 200_000) + 1e-4,  # many tiny values
        lambda g: np.concatenate([np.zeros(2_000), g.uniform(1e-3, 1e4, 100_000)]),  # zeros, seven decades
        lambda g: np.concatenate([-g.exponential(1.0, 1_000), g.exponential(1.0, 100_000)]),  # a few negatives
    ],
)
def test_quantiles_within_the_stated_relative_error(draw):
    x = draw(np.random.default_rng(11))
    sketch = LatencySketch()
    for part in np.array_split(x, 9):
        sketch.add(part)
    exact = np.percentile(x, [q * 100 for q in QS], method="lower")
    for q, e in zip(QS, exact, strict=True):
        assert _rel(sketch.quantile(q), e) <= BOUND, (q, sketch.quantile(q), e)
    assert sketch.count == len(x)
    assert sketch.mean == pytest.approx(x.mean(), rel=1e-12, abs=1e-12)


def test_merging_equals_adding_everything_once():
    g = np.random.default_rng(3)
    parts = [g.lognormal(1.0, 0.8, 50_000) for _ in range(4)]
    whole = LatencySketch()
    whole.add(np.concatenate(parts))
    merged = LatencySketch()
    for p in parts:
        one = LatencySketch()
        one.add(p)
        merged.merge(pickle.loads(pickle.dumps(one)))  # as a Dask worker would send it
    for q in QS:
        assert merged.quantile(q) == whole.quantile(q)
    assert merged.count == whole.count


def test_bad_values_and_empty_sketch():
    sketch = LatencySketch()
    assert np.isnan(sketch.quantile(0.99))
    assert np.isnan(sketch.mean)
    with pytest.raises(ValueError, match="finite"):
        sketch.add(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="accuracy"):
        sketch.merge(LatencySketch(0.01))


@pytest.mark.parametrize(
    ("path", "overrides"),
    [
        ("inference_platform.yaml", ["duration_s=1.5", "warmup_s=0.3"]),
        ("cv_degradation.yaml", ["duration_s=40", "warmup_s=5"]),  # drops (deadlines, full queues)
        ("feature_store_outage.yaml", ["duration_s=4", "warmup_s=0.5", "features.on_timeout=fail"]),
        ("autoscaling.yaml", ["duration_s=150"]),  # a fleet that grows, cold starts, a backlog
        ("scale_to_zero.yaml", []),  # the activator's buffer and rejections
        # traffic classes: a tenant's burst on a shared pool under a quota, and on a pool of its own
        ("noisy_neighbour.yaml", [*NOISY, "traffic.classes.tagger.max_instances=5"]),
        ("noisy_neighbour.yaml", [*NOISY, "workers.count=3", "traffic.classes.tagger.workers=5"]),
    ],
)
def test_reduced_summary_matches_the_whole_run(path, overrides):
    """Counts, batches, utilization and cost exactly; percentiles within the sketch's
    error of the exact rank values; the timeline to rounding (its levels are sums taken in
    another order: the whole run's prefix sums lose about 1e-9 under a long backlog), its
    windowed percentiles exactly."""
    s = load_scenario(ROOT / "scenarios" / path, overrides)
    run = simulate(s)
    whole = summarize(run, interval_s=0.5)
    red = Reduction(s, s.seed, interval_s=0.5)
    fleet = None
    for piece in stream(s, chunk_s=0.23 if s.duration_s < 60 else 7.0):
        red.add(piece.records, piece.batches, piece.watermark_ms, pools=piece.pools)
        fleet = piece.fleet or fleet
    got = red.summary(wall_s=1.0, fleet=fleet)
    if whole["classes"] is not None:  # each class's counts and shares exactly, its percentiles from sketches
        rec = run.records
        for code, (name, table) in enumerate(whole["classes"].items()):
            mine = got["classes"][name]
            done = window(rec, s) & rec.completed & (rec.traffic_class == code)
            e2e = (rec.t_response - rec.arrival)[done]
            for key, values in (("latency_ms", e2e), ("queue_ms", rec.stage_ms("queue")[done])):
                for q_key, q in (("p50", 50), ("p99", 99), ("p999", 99.9)):
                    assert _rel(mine[key][q_key], np.percentile(values, q, method="lower")) <= BOUND, (name, key)
                del mine[key], table[key]
            verdict, exact_verdict = mine.pop("sla"), table.pop("sla")
            assert verdict["attainment"] == exact_verdict["attainment"]
            assert verdict["met"] == exact_verdict["met"]
            assert _rel(verdict["attained_ms"], np.percentile(e2e, verdict["percentile"], method="lower")) <= BOUND
            for key in ("priority", "pool", "workers", "max_instances"):
                assert mine.pop(key) == table.pop(key), key
            assert mine == pytest.approx(table, rel=1e-12)
        assert got["utilization"]["of_peak_capacity"] == pytest.approx(whole["utilization"]["of_peak_capacity"])
    assert got["fleet"] == whole["fleet"]
    if whole["logging"] is not None:  # the prediction log: volume and backlog exact, lag from its sketch
        lag_got, lag_whole = got["logging"].pop("lag_ms"), whole["logging"].pop("lag_ms")
        assert got["logging"] == whole["logging"]
        assert lag_got["mean"] == pytest.approx(lag_whole["mean"], rel=1e-9)
    assert got["requests"] == whole["requests"]
    assert got["batch_size"] == whole["batch_size"]
    assert got["utilization"]["per_worker"] == pytest.approx(whole["utilization"]["per_worker"], rel=1e-12)
    assert got["cost"].pop("market") == whole["cost"].pop("market")
    assert got["cost"] == pytest.approx(whole["cost"], rel=1e-12)
    assert got["sla"]["attainment"] == whole["sla"]["attainment"]
    assert got["sla"]["met"] == whole["sla"]["met"]
    rec = run.records
    done = window(rec, s) & rec.completed
    exact = {name: rec.stage_ms(name)[done] for name, _, _ in STAGES}
    exact["e2e"] = (rec.t_response - rec.arrival)[done]
    for name, values in exact.items():
        table = got["latency_ms"]["e2e"] if name == "e2e" else got["latency_ms"]["stages"][name]
        for key, q in (("p50", 50), ("p95", 95), ("p99", 99), ("p999", 99.9)):
            assert _rel(table[key], np.percentile(values, q, method="lower")) <= BOUND, (name, key)
        assert table["mean"] == pytest.approx(values.mean(), rel=1e-9, abs=1e-12)
    assert len(got["timeline"]) == len(whole["timeline"])
    for a, b in zip(got["timeline"], whole["timeline"], strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9, nan_ok=True), key


def test_a_long_runs_headline_is_streamed_with_the_same_numbers():
    """plan, explain and sweep price a run of over 5M requests by streaming it: its row has
    the whole run's counts and cost, and percentiles within the sketch's error."""
    from simulator.planning.replicate import headline

    s = load_scenario(ROOT / "scenarios/inference_platform.yaml", ["duration_s=1.5", "warmup_s=0.3"])
    whole, pooled = headline(s), LatencySketch()
    streamed = headline(s, chunk_s=0.4, sketch=pooled)
    for key in ("completed_rps", "dropped", "requests", "cost_per_hour_usd", "cost_per_million_usd", "met"):
        assert streamed[key] == pytest.approx(whole[key], rel=1e-12), key
    for key in ("p50_ms", "p95_ms", "p99_ms", "sla_ms"):
        assert streamed[key] == pytest.approx(whole[key], rel=0.01), key  # rank value vs interpolation
    assert pooled.count == round(whole["completed_rps"] * 1.2)
