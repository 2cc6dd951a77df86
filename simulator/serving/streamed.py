"""Serving for the engine (:mod:`simulator.engine`): the primary pool fed
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

from simulator.ledger import BatchLog, Outcome, Served, concat_logs
from simulator.scenario.config import Scenario
from simulator.serving.scheduler import build, queues_of
from simulator.serving.served import PoolRun
from simulator.serving.workers import Feed, ServiceModel, queue_results


class Horizon:
    """Inputs of an order-dependent stage waiting for their turn: each input's time, its
    request id and any other columns, kept in the order pushed; :meth:`ready` hands out,
    sorted by time, those before the horizon. Ties keep the order pushed, or with
    ``by_id`` go in id order, for inputs that are not pushed in request order. A column
    given as None (one a run does not have) stays None."""

    def __init__(self, *, by_id: bool = False) -> None:
        self.cols: tuple[np.ndarray, ...] | None = None
        self.by_id = by_id

    def push(self, t: np.ndarray, ids: np.ndarray, *cols: np.ndarray) -> None:
        new = (t, ids, *cols)
        old = self.cols
        self.cols = new if old is None else tuple(_apply(np.concatenate, a, b) for a, b in zip(old, new, strict=True))

    def ready(self, horizon: float) -> tuple[np.ndarray, ...]:
        """The inputs with time < ``horizon`` as pushed (time, ids, the other columns),
        sorted by time; they leave the stage's wait."""
        c = self.cols
        go = c[0] < horizon
        if go.all():
            take, self.cols = c, None
        else:
            take = tuple(_apply(lambda v: v[go], v) for v in c)
            self.cols = tuple(_apply(lambda v: v[~go], v) for v in c)
        t = take[0]
        if not self.by_id and np.all(t[:-1] <= t[1:]):  # already in order (ties as pushed)
            return take
        order = np.lexsort((take[1], t)) if self.by_id else np.argsort(t, kind="stable")
        return tuple(_apply(lambda v: v[order], v) for v in take)


def _apply(fn, first, *rest):
    """``fn`` of a column (with its own parts, to concatenate), or None for a column not kept."""
    if first is None:
        return None
    return fn((first, *rest)) if rest else fn(first)


def run_to(env, horizon: float, final: bool) -> None:
    """Run a SimPy environment up to ``horizon`` (its events before it), or to its end."""
    if final:
        env.run()
    elif horizon > env.now:
        env.run(until=horizon)


def settle(feed: Feed, cut: int, batches: int | None = None, *, results: PoolRun | None = None):
    """A feed's first ``cut`` arrivals' serving columns (:class:`Served`), and its first ``batches``
    dispatched batches (default: all), copied out of the queue's buffers so that the
    queue can be trimmed: :func:`~simulator.serving.workers.queue_results` (or the feed's
    own ``results``, a crashed worker's) cut to what has settled."""
    run = results if results is not None else queue_results(feed.queue, feed.b_start, feed.b_end, feed.b_inst)
    nb = len(run.batches.start) if batches is None else batches
    return Served(*(np.array(v[:cut]) for v in run.served)), run.batches.take(np.arange(nb))


class StreamedPool:
    """The primary pool, fixed: its scheduler (:func:`~simulator.serving.scheduler.build`:
    per-worker batch queues, or one shared) fed chunk by chunk in time order."""

    fleet = None  # a fixed fleet leaves no fleet log

    def __init__(self, s: Scenario, service: ServiceModel, *, compiled: bool | None = None):
        self.shared = s.router.balancing == "shared"
        instances = queues_of(s.workers.count, s.workers.instances, shared=self.shared)
        self.scheduler = build(s.batching, instances, service, compiled=compiled)
        self.waiting = Horizon()
        self.deadlines = s.batching.deadline_ms is not None

    def run(self, t_pre, rid, worker, deadline, horizon: float, final: bool, work=None):
        """Feed the requests (request order) and run to ``horizon``; returns the settled
        requests' serving columns (ids and columns, and an LLM's tokens where ``work``
        gives them theirs), and the batches that started."""
        work = () if work is None else work
        self.waiting.push(t_pre, rid, worker, deadline, *work)
        # maybe none are ready: every queue still learns the horizon
        t, ids, queue, dl, *ready = self.waiting.ready(math.inf if final else horizon)
        self.scheduler.extend(
            t, ids, None if self.shared else queue, dl if self.deadlines else None, horizon, tuple(ready) or None
        )
        if final:
            self.scheduler.close()
        got = self.scheduler.run()
        if final:  # its queues' buffers go now, not with the run
            self.fleet = getattr(self.scheduler, "fleet", None)  # an LLM pool that scaled itself
            self.scheduler = None
        if got.tokens is not None:
            return (got.ids, got.served, got.tokens), got.batches
        return (got.ids, got.served), got.batches


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

    def run(self, t_pre, rid, worker, deadline, horizon: float, final: bool, work=None):
        self.waiting.push(t_pre, rid, deadline)
        t, ids, dl = self.waiting.ready(math.inf if final else horizon)
        self.pool.push(t, ids, dl if self.deadlines else None, horizon, final)
        run_to(self.env, horizon, final)
        return self._harvest(final)

    def _harvest(self, final: bool):
        pool = self.pool
        ids, parts, logs = [], [], []
        for w in pool.fleet.workers:
            feed = w.feed
            routed = pool.routed.get(w.wid)
            if feed.queue.m == 0 and not len(feed.b_end):
                continue
            if feed.crashed_at is not None or final:  # everything it held settles
                cut, nb = feed.queue.m, len(feed.b_end)
                cols, log = settle(feed, cut, results=feed.results())
            else:
                cut, nb = self._settled(feed)
                cols, log = settle(feed, cut, nb)
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
        merged = Served(*(np.concatenate(column) for column in zip(*parts, strict=True)))
        return (np.concatenate(ids), merged), concat_logs(logs)

    def _settled(self, feed) -> tuple[int, int]:
        """How many of a live worker's arrivals have settled (dropped, or in a batch that
        ended), and how many of its first batches are no longer needed: ended, and out of
        the p99 metric's window (``window`` ≥ 0, so out of the window implies ended)."""
        q = feed.queue
        members, sizes = q.members()
        b_end = np.frombuffer(feed.b_end, dtype=float)[: len(sizes)]
        gone = b_end <= self.env.now - self.window
        nb = int(np.argmin(gone)) if not gone.all() else len(gone)
        if nb == len(sizes):
            return q.settled(), nb
        return min(q.settled(), int(members[int(sizes[:nb].sum())])), nb

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
            rejected = np.full(n, Outcome.REJECTED, dtype=np.int8)
            parts.append(Served.empty(n)._replace(outcome=rejected, t_dropped=pool.q[positions] + extra))
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


__all__ = ["Horizon", "StreamedDynamicPool", "StreamedPool", "run_to", "settle"]
