"""The scheduler seam: build() picks the triton strategy from the batching section, and
every strategy, fed in chunks, hands out what one whole feed does, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.scenario.config import TritonBatching, Workers
from simulator.serving.scheduler import Scheduler, build, queues_of
from simulator.serving.triton import CompiledScheduler, FcfsScheduler, SimPyScheduler

WORKERS = Workers(count=3, instances=2, service_time={"kind": "affine", "base_ms": 2.0, "per_item_ms": 0.4})


def _service(batching: TritonBatching, seed: int):
    from simulator.serving.workers import ServiceModel

    return ServiceModel(WORKERS, batching.max_batch_size, np.random.default_rng(seed))


@pytest.mark.parametrize(
    ("batching", "compiled", "kind"),
    [
        (TritonBatching(), None, FcfsScheduler),
        (TritonBatching(max_batch_size=8, max_queue_delay_ms=1.0), None, CompiledScheduler),
        (TritonBatching(max_batch_size=8, max_queue_delay_ms=1.0), False, SimPyScheduler),
        (TritonBatching(max_batch_size=8, max_queue_delay_ms=1.0, deadline_ms=40.0), None, SimPyScheduler),
    ],
)
def test_build_picks_the_strategy(batching, compiled, kind):
    got = build(batching, queues_of(3, 2, shared=False), _service(batching, 0), compiled=compiled)
    assert isinstance(got, kind)
    for method in ("extend", "close", "run"):  # the protocol's one signature
        assert callable(getattr(got, method)), method
    assert set(Scheduler.__dict__) >= {"extend", "close", "run"}


def _feed(batching, compiled, shared, cuts, seed=3, n=4000):
    """One scheduler fed the same requests in the pieces ``cuts`` (times, ms)."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.exponential(0.4, n).cumsum())  # ~2,500 req/s over 6 queue instances
    queue = None if shared else rng.integers(0, 3, n)
    deadlines = t + 40.0
    pool = build(batching, queues_of(3, 2, shared=shared), _service(batching, seed), compiled=compiled)
    ids, parts, logs = [], [], []
    edges = [*cuts, np.inf]
    lo = 0
    for hi in edges:
        sel = slice(np.searchsorted(t, lo), np.searchsorted(t, hi))
        pool.extend(t[sel], np.arange(n)[sel], None if queue is None else queue[sel], deadlines[sel], hi)
        if hi == np.inf:
            pool.close()
        got = pool.run()
        ids.append(got.ids)
        parts.append(got.served)
        logs.append(got.batches)
        lo = hi
    order = np.argsort(np.concatenate(ids), kind="stable")
    served = {f: np.concatenate([getattr(p, f) for p in parts])[order] for f in parts[0]._fields}
    log = {f: np.concatenate([getattr(b, f) for b in logs]) for f in ("start", "end", "size", "instance")}
    by = np.lexsort((log["instance"], log["start"]))
    return np.concatenate(ids)[order], served, {f: v[by] for f, v in log.items()}


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize(
    ("batching", "compiled"),
    [
        (TritonBatching(), None),
        (TritonBatching(max_batch_size=8, max_queue_delay_ms=1.0, max_queue_size=30, timeout_ms=25), None),
        (TritonBatching(max_batch_size=8, max_queue_delay_ms=1.0, max_queue_size=30, timeout_ms=25), False),
        (TritonBatching(max_batch_size=8, max_queue_delay_ms=1.0, deadline_ms=40.0), None),
    ],
)
def test_a_chunked_feed_hands_out_what_one_feed_does(batching, compiled, shared):
    whole = _feed(batching, compiled, shared, [])
    chunked = _feed(batching, compiled, shared, [97.3, 400.0, 401.5, 1200.0])
    np.testing.assert_array_equal(whole[0], np.arange(4000))  # every request settles once
    np.testing.assert_array_equal(chunked[0], whole[0])
    for f in whole[1]:
        np.testing.assert_array_equal(chunked[1][f], whole[1][f], err_msg=f)
    for f in whole[2]:
        np.testing.assert_array_equal(chunked[2][f], whole[2][f], err_msg=f)
