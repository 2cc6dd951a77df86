"""Feature fetch: fan-out arithmetic, list scheduling, and a contended store against M/D/1."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.engine import simulate
from simulator.ledger import Outcome
from simulator.scenario.config import Features
from simulator.scenario.distributions import Sampler
from simulator.stages.features import Store, _makespan, fetch_uncontended, trip_keys
from tests.helpers import scenario
from tests.test_theory import check
from tests.theory import pk_mean_wait


def test_trip_keys_split_lookups_into_batches():
    assert trip_keys(
        Features(lookups_per_request=10, batch_size=4, round_trip={"kind": "exponential", "mean_ms": 1})
    ).tolist() == [4, 4, 2]
    assert trip_keys(
        Features(lookups_per_request=3, batch_size=50, round_trip={"kind": "exponential", "mean_ms": 1})
    ).tolist() == [3]


def test_list_scheduling_makespan():
    lat = np.array([[5.0, 1.0, 1.0, 1.0, 3.0]])
    # two slots: 5 | 1,1,1,3 -> slot A 5, slot B 1+1+1 = 3 then the 3 ms trip goes to B (free at 3): 6
    assert _makespan(lat, 2).tolist() == [6.0]
    assert _makespan(lat, 5).tolist() == [5.0]
    assert _makespan(lat, 1).tolist() == [11.0]


def test_store_with_ample_threads_equals_uncontended():
    cfg = dict(
        lookups_per_request=20, batch_size=3, parallelism=4, round_trip={"kind": "lognormal", "mean_ms": 2.0, "cv": 1.0}
    )
    start = np.sort(np.random.default_rng(1).uniform(0, 1000, 500))
    free = fetch_uncontended(Features(**cfg), start, Sampler(Features(**cfg).round_trip, np.random.default_rng(7)))
    f = Features(**cfg, store={"threads": 10_000})
    store = Store(f, Sampler(f.round_trip, np.random.default_rng(7)))
    store.feed(np.arange(len(start)), start)
    ids, fetched = store.run(np.inf)
    busy = np.empty_like(start)
    busy[ids] = fetched.end
    np.testing.assert_allclose(busy, start + free, rtol=1e-12)


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_single_thread_store_is_md1(rho):
    """One key per request, one store thread holding 1 ms: the feature stage is M/D/1."""
    rate_ms = rho / 1.0
    waits = []
    for seed in range(5):
        s = scenario(
            seed=seed,
            duration_s=30_000 / (rate_ms * 1000),
            warmup_s=3_000 / (rate_ms * 1000),
            traffic={"rate_rps": rate_ms * 1000},
            features={"lookups_per_request": 1, "store": {"threads": 1, "per_op_ms": 1.0}},
        )
        run = simulate(s)
        mask = run.records.arrival >= s.warmup_s * 1000
        waits.append(run.records.stage_ms("features")[mask].mean() - 1.0)
    check(waits, pk_mean_wait(rate_ms, 1.0, 0.0), f"M/D/1 store rho={rho}")


@pytest.mark.parametrize("on_timeout", ["default", "fail"])
def test_outage_window_degrades_or_fails_exactly_the_requests_inside(on_timeout):
    s = scenario(
        duration_s=30.0,
        traffic={"rate_rps": 300},
        features={
            "lookups_per_request": 6,
            "batch_size": 2,
            "parallelism": 2,
            "timeout_ms": 40.0,
            "on_timeout": on_timeout,
            "round_trip": {"kind": "uniform", "low_ms": 1.0, "high_ms": 5.0},
            "outages": [{"start_s": 10, "duration_s": 5}],
        },
    )
    r = simulate(s).records
    hit = r.degraded if on_timeout == "default" else r.outcome == Outcome.FAILED
    t = r.t_router
    # every fetch that starts inside the outage is hit; one that starts > 10 ms before it (two
    # rounds of trips of at most 5 ms) finishes in time; nothing after it is hit
    assert hit[(t >= 10_000) & (t < 15_000)].all()
    assert not hit[(t < 10_000 - 10.0) | (t >= 15_000)].any()
    if on_timeout == "default":
        assert r.completed.all()
        np.testing.assert_allclose(r.stage_ms("features")[hit], 40.0)
    else:
        np.testing.assert_allclose((r.t_dropped - r.t_router)[hit], 40.0)
        assert np.isnan(r.t_response[hit]).all()
        assert r.completed[~hit].all()


def test_slowdown_multiplies_round_trips_inside_the_window():
    s = scenario(
        duration_s=20.0,
        traffic={"rate_rps": 200},
        features={
            "lookups_per_request": 1,
            "round_trip": {"kind": "deterministic", "value_ms": 4.0},
            "slowdowns": [{"start_s": 5, "duration_s": 5, "multiplier": 3}],
        },
    )
    r = simulate(s).records
    inside = (r.t_router >= 5000) & (r.t_router < 10_000)
    np.testing.assert_allclose(r.stage_ms("features")[inside], 12.0)
    np.testing.assert_allclose(r.stage_ms("features")[~inside], 4.0)
