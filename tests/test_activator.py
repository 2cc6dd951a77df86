"""Scale from zero through Knative's activator, and the fleet after the last arrival."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.engine import simulate
from simulator.ledger import Outcome
from tests.helpers import scenario

LOAD_MS = 5_000.0  # cold start: model load only, deterministic


def _idle_gap(activator=None, **workers):
    """Traffic for 10 s, nothing until 40 s, traffic again until 50 s; KPA may go to zero."""
    return scenario(
        duration_s=50.0,
        traffic={
            "shape": {
                "kind": "steps",
                "steps": [{"at_s": 0, "rate_rps": 40}, {"at_s": 10, "rate_rps": 0}, {"at_s": 40, "rate_rps": 40}],
            }
        },
        router={"balancing": "random", **({"activator": activator} if activator is not None else {})},
        batching={"max_batch_size": 4, "max_queue_delay_ms": 2},
        workers={
            "count": 1,
            "service_time": {"kind": "deterministic", "value_ms": 5.0},
            "autoscaler": {
                "policy": "knative",
                "target": 2,
                "min_replicas": 0,
                "max_replicas": 4,
                "sync_period_s": 2,
                "stable_window_s": 6,
                "panic_window_s": 2,
            },
            "cold_start": {"model_load": {"kind": "deterministic", "value_ms": LOAD_MS}},
            **workers,
        },
    )


def _first_ready_after(run, t_ms: float) -> float:
    return min(w.ready_at for w in run.fleet.workers if w.ready_at > t_ms)


def _serving(run, t_ms: np.ndarray) -> np.ndarray:
    """Whether some worker serves at each time (the fleet only changes at control epochs)."""
    out = np.zeros(len(t_ms), dtype=bool)
    for w in run.fleet.workers:
        out |= (w.ready_at <= t_ms) & (t_ms < min(w.drain_at, w.crashed_at, w.gone_at))
    return out


def test_without_an_activator_an_empty_fleet_rejects_and_never_wakes():
    """Nothing counts the requests an empty fleet turns away, so a fleet at zero stays there:
    the reason Knative puts an activator in the path."""
    run = simulate(_idle_gap())
    r = run.records
    empty = ~_serving(run, r.t_preprocessed)
    assert empty.any()
    rejected = r.outcome == Outcome.REJECTED
    np.testing.assert_array_equal(rejected, empty)
    np.testing.assert_array_equal(r.t_dropped[rejected], r.t_preprocessed[rejected])  # 503 at once
    assert not any(e[1] == "scale_up" for e in run.fleet.events)


def test_the_activator_buffers_until_a_worker_serves():
    run = simulate(_idle_gap(activator={}))
    r = run.records
    assert (r.outcome == Outcome.COMPLETED).all()
    # the fleet went to zero during the gap, and came back for the second wave
    assert any(e[1] == "scale_down" and e[2].endswith("-> 0") and 10_000 < e[0] < 40_000 for e in run.fleet.events)
    ready = _first_ready_after(run, 40_000)
    assert 40_000 + LOAD_MS <= ready <= 40_000 + LOAD_MS + 2_000  # a tick, then the cold start
    held = (r.arrival >= 40_000) & (r.t_preprocessed < ready)
    assert held.sum() > 100
    np.testing.assert_array_equal(held, (r.arrival >= 40_000) & ~_serving(run, r.t_preprocessed))
    assert (r.t_dispatch[held] >= ready).all()  # released when the worker serves
    first = np.flatnonzero(held)[0]
    assert r.t_response[first] - r.arrival[first] >= ready - r.t_preprocessed[first]


def test_activator_timeout_and_capacity():
    run = simulate(_idle_gap(activator={"timeout_ms": 3_000}))
    r = run.records
    second = r.arrival >= 40_000
    ready = _first_ready_after(run, 40_000)
    expired = second & (r.outcome == Outcome.REJECTED)
    np.testing.assert_array_equal(expired, second & (r.t_preprocessed + 3_000 <= ready))
    np.testing.assert_allclose(r.t_dropped[expired], r.t_preprocessed[expired] + 3_000)
    assert expired.sum() > 50

    run = simulate(_idle_gap(activator={"capacity": 25}))
    r = run.records
    held = (r.arrival >= 40_000) & (r.t_preprocessed < _first_ready_after(run, 40_000))
    order = np.flatnonzero(held)
    assert (r.outcome[order[:25]] == Outcome.COMPLETED).all()
    assert (r.outcome[order[25:]] == Outcome.REJECTED).all()
    np.testing.assert_array_equal(r.t_dropped[order[25:]], r.t_preprocessed[order[25:]])


def test_activator_needs_a_changing_fleet():
    with pytest.raises(ValueError, match=r"needs workers\.autoscaler"):
        scenario(router={"balancing": "random", "activator": {}})


def test_a_crash_after_the_last_arrival_still_loses_work():
    """The fleet's story goes on after the last arrival while work is left."""
    s = scenario(
        duration_s=5.0,
        traffic={"rate_rps": 400},
        router={"balancing": "round_robin"},
        batching={"max_batch_size": 1},
        workers={
            "count": 2,
            "service_time": {"kind": "deterministic", "value_ms": 6.0},  # overloaded: a queue builds
            "failures": {"mttr_s": 1, "crashes": [{"at_s": 5.5, "worker": 0}]},
        },
    )
    r = simulate(s).records
    crashed = r.outcome == Outcome.CRASHED
    assert crashed.any()
    assert (r.arrival[crashed] < 5_000).all()
    np.testing.assert_array_equal(r.t_dropped[crashed], 5_500.0)
    assert ((r.outcome == Outcome.COMPLETED) | crashed).all()
