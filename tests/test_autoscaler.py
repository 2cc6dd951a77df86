"""Autoscaling: policy decisions on known metric traces, and the fleet they drive."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.engine import simulate
from simulator.ledger import Outcome
from simulator.results.reduce import summarize
from simulator.scenario.autoscaling import Autoscaler
from simulator.serving.autoscaler import HPA, KPA, Observation
from tests.helpers import scenario


def hpa_sequence(trace, start, **cfg):
    """Replicas after each 15 s evaluation; ``trace`` items are a per-pod metric, or a
    callable of the current replicas (a fixed total load spreads over the pods)."""
    policy = HPA(Autoscaler(target=10, **cfg), initial=start)
    current, out = start, []
    for k, metric in enumerate(trace, 1):
        value = metric(current) if callable(metric) else metric
        current = policy.desired(15.0 * k, Observation(current, current, value))
        out.append(current)
    return out


def test_hpa_scale_up_is_rate_limited_to_double_or_plus_four():
    # a total load of 400 against a target of 10 per pod wants 40 pods; +100% or +4 per 15 s (the larger)
    spread = [lambda n: 400 / n] * 6
    assert hpa_sequence(spread, 4, max_replicas=100) == [8, 16, 32, 40, 40, 40]
    # from 1 pod, +4 beats +100%
    assert hpa_sequence(spread[:3], 1, max_replicas=100) == [5, 10, 20]


def test_hpa_tolerance_holds_within_ten_percent():
    assert hpa_sequence([10.9, 9.1, 11.5], 10) == [10, 10, 12]


def test_hpa_scale_down_waits_for_the_stabilization_window():
    # load halves at once; the highest recommendation of the last 300 s (the initial 10) holds
    seq = hpa_sequence([5] * 24, 10)
    assert seq[:19] == [10] * 19  # evaluations at 15..285 s still see the t=0 recommendation
    assert seq[19:] == [5] * 5  # at 300 s it has left the window


def test_hpa_min_and_max_replicas():
    assert hpa_sequence([0.1] * 25, 4, min_replicas=2)[-1] == 2
    assert hpa_sequence([1000] * 5, 4, max_replicas=12)[-1] == 12


def test_kpa_panics_on_a_burst_and_never_scales_down_while_panicking():
    cfg = Autoscaler(policy="knative", target=10, sync_period_s=2, max_replicas=100)
    kpa = KPA(cfg)
    current, seq, samples = 2, {}, []
    for k in range(1, 100):
        t = 2.0 * k
        concurrency = 200.0 if 20 <= t < 30 else 20.0
        samples.append((t, concurrency))
        current = kpa.desired(t, Observation(current, current, concurrency))
        seq[t] = (current, kpa.panic_since)
    assert seq[18.0] == (2, None)
    # the 6 s panic window at 20 s averages (20 + 20 + 200) / 3 = 80: 8 pods >= 2 x 2 ready: panic
    assert seq[20.0] == (8, 20.0)
    assert seq[24.0][0] == 20
    panicking = [seq[t][0] for t in sorted(seq) if seq[t][1] is not None]
    assert panicking == sorted(panicking)  # never shrinks while panicking
    calm = min(t for t in seq if t > 20 and seq[t][1] is None)
    assert calm == 80.0  # a stable window after panic began
    window = [c for s, c in samples if calm - 60 < s <= calm]
    assert seq[calm][0] == int(np.ceil(np.mean(window) / 10))


def _burst(**workers):
    return scenario(
        duration_s=240.0,
        traffic={
            "rate_rps": 600,
            "shape": {"kind": "bursts", "bursts": [{"start_s": 60, "duration_s": 90, "multiplier": 3}]},
        },
        router={"balancing": "random"},
        batching={"max_batch_size": 8, "max_queue_delay_ms": 2, "max_queue_size": 500},
        workers={"count": 3, "service_time": {"kind": "affine", "base_ms": 4, "per_item_ms": 1}, **workers},
    )


AUTO = {"target": 4, "min_replicas": 2, "max_replicas": 30, "scale_down_stabilization_s": 30}


def test_fleet_conserves_requests_and_cold_starts_take_their_time():
    cold = {
        "provision": {"kind": "deterministic", "value_ms": 20_000},
        "model_load": {"kind": "deterministic", "value_ms": 10_000},
    }
    run = simulate(_burst(autoscaler=AUTO, cold_start=cold))
    r = run.records
    counts = np.bincount(r.outcome, minlength=5)
    assert counts.sum() == len(r)
    assert counts[Outcome.CRASHED] == 0
    assert (r.completed | (r.outcome == Outcome.REJECTED)).all()
    fleet = run.fleet
    started = [w for w in fleet.workers if w.requested_at > 0]
    assert started, "the burst must trigger a scale-up"
    for w in started:
        assert w.ready_at - w.requested_at == pytest.approx(30_000)
    # no request is routed to a worker before it is ready, or after it started draining
    for w in fleet.workers:
        mine = r.instance == w.wid
        assert (r.t_dispatch[mine] >= w.ready_at).all()
        assert (r.t_preprocessed[mine] < min(w.drain_at, w.crashed_at)).all()
    drained = [w for w in fleet.workers if w.drain_at < np.inf]
    assert drained, "after the burst the fleet must shrink"
    out = summarize(run)
    assert out["fleet"]["active_max"] > 3
    assert any(e["event"] == "scale_down" for e in out["fleet"]["events"])


def test_warm_pool_skips_provisioning():
    cold = {
        "provision": {"kind": "deterministic", "value_ms": 60_000},
        "model_load": {"kind": "deterministic", "value_ms": 5_000},
        "warm_pool": 2,
    }
    run = simulate(_burst(autoscaler=AUTO, cold_start=cold))
    started = [w for w in run.fleet.workers if w.requested_at > 0]  # in the order they were requested
    waits = [w.ready_at - w.requested_at for w in started]
    assert waits[:2] == [5_000, 5_000]  # the two warm nodes
    assert set(waits[2:6]) == {65_000}  # then cold ones, until scale-downs return nodes to the pool


def test_crash_loses_queued_and_running_requests_and_is_replaced():
    run = simulate(_burst(failures={"mttr_s": 20, "crashes": [{"at_s": 100, "worker": 0}]}))
    r = run.records
    crashed = r.outcome == Outcome.CRASHED
    w0 = run.fleet.workers[0]
    assert w0.crashed_at == 100_000
    assert crashed.any()
    assert (r.t_preprocessed[crashed] < 100_000).all()
    assert (r.t_dropped[crashed] == 100_000).all()
    replacement = run.fleet.workers[-1]
    assert replacement.ready_at == 120_000
    assert (r.t_dispatch[r.instance == replacement.wid] >= 120_000).all()
    assert (r.instance == replacement.wid).any()


def test_fixed_fleet_through_the_dynamic_pool_matches_the_static_engine():
    """No autoscaler event ever fires: the control-plane path must give the same answers."""
    base = dict(
        duration_s=30.0,
        traffic={"rate_rps": 1500},
        router={"balancing": "round_robin"},
        batching={"max_batch_size": 8, "max_queue_delay_ms": 2, "max_queue_size": 50, "timeout_ms": 40},
    )
    w = {"count": 3, "instances": 2, "service_time": {"kind": "affine", "base_ms": 4, "per_item_ms": 1}}
    static = simulate(scenario(**base, workers=w)).records
    dynamic = simulate(scenario(**base, workers={**w, "failures": {"crashes": []}})).records
    np.testing.assert_array_equal(static.outcome, dynamic.outcome)
    np.testing.assert_allclose(static.t_dispatch, dynamic.t_dispatch, atol=1e-9)
    np.testing.assert_allclose(static.t_response, dynamic.t_response, atol=1e-9)


def test_dynamic_fleet_is_deterministic_per_seed():
    cold = {"model_load": {"kind": "exponential", "mean_ms": 5_000}}
    s = _burst(autoscaler=AUTO, cold_start=cold, failures={"mtbf_s": 60, "mttr_s": 10})
    a, b = simulate(s).records, simulate(s).records
    np.testing.assert_array_equal(a.t_response, b.t_response)
    np.testing.assert_array_equal(a.outcome, b.outcome)
    c = simulate(s, seed=99).records
    assert not np.array_equal(np.nan_to_num(a.t_response[:1000]), np.nan_to_num(c.t_response[:1000]))
