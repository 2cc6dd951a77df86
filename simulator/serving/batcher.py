"""The dynamic batching queue, with Triton's semantics.

Requests reach the queue at known, sorted times (the stages before it are feed-forward),
so the queue is a cursor over that array rather than a process per request. When a
model instance is free the scheduler asks :meth:`BatchQueue.decide` what to do at time
``now``; the answer is a batch (its size, taken from the head), a time to wake up, or
"done":

* ``max_batch_size`` queued → that many go at once;
* a preferred size reachable → the largest preferred size ≤ queued goes at once;
* the oldest queued request has waited ``max_queue_delay_ms`` → everything queued
  (up to the maximum) goes;
* otherwise wait until the window closes, the next size threshold is reached, or the
  oldest request times out, whichever is first.

An arrival that finds ``max_queue_size`` requests queued is rejected; a request queued
for ``timeout_ms`` is dropped at that instant (expiry before arrival at equal times).
With ``deadline_ms`` each request also carries an end-to-end deadline counted from the
client's send; when a batch forms, the late ones among the next batch's worth at the
head leave (timed out, at their deadline) and the batch fills from the survivors.
"""

from __future__ import annotations

import bisect
import math
from array import array
from dataclasses import dataclass

import numpy as np

from simulator.ledger import Outcome
from simulator.scenario.config import Batching


@dataclass(frozen=True, slots=True)
class Dispatch:
    """decide(): run a batch of ``size`` requests from the head now."""

    size: int


@dataclass(frozen=True, slots=True)
class Wait:
    """decide(): nothing to run before ``until`` (ms); ask again then."""

    until: float


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


EXTEND = _Marker("EXTEND")  # decide(): the answer depends on arrivals not routed here yet
DONE = _Marker("DONE")  # decide(): no request will ever arrive again

Decision = Dispatch | Wait | _Marker  # what BatchQueue.decide answers


class BatchQueue:
    """Triton-style dynamic batch queue over sorted arrival times (ms).

    The hot path runs once per batch, so the queue keeps its times in ``array.array`` and
    walks them with ``bisect``: no numpy call per decision. Dispatched batches are
    remembered as (position, size) and expanded to request indices once, at the end.
    """

    def __init__(
        self, arrivals: np.ndarray, cfg: Batching, *, closed: bool = True, deadlines: np.ndarray | None = None
    ):
        self.cfg = cfg
        self.max_b = cfg.max_batch_size
        self.delay = cfg.max_queue_delay_ms
        self.cap = cfg.max_queue_size
        self.m = 0
        self.q = array("d")
        self.expiry = array("d") if cfg.timeout_ms is not None else None
        self.dl = array("d") if cfg.deadline_ms is not None else None  # end-to-end deadline of each arrival
        self._outcome = array("b")
        self._drop = array("d")
        self.horizon = -math.inf  # arrivals before this time are all known
        self.preferred = sorted(set(cfg.preferred_batch_sizes))
        self.thresholds = sorted(set(cfg.preferred_batch_sizes) | {cfg.max_batch_size})
        # admitted request indices in FIFO order; without a queue limit every arrival is
        # admitted, so a position in the queue is the request index itself
        self.buf = array("q") if self.cap is not None or self.dl is not None else None
        self.qh = 0  # queue head (a position in buf, or a request index)
        self.qt = 0  # queue tail
        self.scan = 0  # arrivals before this index have been admitted or rejected
        self.batch_pos = array("q")  # queue position of each dispatched batch's first request
        self.batch_size = array("q")
        self._dispatch = tuple(Dispatch(k) for k in range(self.max_b + 1))  # no allocation per batch
        self.closed = False
        self.on_admit = None  # called with the arrival times of the requests admitted, in order
        self.extend(arrivals, math.inf if closed else -math.inf, deadlines)
        self.closed = closed

    def extend(self, arrivals: np.ndarray, horizon: float, deadlines: np.ndarray | None = None) -> None:
        """Append sorted arrivals (all later than those known), with their end-to-end
        deadlines when ``deadline_ms`` is set; every arrival before ``horizon`` is now known."""
        arrivals = np.ascontiguousarray(arrivals, dtype=float)
        self.q.frombytes(arrivals.tobytes())
        if self.dl is not None:
            if deadlines is None or len(deadlines) != len(arrivals):
                raise ValueError("batching.deadline_ms needs each arrival's deadline")
            self.dl.frombytes(np.ascontiguousarray(deadlines, dtype=float).tobytes())
        if self.expiry is not None:
            self.expiry.frombytes((arrivals + self.cfg.timeout_ms).tobytes())
        self._outcome.frombytes(bytes(len(arrivals)))
        self._drop.frombytes(np.full(len(arrivals), np.nan).tobytes())
        self.m += len(arrivals)
        self.horizon = max(self.horizon, horizon)

    def close(self) -> None:
        """No more arrivals will come."""
        self.closed = True
        self.horizon = math.inf

    @property
    def outcome(self) -> np.ndarray:
        """Outcome of each arrival, in queue order."""
        return np.frombuffer(self._outcome, dtype=np.int8).copy() if self.m else np.zeros(0, np.int8)

    @property
    def drop_time(self) -> np.ndarray:
        """When each rejected or timed-out arrival left (NaN otherwise), in queue order."""
        return np.frombuffer(self._drop, dtype=float).copy() if self.m else np.zeros(0)

    def __len__(self) -> int:
        return self.qt - self.qh

    def _req(self, pos: int) -> int:
        return pos if self.buf is None else self.buf[pos]

    # --- admission and expiry -------------------------------------------------
    def _admit(self, stop: int) -> None:
        if self.on_admit is not None:
            self.on_admit(self.q[self.scan : stop])
        if self.buf is not None:
            self.buf.extend(range(self.scan, stop))
        self.qt += stop - self.scan
        self.scan = stop

    def _reject(self, stop: int) -> None:
        k = stop - self.scan
        self._outcome[self.scan : stop] = array("b", [Outcome.REJECTED]) * k
        self._drop[self.scan : stop] = self.q[self.scan : stop]
        self.scan = stop

    def _expire(self, t: float) -> None:
        e = self.expiry
        if e is None:
            return
        while self.qh < self.qt:
            i = self._req(self.qh)
            if e[i] > t:
                return
            self._outcome[i] = Outcome.TIMED_OUT
            # past its end-to-end deadline too: it left at whichever came first
            self._drop[i] = e[i] if self.dl is None else min(e[i], self.dl[i])
            self.qh += 1

    def advance(self, now: float) -> None:
        """Admit, reject and expire everything that happens up to ``now`` inclusive."""
        end = bisect.bisect_right(self.q, now, self.scan)
        if self.cap is None:
            if end > self.scan:
                self._admit(end)
            self._expire(now)
            return
        while self.scan < end:
            self._expire(self.q[self.scan])
            space = self.cap - len(self)
            if space >= end - self.scan:
                self._admit(end)
            elif space > 0:
                self._admit(self.scan + space)
            else:  # full: every arrival before the next expiry is rejected
                nxt = self.expiry[self._req(self.qh)] if self.expiry is not None else math.inf
                self._reject(min(end, bisect.bisect_left(self.q, nxt, self.scan)))
        self._expire(now)

    # --- batch formation ------------------------------------------------------
    def _take(self, k: int) -> None:
        self.batch_pos.append(self.qh)
        self.batch_size.append(k)
        self.qh += k

    def take(self, k: int) -> None:
        """Dispatch the ``k`` requests at the head (after ``decide(now, take=False)`` said ``Dispatch(k)``)."""
        self._take(k)

    def queued(self, now: float) -> int:
        """Requests waiting in the queue at ``now`` (admitting and expiring up to then)."""
        self.advance(now)
        return len(self)

    def unfinished(self, now: float) -> bool:
        """Whether requests are waiting at ``now``, or known arrivals are still to come."""
        self.advance(now)
        return len(self) > 0 or self.scan < self.m

    def batch_arrivals(self, k: int) -> list[float]:
        """When each request of the ``k``-th dispatched batch reached the queue."""
        pos0, size = self.batch_pos[k], self.batch_size[k]
        requests = range(pos0, pos0 + size) if self.buf is None else self.buf[pos0 : pos0 + size]
        return [self.q[i] for i in requests]

    def head_arrival(self) -> float:
        """When the oldest queued request reached the queue (inf when empty)."""
        return self.q[self._req(self.qh)] if self.qt > self.qh else math.inf

    def decide(self, now: float, *, take: bool = True) -> Decision:
        """With a free instance at ``now``: :class:`Dispatch` (the batch it takes from the
        head), :class:`Wait` (a time to wake up and ask again), ``EXTEND`` (ask again when
        more arrivals are known), or ``DONE``. With ``take=False`` a ready batch is only
        sized, and stays queued until :meth:`take`."""
        d = self._decide(now)
        if take and type(d) is Dispatch:
            self._take(d.size)
        return d

    def _shed_late(self, now: float) -> None:
        """Drop the requests past their deadline among the next batch's worth at the head.

        Late requests further back are dropped when they come this close to the front
        (until then they count toward ``max_queue_size``). The survivors keep their order.
        """
        dl, buf = self.dl, self.buf
        while self.qt > self.qh:
            stop = min(self.qt, self.qh + self.max_b)
            ids = buf[self.qh : stop]
            late = [i for i in ids if dl[i] <= now]
            if not late:
                return
            buf[self.qh : stop] = array("q", late + [i for i in ids if dl[i] > now])
            for i in late:
                self._outcome[i] = Outcome.TIMED_OUT
                self._drop[i] = dl[i]
            self.qh += len(late)

    def _decide(self, now: float) -> Decision:
        self.advance(now)
        if self.dl is not None:
            self._shed_late(now)
        n = self.qt - self.qh
        if n == 0:
            if self.scan < self.m:
                return Wait(self.q[self.scan])
            return DONE if self.closed else EXTEND
        if n >= self.max_b:
            return self._dispatch[self.max_b]
        if self.preferred and n >= self.preferred[0]:
            return self._dispatch[self.preferred[bisect.bisect_right(self.preferred, n) - 1]]
        head = self._req(self.qh)
        deadline = self.q[head] + self.delay
        if deadline <= now:
            return self._dispatch[n]
        idx = self.scan + self.thresholds[bisect.bisect_right(self.thresholds, n)] - n - 1
        wake = deadline if idx >= self.m else min(deadline, self.q[idx])
        if self.expiry is not None:
            wake = min(wake, self.expiry[head])
        return Wait(wake) if wake <= self.horizon else EXTEND

    def settled(self) -> int:
        """How many arrivals, from the first, have left the queue for good (dispatched,
        rejected, timed out): every arrival before this index is settled."""
        if self.qt == self.qh:
            return self.scan
        return self.qh if self.buf is None else min(self.scan, self.buf[self.qh])

    def trim(self, cut: int, batches: int | None = None) -> None:
        """Forget the first ``cut`` arrivals (settled, and read by the caller) and the first
        ``batches`` dispatched batches (default: all; their requests must be among the
        first ``cut``); later arrivals are renumbered from 0. What is left is the queue's
        state: waiting requests, arrivals not admitted yet, and the batches kept (so that
        :meth:`batch_arrivals` still answers for them)."""
        nb = len(self.batch_size) if batches is None else batches
        for column in (self.q, self.expiry, self.dl, self._outcome, self._drop):
            if column is not None:
                del column[:cut]
        self.m -= cut
        self.scan -= cut
        kept = np.frombuffer(self.batch_pos, dtype=np.int64)[nb:].copy() if len(self.batch_pos) > nb else None
        del self.batch_pos[:]
        del self.batch_size[:nb]
        if self.buf is None:  # positions are request indices
            self.qh -= cut
            self.qt -= cut
            shift = cut
        else:
            p0 = self.qh if kept is None else min(self.qh, int(kept[0]))
            rest = np.frombuffer(self.buf, dtype=np.int64)[p0 : self.qt] - cut
            self.buf = array("q", rest.tobytes())
            self.qh -= p0
            self.qt -= p0
            shift = p0
        if kept is not None:
            self.batch_pos.frombytes((kept - shift).tobytes())

    def members(self) -> tuple[np.ndarray, np.ndarray]:
        """Request indices of all dispatched batches in dispatch order, and each batch's size."""
        sizes = np.frombuffer(self.batch_size, dtype=np.int64) if len(self.batch_size) else np.zeros(0, np.int64)
        pos0 = np.frombuffer(self.batch_pos, dtype=np.int64) if len(self.batch_pos) else np.zeros(0, np.int64)
        first = np.cumsum(sizes) - sizes
        pos = np.repeat(pos0 - first, sizes) + np.arange(int(sizes.sum()))
        if self.buf is not None:
            pos = np.frombuffer(self.buf, dtype=np.int64)[pos] if len(pos) else pos
        return pos, sizes
