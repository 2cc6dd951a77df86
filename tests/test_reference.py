"""The fast engine against the event-per-request reference model, on identical inputs.

Inputs are replayed in order (``order: sequential`` empirical distributions and an
arrivals file), so both models see the same numbers and must agree to float precision:
a noise-free correctness check beside the statistical ones.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.engine import simulate
from simulator.ledger import Outcome
from tests.helpers import scenario
from tests.reference_model import simulate_reference

COLUMNS = ("t_dropped", "t_api", "t_router", "t_features", "t_preprocessed", "t_dispatch", "t_inferred", "t_response")


def _seq(rng, n, scale):
    return {"kind": "empirical", "order": "sequential", "samples_ms": rng.exponential(scale, n).round(6).tolist()}


def _build(tmp_path, seed, *, load, workers, instances, balancing, batching, cpu_workers, lookups, n=400):
    """``load``: mean batch service time × arrival rate per instance (1 = saturated at batch size 1)."""
    rng = np.random.default_rng(seed)  # test inputs only; the models draw from the scenario's streams
    arrivals = np.sort(rng.uniform(0, 1.0, n))
    path = tmp_path / f"arrivals_{seed}.txt"
    path.write_text("\n".join(f"{t:.9f}" for t in arrivals) + "\n")
    return scenario(
        duration_s=1.0,
        traffic={"arrivals_file": str(path)},
        network={"client_to_api": _seq(rng, 97, 2.0), "api_to_client": _seq(rng, 89, 2.0)},
        router={"overhead": _seq(rng, 83, 0.5), "balancing": balancing},
        features={"lookups_per_request": lookups, "batch_size": 3, "parallelism": 2, "round_trip": _seq(rng, 71, 1.0)}
        if lookups
        else {},
        preprocess={"service": _seq(rng, 61, 1.0), "cpu_workers": cpu_workers},
        batching=batching,
        workers={
            "count": workers,
            "instances": instances,
            "service_time": _seq(rng, 53, load * workers * instances / n * 1000.0),
        },
        postprocess={"service": _seq(rng, 47, 0.3)},
    )


def _compare(s):
    fast = simulate(s)
    ref = simulate_reference(s)
    np.testing.assert_array_equal(fast.records.outcome, ref["outcome"])
    for col in COLUMNS:
        np.testing.assert_allclose(getattr(fast.records, col), ref[col], rtol=0, atol=1e-9, err_msg=col)
    # batch for batch: the same start, instance, members and size, in the same order
    r = fast.records

    def members(t, i):
        return tuple(np.flatnonzero((r.t_dispatch == t) & (r.instance == i)))

    b = fast.batches
    fast_log = sorted(
        (round(float(t), 6), int(i), int(k), members(t, i)) for t, i, k in zip(b.start, b.instance, b.size, strict=True)
    )
    ref_log = sorted((round(float(t), 6), int(i), len(ids), tuple(sorted(ids))) for t, ids, i in ref["log"])
    assert len(fast_log) == len(ref_log)
    for got, want in zip(fast_log, ref_log, strict=True):
        assert got[1:] == want[1:], f"batch at {got[0]} ms: engine {got[1:]}, reference {want[1:]}"
        assert abs(got[0] - want[0]) <= 1e-6
        assert got[2] == len(got[3])  # the batch log's size is its members in the records
    return fast, ref


@pytest.mark.parametrize(
    ("balancing", "batching", "load"),
    [
        ("shared", {"max_batch_size": 1}, 0.8),  # the FCFS recursion fast path
        ("shared", {"max_batch_size": 1, "max_queue_size": 10_000}, 0.8),  # same system, SimPy scheduler
        ("shared", {"max_batch_size": 8, "max_queue_delay_ms": 2.0}, 3.0),
        ("random", {"max_batch_size": 4, "max_queue_delay_ms": 1.0, "preferred_batch_sizes": [2]}, 2.0),
        ("round_robin", {"max_batch_size": 3, "max_queue_delay_ms": 3.0, "max_queue_size": 4, "timeout_ms": 8.0}, 4.0),
        ("random", {"max_batch_size": 4, "max_queue_delay_ms": 2.0, "deadline_ms": 20.0}, 3.0),
        ("shared", {"max_batch_size": 1, "deadline_ms": 15.0}, 1.5),
        ("round_robin", {"max_batch_size": 8, "max_queue_delay_ms": 1.0, "timeout_ms": 12.0, "deadline_ms": 18.0}, 4.0),
    ],
)
def test_engine_matches_reference(tmp_path, balancing, batching, load):
    s = _build(
        tmp_path, 3, load=load, workers=2, instances=2, balancing=balancing, batching=batching, cpu_workers=2, lookups=7
    )
    fast, _ = _compare(s)
    assert fast.records.completed.sum() > 0
    if "deadline_ms" in batching:  # the case sheds late requests, so the comparison covers it
        assert (fast.records.outcome == Outcome.TIMED_OUT).sum() > 5


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10_000),
    workers=st.integers(1, 3),
    instances=st.integers(1, 2),
    max_batch=st.integers(1, 8),
    delay=st.floats(0.0, 5.0),
    cap=st.one_of(st.none(), st.integers(1, 20)),
    timeout=st.one_of(st.none(), st.floats(0.5, 30.0)),
    deadline=st.one_of(st.none(), st.floats(2.0, 40.0)),
    load=st.floats(0.2, 5.0),
    cpu_workers=st.one_of(st.none(), st.integers(1, 3)),
    lookups=st.integers(0, 7),
    preferred=st.sets(st.integers(1, 8), max_size=3),
)
def test_engine_matches_reference_hypothesis(
    tmp_path, seed, workers, instances, max_batch, delay, cap, timeout, deadline, load, cpu_workers, lookups, preferred
):
    if cap is not None:  # with a queue limit, when late requests are shed decides admissions: engine-specific
        deadline = None
    batching = {
        "max_batch_size": max_batch,
        "max_queue_delay_ms": delay,
        "max_queue_size": cap,
        "timeout_ms": timeout,
        "deadline_ms": deadline,
        "preferred_batch_sizes": sorted(p for p in preferred if p <= max_batch),
    }
    balancing = "shared" if max_batch == 1 and cap is None and timeout is None and deadline is None else "round_robin"
    s = _build(
        tmp_path,
        seed,
        load=load,
        workers=workers,
        instances=instances,
        balancing=balancing,
        batching=batching,
        cpu_workers=cpu_workers,
        lookups=lookups,
        n=150,
    )
    _compare(s)
