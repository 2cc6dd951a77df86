"""Properties that hold for any scenario: conservation, batch limits, FCFS, admission and
timeouts, Little's law over a window."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine import simulate
from simulator.ledger import Outcome
from simulator.results.records import STAGES
from simulator.results.reduce import timeline
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
    # conservation: every arrival ends exactly one way, with exactly one terminal timestamp
    # (nothing is still in flight after the run, nothing both answered and dropped)
    assert np.isin(r.outcome, [o.value for o in Outcome]).all()
    assert np.isfinite(r.t_response[done]).all()
    assert np.isnan(r.t_dropped[done]).all()
    assert np.isfinite(r.t_dropped[~done]).all()
    assert np.isnan(r.t_response[~done]).all()
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
    # a rejected request never waited: it left the moment it reached the queue
    rejected, timed_out = r.outcome == Outcome.REJECTED, r.outcome == Outcome.TIMED_OUT
    assert not rejected.any() or s.batching.max_queue_size is not None
    assert (r.t_dropped[rejected] == r.t_preprocessed[rejected]).all()
    # a timed-out request waited exactly its timeout, and no dispatched one waited longer
    assert not timed_out.any() or s.batching.timeout_ms is not None
    if s.batching.timeout_ms is not None:
        waited = r.t_dropped[timed_out] - r.t_preprocessed[timed_out]
        assert np.allclose(waited, s.batching.timeout_ms, rtol=0, atol=1e-9)
        assert (r.t_dispatch[done] - r.t_preprocessed[done] <= s.batching.timeout_ms + 1e-9).all()
    # with one queue, a request was rejected only when it found the queue full
    if rejected.any() and (s.router.balancing == "shared" or s.workers.count == 1):
        left = np.where(done, r.t_dispatch, r.t_dropped)
        queued = np.isfinite(r.t_preprocessed) & ~rejected
        a, d = r.t_preprocessed[queued], left[queued]
        for t in r.t_dropped[rejected]:
            # waiting at t (one leaving at that very instant counted: ties go either way)
            assert np.count_nonzero((a <= t) & (d >= t)) >= s.batching.max_queue_size


@settings(max_examples=15, deadline=None)
@given(s=scenarios)
def test_littles_law_in_a_window_against_the_timeline(s):
    """Over a window that cuts through busy periods, the timeline's time-average queue depth
    (its own integral of the step function) = λW of the requests that arrived in the window,
    up to the boundary terms: those waiting at either edge, each for at most the longest wait.
    """
    run = simulate(s)
    r = run.records
    interval_s = 0.1
    table = timeline(run, interval_s=interval_s)
    left = np.where(r.completed, r.t_dispatch, r.t_dropped)
    queued = np.isfinite(r.t_preprocessed)
    a, d = r.t_preprocessed[queued], left[queued]
    lo, hi = 0.5 * s.duration_s * 1000.0, 0.9 * s.duration_s * 1000.0  # ms, on the timeline's bin edges
    bins = (table["t_s"] * 1000.0 >= lo - 1e-6) & (table["t_s"] * 1000.0 < hi - 1e-6)
    L = table.loc[bins, "queue_depth"].mean()
    inside = (a >= lo) & (a < hi)
    lam_w = (d[inside] - a[inside]).sum() / (hi - lo)  # λ W = (count / T) × mean wait
    at_edges = np.count_nonzero((a < lo) & (d > lo)) + np.count_nonzero((a < hi) & (d > hi))
    longest = (d - a).max() if len(a) else 0.0
    assert abs(L - lam_w) <= at_edges * longest / (hi - lo) + 1e-9
