"""The timeline's per-interval sums of a piece of records, in one compiled pass.

A run's timeline counts each request in the interval it arrived in (offered, dropped,
degraded) and the one it responded in (completed), and integrates two levels over every
interval: the batch queue's depth and the requests in flight. Written with numpy, that
is a dozen passes over the records, each allocating a temporary as long as the run
(masks, interval indices, weights), and searchsorted over times out of order (the
responses); a run of 240,000 requests spent 40 ms there in a fresh process. This pass
reads each record once and writes only the per-interval sums and the intervals of the
arrivals and the responses.

The sums are the ones :class:`simulator.results.reduce._Bins` accumulates, added in the
same order (request order within a row, as ``np.bincount`` adds), so a summary is the
same to the bit with or without numba.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simulator import jit
from simulator.ledger import DROPS, BatchLog

if TYPE_CHECKING:
    from simulator.results.records import Records


# rows of the sums: counts by arrival, completions by response, and the two levels, each a
# start and an end row (the partial widths, then the counts), as _Bins.add_level keeps them
OFFERED, REJECTED, TIMED_OUT, FAILED, DEGRADED, COMPLETED = range(6)
QUEUE = 6  # queue_depth: 6 starts' partial, 7 starts' count, 8 ends' partial, 9 ends' count
IN_FLIGHT = 10  # in_flight: 10-13 likewise
BATCHES, BATCH_ITEMS = 14, 15  # batches by start, and the requests in them
ROWS = 16


def _bin(edges: np.ndarray, inv_w: float, t: float) -> int:
    """``searchsorted(edges, t, side="right") - 1`` for a finite ``t`` covered by the
    edges: ``⌊t / w⌋``, then one step either way against the edges themselves."""
    k = int(t * inv_w)
    top = len(edges) - 2
    if k > top:
        k = top
    if k < 0:
        k = 0
    if edges[k + 1] <= t:
        k += 1
    if edges[k] > t:
        k -= 1
    return k


def _timeline_py(
    edges: np.ndarray,
    inv_w: float,
    arrival: np.ndarray,
    t_response: np.ndarray,
    done: np.ndarray,
    outcome: np.ndarray,
    degraded: np.ndarray,
    t_queued: np.ndarray,
    t_dispatch: np.ndarray,
    t_dropped: np.ndarray,
    codes: np.ndarray,
    b_start: np.ndarray,
    b_size: np.ndarray,
    sums: np.ndarray,
    ka: np.ndarray,
    kr: np.ndarray,
    e2e: np.ndarray,
) -> None:
    """Add one piece's per-interval sums (its batches' too) to ``sums`` (:data:`ROWS` rows, one column per
    interval, zeros); write each arrival's interval into ``ka``, each completed
    request's response interval, in request order, into ``kr``, and the completed
    requests' latencies into ``e2e`` grouped by response interval (intervals in order;
    numba's sort is several times slower than numpy's, so the caller sorts each group)."""
    keep_ka, keep_kr = len(ka) > 0, len(kr) > 0
    j = 0
    for i in range(len(arrival)):
        a = arrival[i]
        k = _bin(edges, inv_w, a)
        if keep_ka:
            ka[i] = k
        sums[OFFERED, k] += 1.0
        o = outcome[i]
        if o == codes[0]:
            sums[REJECTED, k] += 1.0
        elif o == codes[1]:
            sums[TIMED_OUT, k] += 1.0
        elif o == codes[2]:
            sums[FAILED, k] += 1.0
        if done[i]:
            if degraded[i]:
                sums[DEGRADED, k] += 1.0
            t = t_response[i]
            r = _bin(edges, inv_w, t)
            if keep_kr:
                kr[j] = r
            j += 1
            sums[COMPLETED, r] += 1.0
            sums[IN_FLIGHT, k] += edges[k + 1] - a
            sums[IN_FLIGHT + 1, k] += 1.0
            sums[IN_FLIGHT + 2, r] += edges[r + 1] - t
            sums[IN_FLIGHT + 3, r] += 1.0
            left = t_dispatch[i]
        else:
            left = t_dropped[i]
        q = t_queued[i]
        if np.isfinite(q) and np.isfinite(left):
            kq = _bin(edges, inv_w, q)
            sums[QUEUE, kq] += edges[kq + 1] - q
            sums[QUEUE + 1, kq] += 1.0
            kl = _bin(edges, inv_w, left)
            sums[QUEUE + 2, kl] += edges[kl + 1] - left
            sums[QUEUE + 3, kl] += 1.0
    for i in range(len(b_start)):
        k = _bin(edges, inv_w, b_start[i])
        sums[BATCHES, k] += 1.0
        sums[BATCH_ITEMS, k] += b_size[i]
    # the latencies by response interval: a counting sort (stable)
    at = np.zeros(len(edges) + 1, dtype=np.int64)
    for k in range(len(edges)):
        at[k + 1] = at[k] + np.int64(sums[COMPLETED, k])
    j = 0
    for i in range(len(arrival)):
        if done[i]:
            t = t_response[i]
            r = kr[j] if keep_kr else _bin(edges, inv_w, t)
            e2e[at[r]] = t - arrival[i]
            at[r] += 1
            j += 1


_bin = jit.njit(cache=True, inline="always")(_bin)
_timeline = jit.njit(cache=True, nogil=True)(_timeline_py)


def _index(edges: np.ndarray, inv_w: float, t: np.ndarray) -> np.ndarray:
    """:func:`_bin` of each of the finite times ``t``, in numpy."""
    k = (t * inv_w).astype(np.intp)
    np.clip(k, 0, len(edges) - 2, out=k)
    k += edges[k + 1] <= t
    k -= edges[k] > t
    return k


def _timeline_np(edges: np.ndarray, inv_w: float, *arrays: np.ndarray) -> None:
    """:func:`_timeline_py` (the same arguments) in numpy passes: each row's additions
    are ``np.bincount``'s, which adds in request order as the loop does, so the sums are
    the same to the bit."""
    arrival, t_response, done, outcome, degraded, t_queued, t_dispatch, t_dropped = arrays[:8]
    codes, b_start, b_size, sums, ka, kr, e2e = arrays[8:]
    n = len(edges)

    def add(row: int, k: np.ndarray, weights: np.ndarray | None = None) -> None:
        sums[row] += np.bincount(k, weights=weights, minlength=n)

    k = _index(edges, inv_w, arrival)
    if len(ka):
        ka[:] = k
    add(OFFERED, k)
    for row, code in zip((REJECTED, TIMED_OUT, FAILED), codes, strict=True):
        add(row, k[outcome == code])
    done = done.astype(bool, copy=False)
    kd, a, t = k[done], arrival[done], t_response[done]
    r = _index(edges, inv_w, t)
    if len(kr):
        kr[:] = r
    add(DEGRADED, k[done & degraded.astype(bool, copy=False)])
    add(COMPLETED, r)
    add(IN_FLIGHT, kd, edges[kd + 1] - a)
    add(IN_FLIGHT + 1, kd)
    add(IN_FLIGHT + 2, r, edges[r + 1] - t)
    add(IN_FLIGHT + 3, r)
    left = np.where(done, t_dispatch, t_dropped)
    queued = np.isfinite(t_queued) & np.isfinite(left)
    for row, times in ((QUEUE, t_queued[queued]), (QUEUE + 2, left[queued])):
        kq = _index(edges, inv_w, times)
        add(row, kq, edges[kq + 1] - times)
        add(row + 1, kq)
    kb = _index(edges, inv_w, b_start)
    add(BATCHES, kb)
    add(BATCH_ITEMS, kb, b_size.astype(float))
    e2e[:] = (t - a)[np.argsort(r, kind="stable")]  # grouped by response interval, request order within


def timeline_sums(
    edges: np.ndarray, w: float, r: Records, done: np.ndarray, batches: BatchLog, *, intervals: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A piece's per-interval sums (:data:`ROWS` × ``len(edges)``), the interval of
    each arrival, the response interval of each completed request (``done``, in request
    order), and their end-to-end latencies grouped by that interval (intervals in order;
    the group sizes are the ``COMPLETED`` row), each group sorted; its ``batches`` are
    counted by start. ``edges`` must cover every finite time given (``_Bins._grow``).
    ``intervals=False`` leaves the arrivals' and responses' intervals out (empty): two
    run-long arrays a summary needs only for some sections."""
    sums = np.zeros((ROWS, len(edges)))
    n_done = int(np.count_nonzero(done))
    ka = np.empty(len(r.arrival) if intervals else 0, dtype=np.intp)
    kr = np.empty(n_done if intervals else 0, dtype=np.intp)
    e2e = np.empty(n_done)
    codes = np.array([DROPS["rejected"], DROPS["timed_out"], DROPS["failed"]], dtype=r.outcome.dtype)
    columns = (r.arrival, r.t_response, done, r.outcome, r.degraded, r.t_preprocessed, r.t_dispatch, r.t_dropped)
    # numba's pass once numba has started in this process (a compiled engine's run starts it),
    # else numpy's: an LLM run compiles nothing and need not pay numba's start for this
    one_pass = _timeline if jit.started() else _timeline_np
    one_pass(edges, 1.0 / w, *columns, codes, batches.start, batches.size, sums, ka, kr, e2e)
    lo = 0
    for hi in np.cumsum(sums[COMPLETED]).astype(np.int64).tolist():
        if hi - lo > 1:
            e2e[lo:hi].sort()
        lo = hi
    return sums, ka, kr, e2e
