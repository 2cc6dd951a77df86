"""Dynamic batching, Triton semantics: exact event logs of tiny scenarios.

One worker, one instance, deterministic service, no other delays: every dispatch,
rejection and timeout happens at a time we can work out by hand.
"""

from __future__ import annotations

import numpy as np

from simulator.ledger import Outcome
from simulator.scenario.config import TritonBatching, Workers
from simulator.serving.batcher import BatchQueue
from simulator.serving.workers import ServiceModel, run_pool


def run(arrivals_ms, service_ms, instances=1, deadlines=None, **batching):
    cfg = TritonBatching(**batching)
    workers = Workers(count=1, instances=instances, service_time={"kind": "deterministic", "value_ms": service_ms})
    queue = BatchQueue(np.asarray(arrivals_ms, dtype=float), cfg, deadlines=deadlines)
    service = ServiceModel(workers, cfg.max_batch_size, np.random.default_rng(0))
    [(start, *_)], log = run_pool([queue], [list(range(instances))], service)
    batches = []
    for t in log.start:
        ids = tuple(int(i) for i in np.flatnonzero(start == t))
        if not batches or batches[-1] != (float(t), ids):
            batches.append((float(t), ids))
    dropped = [
        (int(i), Outcome(queue.outcome[i]).name, float(queue.drop_time[i])) for i in np.flatnonzero(queue.outcome)
    ]
    return batches, dropped


def test_window_expires_from_the_oldest_request():
    batches, dropped = run([0.0, 2.0, 5.0, 30.0], service_ms=4.0, max_batch_size=4, max_queue_delay_ms=10.0)
    assert batches == [(10.0, (0, 1, 2)), (40.0, (3,))]
    assert dropped == []


def test_max_batch_size_closes_the_batch_before_the_window():
    batches, _ = run([0.0, 1.0, 2.0, 3.0, 4.0], service_ms=4.0, max_batch_size=4, max_queue_delay_ms=10.0)
    # four requests by t=3 close the first batch; the fifth waits its own window (4 + 10 = 14)
    assert batches == [(3.0, (0, 1, 2, 3)), (14.0, (4,))]


def test_batch_forms_only_when_an_instance_is_free():
    batches, _ = run([0.0, 1.0, 6.0, 7.0, 8.0], service_ms=20.0, max_batch_size=8, max_queue_delay_ms=5.0)
    # first batch at its window (5); the instance is busy until 25, by when the rest waited past theirs
    assert batches == [(5.0, (0, 1)), (25.0, (2, 3, 4))]


def test_preferred_size_goes_at_once():
    batches, _ = run(
        [0.0, 1.0, 2.0, 3.0, 4.0],
        service_ms=1.0,
        max_batch_size=8,
        max_queue_delay_ms=50.0,
        preferred_batch_sizes=[2, 4],
    )
    # two queued at t=1 is a preferred size; then 2 and 3 make another pair at t=3; 4 waits its window
    assert batches == [(1.0, (0, 1)), (3.0, (2, 3)), (54.0, (4,))]


def test_largest_preferred_size_when_more_are_queued():
    # the instance is busy until 10, when five are queued: the largest preferred size <= 5 is 4
    batches, _ = run(
        [0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        service_ms=10.0,
        max_batch_size=8,
        max_queue_delay_ms=0.0,
        preferred_batch_sizes=[2, 4],
    )
    assert batches == [(0.0, (0,)), (10.0, (1, 2, 3, 4)), (20.0, (5,))]


def test_full_queue_rejects_arrivals():
    batches, dropped = run([0.0, 1.0, 2.0, 3.0, 4.0], service_ms=100.0, max_batch_size=1, max_queue_size=2)
    assert batches == [(0.0, (0,)), (100.0, (1,)), (200.0, (2,))]
    assert dropped == [(3, "REJECTED", 3.0), (4, "REJECTED", 4.0)]


def test_queue_timeout_drops_requests_at_their_deadline():
    batches, dropped = run([0.0, 1.0, 2.0, 50.0], service_ms=100.0, max_batch_size=1, timeout_ms=60.0)
    # 1 and 2 would start at 100, past their deadlines (61, 62); 3's deadline is 110
    assert batches == [(0.0, (0,)), (100.0, (3,))]
    assert dropped == [(1, "TIMED_OUT", 61.0), (2, "TIMED_OUT", 62.0)]


def test_expiry_frees_space_before_an_arrival_at_the_same_instant():
    # queue cap 1: request 1 waits, expires at 1 + 5 = 6; request 2 arrives at 6 and gets the space
    batches, dropped = run([0.0, 1.0, 6.0, 7.0], service_ms=100.0, max_batch_size=1, max_queue_size=1, timeout_ms=5.0)
    assert dropped == [(1, "TIMED_OUT", 6.0), (2, "TIMED_OUT", 11.0), (3, "REJECTED", 7.0)]
    assert batches == [(0.0, (0,))]


def test_two_instances_take_batches_in_turn():
    batches, _ = run([0.0, 0.5, 1.0, 1.5], service_ms=10.0, instances=2, max_batch_size=2, max_queue_delay_ms=0.0)
    assert batches == [(0.0, (0,)), (0.5, (1,)), (10.0, (2, 3))]


def test_requests_past_their_deadline_are_shed_when_a_batch_forms():
    # deadlines count from the client's send, so they need not follow queue order
    batches, dropped = run(
        [0.0, 1.0, 2.0, 3.0], service_ms=10.0, max_batch_size=2, deadline_ms=1.0, deadlines=[50.0, 8.0, 100.0, 9.0]
    )
    # at 10 the instance frees: 1 and 3 are late (8, 9) and leave; 2 goes alone
    assert batches == [(0.0, (0,)), (10.0, (2,))]
    assert dropped == [(1, "TIMED_OUT", 8.0), (3, "TIMED_OUT", 9.0)]


def test_late_requests_beyond_the_next_batch_wait_their_turn_to_be_shed():
    # 3 is late from t=5 but sits behind a full batch of live ones: it leaves when it reaches the front (20)
    batches, dropped = run(
        [0.0, 1.0, 2.0, 3.0], service_ms=10.0, max_batch_size=2, deadline_ms=1.0, deadlines=[50.0, 60.0, 70.0, 5.0]
    )
    assert batches == [(0.0, (0,)), (10.0, (1, 2))]
    assert dropped == [(3, "TIMED_OUT", 5.0)]
