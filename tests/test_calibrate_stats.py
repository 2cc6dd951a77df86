"""The calibration's statistics: interval coverage against exact order-statistic results,
the slice bootstrap under correlated slices, the robust noise fit under stalls, and the
recovery of the front-end station from synthetic slices and requests."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from calibrate.fit import fit_affine, fit_frontend, fit_profile, fit_table
from calibrate.stats import (
    order_statistic_coverage,
    quantile_ci,
    replication_interval,
    robust_lognormal_cv,
    slice_bootstrap_ci,
    stalls,
    t_interval,
)


@pytest.mark.parametrize(("n", "q"), [(200, 0.5), (500, 0.95), (2000, 0.99)])
def test_order_statistic_interval_has_its_exact_coverage(n, q):
    rng = np.random.default_rng(11)
    exact = order_statistic_coverage(n, q)
    assert exact >= 0.95  # conservative by construction
    truth = stats.expon.ppf(q)
    reps = 2000
    hits = sum(lo <= truth <= hi for lo, hi in (quantile_ci(rng.exponential(size=n), q) for _ in range(reps)))
    se = math.sqrt(exact * (1 - exact) / reps)
    assert abs(hits / reps - exact) < 4 * se + 1e-9, (hits / reps, exact)


@pytest.mark.parametrize("n", [20, 50, 200])
def test_the_replication_interval_holds_a_new_draw_as_often_as_it_says(n):
    # a new replication falls in [x_(j), x_(n+1-j)] with chance (n+1-2j)/(n+1), whatever the law;
    # the 5th to 95th percentile of 20 holds it only (n+1-2*1.95)/(n+1), about 81% of the time
    rng = np.random.default_rng(n)
    j = max(math.floor((n + 1) * 0.05 + 1e-9), 1)
    exact = (n + 1 - 2 * j) / (n + 1)
    assert exact >= 0.9
    reps = 4000
    draws = rng.lognormal(0.0, 0.5, (reps, n + 1))
    hits = 0
    short = 0
    for row in draws:
        lo, mid, hi = replication_interval(row[:n])
        assert lo <= mid <= hi
        hits += lo <= row[n] <= hi
        p5, p95 = np.percentile(row[:n], [5, 95])
        short += p5 <= row[n] <= p95
    se = math.sqrt(exact * (1 - exact) / reps)
    assert abs(hits / reps - exact) < 4 * se, (hits / reps, exact)
    if n == 20:
        assert short / reps < 0.85  # the interval the LLM calibration had: an 81% one


def test_the_replication_interval_drops_nans_and_takes_the_range_of_few():
    lo, mid, hi = replication_interval([3.0, np.nan, 1.0, 2.0])
    assert (lo, mid, hi) == (1.0, 2.0, 3.0)
    assert all(math.isnan(v) for v in replication_interval([np.nan]))


def test_order_statistic_interval_is_refused_when_too_few_samples():
    lo, hi = quantile_ci(np.arange(50.0), 0.99)
    assert math.isnan(lo)
    assert math.isnan(hi)


def test_slice_bootstrap_covers_under_correlated_slices_where_order_statistics_do_not():
    # each slice has its own level (a slow minute): requests inside a slice are correlated
    rng = np.random.default_rng(5)
    k, per, q = 12, 200, 0.5
    truth = 1.0  # median of the pooled law: shifts are symmetric around 0, noise too
    boot_hits = order_hits = 0
    reps = 150
    for _ in range(reps):
        shifts = rng.normal(0.0, 0.3, k)
        x = np.concatenate([truth + s + rng.normal(0.0, 0.1, per) for s in shifts])
        labels = np.repeat(np.arange(k), per)
        lo, hi = slice_bootstrap_ci(x, labels, q, rng=rng, reps=300)
        boot_hits += lo <= truth <= hi
        lo, hi = quantile_ci(x, q)
        order_hits += lo <= truth <= hi
    assert boot_hits / reps > 0.85  # near nominal (a percentile bootstrap over 12 blocks runs a little short)
    assert order_hits / reps < 0.6  # iid intervals are far too narrow here


def test_t_interval_matches_scipy():
    x = np.array([1.0, 2.0, 4.0, 3.0])
    m, lo, hi = t_interval(x)
    ref = stats.t.interval(0.95, 3, loc=x.mean(), scale=stats.sem(x))
    assert m == pytest.approx(2.5)
    assert (lo, hi) == pytest.approx(ref)


def test_robust_noise_ignores_stalls_that_inflate_the_standard_deviation():
    rng = np.random.default_rng(2)
    n, cv = 4000, 0.08
    sigma = math.sqrt(math.log1p(cv * cv))
    b = rng.integers(1, 9, n)
    y = (3.0 + 1.0 * b) * rng.lognormal(-sigma * sigma / 2, sigma, n)
    stalled = rng.random(n) < 0.01
    y[stalled] += rng.uniform(30.0, 150.0, stalled.sum())  # pauses of tens of ms
    fit = fit_affine(b, y)
    assert fit["noise_cv_robust"] == pytest.approx(cv, rel=0.08)
    assert fit["noise_cv_sd"] > 3 * cv  # what the plain figure would have said
    assert fit["stalls"] == pytest.approx(stalled.sum(), abs=3)
    # located without the stalls, then scaled to the whole mean, stalls included
    inflate = float(np.mean(y / (3.0 + 1.0 * b)))
    assert fit["base_ms"] == pytest.approx(3.0 * inflate, rel=0.05)
    assert fit["per_item_ms"] == pytest.approx(1.0 * inflate, rel=0.02)
    # the ratios the simulator resamples: mean one, the measured tail (body and stalls) kept
    r = np.asarray(fit["noise_ratios"])
    assert r.mean() == pytest.approx(1.0, abs=1e-5)  # to the rounding of the stored ratios
    measured = y / (3.0 + 1.0 * b) / inflate
    for q in (0.5, 0.9, 0.98):
        assert np.quantile(r, q) == pytest.approx(np.quantile(measured, q), rel=0.03)
    assert fit["noise_cv"] == 0.0
    table = fit_table(b, y)
    for size, ms in table["batch_ms"].items():
        assert ms == pytest.approx((3.0 + size) * inflate, rel=0.02)
    assert robust_lognormal_cv(np.log(rng.lognormal(0, sigma, 20_000))) == pytest.approx(cv, rel=0.03)
    assert not stalls(rng.normal(0, 0.05, 10_000)).any()


def test_front_end_station_is_recovered_from_slices_and_requests():
    rng = np.random.default_rng(9)
    rate = np.repeat([150.0, 300.0, 450.0], 4)
    seconds = rng.uniform(3.9, 4.2, 12)
    slices = pd.DataFrame({"level": np.repeat([0, 1, 2], 4), "kept": True, "rate_rps": rate, "seconds": seconds})
    slices["requests"] = rng.poisson(rate * seconds)
    per_s = slices["requests"] / seconds
    server_ms, client_ms, background = 0.9, 0.3, 0.15  # 0.1 + 0.05 cores busy whatever the load
    slices["frontend_cpu_s"] = (0.10 + per_s * server_ms / 1e3) * seconds * rng.normal(1, 0.01, 12)
    slices["client_cpu_s"] = (0.05 + per_s * client_ms / 1e3) * seconds * rng.normal(1, 0.01, 12)
    fe = fit_frontend(slices, servers=1, client_shares_cores=True)
    assert fe["cpu_ms_per_request"] == pytest.approx(server_ms, rel=0.05)
    assert fe["client_cpu_ms_per_request"] == pytest.approx(client_ms, rel=0.1)
    assert fe["background_cores"] == pytest.approx(background, abs=0.02)
    # the requests get what the background leaves of the core
    assert fe["station_ms_per_request"] == pytest.approx((server_ms + client_ms) / (1 - background), rel=0.05)
    assert fe["capacity_rps"] == pytest.approx((1 - background) / (server_ms + client_ms) * 1e3, rel=0.05)
    alone = fit_frontend(slices, servers=1, client_shares_cores=False)
    assert alone["station_ms_per_request"] == pytest.approx(server_ms / (1 - 0.10), rel=0.05)
    # a redis-server pinned to the front end's one core (0.5 ms per request, 0.02 cores idle)
    # takes that core's CPU too; on a front end of its own cores it does not count
    side = slices.assign(sidecar_cpu_s=(0.02 + per_s * 0.5 / 1e3) * seconds * rng.normal(1, 0.01, 12))
    shared = fit_frontend(side, servers=1, client_shares_cores=True)
    assert shared["sidecar_cpu_ms_per_request"] == pytest.approx(0.5, rel=0.1)
    assert shared["station_ms_per_request"] == pytest.approx((server_ms + client_ms + 0.5) / (1 - 0.17), rel=0.05)
    assert fit_frontend(side, servers=1, client_shares_cores=False)["station_ms_per_request"] == pytest.approx(
        alone["station_ms_per_request"], rel=1e-9
    )
    one_rate = slices[slices["level"] == 1]  # no line through one rate: the mean cost per request
    assert fit_frontend(one_rate, servers=1, client_shares_cores=False)["cpu_ms_per_request"] == pytest.approx(
        server_ms + 0.10 / 300 * 1e3, rel=0.05
    )
    # --frontends 4: a hub of 0.2 ms a request and 0.05 cores idle, its CPU inside the
    # server's, is a one-server station of its own; the four servers carry the rest
    hub = slices.assign(hub_cpu_s=(0.05 + per_s * 0.2 / 1e3) * seconds * rng.normal(1, 0.01, 12))
    four = fit_frontend(hub, servers=4, client_shares_cores=False)
    assert four["cpu_ms_per_request"] == pytest.approx(server_ms, rel=0.05)  # the server's, hub included
    assert four["hub_station_ms_per_request"] == pytest.approx(0.2 / (1 - 0.05), rel=0.1)
    assert four["station_ms_per_request"] == pytest.approx((server_ms - 0.2) / (1 - 0.05 / 4), rel=0.05)
    slow = hub.assign(hub_cpu_s=(0.05 + per_s * 0.5 / 1e3) * seconds)  # 0.5 of the 0.9 ms: the hub binds
    assert fit_frontend(slow, servers=4, client_shares_cores=False)["capacity_rps"] == pytest.approx(
        (1 - 0.05) / 0.5 * 1e3, rel=0.05
    )
    # the four servers and the hub on two cores share them: 2 cores less the 0.10 busy
    # anyway, over the 0.9 ms of the server's CPU per request, hub included
    assert fit_frontend(hub, servers=4, client_shares_cores=False, cores=2)["capacity_rps"] == pytest.approx(
        (2 - 0.10) / server_ms * 1e3, rel=0.05
    )
    assert alone["hub_station_ms_per_request"] is None
    fe = {**fe, "station_ms_per_request": 1.2}
    # requests whose decode takes 0.5 ms of the 1.2 ms: the station adds the other 0.7 ms, and
    # the delay outside it is what the light level shows beyond the station's work
    n = 3000
    b = rng.integers(1, 5, n)
    df = pd.DataFrame(
        {
            "level": rng.integers(0, 2, n),
            "warmup": False,
            "status": 200,
            "batch_size": b,
            "handoff_us": 300.0,
            "compute_input_us": 50.0,
            "compute_infer_us": (2000.0 + 500.0 * b) * rng.lognormal(0, 0.03, n),
            "compute_output_us": 50.0,
            "preprocess_us": rng.gamma(25.0, 20.0, n),  # mean 0.5 ms
            "queue_us": rng.exponential(1500.0, n),
        }
    )
    stages = ["preprocess_us", "queue_us", "handoff_us", "compute_input_us", "compute_infer_us", "compute_output_us"]
    after = rng.gamma(4.0, 100.0, n)  # 0.4 ms encoding and waking
    df["request_us"] = df[stages].sum(axis=1) + after
    overhead = rng.gamma(9.0, 200.0, n) / 1e3  # 1.8 ms outside the server
    df["latency_ms"] = df["request_us"] / 1e3 + overhead
    prof = fit_profile(df, fit_levels=[0, 1], rng=rng, frontend=fe)
    f = prof["frontend"]
    assert f["other_cpu_ms"] == pytest.approx(1.2 - 0.5, abs=0.02)
    svc = f["service"]
    mean = np.mean(svc["samples_ms"]) if svc["kind"] == "empirical" else svc["mean_ms"]
    assert mean == pytest.approx(1.2, rel=0.03)
    delay = f["fixed_delay"]
    dmean = np.mean(delay["samples_ms"]) if delay["kind"] == "empirical" else delay["mean_ms"]
    assert dmean == pytest.approx(1.8 + 0.4 - 0.7, rel=0.05)
    # the batch time includes the hand-off
    st = prof["service_time"]
    one = st["batch_ms"][1] if st["kind"] == "table" else st["base_ms"] + st["per_item_ms"]
    assert one == pytest.approx((300 + 50 + 2500 + 50) / 1e3, rel=0.02)
    # a decode thread's GIL waits: preprocessing's wall time (mean 2.0 ms) above the
    # station's CPU (1.2 ms). The station keeps its CPU, with the wall time's shape; the
    # 0.8 ms of waiting moves to the delay outside it
    slow = df.assign(preprocess_us=df["preprocess_us"] * 4.0)
    slow["request_us"] = slow[stages].sum(axis=1) + after
    slow["latency_ms"] = slow["request_us"] / 1e3 + overhead
    g = fit_profile(slow, fit_levels=[0, 1], rng=rng, frontend=fe)["frontend"]
    svc = g["service"]
    mean = np.mean(svc["samples_ms"]) if svc["kind"] == "empirical" else svc["mean_ms"]
    assert mean == pytest.approx(1.2, rel=0.03)
    assert g["other_cpu_ms"] == 0.0
    assert g["preprocess_wait_ms"] == pytest.approx(2.0 - 1.2, rel=0.05)
    delay = g["fixed_delay"]
    dmean = np.mean(delay["samples_ms"]) if delay["kind"] == "empirical" else delay["mean_ms"]
    assert dmean == pytest.approx(1.8 + 0.4 + 0.8, rel=0.05)


def test_a_gpu_profile_is_priced_as_its_catalog_type():
    from calibrate.scenario import catalog_gpu

    h100 = {"hardware": {"gpu": {"name": "NVIDIA H100 80GB HBM3"}}, "server": {"device": "cuda:0"}}
    assert catalog_gpu(h100) == "h100"
    assert catalog_gpu({**h100, "server": {"device": "cpu"}}) is None  # measured on the CPU
    assert catalog_gpu({**h100, "hardware": {"gpu": {"name": "NVIDIA GB300"}}}) is None  # not in the catalog
    assert catalog_gpu({"hardware": {"gpu": {"name": None}}, "server": {"device": "cpu"}}) is None


def test_the_capacity_takes_the_largest_batches_as_the_server_ran_them():
    """A microbenchmark that times a batch of 8 at 1.5 ms, where the server's own batches of
    8 took 2.3 ms (hand-off and compute), sets the instance's capacity from the server's
    (8 / 2.3 ms); with too few such batches in the warm-up, from the microbenchmark."""
    from calibrate.profile import MIN_FULL_BATCHES, capacity

    bench = pd.DataFrame({"batch_size": [1, 8], "mean_ms": [1.2, 1.5]})
    front = {"capacity_rps": 1e6, "station_ms_per_request": 0.1, "background_cores": 0.0, "client_shares_cores": True}

    def warm(batches: int) -> pd.DataFrame:
        rows = [
            {"status": 200, "batch_size": 8, "slice": 0, "handoff_us": 300.0 + k, "compute_input_us": 200.0,
             "compute_infer_us": 1600.0, "compute_output_us": 200.0 - k}
            for k in range(batches) for _ in range(8)
        ]  # fmt: skip
        return pd.DataFrame(rows)

    cap = capacity(bench, warm(MIN_FULL_BATCHES), front, instances=1)
    assert cap["full_batch_ms_inside"] == pytest.approx(2.3)
    assert cap["instances_rps"] == pytest.approx(8 / 2.3e-3)
    few = capacity(bench, warm(MIN_FULL_BATCHES - 1), front, instances=1)
    assert few["full_batch_ms_inside"] is None
    assert few["instances_rps"] == pytest.approx(8 / (1.5 + few["handoff_ms"]) * 1e3)
