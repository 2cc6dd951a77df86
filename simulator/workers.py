"""GPU worker pool: batch service times and the SimPy scheduler that feeds instances.

Each worker runs ``workers.instances`` model instances fed by its own batch queue (or,
with ``router.balancing: shared``, the whole pool shares one queue). Free instances sit
in a FIFO (the longest idle serves next). One scheduler process per queue takes a
free instance, asks the :class:`~simulator.batcher.BatchQueue` for a batch (waiting out the batching
window if it must), and hands the batch to the instance; the instance returns to the
FIFO when its service time elapses. That is a handful of SimPy events per *batch*,
never per request.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from dataclasses import dataclass

import numpy as np
import simpy

from simulator.batcher import DONE, BatchQueue
from simulator.config import Affine, Table, Workers
from simulator.distributions import Sampler

_CHUNK = 1 << 16


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
            return max(0.0, times[lo] + slope * (batch_size - sizes[lo]))
        case _:
            return st.mean


class ServiceModel:
    """Draws batch service times in dispatch order from one random stream."""

    def __init__(self, cfg: Workers, max_batch: int, rng: np.random.Generator):
        st = cfg.service_time
        self._per_size = isinstance(st, Affine | Table)
        if self._per_size:
            self._means = [0.0] + [mean_service_ms(cfg, b) for b in range(1, max_batch + 1)]
            cv = st.noise_cv
            sigma2 = math.log1p(cv * cv)
            self._factor = lambda n: rng.lognormal(-sigma2 / 2, math.sqrt(sigma2), n) if cv else np.ones(n)
        else:
            sampler = Sampler(st, rng)
            self._factor = sampler.draw
        self._buf: list[float] = []
        self._pos = 0

    def draw(self, count: int, batch_size: int) -> np.ndarray:
        """``count`` service times of batches of ``batch_size``, in order (same stream as calls)."""
        return np.fromiter((self(batch_size) for _ in range(count)), dtype=float, count=count)

    def __call__(self, batch_size: int) -> float:
        if self._pos == len(self._buf):
            self._buf = self._factor(_CHUNK).tolist()
            self._pos = 0
        x = self._buf[self._pos]
        self._pos += 1
        return self._means[batch_size] * x if self._per_size else x


@dataclass
class BatchLog:
    """Columnar record of every batch: when it ran, how big, on which instance."""

    start: np.ndarray
    end: np.ndarray
    size: np.ndarray
    instance: np.ndarray


class _Instances:
    """The free model instances of one queue, longest idle first.

    A plain FIFO plus one wake-up event for the scheduler when it waits for an instance:
    one SimPy event per hand-back instead of a Store's put and get.
    """

    __slots__ = ("env", "free", "waiting")

    def __init__(self, env: simpy.Environment, ids: list[int]):
        self.env = env
        self.free = deque((i, 0.0) for i in ids)
        self.waiting: simpy.Event | None = None

    def release(self, inst: int, at: float):
        def callback(_event):
            self.free.append((inst, at))
            if self.waiting is not None:
                self.waiting.succeed()
                self.waiting = None

        return callback


def run_pool(queues: list[BatchQueue], instances: list[list[int]], service: ServiceModel) -> tuple[list, BatchLog]:
    """Simulate every queue's scheduler and its instances in one environment.

    ``instances[k]`` are the global ids of the model instances fed by ``queues[k]``
    (one queue per worker, or one queue shared by the whole pool). Returns, per queue,
    per-request (queue order) start, end, batch size and instance, and the batch log
    of the whole pool; requests never dispatched keep NaN times, size 0, instance -1.

    Times are exact: each scheduler keeps its own logical clock (SimPy's ``now``
    accrues rounding as ``now + delay``), so a window that closes at t closes at t.
    """
    env = simpy.Environment()
    logs = []

    def scheduler(queue: BatchQueue, pool: _Instances, b_start: list, b_end: list, b_inst: list):
        clock = 0.0
        free = pool.free
        while True:
            if not free:
                pool.waiting = env.event()
                yield pool.waiting
            inst, free_at = free.popleft()
            if free_at > clock:
                clock = free_at
            while True:
                decision = queue.decide(clock)
                if decision is DONE:
                    return
                if isinstance(decision, float):
                    yield env.timeout(max(0.0, decision - env.now))
                    clock = decision
                    continue
                break
            done = clock + service(decision)
            b_start.append(clock)
            b_end.append(done)
            b_inst.append(inst)
            env.timeout(max(0.0, done - env.now)).callbacks.append(pool.release(inst, done))

    for queue, ids in zip(queues, instances, strict=True):
        lists = (array("d"), array("d"), array("q"))
        logs.append(lists)
        env.process(scheduler(queue, _Instances(env, ids), *lists))
    env.run()

    results, parts = [], []
    for queue, (b_start, b_end, b_inst) in zip(queues, logs, strict=True):
        members, sizes = queue.members()
        start = np.full(queue.m, np.nan)
        end = np.full(queue.m, np.nan)
        size = np.zeros(queue.m, dtype=np.int64)
        inst = np.full(queue.m, -1, dtype=np.int64)
        log = BatchLog(_np(b_start, float), _np(b_end, float), sizes, _np(b_inst, np.int64))
        start[members] = np.repeat(log.start, sizes)
        end[members] = np.repeat(log.end, sizes)
        size[members] = np.repeat(sizes, sizes)
        inst[members] = np.repeat(log.instance, sizes)
        results.append((start, end, size, inst))
        parts.append(log)
    log = BatchLog(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("start", "end", "size", "instance")))
    return results, log


def _np(values: array, dtype) -> np.ndarray:
    return np.frombuffer(values, dtype=dtype).copy() if len(values) else np.zeros(0, dtype=dtype)
