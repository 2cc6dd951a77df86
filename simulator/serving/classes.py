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
``workers`` runs on a dedicated fixed pool (:class:`~simulator.serving.streamed.StreamedPool`).

The engine feeds them chunk by chunk (:class:`ClassesPool`): the shared pool's queues stay
open between chunks, each told that every arrival before the chunk's end is known, and
its SimPy environment runs to that end; what a request draws for the pools (its worker in
its class's own pool) is drawn when it arrives, in request order. So a run's records are
the same for any chunk length.
"""

from __future__ import annotations

import math
from array import array
from collections import deque

import numpy as np
import simpy

from simulator.ledger import BatchLog, Served, concat_logs
from simulator.rng import Streams
from simulator.scenario.config import Scenario
from simulator.serving.batcher import DONE, EXTEND, BatchQueue, Dispatch
from simulator.serving.dispatch import pool_workers
from simulator.serving.router import Router
from simulator.serving.scheduler import batch_queue, queues_of
from simulator.serving.served import ClassesRun
from simulator.serving.streamed import Horizon, StreamedPool, run_to
from simulator.serving.workers import ServiceModel, queue_results
from simulator.stages.speed import SpeedProcess

PRIORITY = {"realtime": 0, "bulk": 1}


class Quota:
    """Model instances each class holds across the whole shared pool, against its cap.

    A feed that waits for a capped class's instance waits on an event of its own. When a
    capped class frees one, every waiting feed is woken at that time, the feed whose
    oldest request of that class has waited longest first (ties: the lower worker): the
    first that has a batch ready takes the instance. The order is the state's, not the
    order in which the feeds began to wait, so it is the same however the run is cut
    into chunks.
    """

    def __init__(self, env: simpy.Environment, limits: list[float]):
        self.env = env
        self.limit = limits
        self.busy = [0] * len(limits)
        self.waiting: dict[int, tuple[simpy.Event, ClassFeed]] = {}  # by feed: fires with the time

    def full(self, c: int) -> bool:
        return self.busy[c] >= self.limit[c]

    def release(self, c: int, at: float) -> None:
        self.busy[c] -= 1
        if self.waiting and self.limit[c] < math.inf:
            order = sorted(self.waiting, key=lambda f: (self.waiting[f][1].head(c, at), f))
            waiting, self.waiting = self.waiting, {}
            for f in order:
                waiting[f][0].succeed(at)

    def wait(self, feed: ClassFeed) -> simpy.Event:
        """The event that wakes ``feed`` when a capped class frees an instance."""
        got = self.waiting.get(feed.index)
        if got is None:
            got = self.waiting[feed.index] = (self.env.event(), feed)
        return got[0]


class ClassFeed:
    """One worker's per-class batch queues (or the shared queues of the whole pool) and the
    model instances they feed. ``levels`` lists class indices by priority, highest first.
    ``ids`` holds, per class, the request ids of its queue's arrivals not handed out yet
    (queue order)."""

    def __init__(
        self, env: simpy.Environment, queues: list[BatchQueue], levels: list[list[int]], ids: list[int], index: int = 0
    ):
        self.env = env
        self.index = index  # the worker it is, among the pool's feeds
        self.queues = queues
        self.levels = levels
        self.free = deque((i, 0.0) for i in ids)
        self.n_instances = len(ids)
        self.waiting: simpy.Event | None = None
        self.extended: simpy.Event | None = None  # fires with the time more arrivals are known
        self.logs = [(array("d"), array("d"), array("q")) for _ in queues]
        self.ids: list[list[np.ndarray]] = [[] for _ in queues]

    def release(self, inst: int, at: float, c: int, quota: Quota):
        def callback(_event):
            self.free.append((inst, at))
            quota.release(c, at)
            if self.waiting is not None:
                self.waiting.succeed()
                self.waiting = None

        return callback

    def more(self) -> simpy.Event:
        """An event that fires when more arrivals are known (with the time they are)."""
        if self.extended is None:
            self.extended = self.env.event()
        return self.extended

    def head(self, c: int, at: float) -> float:
        """When class ``c``'s oldest request queued at ``at`` arrived (inf: none queued)."""
        q = self.queues[c]
        q.advance(at)
        return q.head_arrival()

    def wake(self, at: float) -> None:
        if self.extended is not None:
            self.extended.succeed(at)
            self.extended = None

    def choose(self, now: float, quota: Quota) -> tuple[int, int] | tuple[None, float, bool, bool, bool]:
        """(class, batch size) to dispatch at ``now``; or (None, next wake-up, whether a
        capped class waits for its quota, whether anything is left to do, whether the
        answer waits for arrivals not known yet)."""
        wake, blocked, pending, extend = math.inf, False, False, False
        for level in self.levels:
            best, best_k, best_head = -1, 0, math.inf
            for c in level:
                q = self.queues[c]
                if quota.full(c):
                    if len(q) or q.scan < q.m:
                        blocked = pending = True
                    elif not q.closed:
                        pending = extend = True
                    continue
                d = q.decide(now, take=False)
                if d is DONE:
                    continue
                pending = True
                if type(d) is Dispatch:
                    head = q.head_arrival()
                    if head < best_head:
                        best, best_k, best_head = c, d.size, head
                elif d is EXTEND:
                    extend = True
                elif d.until < wake:
                    wake = d.until
            if best >= 0:
                return best, best_k
        return None, wake, blocked, pending, extend


def schedule_classes(env: simpy.Environment, feed: ClassFeed, services: list[ServiceModel], quota: Quota):
    """The scheduler of one multi-class feed: take a free instance, pick a queue and a
    batch, run it; repeat. Keeps its own exact clock, as :func:`simulator.serving.workers.schedule`;
    where the choice waits for arrivals not known yet, it waits for the next chunk too."""
    for c, queue in enumerate(feed.queues):
        services[c].watch(queue, feed.n_instances)
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
            _, wake, blocked, pending, extend = pick
            if not pending:
                return
            timer = env.timeout(max(0.0, wake - env.now)) if wake < math.inf else None
            freed = quota.wait(feed) if blocked else None
            more = feed.more() if extend else None
            events = [e for e in (timer, freed, more) if e is not None]
            if len(events) == 1:
                value = yield events[0]
                clock = max(clock, wake if timer is not None else value)
                continue
            fired = yield env.any_of(events)
            if timer is not None and timer in fired:
                clock = max(clock, wake)
            else:
                clock = max(clock, fired[freed] if freed is not None and freed in fired else fired[more])
        c, k = pick
        if services[c].rate_arrivals:  # every class's arrivals up to now reach by_rate's average
            for q in feed.queues:
                q.advance(clock)
        feed.queues[c].take(k)
        quota.busy[c] += 1
        done = services[c].finish(clock, k, clock - free_at, inst, len(feed.queues[c]) + k, feed.n_instances)
        start, end, where = feed.logs[c]
        start.append(clock)
        end.append(done)
        where.append(inst)
        env.timeout(max(0.0, done - env.now)).callbacks.append(feed.release(inst, done, c, quota))


class ClassesPool:
    """The traffic classes' pools, fed chunk by chunk as requests reach the batching stage.

    The shared pool's per-class queues (one set per worker, or one for the whole pool)
    run in one SimPy environment with one quota, their queues open until the last chunk;
    each class with its own ``workers`` has a fixed pool of its own. Each class draws its
    batch times from its own stream, and its own pool's routing from another
    (``rng.classes``, spawned per class).
    """

    fleet = None  # fixed pools leave no fleet log

    def __init__(self, s: Scenario, rng: Streams, speed: SpeedProcess | None, *, by_id: bool = True):
        traffic_classes, workers, batching = s.traffic.classes, s.workers, s.batching
        self.names = list(traffic_classes)
        classes = list(traffic_classes.values())
        self.k = k = len(classes)
        children = rng.classes.spawn(2 * k)  # service times, then own-pool routing, per class
        self.services = [
            ServiceModel(
                workers.model_copy(update={"service_time": cl.service_time or workers.service_time}),
                batching.max_batch_size,
                children[c],
                speed,
            )
            for c, cl in enumerate(classes)
        ]
        for sm in self.services[1:]:  # an instance's recent throughput counts every class's batches
            sm.rst = self.services[0].rst
            sm.arrived = self.services[0].arrived  # and, counting arrivals, every class's
        self.deadlines = batching.deadline_ms is not None
        self.shared = [c for c in range(k) if classes[c].workers is None]
        self.own: dict[int, StreamedPool] = {}
        self.own_router: dict[int, tuple[Router, int]] = {}
        for c in range(k):
            if c in self.shared:
                continue
            pw = pool_workers(workers, classes[c].workers, classes[c].service_time)
            pool = StreamedPool(s.model_copy(update={"workers": pw}), self.services[c])
            pool.waiting = Horizon(by_id=by_id)
            self.own[c] = pool
            self.own_router[c] = (Router(s.router.balancing, children[k + c]), pw.count)
        self.waiting = Horizon(by_id=by_id)
        self.env = env = simpy.Environment()
        self.quota = Quota(env, [classes[c].max_instances or math.inf for c in range(k)])
        levels = [
            [c for c in self.shared if PRIORITY[classes[c].priority] == p] for p in sorted(set(PRIORITY.values()))
        ]
        levels = [lv for lv in levels if lv]
        self.per_worker = s.router.balancing != "shared"
        n_feeds = workers.count if self.per_worker else 1
        instances = queues_of(workers.count, workers.instances, shared=not self.per_worker)
        no_deadlines = np.zeros(0) if self.deadlines else None
        self.feeds = []
        for f in range(n_feeds):
            queues = [batch_queue(batching, np.zeros(0), closed=False, deadlines=no_deadlines) for _ in range(k)]
            for c in range(k):
                if c not in self.shared:
                    queues[c].close()  # its requests go to its own pool
            self.feeds.append(ClassFeed(env, queues, levels, instances[f], f))
        if self.shared:
            for feed in self.feeds:
                env.process(schedule_classes(env, feed, self.services, self.quota))

    def arriving(self, klass: np.ndarray, worker: np.ndarray | None) -> np.ndarray | None:
        """Each new request's worker: in the shared pool (``worker``, the engine's router's
        draw) or, for a class with its own pool, drawn here in request order."""
        for c, (router, count) in self.own_router.items():
            on = np.flatnonzero(klass == c)
            picked = router.pick(len(on), count)
            if picked is not None:
                worker[on] = picked
        return worker

    def run(self, t, rid, worker, deadline, klass, horizon: float, final: bool):
        """Feed the requests that reach the batching stage (request order: ``t``, ids,
        worker, deadline, class) and run every pool to ``horizon``. Returns the settled
        requests (ids and columns, or None), the shared pool's batches that started, and
        each class's batches by name."""
        ids, settled, pools = [], [], {}
        for c, pool in self.own.items():
            on = klass == c
            got, pools[self.names[c]] = pool.run(
                t[on],
                rid[on],
                None if worker is None else worker[on],
                None if deadline is None else deadline[on],
                horizon,
                final,
            )
            if got is not None:
                ids.append(got[0])
                settled.append(got[1])
        if self.shared:
            on = np.isin(klass, self.shared) if self.own else slice(None)
            self.waiting.push(
                t[on],
                rid[on],
                klass[on],
                None if worker is None else worker[on],
                None if deadline is None else deadline[on],
            )
            got, logs = self._shared(horizon, final)
            if got is not None:
                ids.append(got[0])
                settled.append(got[1])
            for c in self.shared:
                pools[self.names[c]] = logs[c]
        batches = concat_logs([pools[self.names[c]] for c in self.shared])
        out = None
        if ids:
            out = (np.concatenate(ids), Served(*(np.concatenate(col) for col in zip(*settled, strict=True))))
        return out, batches, pools

    def _shared(self, horizon: float, final: bool):
        """The shared pool: the requests ready by ``horizon`` join their queues, the pool
        runs to it; the requests settled (dispatched, rejected or timed out) and each
        class's batches that started."""
        t, rid, klass, worker, dl = self.waiting.ready(math.inf if final else horizon)
        k = self.k
        key = klass.astype(np.int64) if not self.per_worker else worker.astype(np.int64) * k + klass
        order = np.argsort(key, kind="stable")
        bounds = np.searchsorted(key[order], np.arange(len(self.feeds) * k + 1))
        known = math.inf if final else horizon
        for f, feed in enumerate(self.feeds):
            for c in self.shared:
                g = order[bounds[f * k + c] : bounds[f * k + c + 1]]
                q = feed.queues[c]
                q.extend(t[g], known, None if dl is None else dl[g])
                if len(g):
                    feed.ids[c].append(rid[g])
                if final:
                    q.close()
            feed.wake(self.env.now)
        run_to(self.env, horizon, final)
        return self._harvest(final)

    def _harvest(self, final: bool):
        ids, parts = [], []
        logs: dict[int, list[BatchLog]] = {c: [] for c in self.shared}
        for feed in self.feeds:
            for c in self.shared:
                q, (start, end, where) = feed.queues[c], feed.logs[c]
                cut = q.m if final else q.settled()
                if not cut and not len(start):
                    continue
                served, log, _ = queue_results(q, start, end, where)
                # the sizes are a view of the queue's buffer: copied, and let go before the trim
                logs[c].append(BatchLog(log.start, log.end, log.size.copy(), log.instance))
                del log
                mine = np.concatenate(feed.ids[c]) if len(feed.ids[c]) != 1 else feed.ids[c][0]
                ids.append(mine[:cut])
                parts.append(served.take(slice(0, cut)))
                feed.ids[c] = [mine[cut:]] if len(mine) > cut else []
                q.trim(cut)
                del start[:], end[:], where[:]
        merged = {c: concat_logs(logs[c]) for c in self.shared}
        if not ids:
            return None, merged
        return (np.concatenate(ids), Served(*(np.concatenate(col) for col in zip(*parts, strict=True)))), merged


def serve_classes(
    s: Scenario, t_pre: np.ndarray, klass: np.ndarray, assign: np.ndarray | None, rng: Streams, deadlines=None
) -> ClassesRun:
    """The traffic classes' pools of ``s`` over requests given all at once, in one part:
    when each reaches the batching stage (``t_pre``), its class, its worker in the shared
    pool (None: one shared queue) and its deadline. Returns the requests (in the order
    given) as :class:`~simulator.ledger.Served` columns, the shared pool's batch log, and
    each class's batch log by name."""
    if assign is None:  # one queue per class across the pool
        s = s.model_copy(update={"router": s.router.model_copy(update={"balancing": "shared"})})
    pool = ClassesPool(s, rng, None)
    n = len(t_pre)
    worker = pool.arriving(klass, None if assign is None else assign.copy())
    got, batches, pools = pool.run(t_pre, np.arange(n), worker, deadlines, klass, math.inf, True)
    served = Served.empty(n)
    if got is not None:
        served.scatter(got[0], got[1])
    return ClassesRun(served, batches, pools)


__all__ = ["PRIORITY", "ClassFeed", "ClassesPool", "Quota", "schedule_classes", "serve_classes"]
