"""Serving for the streaming engine (:mod:`simulator.streaming`): the primary pool fed
chunk by chunk, its settled requests handed out, its queues trimmed.

:class:`StreamedPool` runs a fixed fleet (per-worker batch queues or one shared, or the
exact FCFS recursion with batching off); :class:`StreamedDynamicPool` runs
:class:`~simulator.serving.pool.DynamicPool` with its arrivals given in parts. Both take,
per chunk, the requests that reach the batching stage, keep those at or after the chunk's
end for the next (a :class:`Horizon`), run the SimPy environment to the chunk's end, and
return the requests settled by then with the batches that started.
"""

from __future__ import annotations

import math

import numpy as np
import simpy

from simulator.scenario.config import Scenario
from simulator.serving.batcher import BatchQueue, Outcome
from simulator.serving.dispatch import fast_path
from simulator.serving.served import BatchLog, Served, concat_logs
from simulator.serving.workers import Feed, ServiceModel, schedule
from simulator.stages.stations import FcfsStation


class Horizon:
    """Inputs of an order-dependent stage waiting for their turn: columns kept in request
    order; :meth:`ready` hands out, sorted by time, those before the horizon."""

    def __init__(self) -> None:
        self.cols: dict[str, np.ndarray] | None = None

    def push(self, **cols: np.ndarray) -> None:
        if self.cols is None:
            self.cols = cols
        else:
            self.cols = {k: np.concatenate([self.cols[k], v]) for k, v in cols.items()}

    def ready(self, key: str, horizon: float) -> dict[str, np.ndarray]:
        """The inputs with ``key`` < ``horizon``, sorted by ``key`` (ties in request order)."""
        c = self.cols
        t = c[key]
        go = t < horizon
        if go.all():
            take, self.cols = c, None
        else:
            take = {k: v[go] for k, v in c.items()}
            self.cols = {k: v[~go] for k, v in c.items()}
        order = np.argsort(take[key], kind="stable")
        return {k: v[order] for k, v in take.items()}


def settled_columns(q: BatchQueue, cut: int, members: np.ndarray, log: BatchLog) -> dict[str, np.ndarray]:
    """Serving columns of a queue's first ``cut`` arrivals: from the batches of ``log``
    (their ``members``, in order) where they ran, else how and when they were dropped."""
    cols = {
        "t_dispatch": np.full(cut, np.nan),
        "t_done": np.full(cut, np.nan),
        "batch_size": np.zeros(cut, dtype=np.int64),
        "instance": np.full(cut, -1, dtype=np.int64),
        "outcome": q.outcome[:cut],
        "t_dropped": q.drop_time[:cut],
    }
    cols["t_dispatch"][members] = np.repeat(log.start, log.size)
    cols["t_done"][members] = np.repeat(log.end, log.size)
    cols["batch_size"][members] = np.repeat(log.size, log.size)
    cols["instance"][members] = np.repeat(log.instance, log.size)
    return cols


class StreamedPool:
    """The primary pool, fixed: per-worker batch queues (or one shared) fed chunk by chunk."""

    def __init__(self, s: Scenario, service: ServiceModel):
        w = s.workers
        self.cfg = s.batching
        self.service = service
        self.shared = s.router.balancing == "shared"
        per = w.instances
        self.ids = (
            [list(range(w.count * per))]
            if self.shared
            else [list(range(k * per, (k + 1) * per)) for k in range(w.count)]
        )
        self.fast = fast_path(self.cfg)
        self.waiting = Horizon()
        self.deadlines = self.cfg.deadline_ms is not None
        if self.fast:
            self.stations = [FcfsStation(len(ids)) for ids in self.ids]
        else:
            self.env = simpy.Environment()
            self.feeds = []
            for ids in self.ids:
                dl = np.empty(0) if self.deadlines else None
                feed = Feed(self.env, BatchQueue(np.empty(0), self.cfg, closed=False, deadlines=dl), ids)
                feed.gid = np.empty(0, dtype=np.int64)  # request id of each queued arrival
                self.env.process(schedule(self.env, feed, service))
                self.feeds.append(feed)

    def run(self, t_pre, rid, worker, deadline, horizon: float, final: bool):
        """Feed the requests (request order) and run to ``horizon``; returns the settled
        requests' serving columns (ids and columns), and the batches that started."""
        self.waiting.push(t=t_pre, id=rid, w=worker, dl=deadline)
        ready = None if self.waiting.cols is None else self.waiting.ready("t", math.inf if final else horizon)
        if self.fast:
            return self._fcfs(ready)
        return self._batches(ready, horizon, final)

    def _groups(self, ready):
        """Each queue's share of ``ready`` (in time order)."""
        if self.shared:
            return [np.arange(len(ready["t"]))]
        by = np.argsort(ready["w"], kind="stable")  # worker, then time (ready is in time order)
        cuts = np.searchsorted(ready["w"][by], np.arange(1, len(self.ids)))
        return np.split(by, cuts)

    def _fcfs(self, ready):
        if ready is None or not len(ready["t"]):
            return None, BatchLog.empty()
        n = len(ready["t"])
        svc = self.service.draw(n, 1)  # in queue-arrival order, as the whole-run engine draws them
        start = np.empty(n)
        inst = np.empty(n, dtype=np.int64)
        for q, idx in enumerate(self._groups(ready)):
            st, k = self.stations[q].run(ready["t"][idx], svc[idx])
            start[idx] = st
            inst[idx] = np.asarray(self.ids[q])[k] if len(idx) else k
        cols = {
            "t_dispatch": start,
            "t_done": start + svc,
            "batch_size": np.ones(n, dtype=np.int64),
            "instance": inst,
            "outcome": np.zeros(n, dtype=np.int8),
            "t_dropped": np.full(n, np.nan),
        }
        return (ready["id"], cols), BatchLog(start, start + svc, np.ones(n, np.int64), inst)

    def _batches(self, ready, horizon: float, final: bool):
        now = self.env.now
        if ready is None:  # nothing new, but every queue learns the horizon
            ready = {"t": np.empty(0), "id": np.empty(0, np.int64), "w": np.empty(0, np.int64), "dl": np.empty(0)}
        for q, idx in enumerate(self._groups(ready)):
            feed = self.feeds[q]
            feed.extend(ready["t"][idx], horizon, now, ready["dl"][idx] if self.deadlines else None)
            feed.gid = np.concatenate([feed.gid, ready["id"][idx]])
        if final:
            for feed in self.feeds:
                feed.close(now)
            self.env.run()
        elif horizon > now:
            self.env.run(until=horizon)
        return self._harvest()

    def _harvest(self):
        ids, parts, logs = [], [], []
        for feed in self.feeds:
            q = feed.queue
            cut = q.settled()
            members, sizes = q.members()
            sizes = np.array(sizes)  # a copy: the queue's buffer is trimmed below
            nb = len(sizes)
            b_start = np.frombuffer(feed.b_start, dtype=float)[:nb].copy()
            b_end = np.frombuffer(feed.b_end, dtype=float)[:nb].copy()
            b_inst = np.frombuffer(feed.b_inst, dtype=np.int64)[:nb].copy()
            log = BatchLog(b_start, b_end, sizes, b_inst)
            logs.append(log)
            cols = settled_columns(q, cut, members, log)
            ids.append(feed.gid[:cut])
            parts.append(cols)
            feed.gid = feed.gid[cut:]
            q.trim(cut)
            del feed.b_start[:nb], feed.b_end[:nb], feed.b_inst[:nb]
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        return (np.concatenate(ids), merged), concat_logs(logs)


class StreamedDynamicPool:
    """The primary pool under an autoscaler (or with failures), fed chunk by chunk.

    :class:`~simulator.serving.pool.DynamicPool` itself, told that arrivals come in parts
    (its control process waits for each chunk when an epoch reaches past what is known).
    A request is handed out once its batch has *ended* (a later crash cannot take it
    back) or it was dropped; a crashed worker settles everything it held at once. Batches
    stay while the autoscaler's p99 window may still read them.
    """

    def __init__(self, s: Scenario, service: ServiceModel, rng):
        from simulator.serving.pool import DynamicPool

        self.deadlines = s.batching.deadline_ms is not None
        dl = np.empty(0) if self.deadlines else None
        self.pool = DynamicPool(s.workers, s.batching, s.router, np.empty(0), service, rng, dl, final=False)
        self.env = self.pool.env
        self.env.process(self.pool.control())
        a = s.workers.autoscaler
        self.window = a.metric_window_s * 1000.0 if a is not None and a.metric == "p99_ms" else 0.0
        self.timeout = s.router.activator.timeout_ms if s.router.activator is not None else 0.0
        self.waiting = Horizon()
        self.last_end: dict[int, float] = {}

    def run(self, t_pre, rid, worker, deadline, horizon: float, final: bool):
        self.waiting.push(t=t_pre, id=rid, dl=deadline)
        empty = {"t": np.empty(0), "id": np.empty(0, np.int64), "dl": np.empty(0)}
        ready = empty if self.waiting.cols is None else self.waiting.ready("t", math.inf if final else horizon)
        self.pool.push(ready["t"], ready["id"], ready["dl"] if self.deadlines else None, horizon, final)
        if final:
            self.env.run()
        elif horizon > self.env.now:
            self.env.run(until=horizon)
        return self._harvest(math.inf if final else self.env.now, final)

    def _harvest(self, now: float, final: bool):
        pool = self.pool
        ids, parts, logs = [], [], []
        for w in pool.fleet.workers:
            feed = w.feed
            routed = pool.routed.get(w.wid)
            if feed.queue.m == 0 and not len(feed.b_end):
                continue
            if feed.crashed_at is not None or final:
                run = feed.results()  # everything it held settles
                cut, nb = feed.queue.m, len(feed.b_end)
                cols = {k: np.array(v) for k, v in zip(Served._fields, run.served, strict=True)}
                log = BatchLog(
                    *(np.array(v) for v in (run.batches.start, run.batches.end, run.batches.size, run.batches.instance))
                )
                del run  # its views of the queue's buffers, before the queue is trimmed
            else:
                cut, nb, cols, log = self._settled(feed)
            if len(log.end):
                self.last_end[w.wid] = max(self.last_end.get(w.wid, 0.0), float(log.end.max()))
            positions = np.concatenate(routed) if routed else np.empty(0, np.int64)
            ids.append(pool.ids[positions[:cut]])
            pool.routed[w.wid] = [positions[cut:]] if len(positions) > cut else []
            parts.append(cols)
            logs.append(log)
            feed.queue.trim(cut, nb)
            del feed.b_start[:nb], feed.b_end[:nb], feed.b_inst[:nb]
        ids_a, parts_a = self._activator()
        ids += ids_a
        parts += parts_a
        if final:
            for w in pool.fleet.workers:
                pool.fleet.settle(w, self.last_end.get(w.wid, 0.0), pool.end_ms)
        self._forget()
        if not ids:
            return None, BatchLog.empty()
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        return (np.concatenate(ids), merged), concat_logs(logs)

    def _settled(self, feed):
        """A live worker's requests settled by now, and its batches no longer needed."""
        q = feed.queue
        members, sizes = q.members()
        sizes = np.array(sizes)
        b_end = np.frombuffer(feed.b_end, dtype=float)[: len(sizes)].copy()
        gone = b_end <= self.env.now - self.window
        nb = int(np.argmin(gone)) if not gone.all() else len(gone)
        ended = b_end <= self.env.now
        first_open = int(np.argmin(ended)) if not ended.all() else len(ended)
        nb = min(nb, first_open)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        cut = q.settled() if nb == len(sizes) else min(q.settled(), int(members[starts[nb]]))
        b_start = np.frombuffer(feed.b_start, dtype=float)[:nb].copy()
        b_inst = np.frombuffer(feed.b_inst, dtype=np.int64)[:nb].copy()
        log = BatchLog(b_start, b_end[:nb], sizes[:nb], b_inst)
        return cut, nb, settled_columns(q, cut, members[: starts[nb]], log), log

    def _activator(self):
        """Requests the router's activator rejected, or held past its timeout, so far."""
        a, pool = self.pool.activator, self.pool
        ids, parts = [], []
        for positions, extra in (
            (np.concatenate(a.rejected) if a.rejected else None, 0.0),
            (np.asarray(a.expired, dtype=np.int64) if a.expired else None, self.timeout),
        ):
            if positions is None or not len(positions):
                continue
            n = len(positions)
            ids.append(pool.ids[positions])
            parts.append(
                {
                    "t_dispatch": np.full(n, np.nan),
                    "t_done": np.full(n, np.nan),
                    "batch_size": np.zeros(n, dtype=np.int64),
                    "instance": np.full(n, -1, dtype=np.int64),
                    "outcome": np.full(n, Outcome.REJECTED, dtype=np.int8),
                    "t_dropped": pool.q[positions] + extra,
                }
            )
        a.rejected.clear()
        a.expired.clear()
        return ids, parts

    def _forget(self) -> None:
        """Drop the queue-arrival positions no one will read again."""
        pool = self.pool
        low = pool.pos
        if pool.activator.held:
            low = min(low, min(pool.activator.held))
        for parts in pool.routed.values():
            if parts and len(parts[0]):
                low = min(low, int(parts[0][0]))
        for col in (pool.q, pool.ids, pool.dl):
            if col is not None:
                col.drop_before(low)

    @property
    def fleet(self):
        return self.pool.fleet.log


__all__ = ["Horizon", "StreamedDynamicPool", "StreamedPool", "settled_columns"]
