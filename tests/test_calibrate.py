"""Calibration: fits recover known parameters; importers read Triton's formats; and one
end-to-end calibration of a tiny model against the real server."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from calibrate.fit import fit_affine, fit_distribution
from calibrate.importers import affine_from_triton, perf_analyzer_levels, triton_batch_times


def test_affine_fit_recovers_base_slope_and_noise():
    rng = np.random.default_rng(11)
    n, base, per, cv = 4000, 5.0, 2.0, 0.1
    b = rng.integers(1, 17, n)
    sigma = np.sqrt(np.log1p(cv * cv))
    y = (base + per * b) * rng.lognormal(-sigma * sigma / 2, sigma, n)
    fit = fit_affine(b, y)
    # standard errors at this n are ~1-2% of each parameter; allow 4 of them
    assert fit["base_ms"] == pytest.approx(base, rel=0.06)
    assert fit["per_item_ms"] == pytest.approx(per, rel=0.03)
    assert fit["noise_cv_robust"] == pytest.approx(cv, rel=0.06)
    assert np.std(fit["noise_ratios"]) == pytest.approx(cv, rel=0.06)  # the ratios the simulator resamples


@pytest.mark.parametrize(
    ("family", "draw", "mean", "cv"),
    [
        (
            "lognormal",
            lambda r, n: r.lognormal(np.log(4.0) - 0.5 * np.log1p(0.25), np.sqrt(np.log1p(0.25)), n),
            4.0,
            0.5,
        ),
        ("gamma", lambda r, n: r.gamma(4.0, 0.5, n), 2.0, 0.5),
        ("exponential", lambda r, n: r.exponential(3.0, n), 3.0, 1.0),
    ],
)
def test_distribution_fit_recovers_family_and_moments(family, draw, mean, cv):
    rng = np.random.default_rng(5)
    spec = fit_distribution(draw(rng, 20_000), rng=rng)
    assert spec["fit"]["family"] == family
    assert spec["mean_ms"] == pytest.approx(mean, rel=0.03)
    if "cv" in spec:
        assert spec["cv"] == pytest.approx(cv, rel=0.05)


def test_a_shape_no_family_fits_falls_back_to_empirical():
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.normal(2.0, 0.1, 5000), rng.normal(20.0, 0.5, 5000)])  # two modes
    spec = fit_distribution(x, rng=rng)
    assert spec["kind"] == "empirical"
    assert np.median(spec["samples_ms"]) == pytest.approx(np.median(x), rel=0.5)
    with pytest.raises(ValueError, match="at least 20"):
        fit_distribution(np.ones(5), rng=rng)


def test_triton_statistics_give_the_affine_batch_time():
    base, per = 3.0, 1.5
    counts = {1: 40, 2: 30, 4: 20, 8: 10}
    stats = {
        "model_stats": [
            {
                "name": "m",
                "batch_stats": [
                    {
                        "batch_size": b,
                        "compute_input": {"count": n, "ns": int(n * 0.1e6)},
                        "compute_infer": {"count": n, "ns": int(n * (base - 0.2 + per * b) * 1e6)},
                        "compute_output": {"count": n, "ns": int(n * 0.1e6)},
                    }
                    for b, n in counts.items()
                ],
            }
        ]
    }
    times = triton_batch_times(stats, "m")
    assert times["batches"].tolist() == [40, 30, 20, 10]
    fit = affine_from_triton(stats, "m")
    assert fit["base_ms"] == pytest.approx(base, abs=1e-6)
    assert fit["per_item_ms"] == pytest.approx(per, abs=1e-6)
    with pytest.raises(ValueError, match="not in the statistics"):
        triton_batch_times(stats, "other")


def test_perf_analyzer_csv_levels(tmp_path):
    csv = tmp_path / "pa.csv"
    pd.DataFrame(
        {
            "Concurrency": [1, 2],
            "Inferences/Second": [100.0, 180.0],
            "p50 latency": [9000, 11000],
            "p90 latency": [12000, 15000],
            "p95 latency": [13000, 17000],
            "p99 latency": [15000, 21000],
        }
    ).to_csv(csv, index=False)
    levels = perf_analyzer_levels(csv)
    assert levels["p99_ms"].tolist() == [15.0, 21.0]
    assert levels["offered_rps"].tolist() == [100.0, 180.0]
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a perf_analyzer CSV"):
        perf_analyzer_levels(tmp_path / "bad.csv")


def test_end_to_end_calibration_of_a_tiny_model(tmp_path):
    pytest.importorskip("torch", reason="calibration drives the reference server (torch)")
    pytest.importorskip("aiohttp", reason="the load generator needs aiohttp")
    from calibrate.run import Design, calibrate_run

    args = ["--resolution", "32", "--width", "8", "--max-batch-size", "4", "--max-queue-delay-ms", "2"]
    short = Design(rounds=2, slice_s=1.5, min_requests=0)
    report = calibrate_run(args, tmp_path, design=short, reps=2, draws=20, log=lambda _msg: None)
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["schema_version"] == 1
    assert profile["model"]["resolution"] == 32
    assert profile["hardware"]["cpu"]
    assert profile["software"]["torch"]
    st = profile["service_time"]
    assert st["kind"] in ("affine", "table")  # whichever fits the batches better
    assert profile["service_time_fits"]["affine"]["per_item_ms"] > 0
    assert profile["server"]["max_batch_size"] == 4
    rows = report["validation"]
    assert {r["load"] for r in rows} == {0.2, 0.5, 0.7, 0.85}  # held out: not the fitted 30/60/80%
    assert all(np.isfinite(r["error_pct"]) for r in rows)
    assert profile["server"]["instance_mode"] == "process"
    assert profile["frontend"]["cpu_ms_per_request"] > 0  # the front end's CPU, from its /metrics
    assert profile["design"]["rounds"] == 2
    verdicts = {"within target", "inside prediction interval", "inside interval", "miss", "shown"}
    assert {r["verdict"] for r in rows} <= verdicts
    assert all(r["measured_lo"] <= r["measured_ms"] <= r["measured_hi"] for r in rows)
    measured = pd.read_csv(tmp_path / "measurements.csv.gz")
    assert measured.groupby("level")["slice"].nunique().eq(2).all()  # every level in each of the 2 rounds
    assert (measured.loc[measured["status"] == 200, "handoff_us"] > 0).all()
    for name in ("measurements.csv.gz", "slices.csv", "validation.json", "validation.md", "validation.png"):
        assert (tmp_path / name).stat().st_size > 0
    # the profile as a scenario: it runs, at another rate too
    from simulator.scenario.loader import load_scenario

    s = load_scenario(tmp_path / "scenario.yaml")
    assert s.preprocess.cpu_workers == profile["frontend"]["servers"]
    assert s.workers.service_time.kind == profile["service_time"]["kind"]


@pytest.mark.slow  # 40 s: the tiny model's end-to-end calibration stays in the default suite
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed (CI installs it)")
def test_end_to_end_calibration_of_the_ranker_through_redis(tmp_path):
    pytest.importorskip("torch", reason="calibration drives the reference server (torch)")
    pytest.importorskip("aiohttp", reason="the load generator needs aiohttp")
    from calibrate.run import Design, calibrate_run

    args = ["--model", "ranker", "--feature-keys", "8", "--max-batch-size", "8", "--max-queue-delay-ms", "2"]
    short = Design(rounds=2, slice_s=1.5, min_requests=0)
    report = calibrate_run(args, tmp_path, design=short, reps=2, draws=20, log=lambda _msg: None)
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["model"]["kind"] == "ranker"
    f = profile["features"]  # fitted from the server's own Redis fetch timings
    assert (f["lookups_per_request"], f["batch_size"], f["parallelism"]) == (8, 1, 1)
    assert f["store"]["threads"] == 1
    assert 0 < f["store"]["per_op_ms"] < 50
    measured = pd.read_csv(tmp_path / "measurements.csv.gz")
    assert (measured.loc[measured["status"] == 200, "feature_round_trips"] == 8).all()
    assert [r["in_flight"] for r in profile["feature_fetch_microbench"]["by_in_flight"]] == [1, 8, 32, 64, 128]
    assert "## The feature fetch under concurrency" in (tmp_path / "validation.md").read_text()
    assert {r["load"] for r in report["validation"]} == {0.2, 0.5, 0.7, 0.85}
    assert all(np.isfinite(r["error_pct"]) for r in report["validation"])


def test_a_scenario_reads_its_service_time_from_a_profile(tmp_path):
    from simulator.scenario.loader import ScenarioError, load_scenario

    profile = {"schema_version": 1, "service_time": {"kind": "table", "batch_ms": {"1": 5.0, "4": 9.0}, "r2": 0.9}}
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    text = """name: p
duration_s: 1
sla: {percentile: 99, target_ms: 100}
traffic: {rate_rps: 10}
workers:
  count: 1
  service_time: {kind: profile, path: profile.json}
"""
    (tmp_path / "s.yaml").write_text(text)
    st = load_scenario(tmp_path / "s.yaml").workers.service_time
    assert st.kind == "table"
    assert st.batch_ms == {1: 5.0, 4: 9.0}
    (tmp_path / "profile.json").write_text(json.dumps({"service_time": {}}))
    with pytest.raises(ScenarioError, match=r"line 7: workers\.service_time\.path: .*not a servesim calibration"):
        load_scenario(tmp_path / "s.yaml")


def test_round_trip_fit_recovers_per_trip_and_per_key_cost():
    from calibrate.fit import fit_round_trip

    rng = np.random.default_rng(3)
    keys = rng.integers(1, 200, 500)
    trips = np.ceil(keys / rng.choice([1, 10, 50], 500))
    ms = 0.4 * trips + 0.01 * keys + rng.normal(0, 0.02, 500)
    fit = fit_round_trip(keys, trips, ms)
    assert fit["per_round_trip_ms"] == pytest.approx(0.4, rel=0.02)
    assert fit["per_key_ms"] == pytest.approx(0.01, rel=0.05)


def test_calibrate_fit_command_on_the_committed_measurements(tmp_path):
    from typer.testing import CliRunner

    from servesim.cli import app
    from tests.helpers import ROOT

    config = {
        "max_batch_size": 8,
        "dynamic_batching": {"max_queue_delay_microseconds": 2000, "default_queue_policy": {"max_queue_size": 256}},
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": {"servesim": {"device": "cpu", "threads": 1, "model": {"kind": "resnet", "resolution": 64}}},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    csv = ROOT / "calibrate/profiles/cpu-resnet64/measurements.csv.gz"
    args = ["calibrate", "fit", str(csv), "--config", str(tmp_path / "config.json"), "--fit-levels", "1,3,5"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 0, result.output
    profile = json.loads((tmp_path / "p.json").read_text())
    assert profile["server"]["max_batch_size"] == 8
    assert profile["stages"]["preprocess"]["fit"]["n"] > 100
    missing = ["--config", str(tmp_path / "nope.json"), "--fit-levels", "1", "--out", str(tmp_path / "x.json")]
    bad = CliRunner().invoke(app, [*args[:3], *missing])
    assert bad.exit_code == 2
    assert "nope.json" in bad.output


def test_fit_profile_from_synthetic_requests_recovers_the_round_trip():
    from calibrate.fit import fit_profile

    rng = np.random.default_rng(8)
    n = 3000
    b = rng.integers(1, 9, n)
    trips = 4  # 8 keys per item in MGETs of 2, one round trip at a time
    df = pd.DataFrame(
        {
            "level": rng.integers(0, 2, n),
            "warmup": False,
            "status": 200,
            "batch_size": b,
            "compute_input_us": 100.0,
            "compute_infer_us": (2000.0 + 500.0 * b) * rng.lognormal(0, 0.05, n),
            "compute_output_us": 100.0,
            "preprocess_us": rng.gamma(4.0, 250.0, n),
            "queue_us": rng.exponential(2000.0, n),
            "feature_us": trips * rng.lognormal(np.log(300.0), 0.2, n),
            "feature_round_trips": trips,
        }
    )
    stages = ["feature_us", "preprocess_us", "queue_us", "compute_input_us", "compute_infer_us", "compute_output_us"]
    df["request_us"] = df[stages].sum(axis=1) + rng.gamma(2.0, 150.0, n)  # the server's whole span
    df["latency_ms"] = df["request_us"] / 1e3 + rng.gamma(3.0, 1.0, n)
    profile = fit_profile(df, fit_levels=[0, 1], rng=rng, features={"keys": 8, "batch_size": 2, "parallelism": 1})
    f = profile["features"]
    assert f["lookups_per_request"] == 8
    assert f["round_trip"]["fit"]["family"] == "lognormal"
    assert f["round_trip"]["mean_ms"] == pytest.approx(0.3 * np.exp(0.02), rel=0.03)  # lognormal mean
    assert profile["stages"]["overhead"]["mean_ms"] == pytest.approx(3.0, rel=0.1)
    assert profile["stages"]["postprocess"]["mean_ms"] == pytest.approx(0.3, rel=0.1)
    # the station's time per trip: the median round trip at the lightest fitting level
    light = df[df["level"] == 0]
    assert f["store"] == {"threads": 1, "per_op_ms": pytest.approx(np.median(light["feature_us"]) / 4e3)}
    assert f["store"]["per_op_ms"] == pytest.approx(0.3, rel=0.05)  # the lognormal's median


def test_sigterm_to_calibrate_run_stops_its_server_and_every_child(tmp_path):
    pytest.importorskip("torch", reason="calibration drives the reference server (torch)")
    import signal
    import subprocess
    import time

    from tests.servers import descendants, servesim_cmd, wait_gone

    args = "--resolution 32 --width 8 --max-batch-size 4"
    proc = subprocess.Popen(
        [*servesim_cmd(), "calibrate", "run", "--out", str(tmp_path), "--server-args", args, "--rounds", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        family: list[int] = []
        while time.monotonic() < deadline and len(family) < 4:  # the server, its instance, meters, trackers
            time.sleep(0.5)
            family = descendants(proc.pid)
        assert len(family) >= 2, "calibrate run never started its server"
        family = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 130
        assert "Traceback" not in proc.stderr.read()
        assert wait_gone(family, timeout_s=20) == []
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_rankers_event_loop_becomes_the_feature_stores_one_thread():
    """26 GETs per request, each 0.15 ms at light load of which 0.10 ms is the client's CPU
    (the fetch timed alone); the loop spends 3.0 ms of CPU per request in all. The fit puts
    the loop's 3.0 ms on the trips (3.0 / 26 per trip), leaves Redis's 0.05 ms answer off the
    loop, drops the front end's second station, and takes the 0.4 ms of CPU moved onto the
    trips out of the delay outside, so light-load latency is unchanged."""
    from calibrate.fit import fit_profile
    from calibrate.scenario import scenario_dict

    rng = np.random.default_rng(11)
    n, trips = 3000, 26
    b = rng.integers(1, 9, n)
    per_trip = rng.gamma(100.0, 0.15 / 100.0, (n, trips))  # ms, mean 0.15
    df = pd.DataFrame(
        {
            "level": rng.integers(0, 2, n),
            "warmup": False,
            "status": 200,
            "batch_size": b,
            "compute_input_us": 50.0,
            "compute_infer_us": (300.0 + 20.0 * b) * rng.lognormal(0, 0.03, n),
            "compute_output_us": 50.0,
            "preprocess_us": rng.gamma(16.0, 10.0, n),  # 0.16 ms
            "queue_us": rng.exponential(1000.0, n),
            "feature_us": per_trip.sum(axis=1) * 1e3,
            "feature_round_trips": trips,
        }
    )
    stages = ["feature_us", "preprocess_us", "queue_us", "compute_input_us", "compute_infer_us", "compute_output_us"]
    after = rng.gamma(4.0, 100.0, n)  # 0.4 ms
    df["request_us"] = df[stages].sum(axis=1) + after
    df["latency_ms"] = df["request_us"] / 1e3 + rng.gamma(9.0, 200.0, n) / 1e3  # 1.8 ms outside
    fe = {"servers": 1, "station_ms_per_request": 3.0, "cpu_ms_per_request": 3.0, "background_cores": 0.0}
    cost = {"cpu_ms_per_trip": 0.10, "wall_ms_per_trip": 0.15}
    features = {"keys": trips, "batch_size": 1, "parallelism": 1}
    prof = fit_profile(df, fit_levels=[0, 1], rng=rng, features=features, frontend=fe, fetch_cost=cost)
    f, front = prof["features"], prof["frontend"]
    assert f["store"] == {"threads": 1, "per_op_ms": pytest.approx(3.0 / 26)}
    wait = f["store_wait"]
    wmean = np.mean(wait["samples_ms"]) if wait["kind"] == "empirical" else wait["mean_ms"]
    assert wmean == pytest.approx(0.05, rel=0.1)
    assert f["loop"]["moved_ms"] == pytest.approx(3.0 - 2.6)
    delay = front["fixed_delay"]
    dmean = np.mean(delay["samples_ms"]) if delay["kind"] == "empirical" else delay["mean_ms"]
    assert dmean == pytest.approx(1.8 + 0.4 + 0.16 - 0.4, rel=0.05)
    # light load, end to end: delay + 26 x (hold + wait) = what was measured outside the batch
    assert dmean + trips * (3.0 / 26 + wmean) == pytest.approx(1.8 + 0.4 + 0.16 + 26 * 0.15, rel=0.03)
    prof["server"] = {"max_batch_size": 8, "max_queue_delay_ms": 2.0, "max_queue_size": None, "instances": 1}
    prof["model"] = {"kind": "ranker"}
    doc = scenario_dict(prof, 100.0, duration_s=10.0, warmup_s=1.0)
    assert doc["preprocess"] == {}  # one station for the one loop
    assert doc["features"]["store"]["per_op_ms"] == pytest.approx(3.0 / 26)
    assert doc["features"]["round_trip"]["kind"] == wait["kind"]


def test_a_ranker_with_the_server_clocks_runs_on_one_event_loop_and_keeps_its_light_latency():
    """The MGET ranker (one trip of 26 keys, 0.5 ms at light load, 0.35 ms of it the
    client's CPU), its loop 2.0 ms of CPU per request, with the server's clocks: the loop
    admits each request (its CPU less the responses) and writes the responses after the
    batch, as the ResNet's does; the fetch is its light-load wall time, a pure delay. The
    scenario at a light rate gives the measured light-load latency; the store's station
    is gone. Without the clocks (no loop fitted) the ranker keeps the store's station."""
    from calibrate.fit import fit_profile
    from calibrate.scenario import ranker_on_loop, scenario_dict
    from simulator import simulate
    from simulator.scenario.config import Scenario

    rng = np.random.default_rng(3)
    rows, t = [], 0
    for level, batches in ((0, 1500), (1, 1500)):
        for _ in range(batches):
            k = (1 + int(rng.random() < 0.1)) if level == 0 else int(rng.integers(1, 5))
            infer = (300.0 + 20.0 * k) * rng.lognormal(0, 0.03)
            dispatched = t + 3_000_000
            for j in range(k):
                pre, fetch, queue = rng.gamma(16.0, 10.0), rng.gamma(100.0, 5.0), rng.exponential(20.0)
                recv = dispatched - int((pre + fetch + queue) * 1e3)
                after = 200.0 + 150.0 * j  # the loop: 0.2 ms a batch, 0.15 ms a response
                request = pre + fetch + queue + 100.0 + infer + after
                rows.append({
                    "level": level, "slice": level, "warmup": False, "status": 200, "batch_size": k,
                    "received_at_ns": recv, "enqueued_at_ns": recv + int((pre + fetch) * 1e3),
                    "dispatched_at_ns": dispatched, "queue_us": queue, "handoff_us": 100.0, "handoff_in_us": 100.0,
                    "compute_infer_us": infer, "preprocess_us": pre, "feature_us": fetch, "feature_round_trips": 1,
                    "request_us": request, "latency_ms": request / 1e3 + rng.gamma(100.0, 22.5) / 1e3,
                })  # fmt: skip
            t += 20_000_000
    df = pd.DataFrame(rows)
    fe = {"servers": 1, "station_ms_per_request": 2.0, "cpu_ms_per_request": 1.6, "background_cores": 0.0,
          "client_cpu_ms_per_request": 0.4, "client_shares_cores": True}  # fmt: skip
    cost = {"cpu_ms_per_trip": 0.35, "wall_ms_per_trip": 0.4}
    features = {"keys": 26, "batch_size": 26, "parallelism": 1}
    prof = fit_profile(df, fit_levels=[0, 1], rng=rng, features=features, frontend=fe, fetch_cost=cost)
    prof["server"] = {"max_batch_size": 8, "max_queue_delay_ms": 0.0, "max_queue_size": None, "instances": 1}
    prof["model"] = {"kind": "ranker"}
    assert ranker_on_loop(prof)
    doc = scenario_dict(prof, 20.0, duration_s=60.0, warmup_s=1.0)
    loop = doc["preprocess"]["event_loop"]
    assert loop["respond_per_batch_ms"] == pytest.approx(0.2, abs=0.01)
    assert loop["respond_per_request_ms"] == pytest.approx(0.15, abs=0.01)
    assert "store" not in doc["features"]
    s = Scenario.model_validate(doc)
    assert s.features.round_trip.mean == pytest.approx(0.5, rel=0.03)  # the fetch's light-load wall time
    # the loop holds the station's 2.0 ms per request: the read, the resumption after the
    # fetch (fitted off back-to-back queue arrivals, if any), and the responses' share
    per_request_batches = df.drop_duplicates(["slice", "dispatched_at_ns"]).shape[0] / len(df)
    resumed = s.preprocess.event_loop.resume_ms or 0.0
    admit = s.preprocess.service.mean + resumed
    assert admit + 0.15 + 0.2 * per_request_batches == pytest.approx(2.0, rel=0.05)
    r = simulate(s, seed=1).records
    light = df[df["level"] == 0]
    assert np.mean(r.t_response - r.arrival) == pytest.approx(light["latency_ms"].mean(), rel=0.03)
    # a handler that awaits its fetch: read, fetch, 0.02 ms to resume; the same loop CPU and light latency
    prof["frontend"]["event_loop"]["resume_ms"] = 0.02
    split = Scenario.model_validate(scenario_dict(prof, 20.0, duration_s=60.0, warmup_s=1.0))
    assert split.preprocess.event_loop.resume_ms == pytest.approx(0.02)
    assert split.preprocess.service.mean + 0.02 == pytest.approx(admit, rel=1e-6)
    r = simulate(split, seed=1).records
    assert np.mean(r.t_response - r.arrival) == pytest.approx(light["latency_ms"].mean(), rel=0.03)
    fetched = {k: v for k, v in prof["features"].items() if k != "light_round_trip"}  # as before the loop
    old = scenario_dict({**prof, "features": fetched}, 20.0, duration_s=60.0, warmup_s=1.0)
    assert old["preprocess"] == {}
    assert old["features"]["store"]["threads"] == 1
    no_clocks = fit_profile(
        df.drop(columns=["received_at_ns"]), fit_levels=[0, 1], rng=rng, features=features, frontend=fe,
        fetch_cost=cost,
    )  # fmt: skip
    assert not ranker_on_loop({**prof, **no_clocks})


RANKER = Path(__file__).parents[1] / "calibrate/profiles/cpu-ranker-mget/profile.json"


def _fetches_made(profile: dict, hold: float) -> pd.DataFrame:
    """The fitted levels' fetch times, as the server logs them, made by the profile's own
    model reading first for ``hold`` ms (another seed than the fit's)."""
    from calibrate.reads import fetch_times

    rows = []
    for f in profile["fit_levels"]:
        x = fetch_times(profile, profile["levels_rps"][f["level"]], hold, seed=5, secs=10.0)
        rows.append(pd.DataFrame({"level": f["level"], "status": 200, "warmup": False, "feature_us": x * 1e3}))
    return pd.concat(rows, ignore_index=True)


@pytest.mark.parametrize(("hold", "fitted"), [(2.0, (1.5, 2.0, 2.5)), (0.0, (0.0, 0.5)), (4.0, (3.0, 4.0))])
def test_the_reads_first_hold_is_fitted_back_from_the_fetch_times_it_makes(hold, fitted):
    """The MGET ranker's committed profile: fetch times its model makes reading first for
    2 ms, in the order ready, or for 4 ms give back that hold (within a step of the grid,
    the shortest whose p90s are within a tenth of the best error)."""
    from calibrate.reads import fit_reads_first

    profile = json.loads(RANKER.read_text())
    fit = fit_reads_first(profile, _fetches_made(profile, hold), secs=10.0)
    assert fit["hold_ms"] in fitted
    assert [r["hold_ms"] for r in fit["by_hold"]][-1] is None  # no bound, as JSON keeps it
    assert len(fit["measured_p90_ms"]) == len(profile["fit_levels"])
    if hold == 2.0:  # the report says what was fitted
        from calibrate.report_model import _event_loop

        profile["frontend"]["event_loop"]["reads_first"] = fit
        said = _event_loop(profile["frontend"], on_loop=True)
        assert f"for {fit['hold_ms']:g} ms after its reply (`event_loop.reads_first_ms`)" in said
    profile["frontend"]["event_loop"].pop("resume_ms")  # the fetch before the admission: nothing to hold
    assert fit_reads_first(profile, _fetches_made(json.loads(RANKER.read_text()), hold)) is None


def test_the_fitted_hold_reaches_the_scenario(monkeypatch):
    """A profile's fitted hold is the scenario's reads_first_ms (as slow as the loop's
    jobs: × the slice's speed); no bound is reads_first alone; 0, or a profile fitted before
    the hold, is the order ready; READS_FIRST set overrides the profile."""
    import calibrate.scenario as calibrated
    from simulator.scenario.config import Scenario

    profile = json.loads(RANKER.read_text())

    def loop(hold, speed=1.0) -> dict:
        profile["frontend"]["event_loop"].pop("reads_first", None)  # a profile fitted before the hold
        if hold != "absent":
            profile["frontend"]["event_loop"]["reads_first"] = {"hold_ms": hold}
        doc = calibrated.scenario_dict(profile, 500.0, duration_s=5.0, warmup_s=1.0, speed=speed)
        Scenario.model_validate(doc)
        el = doc["preprocess"]["event_loop"]
        return {k: el[k] for k in ("reads_first", "reads_first_ms") if k in el}

    front = calibrated.episodes_mean(profile)[0]  # its speed process's episodes, divided out (test_calibrate_speed)
    assert loop("absent") == {}
    assert loop(2.0) == {"reads_first": True, "reads_first_ms": pytest.approx(2.0 / front)}
    assert loop(2.0, speed=1.5) == {"reads_first": True, "reads_first_ms": pytest.approx(3.0 / front)}
    assert loop(None) == {"reads_first": True}
    assert loop(0.0) == {}
    monkeypatch.setattr(calibrated, "READS_FIRST", False)
    assert loop(2.0) == {}
    monkeypatch.setattr(calibrated, "READS_FIRST", True)
    assert loop(2.0) == {"reads_first": True}
    monkeypatch.setattr(calibrated, "READS_FIRST_MS", 1.0)
    assert loop(None) == {"reads_first": True, "reads_first_ms": pytest.approx(1.0 / front)}


def test_the_platform_speed_per_slice_is_recovered_and_averages_one():
    """Slices at three loads, each with the speed meter's mean slowdown s; the CPU per
    request is the load's own cost times s**0.8 and 3% noise. The fit recovers the
    elasticity from the fitted levels alone (the load's effect cancels within a level) and
    gives every fitted slice a factor, mean one, ordered as the speeds are."""
    from calibrate.fit import fit_speed

    rng = np.random.default_rng(5)
    rows = []
    for i in range(60):
        level = i % 3
        s = rng.choice([0.7, 1.0]) * rng.lognormal(0, 0.05)  # a two-speed platform, as measured
        per_ms = (4.0, 3.5, 3.2)[level] * s**0.8 * rng.lognormal(0, 0.03)
        n = 500 + 300 * level
        rows.append(
            {
                "slice": i,
                "level": level,
                "kept": i != 7,
                "requests": n,
                "frontend_cpu_s": 0.8 * per_ms * n / 1e3,
                "client_cpu_s": 0.15 * per_ms * n / 1e3,
                "sidecar_cpu_s": 0.05 * per_ms * n / 1e3,
                "slowdown_mean": s,
            }
        )
    slices = pd.DataFrame(rows)
    sp = fit_speed(slices, [0, 2], client_shares_cores=True)
    assert sp["elasticity"] == pytest.approx(0.8, abs=0.08)
    assert sp["r"] > 0.9
    assert sp["slices_fitted"] == 40  # levels 0 and 2 (slice 7, of level 1, not kept)
    f = np.asarray(sp["slice_factors"])
    assert len(f) == 40  # the fitted slices only: the held-out ones give nothing
    assert f.mean() == pytest.approx(1.0, abs=1e-3)
    fitted = slices[slices["kept"] & slices["level"].isin([0, 2])]
    assert sp["slices"] == fitted["slice"].tolist()
    assert np.all(np.diff(f[np.argsort(fitted["slowdown_mean"].to_numpy())]) >= 0)
    assert fit_speed(slices.drop(columns="slowdown_mean"), [0, 2], client_shares_cores=True) is None


def test_each_simulated_slice_runs_at_a_measured_platform_speed():
    """A front-end station at 80% load: slices at 0.8x and 1.2x its CPU (mean one) give a
    heavier tail than every slice at the mean speed, as a queue's convexity in its load
    says; the factors scale the station's service times and nothing else."""
    from calibrate.scenario import scenario_dict
    from calibrate.validate import predict

    prof = {
        "model": {"kind": "resnet"},
        "server": {"max_batch_size": 8, "max_queue_delay_ms": 1.0, "max_queue_size": None, "instances": 1},
        "service_time": {"kind": "affine", "base_ms": 0.5, "per_item_ms": 0.05, "noise_cv": 0.0},
        "frontend": {
            "servers": 1,
            "service": {"kind": "exponential", "mean_ms": 4.0},
            "fixed_delay": {"kind": "deterministic", "value_ms": 1.0},
        },
    }
    doc = scenario_dict(prof, 200.0, duration_s=5.0, warmup_s=0.5, speed=1.2)
    assert doc["preprocess"]["service"] == {"kind": "exponential", "mean_ms": pytest.approx(4.8)}
    assert doc["router"]["overhead"] == {"kind": "deterministic", "value_ms": 1.0}
    even = predict(prof, 200.0, slices=8, slice_s=5.0, warmup_s=0.5, reps=6, seed=1)
    prof["frontend"]["speed"] = {"slices": [3, 9], "slice_factors": [0.8, 1.2]}
    mixed = predict(prof, 200.0, slices=8, slice_s=5.0, warmup_s=0.5, reps=6, seed=1)
    even_hi, mixed_lo = even["p99"][2], mixed["p99"][1]
    assert mixed_lo > even_hi  # M/M/1 p99 at 0.64, 0.8, 0.96 load: 51, 92, 460 ms (x4.6 ln 100 / (1 - rho))


def test_a_server_of_several_front_ends_is_dealt_servers_and_a_hub():
    """A profile of ``servesim serve --frontends 4``: four servers dealt in turn, then the
    hub as one more station (at the slice's speed too), and it loads as a scenario."""
    from calibrate.scenario import scenario_dict
    from simulator.scenario.loader import load_scenario

    prof = {
        "model": {"kind": "resnet"},
        "server": {"max_batch_size": 8, "max_queue_delay_ms": 1.0, "max_queue_size": None, "instances": 1,
                   "frontend_dispatch": "round_robin"},
        "service_time": {"kind": "affine", "base_ms": 0.5, "per_item_ms": 0.05, "noise_cv": 0.0},
        "frontend": {
            "servers": 4,
            "service": {"kind": "exponential", "mean_ms": 1.0},
            "fixed_delay": {"kind": "deterministic", "value_ms": 1.0},
            "hub_station_ms_per_request": 0.25,
        },
    }  # fmt: skip
    doc = scenario_dict(prof, 200.0, duration_s=5.0, warmup_s=0.5, speed=1.2)
    pre = doc["preprocess"]
    assert (pre["cpu_workers"], pre["dispatch"]) == (4, "round_robin")
    assert pre["hub"] == {"kind": "deterministic", "value_ms": pytest.approx(0.3)}
    load_scenario("calibrated.yaml", text=yaml.safe_dump(doc))
    prof["frontend"]["hub_station_ms_per_request"] = None  # an older profile: no hub apart
    assert "hub" not in scenario_dict(prof, 200.0, duration_s=5.0, warmup_s=0.5)["preprocess"]


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed (CI installs it)")
def test_the_feature_fetch_is_measured_alone_and_under_concurrency(tmp_path):
    """Against a real redis-server: the server's own client, alone (CPU and wall time per
    round trip) and with 1, 4 and 16 fetches in flight over 2 pooled connections (fetches/s,
    the client's and the redis-server's CPU per fetch, nothing failed); the report shows it."""
    import asyncio

    from calibrate.microbench import feature_fetch_cost, feature_fetch_in_flight
    from calibrate.report import _fetch_in_flight
    from calibrate.run import redis_pids
    from reference_server.features import FeatureStore, FeatureStoreConfig
    from tests.servers import redis_server

    features = {"keys": 4, "batch_size": 1, "parallelism": 1, "entities": 200, "max_connections": 2}
    with redis_server() as url:

        async def fill() -> None:
            store = FeatureStore(FeatureStoreConfig(url=url, **features))
            await store.populate(1000)
            await store.close()

        asyncio.run(fill())
        alone = feature_fetch_cost(url, features, fetches=200, warmup=20)
        assert alone["round_trips_per_fetch"] == 4
        assert 0 < alone["cpu_ms_per_trip"] <= alone["wall_ms_per_trip"]
        pids = redis_pids(url)
        by = feature_fetch_in_flight(url, features, in_flight=(1, 4, 16), seconds=0.3, sidecars=pids)
    assert by["in_flight"].tolist() == [1, 4, 16]
    assert (by["fetches_per_s"] > 0).all()
    assert (by["client_cpu_ms_per_fetch"] > 0).all()
    assert by["sidecar_cpu_ms_per_fetch"].notna().all()
    assert (by["failed"] == 0).all()
    assert (by["cpu_ms_per_fetch"] >= by["client_cpu_ms_per_fetch"]).all()
    text = "\n".join(_fetch_in_flight({"feature_fetch_microbench": {"by_in_flight": by.to_dict(orient="records")}}))
    assert "## The feature fetch under concurrency" in text
    assert "| 16 |" in text


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed (CI installs it)")
def test_fetches_wait_for_a_connection_in_the_order_they_asked():
    """Against a real redis-server: 8 fetches back to back on 2 pooled connections for 1 s
    all succeed, none waiting anywhere near the pool's timeout (0.3 s). With redis-py's
    BlockingConnectionPool a fetch woken for a freed connection found it taken by the next
    caller and went to the back of the line: 6 of the 8 waited out the timeout again and
    again (a 503 each in the server)."""
    import asyncio
    import time

    from reference_server.features import FeatureStore, FeatureStoreConfig, StoreUnavailable
    from tests.servers import redis_server

    cfg = dict(keys=4, batch_size=4, entities=200, max_connections=2, pool_timeout_s=0.3)

    async def go(url: str) -> tuple[list[float], int]:
        store = FeatureStore(FeatureStoreConfig(url=url, **cfg))
        await store.populate(1000)
        walls, failed, stop = [], 0, time.perf_counter() + 1.0
        rng = np.random.default_rng(0)

        async def worker() -> None:
            nonlocal failed
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                try:
                    await store.fetch(rng.integers(0, 200, 1))
                    walls.append(time.perf_counter() - t0)
                except StoreUnavailable:
                    failed += 1

        try:
            await asyncio.gather(*(worker() for _ in range(8)))
        finally:
            await store.close()
        return walls, failed

    with redis_server() as url:
        walls, failed = asyncio.run(go(url))
    assert failed == 0
    assert len(walls) > 100
    assert max(walls) < 0.2, max(walls)


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed (CI installs it)")
def test_one_lane_fetches_in_the_requests_own_task(tmp_path):
    """Against a real redis-server: with one lane the round trips run in the handler's own
    task (a task of its own cost each reply two more passes of the event loop,
    calibrate/README "The fetch in the handler's own task"), with more lanes one task each;
    the ids are the same either way. (redis-py makes a task of each command's send, with a
    socket timeout: the lanes' are counted over those.)"""
    import asyncio

    from reference_server.features import FeatureStore, FeatureStoreConfig
    from tests.servers import redis_server

    entities = np.array([3, 17, 150])

    async def fetch(url: str, parallelism: int) -> tuple[np.ndarray, int]:
        store = FeatureStore(FeatureStoreConfig(url=url, keys=8, batch_size=2, parallelism=parallelism, entities=200))
        await store.populate(1000)
        await store.fetch(entities)  # the lanes' connections opened (each a few tasks of redis-py's)
        made = []
        loop = asyncio.get_running_loop()
        loop.set_task_factory(lambda lp, coro, **kw: made.append(coro) or asyncio.Task(coro, loop=lp, **kw))
        try:
            ids, stats = await store.fetch(entities)
        finally:
            loop.set_task_factory(None)
            await store.close()
        assert stats["feature_round_trips"] == 12
        return ids, len(made)

    with redis_server() as url:
        one, tasks_one = asyncio.run(fetch(url, 1))
        three, tasks_three = asyncio.run(fetch(url, 3))
    assert tasks_three - tasks_one == 3  # with the lane in a task of its own: 2
    assert one.shape == (3, 8)
    np.testing.assert_array_equal(one, three)


@pytest.mark.parametrize("command", ["refit", "replay", "cycle", "target"])
def test_a_folder_that_is_not_a_calibration_run_is_one_plain_error(tmp_path, command):
    """A folder without profile.json, or no folder at all: one line naming what is missing,
    exit 2 (it printed ``[Errno 2] No such file or directory: '.../profile.json'``)."""
    from typer.testing import CliRunner

    from calibrate.cli import app

    empty = CliRunner().invoke(app, [command, str(tmp_path)])
    assert empty.exit_code == 2
    assert f"error: {tmp_path}: no profile.json there" in empty.output
    assert "Errno" not in empty.output
    gone = CliRunner().invoke(app, [command, str(tmp_path / "nowhere")])
    assert gone.exit_code == 2
    assert f"error: {tmp_path / 'nowhere'}: no such folder" in gone.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["load", "--url", "notaurl", "--rates", "10"], "expected http://HOST:PORT"),
        (["load", "--url", "http://127.0.0.1:1", "--rates", "-5"], "each rate is above 0"),
        (["load", "--url", "http://127.0.0.1:1", "--rates", "0,10"], "each rate is above 0"),
        (["watch", "--url", "localhost:8000"], "expected http://HOST:PORT"),
        (["watch", "--url", "notaurl", "--openai"], "expected http://HOST:PORT"),
        (["watch", "--url", "http://127.0.0.1:99999"], "expected http://HOST:PORT"),
    ],
)
def test_a_server_url_or_rate_that_cannot_be_used_is_one_error(tmp_path, args, message):
    """``--url notaurl`` was urllib's ValueError as a traceback; ``--rates -5`` went on to
    the server. Each is now one line and exit 2, before any connection."""
    from typer.testing import CliRunner

    from calibrate.cli import app

    extra = ["--out", str(tmp_path / "m.csv")] if args[0] == "load" else []
    result = CliRunner().invoke(app, [*args, *extra])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert result.exception is None or isinstance(result.exception, SystemExit)


GENERATOR = """
import multiprocessing as mp, sys, time

def nap():
    time.sleep(120)

if __name__ == "__main__":
    child = mp.get_context("spawn").Process(target=nap)
    child.start()
    with open(sys.argv[1], "w") as f:
        f.write(str(child.pid))
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    from pathlib import Path

    try:
        return not Path(f"/proc/{pid}/status").read_text().count("State:\tZ")
    except FileNotFoundError:
        return False


def test_a_judge_stopped_mid_run_takes_guidellms_workers_with_it(tmp_path, monkeypatch):
    """The judge stopped by SIGTERM (its handler raises KeyboardInterrupt) while GuideLLM
    runs: GuideLLM's worker processes go too, not only its main one (a stand-in generator
    that starts a multiprocessing child as GuideLLM does; killing its main alone, as
    subprocess.run does, left such workers running for an hour)."""
    import signal
    import sys
    import time

    from calibrate import guidellm

    script, pids = tmp_path / "generator.py", tmp_path / "child.pid"
    script.write_text(GENERATOR)
    monkeypatch.setattr(guidellm, "guidellm_command", lambda: [sys.executable, str(script), str(pids)])

    def stop(*_):
        raise KeyboardInterrupt("signal 15")

    old = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, 3.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            guidellm.run_guidellm("http://127.0.0.1:9", 1.0, 10.0, tmp_path / "out.json", tmp_path, 0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    child = int(pids.read_text())
    for _ in range(50):
        if not _alive(child):
            break
        time.sleep(0.1)
    assert not _alive(child)


def test_levels_past_the_front_ends_fitted_capacity_are_called_out():
    """A capacity probe that read the front end's CPU low (2,342 req/s where the run's own
    levels spent enough CPU for 1,556) placed 70-85% past what the server can take: the
    run says so, naming those levels; levels within it say nothing."""
    from calibrate.report import over_capacity

    prof = {"capacity_rps": 2342.0, "frontend": {"capacity_rps": 1556.0}}
    levels = [468.4, 702.59, 1170.99, 1405.19, 1639.38, 1873.58, 1990.68]
    warning = over_capacity({**prof, "levels_rps": levels})
    assert "1639.38, 1873.58, 1990.68 req/s" in warning
    assert "1556 req/s" in warning
    assert over_capacity({**prof, "levels_rps": [r * 0.75 for r in levels]}) is None
    assert over_capacity({"capacity_rps": 100.0, "levels_rps": levels}) is None  # no front end fitted


def test_the_share_per_request_held_is_the_cpus_slope_over_its_value():
    """The CPU per request against the requests in flight: the least-squares slope over its
    fitted value at the fewest; a falling line gives 0, an implausible one or too few counts none."""
    from calibrate.held import MAX_COST, share_per_request

    rows = [{"in_flight": n, "cpu_ms_per_request": 0.45 * (1 + 0.001 * (n - 32))} for n in (32, 128, 256)]
    assert share_per_request(rows) == pytest.approx(0.001)
    falling = [{"in_flight": n, "cpu_ms_per_request": 0.6 - 0.001 * n} for n in (32, 128)]
    assert share_per_request(falling) == 0.0
    steep = [{"in_flight": n, "cpu_ms_per_request": 0.45 * (1 + 2 * MAX_COST * (n - 32))} for n in (32, 128)]
    assert share_per_request(steep) is None
    assert share_per_request(rows[:1]) is None


def test_a_measured_share_per_request_held_reaches_the_loop_the_scenario_and_the_report(monkeypatch):
    """A profile whose run measured the loop per request held: its fitted event loop carries
    the share, the scenario's loop pays it, the report says so; without it, nothing changes.
    With ``HELD_BY_COUNT``, the factor by the count held instead, read from the counts."""
    from pathlib import Path

    import calibrate.refit
    from calibrate.refit import held_cost
    from calibrate.report_model import _event_loop
    from calibrate.scenario import scenario_dict
    from simulator.scenario.config import Scenario

    profile = json.loads((Path(__file__).parents[1] / "calibrate/profiles/gpu-h200/profile.json").read_text())
    profile["frontend"]["servers"] = 1  # its eight front ends as one loop
    plain = scenario_dict(profile, 100.0, duration_s=1.0, warmup_s=0.0)
    assert "cost_per_in_flight" not in plain["preprocess"]["event_loop"]
    profile["loop_in_flight"] = {"by_in_flight": [], "cost_per_in_flight": 0.0009}
    held_cost(profile)
    doc = scenario_dict(profile, 100.0, duration_s=1.0, warmup_s=0.0)
    assert doc["preprocess"]["event_loop"]["cost_per_in_flight"] == 0.0009
    assert doc["preprocess"]["event_loop"]["held_counts"] == "arrived"  # as the closed loop's N in flight
    assert plain["preprocess"]["event_loop"]["batcher_yields"] is True  # the server's batcher is a task on its loop
    assert "held_counts" not in plain["preprocess"]["event_loop"]
    assert "0.00090 of its time more per other request in the server" in _event_loop(profile["frontend"])
    # with the closed loop's counts (a run's, or read back from its profile.json): the factor by count held
    rows = [{"in_flight": n, "cpu_ms_per_request": ms} for n, ms in ((32, 0.44), (64, 0.484), (256, 0.55))]
    profile["loop_in_flight"] = {"by_in_flight": rows, "cost_per_in_flight": 0.0009}
    profile = json.loads(json.dumps(profile))  # as refit reads it back
    held_cost(profile)
    assert scenario_dict(profile, 100.0, duration_s=1.0, warmup_s=0.0)["preprocess"]["event_loop"][
        "cost_per_in_flight"
    ] == pytest.approx(0.0009)
    monkeypatch.setattr(calibrate.refit, "HELD_BY_COUNT", True)
    held_cost(profile)
    loop = scenario_dict(profile, 100.0, duration_s=1.0, warmup_s=0.0)["preprocess"]["event_loop"]
    assert loop["cost_by_held"] == {32: 1.0, 64: 1.1, 256: 1.25}
    assert "cost_per_in_flight" not in loop
    Scenario.model_validate(scenario_dict(profile, 100.0, duration_s=1.0, warmup_s=0.0))
    assert "64 held ×1.100" in _event_loop(profile["frontend"])


def test_the_factor_by_count_held_is_the_cpu_over_its_first_never_falling():
    """Each count's CPU per request over the fewest's; a dip (noise) is held at the factor
    before it, and none goes below 1; None with one count, a repeated count or past 3×."""
    from calibrate.held import factors_by_held

    rows = [{"in_flight": n, "cpu_ms_per_request": ms} for n, ms in ((64, 0.5), (32, 0.4), (48, 0.39), (128, 0.48))]
    assert factors_by_held(rows) == {32: 1.0, 48: 1.0, 64: 1.25, 128: 1.25}
    assert factors_by_held(rows[:1]) is None
    assert factors_by_held([*rows, {"in_flight": 64, "cpu_ms_per_request": 0.5}]) is None
    assert factors_by_held([*rows, {"in_flight": 256, "cpu_ms_per_request": 1.3}]) is None
    assert factors_by_held([*rows, {"in_flight": 256, "cpu_ms_per_request": float("nan")}]) == factors_by_held(rows)


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed (CI installs it)")
def test_the_loop_per_request_held_is_measured_on_a_real_server():
    """A real ranker behind a real redis-server, a closed loop at 2 and 8 in flight: each
    count answered, with the server's and the redis-server's CPU per request and the cores."""
    import urllib.request

    from calibrate.held import in_flight_cost
    from calibrate.payloads import ranker_payloads
    from calibrate.run import redis_pids
    from tests.servers import redis_server, reference_server

    with (
        redis_server() as redis,
        reference_server("--model", "ranker", "--redis-url", redis, "--feature-batch-size", "26") as (url, _),
    ):
        cfg = json.loads(urllib.request.urlopen(url + "/v2/models/ranker/config").read())["parameters"]["servesim"]
        payloads = ranker_payloads(8, cfg["model"]["dense"], 1000, np.random.default_rng(0))
        held = in_flight_cost(url, "ranker", payloads, sidecars=redis_pids(redis), in_flight=(2, 8), secs=0.5)
    rows = held["by_in_flight"]
    assert [r["in_flight"] for r in rows] == [2, 8]
    assert set(held["cost_by_held"]) == {2, 8}
    for r in rows:
        assert r["rps"] > 0
        assert r["failed"] == 0
        assert r["cpu_ms_per_request"] > 0
        assert 0 < r["cores"] < 4
        assert r["p50_ms"] <= r["p99_ms"]


def test_the_warm_up_rates_come_from_the_closed_loops_ceiling_when_there_is_one():
    """The capacity probe's two warm-up rates are 25% and 60% of its guess: with the closed
    loop's most answered (``ceiling_rps``) the guess is that (under the instances' bound),
    not the gentle slice's CPU per request, whose background made it low."""
    from calibrate.run import _capacity

    class Asked(Exception):
        pass

    class Probe:
        seed = 0

        def __init__(self):
            self.rates = []

        def run(self, rates_seeds, *, slice_s, warmup_s):
            self.rates.append([r for r, _ in rates_seeds])
            if len(self.rates) == 2:
                raise Asked
            gentle = pd.DataFrame({"frontend_cpu_s": [0.3], "client_cpu_s": [0.06], "requests": [60]})
            return pd.DataFrame(), gentle, None, None

    bench = pd.DataFrame({"mean_ms": [0.1, 0.4]})
    servesim = {"frontend_cores": [0], "instances": [{"core": 1}]}
    for ceiling, want in ((2100.0, 2100.0), (None, 1 / 0.006)):
        probe = Probe()
        with pytest.raises(Asked):
            _capacity(probe, servesim, bench, instances=1, max_batch=32, log=print, ceiling_rps=ceiling)
        assert probe.rates[1] == pytest.approx([round(0.25 * want, 2), round(0.6 * want, 2)], abs=0.01)


def test_a_client_of_n_connections_sends_each_request_when_an_answer_frees_one():
    from calibrate.scenario import pool_sends

    arrival = np.array([0.0, 1.0, 2.0, 3.0, 30.0])
    answered = np.array([10.0, 5.0, 20.0, 6.0, 31.0])
    # two connections: the third waits for the second's answer (5), the fourth for the first's (10)
    assert pool_sends(arrival, answered, 2).tolist() == [0.0, 1.0, 5.0, 10.0, 30.0]
    # one: a closed loop, each request after the answer before it
    assert pool_sends(arrival, answered, 1).tolist() == [0.0, 10.0, 10.0, 20.0, 30.0]
    assert pool_sends(arrival, answered, 5).tolist() == arrival.tolist()


def test_the_calibrations_client_fills_before_the_servers_queue_so_its_cap_is_lifted(tmp_path):
    """The calibration's load generator holds 256 connections and the H200 run's server a
    queue of 256: the measured server cannot refuse, so the scenario that stands for the
    measurement lifts the cap, and a request the pool would hold waits in the client no
    longer than it would in the queue (its held send still reaches the queue before its batch
    leaves). The server alone (scenario.yaml) keeps its cap."""
    from calibrate.scenario import client_connections, pool_sends, scenario_dict, write_scenario
    from simulator.engine import simulate
    from simulator.scenario.config import Scenario

    profile = json.loads((Path(__file__).parents[1] / "calibrate/profiles/gpu-h200/profile.json").read_text())
    assert client_connections(profile) == 256 == profile["server"]["max_queue_size"]
    rate = 0.85 * profile["capacity_rps"]
    assert scenario_dict(profile, rate, duration_s=1.0, warmup_s=0.0)["batching"]["max_queue_size"] is None
    alone = scenario_dict(profile, rate, duration_s=1.0, warmup_s=0.0, load_generator=False)
    assert alone["batching"]["max_queue_size"] == 256
    wider = {**profile, "design": {**profile["design"], "connections": 512}}  # a client that can fill the queue
    assert scenario_dict(wider, rate, duration_s=1.0, warmup_s=0.0)["batching"]["max_queue_size"] == 256
    write_scenario(profile, tmp_path / "scenario.yaml")
    assert yaml.safe_load((tmp_path / "scenario.yaml").read_text())["batching"]["max_queue_size"] == 256

    refused = held = late = 0
    for seed in range(6):
        lifted = scenario_dict(profile, rate, duration_s=10.0, warmup_s=0.0, seed=seed)
        capped = {**lifted, "batching": {**lifted["batching"], "max_queue_size": 256}}
        refused += int((~simulate(Scenario.model_validate(capped)).records.completed).sum())
        rec = simulate(Scenario.model_validate(lifted)).records
        assert rec.completed.all()
        hold = pool_sends(rec.arrival, rec.t_response, 256) - rec.arrival
        held += int((hold > 0).sum())
        late += int(((hold > 0) & (rec.t_preprocessed + hold > rec.t_dispatch + 1e-9)).sum())
    assert refused > 0  # the server alone refuses
    assert held > refused  # where the client would have held more
    assert late == 0


def test_what_the_simulated_server_refuses_is_counted_never_left_out():
    """A design's percentiles are of the answered requests, as a measured level's are; what
    the simulated server refused is its share beside them, and the report shows it by the
    measured errors. With the calibration's client the H200 server refuses nothing; with a
    client of more connections than its queue (the cap kept) it does at 85%."""
    from calibrate.interval import SliceDesign, design_percentiles
    from calibrate.report import _errors

    profile = json.loads((Path(__file__).parents[1] / "calibrate/profiles/gpu-h200/profile.json").read_text())
    wider = {**profile, "design": {**profile["design"], "connections": 512}}
    rate = 0.85 * profile["capacity_rps"]
    design = SliceDesign(6, 4.0, 0.25, 24.0)
    lifted = [design_percentiles(profile, rate, design, seed=s)["refused"] for s in range(6)]
    capped = [design_percentiles(wider, rate, design, seed=s)["refused"] for s in range(6)]
    assert lifted == [0.0] * 6
    assert max(capped) > 0.0
    assert all(0.0 <= r < 0.1 for r in capped)
    assert _errors({"errors": 0, "predicted_refused": 0.007}) == "0 (simulated: 0.70% refused)"
    assert _errors({"errors": 3, "predicted_refused": 0.0}) == "3"
    assert _errors({"errors": 3, "predicted_refused": None}) == "3"
