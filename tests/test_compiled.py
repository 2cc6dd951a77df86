"""The compiled batch scheduler against the SimPy one: the same batches, request for request.

:mod:`simulator.serving.compiled` runs a fixed pool's batch queue and its instances in a
numba loop. The SimPy scheduler (:func:`simulator.serving.workers.run_pool` over
:class:`~simulator.serving.batcher.BatchQueue`) is the reference: on the same arrivals
and the same batch-time stream every request's dispatch, completion, batch, instance,
outcome and drop time, and every batch, must be identical, bit for bit. The cases are
drawn at random over what the batching can be (sizes, windows, preferred sizes, queue
limits, timeouts, instances, tied arrivals, random and replayed batch times), run
closed and fed in parts with a horizon, as the streaming engine feeds it.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator import load_scenario, simulate
from simulator.ledger import BatchLog, Outcome, Served
from simulator.scenario.config import TritonBatching, Workers
from simulator.serving.batcher import BatchQueue
from simulator.serving.compiled import CompiledFeed, covers, drain
from simulator.serving.dispatch import serve
from simulator.serving.workers import ServiceModel, run_pool
from tests.helpers import ROOT


def _case(seed: int):
    """Arrivals, batching, workers and instance ids of one random case."""
    r = np.random.default_rng(seed)
    n = int(r.integers(1, 2500))
    arrivals = np.sort(r.exponential(1 / r.uniform(0.2, 3.0), n).cumsum())
    if r.random() < 0.3:
        arrivals = np.round(arrivals)  # ties
    max_b = int(r.choice([1, 2, 4, 8, 16, 32]))
    preferred = [int(p) for p in r.choice([2, 4, 8], size=int(r.integers(0, 3)), replace=False) if p <= max_b]
    batching = TritonBatching(
        max_batch_size=max_b,
        max_queue_delay_ms=float(r.choice([0.0, 0.5, 2.0, 5.0])),
        max_queue_size=int(r.choice([1, 3, 10, 100])) if r.random() < 0.6 else None,
        timeout_ms=float(r.choice([1.0, 5.0, 20.0])) if r.random() < 0.5 else None,
        preferred_batch_sizes=preferred if r.random() < 0.4 else [],
    )
    service_time = [
        {"kind": "affine", "base_ms": 2.0, "per_item_ms": 0.5, "noise_cv": 0.3},
        {"kind": "deterministic", "value_ms": float(r.choice([1.0, 3.0]))},
        {"kind": "empirical", "samples_ms": [1.0, 2.0, 7.5], "order": "sequential"},
        {"kind": "lognormal", "mean_ms": 3.0, "cv": 1.0},
    ][int(r.integers(0, 4))]
    k = int(r.choice([1, 1, 2, 3]))
    workers = Workers(count=1, instances=k, service_time=service_time)
    return r, arrivals, batching, workers, list(range(10, 10 + k))


def _equal(a: Served, b: Served, la: BatchLog, lb: BatchLog) -> None:
    for name in Served._fields:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    for name in ("start", "end", "size", "instance"):
        np.testing.assert_array_equal(getattr(la, name), getattr(lb, name), err_msg=f"batches.{name}")


@pytest.mark.parametrize("parts", [False, True], ids=["closed", "in_parts"])
def test_compiled_scheduler_equals_simpy(parts):
    """150 random queues each way; every served column and every batch identical."""
    outcomes = set()
    for seed in range(150):
        r, arrivals, batching, workers, ids = _case(seed)
        service = ServiceModel(workers, batching.max_batch_size, np.random.default_rng(seed))
        ref = run_pool([BatchQueue(arrivals, batching)], [ids], service)
        feed = CompiledFeed(
            batching, ids, ServiceModel(workers, batching.max_batch_size, np.random.default_rng(seed)).feed(0)
        )
        if not parts:
            feed.extend(arrivals, np.inf)
            drain([feed])
            got = feed.results()
            served, log = got.served, got.batches
        else:  # fed up to each horizon, the settled front handed out and forgotten
            pieces = []
            lo = 0
            for horizon in np.sort(r.uniform(0, arrivals[-1] * 1.1, int(r.integers(1, 8)))):
                hi = int(np.searchsorted(arrivals, horizon, side="left"))
                feed.extend(arrivals[lo:hi], horizon)
                lo = hi
                feed.run()
                cut = feed.settled()
                pieces.append(feed.results(cut))
                feed.trim(cut)
            feed.extend(arrivals[lo:], np.inf)
            drain([feed])
            pieces.append(feed.results())
            served = Served(*(np.concatenate(c) for c in zip(*(p.served for p in pieces), strict=True)))
            log = BatchLog(
                *(np.concatenate([getattr(p.batches, f) for p in pieces]) for f in ("start", "end", "size", "instance"))
            )
        _equal(ref.served[0], served, ref.batches, log)
        outcomes.update(np.unique(served.outcome).tolist())
    # the cases reach every outcome a fixed queue has
    assert outcomes == {Outcome.COMPLETED, Outcome.REJECTED, Outcome.TIMED_OUT}


def test_serve_is_the_same_compiled_or_not():
    """A 12-worker pool with random routing and queue limits, through ``serve`` both ways."""
    r = np.random.default_rng(3)
    n = 20_000
    t_pre = np.sort(r.exponential(1 / 45.0, n).cumsum()) + r.gamma(2.0, 0.5, n)  # not sorted
    assign = r.integers(0, 12, n)
    workers = Workers(count=12, instances=2, service_time={"kind": "affine", "base_ms": 3, "per_item_ms": 0.4})
    batching = TritonBatching(max_batch_size=16, max_queue_delay_ms=2, max_queue_size=20, timeout_ms=30)
    runs = [
        serve(t_pre, assign, workers, batching, ServiceModel(workers, 16, np.random.default_rng(5)), compiled=c)
        for c in (True, False)
    ]
    _equal(runs[0].served, runs[1].served, runs[0].batches, runs[1].batches)
    assert (runs[0].served.outcome == Outcome.REJECTED).any()


def test_what_it_covers():
    """Deadlines keep the SimPy scheduler; a scenario with them still runs."""
    assert covers(TritonBatching(max_batch_size=8, max_queue_delay_ms=1))
    assert not covers(TritonBatching(max_batch_size=8, max_queue_delay_ms=1, deadline_ms=50))
    s = load_scenario(
        ROOT / "scenarios/cv_degradation.yaml", overrides=["duration_s=20", "warmup_s=2", "batching.deadline_ms=500"]
    )
    assert not covers(s.batching)
    assert simulate(s).records.completed.any()
