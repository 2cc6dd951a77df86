"""Exact FCFS stations without events.

In a feed-forward chain, a station's output depends only on its own input, so each
FCFS multi-server station can be computed from its sorted arrival times with the
classic recursion: a request starts at max(arrival, earliest server free time). This
is exact (no approximation) and runs at millions of requests per second, where a
process-per-request SimPy model manages about a hundred thousand.
"""

from __future__ import annotations

import heapq

import numpy as np


class Lindley:
    """A single FCFS server fed in successive runs of sorted arrivals, with its state carried.

    With D_n the departure of request n, D_n = max(A_n, D_{n-1}) + S_n; unrolled,
    D_n = C_n + max_{k<=n}(A_k - C_{k-1}) with C the cumulative service. Both the running
    sum C and the running maximum carry over from one run to the next, and numpy
    accumulates them sequentially, so the start times are bit for bit those of one run
    over all the arrivals. Two work arrays, whatever the length.
    """

    def __init__(self) -> None:
        self.total = 0.0  # C: the service accumulated so far
        self.peak = -np.inf  # max_k (A_k - C_{k-1}) so far
        self.last = -np.inf  # the last departure

    def run(self, arrivals: np.ndarray, service: np.ndarray) -> np.ndarray:
        """Start times of the next requests (``arrivals`` sorted, after those before)."""
        n = len(arrivals)
        if n == 0:
            return np.zeros(0)
        dep = np.empty(n + 1)
        dep[0] = self.total
        dep[1:] = service
        np.cumsum(dep, out=dep)
        dep = dep[1:]
        tmp = dep - service
        np.subtract(arrivals, tmp, out=tmp)
        tmp[0] = max(tmp[0], self.peak)
        np.maximum.accumulate(tmp, out=tmp)
        self.total, self.peak = float(dep[-1]), float(tmp[-1])
        np.add(dep, tmp, out=dep)
        tmp[1:] = dep[:-1]
        tmp[0] = self.last
        self.last = float(dep[-1])
        np.maximum(arrivals, tmp, out=tmp)  # never before the arrival, even by rounding
        return tmp


def lindley(arrivals: np.ndarray, service: np.ndarray) -> np.ndarray:
    """Start times at a single FCFS server (arrivals sorted), vectorised (:class:`Lindley`)."""
    return Lindley().run(arrivals, service)


class FcfsStation:
    """A FCFS ``servers``-server station fed in successive runs of sorted arrivals.

    A request takes the server idle longest; the servers' free times carry over, so runs
    in chunks give exactly the start times of one run.
    """

    def __init__(self, servers: int):
        self.servers = servers
        self._one = Lindley() if servers == 1 else None
        self._free = [(0.0, i) for i in range(servers)]  # heap of (free time, server id)

    def run(self, arrivals: np.ndarray, service: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Start times and server index of the next requests."""
        n = len(arrivals)
        if self._one is not None:
            return self._one.run(arrivals, service), np.zeros(n, dtype=np.int64)
        free = self._free
        heapreplace = heapq.heapreplace
        starts: list[float] = []
        ids: list[int] = []
        append_s, append_i = starts.append, ids.append
        for a, s in zip(arrivals.tolist(), service.tolist(), strict=True):
            f, k = free[0]
            st = a if a > f else f
            heapreplace(free, (st + s, k))
            append_s(st)
            append_i(k)
        return np.asarray(starts, dtype=float), np.asarray(ids, dtype=np.int64)


def fcfs_multiserver(arrivals: np.ndarray, service: np.ndarray, servers: int) -> tuple[np.ndarray, np.ndarray]:
    """Start times and server index at a FCFS ``servers``-server station.

    Parameters
    ----------
    arrivals : sorted arrival times.
    service : service time of each request, in arrival order.
    servers : number of identical servers; a request takes the one idle longest.

    Returns
    -------
    start, server
    """
    return FcfsStation(servers).run(arrivals, service)
