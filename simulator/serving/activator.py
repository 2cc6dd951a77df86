"""What the router does with requests while no worker of a dynamic pool serves.

Without ``router.activator`` it has no backend and rejects them at once (HTTP 503). With
it, they wait in the activator's buffer (Knative's activator), oldest first, up to its
capacity, and go to the workers when one serves again (their batch-queue wait then
includes the buffer); a request buffered longer than the timeout gets an error.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from simulator.scenario.path import Activator as ActivatorConfig


class Activator:
    """The buffer of a dynamic pool's router, over requests given as positions in ``arrivals``
    (each request's arrival time at the batching stage, in arrival order)."""

    def __init__(self, cfg: ActivatorConfig | None, arrivals: np.ndarray):
        self.cfg = cfg
        self.q = arrivals
        self.rejected: list[np.ndarray] = []  # no backend, or over capacity: rejected on arrival
        self.held: deque[int] = deque()  # buffered, oldest first
        self.expired: list[int] = []  # buffered past the timeout (or flushed with no worker to come)

    def buffering(self) -> bool:
        """Whether requests are in the buffer."""
        return bool(self.held)

    def expire(self, t: float) -> None:
        """Buffered requests whose timeout passed by ``t`` get an error."""
        timeout = self.cfg.timeout_ms
        while self.held and self.q[self.held[0]] + timeout <= t:
            self.expired.append(self.held.popleft())

    def hold(self, chunk: np.ndarray) -> None:
        """No worker serves: buffer the chunk (up to the capacity), or reject it."""
        if self.cfg is None:
            self.rejected.append(chunk)
            return
        if self.cfg.capacity is None:
            self.held.extend(chunk.tolist())
            return
        for p in chunk.tolist():  # rare path (an empty fleet): one arrival at a time
            self.expire(self.q[p])
            if len(self.held) < self.cfg.capacity:
                self.held.append(p)
            else:
                self.rejected.append(np.array([p]))

    def release(self, t: float) -> np.ndarray:
        """A worker serves again at ``t``: the buffer (what has not expired) drains, oldest first."""
        self.expire(t)
        released = np.fromiter(self.held, dtype=np.int64, count=len(self.held))
        self.held.clear()
        return released

    def waiting(self, t: float) -> int:
        """Requests in the buffer at ``t``, as the activator reports them to the autoscaler."""
        h = self.q[np.fromiter(self.held, dtype=np.int64, count=len(self.held))]
        return int(np.count_nonzero((h <= t) & (h + self.cfg.timeout_ms > t)))

    def mark(self, outcome: np.ndarray, t_dropped: np.ndarray, rejected_code: int) -> None:
        """Write the rejections into per-request columns (positions as in ``arrivals``)."""
        for chunk in self.rejected:
            outcome[chunk] = rejected_code
            t_dropped[chunk] = self.q[chunk]
        if self.expired:
            gone = np.asarray(self.expired, dtype=np.int64)
            outcome[gone] = rejected_code
            t_dropped[gone] = self.q[gone] + self.cfg.timeout_ms
