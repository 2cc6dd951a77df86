"""GPU worker pool: batch service times and the SimPy scheduler that feeds instances.

Each worker runs ``workers.instances`` model instances fed by its own batch queue (or,
with ``router.balancing: shared``, the whole pool shares one queue). Free instances sit
in a FIFO (the longest idle serves next). One scheduler process per queue takes a
free instance, asks the :class:`~simulator.serving.batcher.BatchQueue` for a batch (waiting out the batching
window if it must), and hands the batch to the instance; the instance returns to the
FIFO when its service time elapses. That is a handful of SimPy events per *batch*,
never per request.

This SimPy scheduler is the reference, and it runs every dynamic pool and every queue
with end-to-end deadlines. A fixed pool's other queues run the same decisions compiled
(:mod:`simulator.serving.compiled`, checked against this scheduler request for request);
each fixed-pool queue draws its batch times from a stream of its own
(:meth:`ServiceModel.feed`), so either scheduler gives the same numbers. A dynamic pool's
worker does too (its id's stream), so that the order in which SimPy runs two workers'
decisions at the same instant changes no draw, and a run cut into chunks gives the same
numbers as one chunk.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from typing import NamedTuple

import numpy as np
import simpy

from simulator.ledger import BatchLog, Outcome, Served, concat_logs
from simulator.rng import child
from simulator.scenario.config import Affine, Table, Workers
from simulator.scenario.distributions import Sampler
from simulator.scenario.servicetime import ProfileRef
from simulator.serving.batcher import DONE, EXTEND, BatchQueue, Wait
from simulator.serving.compiled import arrive, rate_factor
from simulator.serving.served import PoolRun
from simulator.stages.speed import SpeedPath, SpeedProcess

_CHUNK = 1 << 12


def mean_service_ms(cfg: Workers, batch_size: int) -> float:
    """Mean service time of one batch of ``batch_size`` requests, ms."""
    st = cfg.service_time
    match st:
        case Affine():
            return st.base_ms + st.per_item_ms * batch_size
        case Table():
            sizes = sorted(st.batch_ms)
            times = [st.batch_ms[s] for s in sizes]
            if len(sizes) == 1:
                return times[0]
            if batch_size <= sizes[0]:
                lo, hi = 0, 1
            elif batch_size >= sizes[-1]:
                lo, hi = len(sizes) - 2, len(sizes) - 1
            else:
                return float(np.interp(batch_size, sizes, times))
            slope = (times[hi] - times[lo]) / (sizes[hi] - sizes[lo])
            value = times[lo] + slope * (batch_size - sizes[lo])
            if batch_size > sizes[-1]:  # past the table a batch is never faster than its largest one
                value = max(value, times[-1])
            return max(0.0, value)
        case _:
            return st.mean


class ServiceModel:
    """Draws batch service times in dispatch order from one random stream.

    A fixed pool gives each of its batch queues a stream of its own (:meth:`feed`): a
    queue's batch times then depend only on its own dispatch order, so each queue can be
    simulated on its own (the compiled scheduler of :mod:`simulator.serving.compiled`)
    with the same numbers as the SimPy scheduler.
    """

    def __init__(
        self, cfg: Workers, max_batch: int, rng: np.random.Generator, speed: SpeedProcess | None = None, queue: int = 0
    ):
        self._args = (cfg, max_batch, rng)
        self.speed = speed
        self.queue = queue
        self.path = None if speed is None else speed.worker(queue)  # the host's speed, where it varies
        st = cfg.service_time
        if isinstance(st, ProfileRef):
            raise ValueError("a profile service time is read by load_scenario; load the scenario from its file")
        self._per_size = isinstance(st, Affine | Table)
        idle = (st.after_idle or {}) if self._per_size else {}
        knots = sorted(idle)
        # the factor by the instance's idle time before a batch (empty: none), as the kernels read it
        self.idle_ms = np.asarray(knots, dtype=float)
        self.idle_factor = np.asarray([idle[k] for k in knots], dtype=float)
        rate = (st.by_rate or {}) if self._per_size else {}
        knots = sorted(rate)
        # the factor by the instance's recent throughput (empty: none), as the kernels read it
        self.rate_rps = np.asarray(knots, dtype=float)
        self.rate_factor = np.asarray([rate[k] for k in knots], dtype=float)
        self.rate_tau_ms = float(st.rate_window_ms) if self._per_size else 1.0
        self.rate_initial = float(st.rate_initial_rps) / 1000.0 if self._per_size else 0.0  # requests a ms
        # by_rate counts the queue's arrivals (each instance its share), not the batches taken
        self.rate_arrivals = bool(self._per_size and rate and st.rate_of == "arrivals")
        self.arrived = np.zeros((1, 4))  # the SimPy schedulers' queue's arrivals, averaged (watch)
        after = (st.after_batch or {}) if self._per_size else {}
        knots = sorted(after)
        # the factor by the size of the instance's batch before (empty: none), as the kernels read it
        self.after_k = np.asarray(knots, dtype=float)
        self.after_f = np.asarray([after[k] for k in knots], dtype=float)
        queue = (st.by_queue or {}) if self._per_size else {}
        knots = sorted(queue)
        # the factor by the requests waiting as a batch is taken (empty: none), as the kernels read it
        self.queue_k = np.asarray(knots, dtype=float)
        self.queue_f = np.asarray([queue[k] for k in knots], dtype=float)
        self.rst: dict = {}  # the SimPy schedulers' instances' recent throughput, by instance
        if self._per_size:
            self._means = [0.0] + [mean_service_ms(cfg, b) for b in range(1, max_batch + 1)]
            if st.noise_ratios is not None:  # a calibration's measured ratios, resampled
                ratios = np.asarray(st.noise_ratios, dtype=float)
                self._factor = lambda n: ratios[rng.integers(0, len(ratios), n)]
            else:
                cv = st.noise_cv
                sigma2 = math.log1p(cv * cv)
                self._factor = lambda n: rng.lognormal(-sigma2 / 2, math.sqrt(sigma2), n) if cv else np.ones(n)
        else:
            sampler = Sampler(st, rng)
            self._factor = sampler.draw
        self._buf: list[float] = []
        self._pos = 0

    def feed(self, k: int, *, path: int | None = None) -> ServiceModel:
        """The model of a fixed pool's ``k``-th queue: its own stream, a child of this one's
        seed (the same for every call, whatever this model has drawn), and its own speed
        path (``path``: queue ``path``'s instead; a dynamic pool's workers keep this model's)."""
        cfg, max_batch, rng = self._args
        return ServiceModel(cfg, max_batch, child(rng, k), self.speed, k if path is None else path)

    def queue_path(self, k: int) -> SpeedPath | None:
        """The speed path of the fixed pool's ``k``-th queue (None: constant speed)."""
        return None if self.speed is None else self.speed.worker(k)

    def block(self) -> np.ndarray:
        """The next block of factors, as :meth:`__call__` draws them (a batch's time is
        ``means[size] × factor``, or the factor itself without ``means``)."""
        return np.asarray(self._factor(_CHUNK), dtype=float)

    @property
    def means(self) -> np.ndarray | None:
        """Mean batch time by batch size (index 0 unused), or None for a plain distribution."""
        return np.asarray(self._means, dtype=float) if self._per_size else None

    def draw(self, count: int, batch_size: int) -> np.ndarray:
        """``count`` service times of batches of ``batch_size``, in order, in bulk.

        The k-th value is the one the k-th call would give: the buffer is used up first,
        and numpy's generators produce the same sequence whatever the chunking.
        """
        take = min(len(self._buf) - self._pos, count)
        head = np.asarray(self._buf[self._pos : self._pos + take], dtype=float)
        self._pos += take
        if count > take:
            drawn = np.asarray(self._factor(count - take), dtype=float)
            # nothing buffered: the draws themselves (a fresh array), not a copy of them
            x = np.concatenate([head, drawn]) if take or drawn.base is not None else drawn
        else:
            x = head
        return self._means[batch_size] * x if self._per_size else x

    def rate_state(self, instances: int) -> np.ndarray:
        """The instances' state for :meth:`rate_args` at the run's start: the throughput
        ``rate_initial_rps`` as of time 0, no batch before."""
        rst = np.zeros((instances, 4))
        rst[:, 0] = self.rate_initial
        if self.rate_arrivals:  # each instance's share of an arrival (compiled.arrive)
            rst[:, 3] = 1.0 / instances
        return rst

    def watch(self, queue, instances: int) -> None:
        """Where ``by_rate`` counts arrivals: average those ``queue`` (a SimPy scheduler's
        :class:`~simulator.serving.batcher.BatchQueue`) admits, as ``instances`` would share
        them as the run starts (:meth:`finish` reads the pool's size as it is then)."""
        if not self.rate_arrivals:
            return
        if self.arrived[0, 3] == 0.0:  # the first queue watched (a class's shares its pool's average)
            self.arrived[0, 0] = self.rate_initial * instances
            self.arrived[0, 3] = 1.0
        queue.on_admit = self._arrive

    def _arrive(self, times) -> None:
        for t in times:
            arrive(self.arrived, t, self.rate_tau_ms)

    def rate_args(self, rst: np.ndarray) -> tuple:
        """What a kernel reads for ``by_rate``, ``after_batch`` and ``by_queue``: the first
        table's knots and factors, its time constant, ``rst``, the instances' state (an
        (instances, 4) array it updates: throughput, when, the last batch's size, the
        instance's share of an arrival where the throughput counts arrivals), the second
        table's knots and factors, and the third's (a kernel passes the count waiting)."""
        return (
            self.rate_rps, self.rate_factor, self.rate_tau_ms, rst, self.after_k, self.after_f,
            self.queue_k, self.queue_f,
        )  # fmt: skip

    def finish(
        self, start: float, batch_size: int, idle_ms: float = 0.0, inst=0, waiting: int = 0, instances: int = 1
    ) -> float:
        """When a batch of ``batch_size`` started at ``start`` (ms) on instance ``inst``, idle
        for ``idle_ms`` before it, ends: its drawn time (times the ``after_idle`` factor and
        the ``by_rate`` factor at the instance's recent throughput and the ``after_batch``
        factor at its batch before, and the ``by_queue`` factor at the ``waiting`` requests
        queued as it was taken, its own included), stretched by the host's speed while it runs.
        Where ``by_rate`` counts arrivals, the instance's share is the watched queue's over
        the ``instances`` serving it."""
        work = self(batch_size)
        if len(self.idle_ms):
            work *= float(np.interp(idle_ms, self.idle_ms, self.idle_factor))  # flat beyond the ends
        if len(self.rate_rps) or len(self.after_k) or len(self.queue_k):
            state = self.rst.get(inst)
            if state is None:
                state = self.rst[inst] = self.rate_state(1)
            if self.rate_arrivals:  # the queue's arrivals, this instance's share of them
                state[0, 0] = self.arrived[0, 0] / max(instances, 1)
                state[0, 1] = self.arrived[0, 1]
            work *= float(rate_factor(start, batch_size, 0, *self.rate_args(state), waiting))
        return start + work if self.path is None else self.path.finish_at(start, work)

    def __call__(self, batch_size: int) -> float:
        if self._pos == len(self._buf):
            self._buf = self.block().tolist()
            self._pos = 0
        x = self._buf[self._pos]
        self._pos += 1
        return self._means[batch_size] * x if self._per_size else x


class Feed:
    """One batch queue and the model instances it feeds (one worker, or the shared pool).

    Free instances wait in a plain FIFO (longest idle first) with one wake-up event for the
    scheduler when it waits for an instance: one SimPy event per hand-back instead of a
    Store's put and get. ``extended`` wakes a scheduler that waits for more arrivals to
    be routed to an open queue; ``crashed_at`` stops everything on a crashed worker.
    """

    def __init__(self, env: simpy.Environment, queue: BatchQueue, ids: list[int], *, start_at: float = 0.0):
        self.env = env
        self.queue = queue
        self.free = deque((i, start_at) for i in ids)
        self.n_instances = len(ids)
        self.waiting: simpy.Event | None = None
        self.extended: simpy.Event | None = None
        self.busy = 0  # requests in service
        self.crashed_at: float | None = None
        self.b_start, self.b_end, self.b_inst = array("d"), array("d"), array("q")

    def release(self, inst: int, at: float, size: int):
        def callback(_event):
            if self.crashed_at is not None:
                return
            self.busy -= size
            self.free.append((inst, at))
            if self.waiting is not None:
                self.waiting.succeed()
                self.waiting = None

        return callback

    def extend(self, arrivals: np.ndarray, horizon: float, at: float, deadlines: np.ndarray | None = None) -> None:
        """At time ``at``, route more arrivals here (all before ``horizon`` are now known)
        and wake the scheduler if it waits for them."""
        self.queue.extend(arrivals, horizon, deadlines)
        self._wake(at)

    def close(self, at: float) -> None:
        """No more arrivals (the worker drains)."""
        self.queue.close()
        self._wake(at)

    def _wake(self, at: float) -> None:
        if self.extended is not None:
            self.extended.succeed(at)
            self.extended = None

    def results(self) -> PoolRun:
        """Its requests (in queue order) and its batch log.

        On a crashed worker, batches still running at the crash and requests still queued
        are lost (``Outcome.CRASHED``, dropped at the crash).
        """
        run = queue_results(self.queue, self.b_start, self.b_end, self.b_inst)
        served, log = run.served, run.batches
        if self.crashed_at is not None:
            lost = (served.outcome == Outcome.COMPLETED) & ~(served.t_done <= self.crashed_at)
            served.outcome[lost] = Outcome.CRASHED
            served.t_dropped[lost] = self.crashed_at
            served.t_dispatch[lost], served.t_done[lost] = np.nan, np.nan
            served.batch_size[lost], served.instance[lost] = 0, -1
            log = log.take(log.end <= self.crashed_at)
        return PoolRun(served, log)


def queue_results(queue: BatchQueue, b_start: array, b_end: array, b_inst: array) -> PoolRun:
    """One queue's requests (queue order) and the batch log of its dispatched batches,
    given each batch's start, end and instance in dispatch order."""
    members, sizes = queue.members()
    log = BatchLog(_np(b_start, float), _np(b_end, float), sizes, _np(b_inst, np.int64))
    served = Served.empty(queue.m)._replace(outcome=queue.outcome, t_dropped=queue.drop_time)
    served.t_dispatch[members] = np.repeat(log.start, sizes)
    served.t_done[members] = np.repeat(log.end, sizes)
    served.batch_size[members] = np.repeat(sizes, sizes)
    served.instance[members] = np.repeat(log.instance, sizes)
    return PoolRun(served, log)


def schedule(env: simpy.Environment, feed: Feed, service: ServiceModel):
    """The scheduler of one feed: take a free instance, form a batch, run it; repeat.

    Times are exact: the scheduler keeps its own logical clock (SimPy's ``now`` accrues
    rounding as ``now + delay``), so a window that closes at t closes at t.
    """
    queue, free = feed.queue, feed.free
    service.watch(queue, feed.n_instances)
    clock = 0.0
    while True:
        if not free:
            feed.waiting = env.event()
            yield feed.waiting
            if feed.crashed_at is not None:
                return
        inst, free_at = free.popleft()
        if free_at > clock:
            clock = free_at
        while True:
            decision = queue.decide(clock)
            if decision is DONE:
                return
            if decision is EXTEND:
                feed.extended = env.event()
                at = yield feed.extended
                clock = max(clock, at)
            elif type(decision) is Wait:
                yield env.timeout(max(0.0, decision.until - env.now))
                clock = decision.until
            else:
                break
            if feed.crashed_at is not None:
                return
        size = decision.size
        done = service.finish(clock, size, clock - free_at, inst, len(queue) + size, feed.n_instances)
        feed.busy += size
        feed.b_start.append(clock)
        feed.b_end.append(done)
        feed.b_inst.append(inst)
        env.timeout(max(0.0, done - env.now)).callbacks.append(feed.release(inst, done, size))


class FeedsRun(NamedTuple):
    """A fixed pool's queues run together: each queue's requests, and the pool's batch log."""

    served: list[Served]
    batches: BatchLog


def run_pool(queues: list[BatchQueue], instances: list[list[int]], service: ServiceModel) -> FeedsRun:
    """Simulate a fixed set of closed queues, each feeding its instances, in one environment.

    ``instances[k]`` are the global ids of the model instances fed by ``queues[k]`` (one
    queue per worker, or one queue shared by the whole pool); queue ``k`` draws its batch
    times from ``service.feed(k)``. Returns, per queue, its
    requests as :meth:`Feed.results` gives them, and the batch log of the whole pool.
    """
    env = simpy.Environment()
    feeds = [Feed(env, queue, ids) for queue, ids in zip(queues, instances, strict=True)]
    for k, feed in enumerate(feeds):
        env.process(schedule(env, feed, service.feed(k)))
    env.run()
    runs = [feed.results() for feed in feeds]
    return FeedsRun([run.served for run in runs], concat_logs([run.batches for run in runs]))


def _np(values: array, dtype) -> np.ndarray:
    return np.frombuffer(values, dtype=dtype).copy() if len(values) else np.zeros(0, dtype=dtype)
