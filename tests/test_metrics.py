"""Metric functions and service-time models, on inputs small enough to check by hand."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.results.metrics import cost, peak_throughput_rps, sla_verdict, utilization, worker_price
from simulator.scenario.config import Workers
from simulator.scenario.loader import load_scenario
from simulator.serving.workers import BatchLog, ServiceModel, mean_service_ms
from tests.helpers import ROOT


def test_sla_counts_dropped_requests_as_misses():
    e2e = np.arange(1.0, 101.0)  # 1..100 ms
    ok = sla_verdict(e2e, 95, 96.0, dropped=0)
    assert ok["met"]
    assert ok["attainment"] == pytest.approx(0.96)
    shed = sla_verdict(e2e, 95, 96.0, dropped=10)  # 96 of 110 within target
    assert shed["attained_ms"] == ok["attained_ms"]
    assert not shed["met"]
    assert shed["attainment"] == pytest.approx(96 / 110)


def test_utilization_clips_batches_to_the_window():
    log = BatchLog(
        start=np.array([0.0, 5.0, 9.0]),
        end=np.array([4.0, 8.0, 12.0]),
        size=np.array([1, 1, 1]),
        instance=np.array([0, 1, 0]),
    )
    # window [2, 10): instance 0 busy 2..4 and 9..10 = 3 ms; instance 1 busy 5..8 = 3 ms
    np.testing.assert_allclose(utilization(log, 2, 2.0, 10.0), [3 / 8, 3 / 8])


TABLE = {"kind": "table", "batch_ms": {1: 5.0, 4: 8.0, 8: 16.0}}


@pytest.mark.parametrize(("b", "ms"), [(1, 5.0), (2, 6.0), (4, 8.0), (6, 12.0), (8, 16.0), (10, 20.0)])
def test_table_interpolates_and_extrapolates(b, ms):
    w = Workers(count=1, service_time=TABLE)
    assert mean_service_ms(w, b) == pytest.approx(ms)


@pytest.mark.parametrize(("b", "ms"), [(12, 14.0), (16, 14.0), (20, 13.0), (24, 12.0), (32, 12.0), (64, 12.0)])
def test_past_a_table_that_falls_a_batch_is_never_faster_than_the_largest(b, ms):
    """A calibrated table can fall at its last sizes (rare sizes, slow batches): past its
    largest size the time stays there, where the line through its last two sizes reached
    0 ms at 36 and put a calibration's speed fit on log(0) (crashed: `ydata` must not be
    empty)."""
    w = Workers(count=1, service_time={"kind": "table", "batch_ms": {1: 5.0, 12: 14.0, 16: 14.0, 24: 12.0}})
    assert mean_service_ms(w, b) == pytest.approx(ms)


@pytest.mark.parametrize(
    "st", [{"kind": "affine", "base_ms": 4.0, "per_item_ms": 0.25, "noise_cv": 0.3}, {**TABLE, "noise_cv": 0.3}]
)
def test_service_noise_keeps_the_mean_and_has_the_cv(st):
    w = Workers(count=1, service_time=st)
    model = ServiceModel(w, 16, np.random.default_rng(3))
    x = model.draw(200_000, 8)
    mean = mean_service_ms(w, 8)
    assert x.mean() == pytest.approx(mean, rel=5 * 0.3 / np.sqrt(len(x)))
    assert x.std() / x.mean() == pytest.approx(0.3, rel=0.02)


def test_peak_throughput_of_the_platform_matches_the_napkin_operating_point(root_dir):
    s = load_scenario(root_dir / "scenarios/inference_platform.yaml")
    # full batches of 32 take 4 + 0.25 x 32 = 12 ms: 32 / 12 ms = 2,667 req/s per worker
    assert peak_throughput_rps(s) == pytest.approx(130 * 32 / 12 * 1000)
    # at batch 16 a worker does 16 / 8 ms = 2,000 req/s, the article's figure
    assert 16 / mean_service_ms(s.workers, 16) * 1000 == pytest.approx(2000)


def test_empirical_file_relative_to_the_scenario(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "svc.csv").write_text("service_ms\n1.5\n2.5 # a comment\n\n3.5\n")
    scn = tmp_path / "s.yaml"
    scn.write_text(
        "name: t\nduration_s: 1\nsla: {target_ms: 10}\ntraffic: {rate_rps: 10}\n"
        "workers: {count: 1, service_time: {kind: empirical, file: data/svc.csv}}\n"
    )
    s = load_scenario(scn)
    assert s.workers.service_time.samples_ms == (1.5, 2.5, 3.5)
    assert s.workers.service_time.mean == pytest.approx(2.5)


def test_price_override_and_catalog(root_dir):
    path = root_dir / "scenarios/inference_platform.yaml"
    default = summarize_cost(load_scenario(path))
    assert default["price_per_worker_hour_usd"] == pytest.approx(4.0966)  # the catalog's a100 row
    overrides = ["cost.price_per_hour_usd=2.5", "workers.instance_type=anything", "workers.measured_on=anything"]
    custom = summarize_cost(load_scenario(path, overrides))
    assert custom["per_hour_usd"] == pytest.approx(130 * 2.5)


def summarize_cost(s):
    return cost(s.workers.count, worker_price(s), completed_rps=s.traffic.rate_rps)


@pytest.mark.parametrize(
    "st",
    [
        {"kind": "exponential", "mean_ms": 2.0},
        {"kind": "affine", "base_ms": 1.0, "per_item_ms": 1.0, "noise_cv": 0.3},
        {"kind": "gamma", "mean_ms": 1.0, "cv": 2.0},
        {"kind": "empirical", "samples_ms": [1.0, 2.0, 3.0]},
    ],
)
def test_bulk_and_one_by_one_service_draws_give_the_same_sequence(st):
    """The fast path draws in bulk, the scheduler one batch at a time: same stream, same values."""
    w = Workers(count=1, service_time=st)
    a, b = (ServiceModel(w, 4, np.random.default_rng(5)) for _ in range(2))
    x = np.concatenate([[a(1) for _ in range(70_000)], a.draw(100_000, 1), [a(1) for _ in range(10)]])
    y = np.concatenate([b.draw(70_000, 1), [b(1) for _ in range(100_000)], b.draw(10, 1)])
    np.testing.assert_array_equal(x, y)


def test_cost_reports_gpu_hours_and_what_experiments_cost():
    from simulator.engine import simulate
    from simulator.results.reduce import summarize

    s = load_scenario(ROOT / "scenarios/canary.yaml", ["duration_s=4", "warmup_s=1"])
    c = summarize(simulate(s))["cost"]
    price = 0.8048  # l4, on demand
    own = s.router.canary.workers + s.router.shadow.workers  # both on pools of their own
    assert c["experiments_per_hour_usd"] == pytest.approx(own * price)
    assert c["experiments_fraction"] == pytest.approx(own * price / c["per_hour_usd"])
    assert c["gpu_hours_per_day"] == pytest.approx(c["per_hour_usd"] / price * 24)
    assert c["market"] == "on_demand"


def test_spot_market_prices_from_the_catalog_and_is_refused_without_one(tmp_path):
    from simulator.scenario.loader import ScenarioError

    platform = ROOT / "scenarios/inference_platform.yaml"
    assert worker_price(load_scenario(platform, ["cost.market=spot"])) == pytest.approx(1.6386)
    catalog = tmp_path / "c.yaml"
    catalog.write_text(
        "instances:\n  a100: {gpu: A100, price_per_gpu_hour_usd: 4.0, source: quote, as_of: '2026-01'}\n"
    )
    with pytest.raises(ScenarioError, match=r"cost\.market: the catalog has no spot price for 'a100'"):
        load_scenario(platform, ["cost.market=spot", f"cost.catalog={catalog}"])


def test_prices_are_resolved_at_load_and_metrics_read_no_file(tmp_path, monkeypatch):
    import pickle

    import simulator.scenario.catalog as catalog_module
    from simulator.engine import simulate
    from simulator.planning.plan import on_instance_type
    from simulator.results.reduce import summarize

    catalog = tmp_path / "quote.yaml"
    catalog.write_text(
        "instances:\n"
        "  a100: {gpu: A100, price_per_gpu_hour_usd: 3.0, source: quote, as_of: '2026-11', relative_throughput: 1.0}\n"
        "  t4: {gpu: T4, price_per_gpu_hour_usd: 0.5, source: quote, as_of: '2026-11', relative_throughput: 0.25}\n"
    )
    overrides = ["duration_s=1", "warmup_s=0", f"cost.catalog={catalog}"]
    s = load_scenario(ROOT / "scenarios/inference_platform.yaml", overrides)
    t4 = on_instance_type(s, "t4")  # a copy on another type is priced as that type
    catalog.unlink()

    def no_reading(*_args, **_kwargs):
        raise AssertionError("a metric read the catalog")

    monkeypatch.setattr(catalog_module, "load_catalog", no_reading)
    assert worker_price(s) == 3.0
    assert worker_price(t4) == 0.5
    assert worker_price(pickle.loads(pickle.dumps(t4))) == 0.5  # as a process pool or a Dask worker gets it
    assert summarize(simulate(s))["cost"]["price_per_worker_hour_usd"] == 3.0
