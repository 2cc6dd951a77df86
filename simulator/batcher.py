"""The dynamic batching queue, with Triton's semantics.

Requests reach the queue at known, sorted times (the stages before it are feed-forward),
so the queue is a cursor over that array rather than a process per request. When a
model instance is free the scheduler asks :meth:`BatchQueue.decide` what to do at time
``now``; the answer is a batch (request indices), a time to wake up, or "done":

* ``max_batch_size`` queued → that many go at once;
* a preferred size reachable → the largest preferred size ≤ queued goes at once;
* the oldest queued request has waited ``max_queue_delay_ms`` → everything queued
  (up to the maximum) goes;
* otherwise wait until the window closes, the next size threshold is reached, or the
  oldest request times out, whichever is first.

An arrival that finds ``max_queue_size`` requests queued is rejected; a request queued
for ``timeout_ms`` is dropped at that instant (expiry before arrival at equal times).
"""

from __future__ import annotations

import bisect
import math
from enum import IntEnum

import numpy as np

from simulator.config import Batching


class Outcome(IntEnum):
    """What became of a request."""

    COMPLETED = 0
    REJECTED = 1
    TIMED_OUT = 2


DONE = None  # decide(): no request will ever arrive again


class BatchQueue:
    """Triton-style dynamic batch queue over sorted arrival times (ms)."""

    def __init__(self, arrivals: np.ndarray, cfg: Batching):
        self.q = arrivals
        self.m = len(arrivals)
        self.cfg = cfg
        self.max_b = cfg.max_batch_size
        self.delay = cfg.max_queue_delay_ms
        self.cap = cfg.max_queue_size
        self.expiry = arrivals + cfg.timeout_ms if cfg.timeout_ms is not None else None
        self.preferred = sorted(set(cfg.preferred_batch_sizes))
        self.thresholds = sorted(set(cfg.preferred_batch_sizes) | {cfg.max_batch_size})
        self.buf = np.empty(self.m, dtype=np.int64)  # admitted request indices, FIFO
        self.qh = 0  # head of the queue in buf
        self.qt = 0  # tail of the queue in buf
        self.scan = 0  # arrivals before this index have been admitted or rejected
        self.outcome = np.zeros(self.m, dtype=np.int8)
        self.drop_time = np.full(self.m, np.nan)

    def __len__(self) -> int:
        return self.qt - self.qh

    # --- admission and expiry -------------------------------------------------
    def _admit(self, stop: int) -> None:
        k = stop - self.scan
        self.buf[self.qt : self.qt + k] = np.arange(self.scan, stop)
        self.qt += k
        self.scan = stop

    def _reject(self, stop: int) -> None:
        self.outcome[self.scan : stop] = Outcome.REJECTED
        self.drop_time[self.scan : stop] = self.q[self.scan : stop]
        self.scan = stop

    def _expire(self, t: float) -> None:
        e = self.expiry
        if e is None or self.qt == self.qh or e[self.buf[self.qh]] > t:
            return
        queued = self.buf[self.qh : self.qt]
        k = int(np.searchsorted(e[queued], t, side="right"))
        gone = queued[:k]
        self.outcome[gone] = Outcome.TIMED_OUT
        self.drop_time[gone] = e[gone]
        self.qh += k

    def advance(self, now: float) -> None:
        """Admit, reject and expire everything that happens up to ``now`` inclusive."""
        end = int(np.searchsorted(self.q, now, side="right"))
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
                nxt = self.expiry[self.buf[self.qh]] if self.expiry is not None else math.inf
                self._reject(min(end, int(np.searchsorted(self.q, nxt, side="left"))))
        self._expire(now)

    # --- batch formation ------------------------------------------------------
    def _take(self, k: int) -> np.ndarray:
        batch = self.buf[self.qh : self.qh + k].copy()
        self.qh += k
        return batch

    def decide(self, now: float) -> np.ndarray | float | None:
        """With a free instance at ``now``: a batch to send, a time to wake, or DONE."""
        self.advance(now)
        n = len(self)
        if n == 0:
            return DONE if self.scan >= self.m else float(self.q[self.scan])
        if n >= self.max_b:
            return self._take(self.max_b)
        if self.preferred and n >= self.preferred[0]:
            return self._take(self.preferred[bisect.bisect_right(self.preferred, n) - 1])
        head = self.buf[self.qh]
        deadline = self.q[head] + self.delay
        if deadline <= now:
            return self._take(n)
        need = self.thresholds[bisect.bisect_right(self.thresholds, n)] - n
        idx = self.scan + need - 1
        wake = min(deadline, self.q[idx] if idx < self.m else math.inf)
        if self.expiry is not None:
            wake = min(wake, self.expiry[head])
        return float(wake)
