"""Caches against theory: per-key TTL hit ratio λT/(1+λT), LRU under Zipf by Che's approximation."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize

from simulator.engine import simulate
from simulator.results.reduce import summarize
from simulator.scenario.config import Cache
from simulator.stages.arrivals import poisson_arrivals
from simulator.stages.caches import lookup, zipf_probabilities
from tests.helpers import scenario
from tests.test_theory import check


def ttl_hit_ratio(rate_per_s: float, probs: np.ndarray, ttl_s: float) -> float:
    """Σ_k p_k · λ_k T / (1 + λ_k T): each key is a renewal process of one miss + λT hits."""
    lam_t = rate_per_s * probs * ttl_s
    return float(np.sum(probs * lam_t / (1 + lam_t)))


def che_hit_ratio(rate_per_s: float, probs: np.ndarray, capacity: int) -> float:
    """Che's approximation: T_C solves Σ_k (1 − e^{−λ p_k T_C}) = C; hit = Σ p_k (1 − e^{−λ p_k T_C})."""
    lam = rate_per_s * probs
    t_c = optimize.brentq(lambda t: np.sum(-np.expm1(-lam * t)) - capacity, 1e-9, 1e9)
    return float(np.sum(probs * -np.expm1(-lam * t_c)))


def _replicated_hit_ratio(cfg, rate, duration_s, reps=6, warm_s=0.0):
    out = []
    for seed in range(reps):
        rng = np.random.default_rng(1000 + seed)
        t = poisson_arrivals(rate, duration_s * 1000, rng=rng)
        hits = lookup(cfg, t, rng=rng)
        out.append(hits[t >= warm_s * 1000].mean())
    return out


@pytest.mark.parametrize("ttl_s", [0.5, 5.0, 60.0])
def test_single_key_ttl_hit_ratio(ttl_s):
    cfg = Cache(keys=1, ttl_s=ttl_s)
    est = _replicated_hit_ratio(cfg, rate=20.0, duration_s=400 + 40 * ttl_s)
    lam_t = 20.0 * ttl_s
    check(est, lam_t / (1 + lam_t), f"TTL {ttl_s}s hit ratio")


@pytest.mark.parametrize(("s", "ttl_s"), [(0.8, 1.0), (1.2, 10.0)])
def test_zipf_ttl_hit_ratio(s, ttl_s):
    cfg = Cache(keys=2000, zipf_s=s, ttl_s=ttl_s)
    est = _replicated_hit_ratio(cfg, rate=500.0, duration_s=300, warm_s=5 * ttl_s)
    check(est, ttl_hit_ratio(500.0, zipf_probabilities(2000, s), ttl_s), f"Zipf({s}) TTL {ttl_s}s hit ratio")


@pytest.mark.parametrize(("s", "capacity"), [(0.8, 200), (1.0, 1000)])
def test_lru_zipf_hit_ratio_matches_che(s, capacity):
    cfg = Cache(keys=10_000, zipf_s=s, capacity=capacity)
    est = _replicated_hit_ratio(cfg, rate=1000.0, duration_s=200, warm_s=50)
    check(est, che_hit_ratio(1000.0, zipf_probabilities(10_000, s), capacity), f"LRU Zipf({s}) C={capacity}")


def test_invalidation_empties_the_cache():
    cfg = Cache(keys=1, invalidate_at_s=(2.0,))
    t = np.array([0.0, 1000.0, 1999.0, 2000.0, 2500.0])
    assert lookup(cfg, t, rng=np.random.default_rng(0)).tolist() == [False, True, True, False, True]


def test_lru_evicts_the_least_recently_used():
    from simulator.stages.caches import _replay

    cfg = Cache(keys=10, capacity=2)
    keys = np.array([1, 2, 1, 3, 2, 1])
    # 1 miss, 2 miss, 1 hit, 3 miss (evicts 2), 2 miss (evicts 1), 1 miss
    assert _replay(cfg, np.arange(6.0), keys).tolist() == [False, False, True, False, False, False]


def test_result_cache_hits_skip_the_model():
    s = scenario(
        duration_s=30.0,
        traffic={"rate_rps": 400},
        caches={
            "result": {
                "keys": 50,
                "zipf_s": 1.0,
                "ttl_s": 2.0,
                "hit": {"kind": "deterministic", "value_ms": 0.5},
                "miss": {"kind": "deterministic", "value_ms": 0.7},
            }
        },
        workers={"count": 2, "service_time": {"kind": "exponential", "mean_ms": 5.0}},
    )
    run = simulate(s)
    r = run.records
    hit = r.result_hit
    assert 0.5 < hit.mean() < 1.0
    np.testing.assert_allclose(r.stage_ms("cache")[hit], 0.5)
    np.testing.assert_allclose(r.stage_ms("cache")[~hit], 0.7)
    assert (r.batch_size[hit] == 0).all()
    assert run.batches.size.sum() == (~hit).sum()  # only misses reach the GPUs
    out = summarize(run)
    assert out["caches"]["result"]["hit_ratio"] == pytest.approx(hit.mean(), abs=0.01)
    assert "feature" not in out["caches"]


def test_feature_cache_hits_skip_the_fetch():
    s = scenario(
        duration_s=20.0,
        traffic={"rate_rps": 300},
        caches={"feature": {"keys": 100, "hit_rate": 0.7, "hit": {"kind": "deterministic", "value_ms": 0.3}}},
        features={"lookups_per_request": 4, "round_trip": {"kind": "deterministic", "value_ms": 5.0}},
    )
    r = simulate(s).records
    assert r.feature_hit.mean() == pytest.approx(0.7, abs=0.03)
    np.testing.assert_allclose(r.stage_ms("features")[r.feature_hit], 0.3)
    np.testing.assert_allclose(r.stage_ms("features")[~r.feature_hit], 20.0)  # 4 sequential 5 ms trips
