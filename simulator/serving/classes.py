"""Traffic classes: several tenants' models sharing one GPU pool, or each on its own.

Every worker of the shared pool hosts every class's model and keeps one batch queue per
model (Triton keeps one scheduler per model). When one of its model instances is free,
the worker's scheduler looks at the queues in priority order, realtime before bulk, and
dispatches the ready batch whose oldest request has waited longest; a batch still inside
its window does not hold the instance while another queue has a batch ready. A quota
(``max_instances``) caps how many of the pool's instances one class may hold at once, so
a spiking tenant cannot take the whole pool. Priority is non-preemptive: a running
batch always finishes.

As in :mod:`simulator.serving.workers`, that is a few SimPy events per batch. A class with its own
``workers`` runs on a dedicated pool through :func:`simulator.serving.dispatch.serve`.
"""

from __future__ import annotations

import math
from array import array
from collections import deque

import numpy as np
import simpy

from simulator.ledger import BatchLog, Served, concat_logs
from simulator.rng import Streams
from simulator.scenario.config import Batching, Scenario, TrafficClass, Workers
from simulator.scenario.config import Router as RouterConfig
from simulator.serving.batcher import DONE, BatchQueue, Dispatch, Wait
from simulator.serving.dispatch import pool_workers, route, serve, sub
from simulator.serving.scheduler import batch_queue, queues_of
from simulator.serving.served import ClassesRun
from simulator.serving.workers import ServiceModel, queue_results

PRIORITY = {"realtime": 0, "bulk": 1}


class Quota:
    """Model instances each class holds across the whole shared pool, against its cap."""

    def __init__(self, env: simpy.Environment, limits: list[float]):
        self.env = env
        self.limit = limits
        self.busy = [0] * len(limits)
        self.changed: simpy.Event | None = None  # fires with the time a capped class frees an instance

    def full(self, c: int) -> bool:
        return self.busy[c] >= self.limit[c]

    def release(self, c: int, at: float) -> None:
        self.busy[c] -= 1
        if self.changed is not None and self.limit[c] < math.inf:
            self.changed.succeed(at)
            self.changed = None

    def wait(self) -> simpy.Event:
        if self.changed is None:
            self.changed = self.env.event()
        return self.changed


class ClassFeed:
    """One worker's per-class batch queues (or the shared queues of the whole pool) and the
    model instances they feed. ``levels`` lists class indices by priority, highest first."""

    def __init__(self, env: simpy.Environment, queues: list[BatchQueue], levels: list[list[int]], ids: list[int]):
        self.env = env
        self.queues = queues
        self.levels = levels
        self.free = deque((i, 0.0) for i in ids)
        self.waiting: simpy.Event | None = None
        self.logs = [(array("d"), array("d"), array("q")) for _ in queues]

    def release(self, inst: int, at: float, c: int, quota: Quota):
        def callback(_event):
            self.free.append((inst, at))
            quota.release(c, at)
            if self.waiting is not None:
                self.waiting.succeed()
                self.waiting = None

        return callback

    def choose(self, now: float, quota: Quota) -> tuple[int, int] | tuple[None, float, bool, bool]:
        """(class, batch size) to dispatch at ``now``; or (None, next wake-up, whether a
        capped class waits for its quota, whether anything is left to do)."""
        wake, blocked, pending = math.inf, False, False
        for level in self.levels:
            best, best_k, best_head = -1, 0, math.inf
            for c in level:
                q = self.queues[c]
                if quota.full(c):
                    if len(q) or q.scan < q.m:
                        blocked = pending = True
                    continue
                d = q.decide(now, take=False)
                if d is DONE:
                    continue
                pending = True
                if type(d) is Dispatch:
                    head = q.head_arrival()
                    if head < best_head:
                        best, best_k, best_head = c, d.size, head
                elif type(d) is Wait and d.until < wake:
                    wake = d.until
            if best >= 0:
                return best, best_k
        return None, wake, blocked, pending


def schedule_classes(env: simpy.Environment, feed: ClassFeed, services: list[ServiceModel], quota: Quota):
    """The scheduler of one multi-class feed: take a free instance, pick a queue and a
    batch, run it; repeat. Keeps its own exact clock, as :func:`simulator.serving.workers.schedule`."""
    clock = 0.0
    while True:
        if not feed.free:
            feed.waiting = env.event()
            yield feed.waiting
        inst, free_at = feed.free.popleft()
        clock = max(clock, free_at)
        while True:
            pick = feed.choose(clock, quota)
            if pick[0] is not None:
                break
            _, wake, blocked, pending = pick
            if not pending:
                return
            timer = env.timeout(max(0.0, wake - env.now)) if wake < math.inf else None
            if blocked and timer is not None:
                freed = quota.wait()
                fired = yield timer | freed
                clock = max(clock, wake if timer in fired else fired[freed])
            elif blocked:
                clock = max(clock, (yield quota.wait()))
            else:
                yield timer
                clock = wake
        c, k = pick
        feed.queues[c].take(k)
        quota.busy[c] += 1
        done = services[c].finish(clock, k)
        start, end, where = feed.logs[c]
        start.append(clock)
        end.append(done)
        where.append(inst)
        env.timeout(max(0.0, done - env.now)).callbacks.append(feed.release(inst, done, c, quota))


def serve_classes(
    s: Scenario, t_pre: np.ndarray, klass: np.ndarray, assign: np.ndarray | None, rng: Streams, deadlines=None
) -> ClassesRun:
    """:func:`serve_by_class` with the sections of the scenario ``s`` (for callers that hold one)."""
    return serve_by_class(s.traffic.classes, s.workers, s.batching, s.router, t_pre, klass, assign, rng, deadlines)


def serve_by_class(
    traffic_classes: dict[str, TrafficClass],
    workers: Workers,
    batching: Batching,
    router: RouterConfig,
    t_pre: np.ndarray,
    klass: np.ndarray,
    assign: np.ndarray | None,
    rng: Streams,
    deadlines=None,
    speed=None,
) -> ClassesRun:
    """Serve live requests (``t_pre``, their class, their shared-pool worker or None for a
    shared queue): the requests as :class:`~simulator.serving.served.Served` columns, the shared
    pool's batch log, and each class's batch log by name (instances of its own pool where it
    has one)."""
    names = list(traffic_classes)
    classes = list(traffic_classes.values())
    k = len(classes)
    children = rng.classes.spawn(2 * k)  # service times, then own-pool routing, per class
    n = len(t_pre)
    served = Served.empty(n)
    logs: dict[str, BatchLog] = {}
    shared = [c for c in range(k) if classes[c].workers is None]
    services = [
        ServiceModel(
            workers.model_copy(update={"service_time": cl.service_time or workers.service_time}),
            batching.max_batch_size,
            children[c],
            speed,
        )
        for c, cl in enumerate(classes)
    ]
    for c in range(k):
        if c in shared:
            continue
        idx = np.flatnonzero(klass == c)
        pw = pool_workers(workers, classes[c].workers, classes[c].service_time)
        to = route(router.balancing, pw.count, len(idx), children[k + c])
        run = serve(t_pre[idx], to, pw, batching, services[c], sub(deadlines, idx))
        logs[names[c]] = run.batches
        served.scatter(idx, run.served)

    env = simpy.Environment()
    quota = Quota(env, [classes[c].max_instances or math.inf for c in range(k)])
    levels = [[c for c in shared if PRIORITY[classes[c].priority] == p] for p in sorted(set(PRIORITY.values()))]
    levels = [lv for lv in levels if lv]
    n_feeds = 1 if assign is None else workers.count
    ids = queues_of(workers.count, workers.instances, shared=assign is None)
    # requests of each (feed, class) in queue-arrival order
    key = klass.astype(np.int64) if assign is None else assign * k + klass
    order = np.lexsort((t_pre, key))
    parts = np.split(order, np.searchsorted(key[order], np.arange(1, n_feeds * k)))
    feeds, members = [], []
    for f in range(n_feeds):
        per_class = [parts[f * k + c] if c in shared else parts[f * k + c][:0] for c in range(k)]
        queues = [batch_queue(batching, t_pre[idx], deadlines=sub(deadlines, idx)) for idx in per_class]
        feeds.append(ClassFeed(env, queues, levels, ids[f]))
        members.append(per_class)
    for feed in feeds:
        env.process(schedule_classes(env, feed, services, quota))
    env.run()
    class_logs: list[list[BatchLog]] = [[] for _ in range(k)]
    for feed, per_class in zip(feeds, members, strict=True):
        for c in shared:
            run = queue_results(feed.queues[c], *feed.logs[c])
            part, log = run.served, run.batches
            served.scatter(per_class[c], part)
            class_logs[c].append(log)
    for c in shared:
        logs[names[c]] = concat_logs(class_logs[c])
    return ClassesRun(served, concat_logs([logs[names[c]] for c in shared]), logs)
