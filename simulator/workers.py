"""GPU worker pool: batch service times and the SimPy scheduler that feeds instances.

Each worker runs ``workers.instances`` model instances fed by its own batch queue (or,
with ``router.balancing: shared``, the whole pool shares one queue). Free instances sit
in a FIFO store (the longest idle serves next). One scheduler process per queue takes a
free instance, asks the :class:`~simulator.batcher.BatchQueue` for a batch (waiting out the batching
window if it must), and hands the batch to the instance; the instance returns to the
store when its service time elapses. That is a handful of SimPy events per *batch*,
never per request.
"""

from __future__ import annotations

import math
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


def run_pool(
    queues: list[BatchQueue], instances: list[list[int]], service: ServiceModel
) -> tuple[list[tuple[np.ndarray, ...]], BatchLog]:
    """Simulate every queue's scheduler and its instances in one environment.

    ``instances[k]`` are the global ids of the model instances fed by ``queues[k]``
    (one queue per worker, or one queue shared by the whole pool). Returns, per queue,
    per-request (queue order) start, end, batch size and instance, and the batch log
    of the whole pool; requests never dispatched keep NaN times, size 0, instance -1.

    Times are exact: each scheduler keeps its own logical clock (SimPy's ``now``
    accrues rounding as ``now + delay``), so a window that closes at t closes at t.
    """
    env = simpy.Environment()
    b_start: list[float] = []
    b_end: list[float] = []
    b_size: list[int] = []
    b_inst: list[int] = []
    results = []

    def release(free: simpy.Store, inst: int, at: float):
        return lambda _event: free.put((inst, at))

    def scheduler(queue: BatchQueue, free: simpy.Store, start, end, sizes, insts):
        clock = 0.0
        while True:
            inst, free_at = yield free.get()
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
            size = len(decision)
            done = clock + service(size)
            start[decision] = clock
            end[decision] = done
            sizes[decision] = size
            insts[decision] = inst
            b_start.append(clock)
            b_end.append(done)
            b_size.append(size)
            b_inst.append(inst)
            env.timeout(max(0.0, done - env.now)).callbacks.append(release(free, inst, done))

    for queue, ids in zip(queues, instances, strict=True):
        free = simpy.Store(env)
        free.items.extend((i, 0.0) for i in ids)
        arrays = (
            np.full(queue.m, np.nan),
            np.full(queue.m, np.nan),
            np.zeros(queue.m, dtype=np.int64),
            np.full(queue.m, -1, dtype=np.int64),
        )
        results.append(arrays)
        env.process(scheduler(queue, free, *arrays))
    env.run()
    log = BatchLog(
        start=np.asarray(b_start),
        end=np.asarray(b_end),
        size=np.asarray(b_size, dtype=np.int64),
        instance=np.asarray(b_inst, dtype=np.int64),
    )
    return results, log
