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


def lindley(arrivals: np.ndarray, service: np.ndarray) -> np.ndarray:
    """Start times at a single FCFS server (arrivals sorted), vectorised.

    With D_n the departure of request n, D_n = max(A_n, D_{n-1}) + S_n; unrolled,
    D_n = C_n + max_{k<=n}(A_k - C_{k-1}) with C the cumulative service. Two work arrays,
    whatever the length (this runs on every request of a minute at 200k req/s).
    """
    dep = np.cumsum(service)
    tmp = dep - service
    np.subtract(arrivals, tmp, out=tmp)
    np.maximum.accumulate(tmp, out=tmp)
    np.add(dep, tmp, out=dep)
    if len(dep):
        tmp[1:] = dep[:-1]
        tmp[0] = -np.inf
    np.maximum(arrivals, tmp, out=tmp)  # never before the arrival, even by rounding
    return tmp


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
    n = len(arrivals)
    if servers == 1:
        return lindley(arrivals, service), np.zeros(n, dtype=np.int64)
    free = [(0.0, i) for i in range(servers)]  # heap of (free time, server id)
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
    return np.asarray(starts), np.asarray(ids, dtype=np.int64)
