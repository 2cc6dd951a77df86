"""``batching.kind: triton``: a request-level dynamic batcher, as a
:class:`~simulator.serving.scheduler.Scheduler`, run by one of three strategies with the
same results.

- :class:`FcfsScheduler`: batching off and no queue limits, so each queue is a plain
  FCFS multi-server station, computed by the exact recursion
  (:class:`~simulator.stages.stations.FcfsStation`).
- :class:`CompiledScheduler`: the batch queue's decisions as one compiled loop per queue
  (:class:`~simulator.serving.compiled.CompiledFeed`), where it covers the batching.
- :class:`SimPyScheduler`: the reference, one SimPy process per queue asking a
  :class:`~simulator.serving.batcher.BatchQueue` (end-to-end deadlines run here).

Each keeps its queues' state between calls, so a run fed in chunks gives a whole run's
numbers bit for bit; each hands out its batches queue by queue, each queue's in order.
"""

from __future__ import annotations

import math

import numpy as np
import simpy

from simulator.ledger import BatchLog, Served, concat_logs
from simulator.scenario.fleet import TritonBatching
from simulator.serving.batcher import BatchQueue
from simulator.serving.compiled import CompiledFeed, covers
from simulator.serving.served import Settled
from simulator.serving.workers import Feed, ServiceModel, queue_results, schedule
from simulator.stages.stations import FcfsStation


def fast_path(cfg: TritonBatching) -> bool:
    """Batching off and no queue limits: the pool is a plain FCFS multi-server station."""
    return cfg.max_batch_size == 1 and cfg.max_queue_size is None and cfg.timeout_ms is None and cfg.deadline_ms is None


def scheduler(cfg: TritonBatching, instances: list[list[int]], service: ServiceModel, *, compiled: bool | None = None):
    """The strategy for ``cfg``: FCFS when batching is off, else compiled where it covers
    the batching (or as ``compiled`` says), else SimPy."""
    if fast_path(cfg) and not (
        len(service.idle_ms) or len(service.rate_rps) or len(service.after_k) or len(service.queue_k)
    ):  # need its clock
        return FcfsScheduler(instances, service)
    if covers(cfg) if compiled is None else compiled:
        return CompiledScheduler(cfg, instances, service)
    return SimPyScheduler(cfg, instances, service)


def by_queue(queue: np.ndarray | None, queues: int, n: int) -> list[np.ndarray]:
    """Positions of ``n`` requests (in time order) in each of ``queues`` queues, each in
    time order; ``queue`` None: one shared queue."""
    if queue is None:
        return [np.arange(n)]
    w = queue.astype(np.int16) if queues <= np.iinfo(np.int16).max else queue
    by = np.argsort(w, kind="stable")  # queue, then time (the input is in time order); radix on int16
    return np.split(by, np.searchsorted(queue[by], np.arange(1, queues)))


def _merge(ids: list[np.ndarray], parts: list[Served], logs: list[BatchLog]) -> Settled:
    if not parts:
        return Settled(np.zeros(0, np.int64), Served.empty(0), BatchLog.empty())
    if len(parts) == 1:
        return Settled(ids[0], parts[0], logs[0])
    served = Served(*(np.concatenate(cols) for cols in zip(*parts, strict=True)))
    return Settled(np.concatenate(ids), served, concat_logs(logs))


class FcfsScheduler:
    """Batch size 1, no limits: each queue an exact FCFS station over its instances.

    Service times are drawn for the requests in the order they reach the batching stage
    (across queues: a shared queue's dispatch order), in bulk; with a host speed that
    varies, each queue's station runs in the clock of the work its host does
    (:mod:`simulator.stages.speed`)."""

    def __init__(self, instances: list[list[int]], service: ServiceModel):
        self.ids = [np.asarray(ids, dtype=np.int64) for ids in instances]
        # a queue over instances 0 … m - 1: the station's server is the instance
        self.identity = [bool(np.array_equal(ids, np.arange(len(ids)))) for ids in self.ids]
        self.service = service
        self.stations = [FcfsStation(len(ids)) for ids in instances]
        self.paths = [service.queue_path(q) for q in range(len(instances))]
        self.pending: Settled | None = None

    def extend(self, t, rid, queue, deadlines, horizon: float, work=None) -> None:
        n = len(t)
        if not n:
            return
        svc_all = self.service.draw(n, 1)
        ids, parts, logs = [], [], []
        groups = by_queue(queue, len(self.ids), n)
        for q, idx in enumerate(groups):
            if not len(idx):
                continue
            whole = len(groups) == 1  # one shared queue: every request, in order, without copies
            svc, path, tq = (svc_all, self.paths[q], t) if whole else (svc_all[idx], self.paths[q], t[idx])
            if path is None:
                start, k = self.stations[q].run(tq, svc)
                done = start + svc
            else:
                work, k = self.stations[q].run(path.work(tq), svc)
                start, done = path.time(work), path.time(work + svc)
            ones = np.ones(len(idx), dtype=np.int64)
            inst = k if self.identity[q] else self.ids[q][k]
            ids.append(rid if whole else rid[idx])
            parts.append(Served(start, done, ones, inst, np.zeros(len(idx), np.int8), np.full(len(idx), np.nan)))
            logs.append(BatchLog(start, done, ones, inst))
        got = _merge(ids, parts, logs)
        self.pending = got if self.pending is None else _merge(*zip(self.pending, got, strict=True))

    def close(self) -> None:
        pass

    def run(self) -> Settled:
        out = self.pending if self.pending is not None else _merge([], [], [])
        self.pending = None
        return out


class CompiledScheduler:
    """Each queue's batch decisions as one compiled loop (:mod:`simulator.serving.compiled`)."""

    def __init__(self, cfg: TritonBatching, instances: list[list[int]], service: ServiceModel):
        self.feeds = [CompiledFeed(cfg, ids, service.feed(k)) for k, ids in enumerate(instances)]
        self.gid = [np.zeros(0, dtype=np.int64) for _ in instances]  # request id of each queued arrival
        self.closed = False

    def extend(self, t, rid, queue, deadlines, horizon: float, work=None) -> None:
        for q, idx in enumerate(by_queue(queue, len(self.feeds), len(t))):
            self.feeds[q].extend(t[idx], horizon)
            if len(idx):
                self.gid[q] = np.concatenate([self.gid[q], rid[idx]])

    def close(self) -> None:
        self.closed = True
        for feed in self.feeds:
            feed.close()

    def run(self) -> Settled:
        ids, parts, logs = [], [], []
        for q, feed in enumerate(self.feeds):
            feed.run()
            cut = feed.settled()
            run = feed.results(cut)
            ids.append(self.gid[q][:cut])
            self.gid[q] = self.gid[q][cut:]
            parts.append(run.served)
            logs.append(run.batches)
            feed.trim(cut)
        return _merge(ids, parts, logs)


class SimPyScheduler:
    """One SimPy process per queue asking its :class:`BatchQueue` what to do: the
    reference, and the strategy for end-to-end deadlines."""

    def __init__(self, cfg: TritonBatching, instances: list[list[int]], service: ServiceModel):
        self.env = simpy.Environment()
        self.deadlines = cfg.deadline_ms is not None
        self.feeds: list[Feed] = []
        for k, ids in enumerate(instances):
            dl = np.empty(0) if self.deadlines else None
            feed = Feed(self.env, BatchQueue(np.empty(0), cfg, closed=False, deadlines=dl), ids)
            self.env.process(schedule(self.env, feed, service.feed(k)))
            self.feeds.append(feed)
        self.gid = [np.zeros(0, dtype=np.int64) for _ in instances]
        self.horizon = -math.inf
        self.closed = False

    def extend(self, t, rid, queue, deadlines, horizon: float, work=None) -> None:
        now = self.env.now
        for q, idx in enumerate(by_queue(queue, len(self.feeds), len(t))):
            self.feeds[q].extend(t[idx], horizon, now, deadlines[idx] if self.deadlines else None)
            if len(idx):
                self.gid[q] = np.concatenate([self.gid[q], rid[idx]])
        self.horizon = max(self.horizon, horizon)

    def close(self) -> None:
        self.closed = True
        for feed in self.feeds:
            feed.close(self.env.now)

    def run(self) -> Settled:
        if self.closed:
            self.env.run()
        elif self.horizon > self.env.now:
            self.env.run(until=self.horizon)
        ids, parts, logs = [], [], []
        for q, feed in enumerate(self.feeds):
            queue = feed.queue
            cut = queue.settled()
            run = queue_results(queue, feed.b_start, feed.b_end, feed.b_inst)
            nb = len(run.batches.start)
            ids.append(self.gid[q][:cut])
            self.gid[q] = self.gid[q][cut:]
            # copies: the queue's buffers are trimmed below, and may not be while viewed
            parts.append(Served(*(np.array(col[:cut]) for col in run.served)))
            logs.append(run.batches.take(np.arange(nb)))
            del run
            queue.trim(cut)
            del feed.b_start[:nb], feed.b_end[:nb], feed.b_inst[:nb]
        return _merge(ids, parts, logs)


__all__ = ["CompiledScheduler", "FcfsScheduler", "SimPyScheduler", "by_queue", "fast_path", "scheduler"]
