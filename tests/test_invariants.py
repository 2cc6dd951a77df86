"""Properties that hold for any scenario: conservation, batch limits, FCFS, Little's law."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.batcher import Outcome
from simulator.engine import simulate
from simulator.recorder import STAGES
from tests.helpers import scenario

scenarios = st.builds(
    lambda rate, workers, instances, max_batch, delay, cap, timeout, balancing, cpu, seed: scenario(
        seed=seed,
        duration_s=2.0,
        traffic={"rate_rps": rate},
        router={"overhead": {"kind": "exponential", "mean_ms": 0.5}, "balancing": balancing},
        features={
            "lookups_per_request": 5,
            "batch_size": 2,
            "parallelism": 2,
            "round_trip": {"kind": "lognormal", "mean_ms": 1.0, "cv": 1.0},
        },
        preprocess={"service": {"kind": "gamma", "mean_ms": 1.0, "cv": 0.5}, "cpu_workers": cpu},
        batching={
            "max_batch_size": max_batch,
            "max_queue_delay_ms": delay,
            "max_queue_size": cap,
            "timeout_ms": timeout,
        },
        workers={
            "count": workers,
            "instances": instances,
            "service_time": {"kind": "affine", "base_ms": 2.0, "per_item_ms": 0.5, "noise_cv": 0.2},
        },
    ),
    rate=st.floats(50, 3000),
    workers=st.integers(1, 4),
    instances=st.integers(1, 2),
    max_batch=st.integers(1, 16),
    delay=st.floats(0, 5),
    cap=st.one_of(st.none(), st.integers(1, 64)),
    timeout=st.one_of(st.none(), st.floats(1, 50)),
    balancing=st.sampled_from(["random", "round_robin", "shared"]),
    cpu=st.one_of(st.none(), st.integers(1, 4)),
    seed=st.integers(0, 2**32 - 1),
)


@settings(max_examples=40, deadline=None)
@given(s=scenarios)
def test_invariants(s):
    run = simulate(s)
    r = run.records
    n = len(r)
    done = r.completed
    # conservation: every arrival ends completed, rejected or timed out (nothing in flight after the run)
    counts = np.bincount(r.outcome, minlength=3)
    assert counts.sum() == n
    assert np.isfinite(r.t_response[done]).all()
    assert np.isnan(r.t_dispatch[~done]).all()
    # stage timestamps never go backwards
    for _, a, b in STAGES:
        d = getattr(r, b)[done] - getattr(r, a)[done]
        assert (d >= 0).all()
    # batches respect the limit, and sizes in the log account for every completed request
    assert (run.batches.size >= 1).all()
    assert (run.batches.size <= s.batching.max_batch_size).all()
    assert run.batches.size.sum() == done.sum()
    # no instance runs two batches at once
    for inst in np.unique(run.batches.instance):
        sel = run.batches.instance == inst
        start, end = run.batches.start[sel], run.batches.end[sel]
        order = np.argsort(start, kind="stable")
        assert (start[order][1:] >= end[order][:-1] - 1e-9).all()
    # FCFS within a queue: among requests that share a worker, earlier into the queue is dispatched no later
    key = np.zeros(n, dtype=np.int64) if s.router.balancing == "shared" else r.instance // s.workers.instances
    for w in np.unique(key[done]):
        sel = done & (key == w)
        order = np.argsort(r.t_preprocessed[sel], kind="stable")
        assert (np.diff(r.t_dispatch[sel][order]) >= 0).all()
    # rejected requests never waited; timed-out ones waited exactly their timeout
    assert not (r.outcome == Outcome.TIMED_OUT).any() or s.batching.timeout_ms is not None
    assert not (r.outcome == Outcome.REJECTED).any() or s.batching.max_queue_size is not None


@settings(max_examples=15, deadline=None)
@given(s=scenarios)
def test_littles_law_in_the_batch_queue(s):
    """Time-average number waiting (from the step function of arrivals and departures) = λ W."""
    run = simulate(s)
    r = run.records
    done = r.completed
    a, d = r.t_preprocessed[done], r.t_dispatch[done]
    if len(a) < 10:
        return
    horizon = d.max()
    times = np.concatenate([a, d])
    steps = np.concatenate([np.ones(len(a)), -np.ones(len(d))])
    order = np.lexsort((-steps, times))  # at equal times count the arrival first
    level = np.cumsum(steps[order])
    area = np.sum(level[:-1] * np.diff(times[order]))
    L = area / horizon
    lam = len(a) / horizon
    W = (d - a).mean()
    assert np.isclose(L, lam * W, rtol=1e-9, atol=1e-9)
