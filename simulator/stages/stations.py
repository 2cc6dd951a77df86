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

from simulator import jit


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


class FcfsStation:
    """A FCFS ``servers``-server station fed in successive runs of sorted arrivals.

    A request takes the server that has been free longest (ties: the lowest id); the
    servers' free times carry over, so runs in chunks give exactly the start times of one
    run. The loop is inherently sequential, and it is most of an M/M/c run, so it is
    compiled with numba (:func:`_fcfs_compiled`, a binary heap over (free time, id)
    pairs); without numba, :mod:`heapq` does the same in Python. Both pick the same server
    for every request (the pairs are unique, so any correct heap pops the same minimum) and
    compute the same floats (``tests/test_streaming.py`` compares them).
    """

    def __init__(self, servers: int, *, compiled: bool | None = None):
        self.servers = servers
        self._one = Lindley() if servers == 1 else None
        self.compiled = _fcfs_compiled is not None if compiled is None else compiled
        if self.compiled and _fcfs_compiled is None:
            raise RuntimeError("numba is not installed")
        self._heap_t = np.zeros(servers)  # a binary heap of (free time, server id)
        self._heap_k = np.arange(servers, dtype=np.int64)
        self._free = [(0.0, i) for i in range(servers)]  # the same heap, for heapq

    def run(self, arrivals: np.ndarray, service: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Start times and server index of the next requests."""
        n = len(arrivals)
        if self._one is not None:
            return self._one.run(arrivals, service), np.zeros(n, dtype=np.int64)
        if self.compiled:
            starts, ids = np.empty(n), np.empty(n, dtype=np.int64)
            a = np.ascontiguousarray(arrivals, dtype=float)
            s = np.ascontiguousarray(service, dtype=float)
            _fcfs_compiled(a, s, self._heap_t, self._heap_k, starts, ids)
            return starts, ids
        free = self._free
        heapreplace = heapq.heapreplace
        starts_l: list[float] = []
        ids_l: list[int] = []
        append_s, append_i = starts_l.append, ids_l.append
        for a, s in zip(arrivals.tolist(), service.tolist(), strict=True):
            f, k = free[0]
            st = a if a > f else f
            heapreplace(free, (st + s, k))
            append_s(st)
            append_i(k)
        return np.asarray(starts_l, dtype=float), np.asarray(ids_l, dtype=np.int64)


def _fcfs_loop(arrivals, service, heap_t, heap_k, starts, ids):  # pragma: no cover - compiled
    """The FCFS multi-server loop over a binary heap of (free time, id), in place."""
    c = len(heap_t)
    for i in range(len(arrivals)):
        f = heap_t[0]
        k = heap_k[0]
        a = arrivals[i]
        st = a if a > f else f
        starts[i] = st
        ids[i] = k
        # replace the root with (st + service, k) and sift it down
        t = st + service[i]
        pos = 0
        while True:
            child = 2 * pos + 1
            if child >= c:
                break
            right = child + 1
            if right < c and (
                heap_t[right] < heap_t[child] or (heap_t[right] == heap_t[child] and heap_k[right] < heap_k[child])
            ):
                child = right
            if heap_t[child] < t or (heap_t[child] == t and heap_k[child] < k):
                heap_t[pos] = heap_t[child]
                heap_k[pos] = heap_k[child]
                pos = child
            else:
                break
        heap_t[pos] = t
        heap_k[pos] = k


# numba compiles the loop once per machine (cached beside this module); a bare numpy runs heapq
_fcfs_compiled = jit.njit(cache=True, nogil=True)(_fcfs_loop) if jit.AVAILABLE else None


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
