"""Canary and shadow routing: sticky buckets, rollout, rollback, and who waits for what."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.engine import simulate
from simulator.ledger import Outcome
from simulator.results.reduce import summarize
from simulator.scenario.versions import Canary
from simulator.stages.canary import BUCKETS, bucket, on_canary
from tests.helpers import scenario

SVC = {"kind": "affine", "base_ms": 2.0, "per_item_ms": 0.5}


def test_bucket_hash_is_uniform_and_fixed():
    users = np.arange(200_000)
    b = bucket(users)
    assert b.min() >= 0
    assert b.max() < BUCKETS
    np.testing.assert_array_equal(b, bucket(users.copy()))  # a pure function of the id
    counts = np.bincount(b // 1000, minlength=10)  # ten coarse cells, 20k expected in each
    chi2 = ((counts - 20_000) ** 2 / 20_000).sum()
    assert chi2 < 9 + 6 * np.sqrt(18)


@pytest.mark.parametrize("percent", [1.0, 5.0, 25.0])
def test_canary_share_of_users_within_binomial_bounds(percent):
    users = np.arange(100_000)
    on = on_canary(Canary(percent=percent), users, np.zeros(len(users)))
    p = percent / 100
    z = (on.mean() - p) / np.sqrt(p * (1 - p) / len(users))
    assert abs(z) < 4


def test_rollout_is_sticky_and_rollback_returns_everyone():
    canary = Canary(
        schedule=[{"at_s": 0, "percent": 1}, {"at_s": 10, "percent": 5}, {"at_s": 20, "percent": 25}], rollback_at_s=30
    )
    rng = np.random.default_rng(0)
    users = rng.integers(0, 50_000, 400_000)
    t_ms = np.sort(rng.uniform(0, 40_000, len(users)))
    on = on_canary(canary, users, t_ms)
    # a user on the canary at some time stays on it at every later time before the rollback
    first_on = {}
    for u, t, c in zip(users.tolist(), t_ms.tolist(), on.tolist(), strict=True):
        if c:
            first_on.setdefault(u, t)
    for u, t, c in zip(users.tolist(), t_ms.tolist(), on.tolist(), strict=True):
        if u in first_on and first_on[u] <= t < 30_000:
            assert c
    assert not on[t_ms >= 30_000].any()


def _scenario(**router):
    return scenario(
        duration_s=30.0,
        traffic={"rate_rps": 2000},
        router={"balancing": "random", "users": 50_000, **router},
        batching={"max_batch_size": 16, "max_queue_delay_ms": 2},
        workers={"count": 2, "service_time": SVC},
    )


CANARY = {
    "percent": 10,
    "workers": 1,
    "service_time": {"kind": "affine", "base_ms": 2.4, "per_item_ms": 0.6},
    "error_rate": 0.05,
}


def test_canary_requests_go_to_their_own_pool_with_errors():
    run = simulate(_scenario(canary=CANARY))
    r = run.records
    canary = r.version == 1
    assert 0.07 < canary.mean() < 0.13
    errors = r.outcome == Outcome.ERROR
    assert errors[~canary].sum() == 0
    rate = errors[canary].mean()
    assert abs(rate - 0.05) < 4 * np.sqrt(0.05 * 0.95 / canary.sum())
    assert run.pools["canary"].size.sum() == canary.sum()
    out = summarize(run)
    assert out["experiments"]["versions"]["canary"]["errors"] == errors.sum()
    assert out["requests"]["errors"] == errors.sum()


def test_own_pool_shadow_never_delays_the_caller():
    plain = simulate(_scenario(canary=CANARY)).records
    shadowed = simulate(_scenario(canary=CANARY, shadow={"percent": 30, "pool": "own", "workers": 1}))
    r = shadowed.records
    primary = r.version == 0
    np.testing.assert_array_equal(plain.t_response[primary], r.t_response[primary])
    sh = shadowed.shadow
    assert len(sh["request"]) == pytest.approx(0.3 * primary.sum(), rel=0.05)
    assert (r.version[sh["request"]] == 0).all()  # copies of primary traffic only
    assert len(r) == len(plain)  # copies are not requests


def test_shared_shadow_competes_with_primary_traffic():
    run = simulate(
        scenario(
            duration_s=30.0,
            traffic={"rate_rps": 3000},
            router={"balancing": "random", "shadow": {"percent": 50, "pool": "shared"}},
            batching={"max_batch_size": 16, "max_queue_delay_ms": 2},
            workers={"count": 2, "service_time": SVC},
        )
    )
    out = summarize(run)["experiments"]["shadow"]
    assert out["primary_p99_ms"]["added"] > 1.0  # 50% more load on the same GPUs
    assert run.batches.size.sum() == run.records.completed.sum() + len(run.shadow["request"])


def test_the_shadow_share_moves_no_draw_of_the_canary():
    """Common random numbers: each purpose draws from its own stream, so copying 10% or 50%
    of the primary to an own-pool shadow leaves every canary request's routing, errors and
    times as they were (one stream once served users, copies, routing and errors alike)."""
    canary = {**CANARY, "workers": 2}
    runs = [
        simulate(_scenario(canary=canary, shadow={"percent": p, "pool": "own", "workers": 2})).records for p in (10, 50)
    ]
    on = runs[0].version == 1
    assert on.sum() > 1000
    np.testing.assert_array_equal(runs[0].version, runs[1].version)
    np.testing.assert_array_equal(runs[0].outcome[on], runs[1].outcome[on])
    np.testing.assert_array_equal(runs[0].t_response[on], runs[1].t_response[on])
