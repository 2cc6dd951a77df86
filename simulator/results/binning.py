"""The timeline's per-interval sums of a piece of records, in one compiled pass.

A run's timeline counts each request in the interval it arrived in (offered, dropped,
degraded) and the one it responded in (completed), and integrates two levels over every
interval: the batch queue's depth and the requests in flight. Written with numpy, that
is a dozen passes over the records, each allocating a temporary as long as the run
(masks, interval indices, weights), and searchsorted over times out of order (the
responses); a run of 240,000 requests spent 40 ms there in a fresh process. This pass
reads each record once and writes only the per-interval sums and the intervals of the
arrivals and the responses.

The sums are the ones :class:`Bins` accumulates (a summary's per-interval sums, growing
as later times come), added in the same order (request order within a row, as
``np.bincount`` adds), so a summary is the same to the bit with or without numba. A
timeline's windowed percentiles group the responses by interval (:func:`group_sort`,
:func:`binned_percentiles`).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np

from simulator import jit
from simulator.ledger import DROPS, BatchLog
from simulator.results.stats import grouped_percentiles

if TYPE_CHECKING:
    from simulator.results.records import Records


# rows of the sums: counts by arrival, completions by response, and the two levels, each a
# start and an end row (the partial widths, then the counts), as Bins.add_level keeps them
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


class Bins:
    """Per-interval sums over ``[k w, (k + 1) w)`` ms, growing as later times come."""

    def __init__(self, width_ms: float):
        self.w = width_ms
        self.edges = np.arange(0.0, 2 * width_ms, width_ms)
        self.sums: dict[str, np.ndarray] = {}
        self.levels: set[str] = set()

    def _grow(self, upto: float) -> None:
        """Edges past ``upto``: ``k w`` as ``np.arange`` computes them for the whole run."""
        if upto >= self.edges[-1]:
            n = max(int(upto // self.w) + 2, 2 * (len(self.edges) - 1))
            self.edges = np.arange(0.0, (n + 0.5) * self.w, self.w)

    def index(self, t: np.ndarray) -> np.ndarray:
        """The interval of each time (as ``np.histogram`` over the run's edges bins it):
        ``np.searchsorted(edges, t, side="right") - 1``, to the bit.

        Computed as ``⌊t / w⌋`` and then corrected by one step either way against the
        edges themselves, so a time on or beside an edge falls where searchsorted puts it
        (the guess is within one of it for any time below 2^40 widths). Four passes
        over the times whatever their order, where searchsorted over times out of order
        (responses, the ends of queue waits) took 4-5 times as long."""
        t = np.asarray(t, dtype=float)
        if not len(t):
            return np.zeros(0, dtype=np.intp)
        self._grow(float(t.max()))
        edges = self.edges
        with np.errstate(invalid="ignore"):  # NaN: any interval, set below
            k = (t * (1.0 / self.w)).astype(np.intp)
        np.clip(k, 0, len(edges) - 2, out=k)
        k += edges[k + 1] <= t
        k -= edges[k] > t
        nan = np.isnan(t)
        if nan.any():  # searchsorted puts NaN after every edge
            k[nan] = len(edges) - 1
        return k

    def add(self, name: str, t: np.ndarray, weights: np.ndarray | None = None) -> None:
        self.add_indexed(name, self.index(t), weights)

    def add_indexed(self, name: str, k: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Add a count (or ``weights``) to the intervals ``k`` (from :meth:`index`)."""
        if not len(k):
            self.sums.setdefault(name, np.zeros(0))
            return
        self._accumulate(name, 0, np.bincount(k, weights=weights))

    def _accumulate(self, name: str, first: int, values: np.ndarray) -> None:
        cur = self.sums.get(name, np.zeros(0))
        need = first + len(values)
        if len(cur) < need:
            cur = np.concatenate([cur, np.zeros(need - len(cur))])
        cur[first:need] += values
        self.sums[name] = cur

    def add_level(
        self,
        name: str,
        starts: np.ndarray,
        ends: np.ndarray,
        k_starts: np.ndarray | None = None,
        k_ends: np.ndarray | None = None,
    ) -> None:
        """Add to the level N(t) = #{i: starts_i ≤ t < ends_i}, whose integral over each
        interval ``timeline.time_average_level`` divides by the width; ``k_starts`` and
        ``k_ends``: their intervals where known (all finite then).

        Without sorting: a start at p in interval j adds (edge_{j+1} − p) there and the
        whole width to every later interval (an end subtracts the same), so each interval
        keeps a partial sum and a signed count, and :meth:`column` adds the width times the
        count of the intervals before it."""
        if k_starts is None or k_ends is None:
            keep = np.isfinite(starts) & np.isfinite(ends)
            starts, ends = starts[keep], ends[keep]
            k_starts, k_ends = self.index(starts), self.index(ends)
        for points, k, sign in ((starts, k_starts, 1.0), (ends, k_ends, -1.0)):
            if not len(points):
                continue
            self._accumulate(name + ":partial", 0, sign * np.bincount(k, weights=self.edges[k + 1] - points))
            self._accumulate(name + ":count", 0, sign * np.bincount(k).astype(float))
        self.levels.add(name)

    def add_sums(self, name: str, rows: np.ndarray) -> None:
        """Add to a level the four rows :func:`binning.timeline_sums` made for it (the
        starts' partial widths and count, then the ends'), as :meth:`add_level` adds them."""
        for partial, count, sign in ((rows[0], rows[1], 1.0), (rows[2], rows[3], -1.0)):
            self._accumulate(name + ":partial", 0, sign * partial)
            self._accumulate(name + ":count", 0, sign * count)
        self.levels.add(name)

    def column(self, name: str, n: int) -> np.ndarray:
        if name in self.levels:
            counts = np.cumsum(self.column(name + ":count", n))
            return self.column(name + ":partial", n) + self.w * np.concatenate([[0.0], counts[:-1]])
        cur = self.sums.get(name, np.zeros(0))[:n]
        return np.concatenate([cur, np.zeros(n - len(cur))])


def binned_percentiles(k: np.ndarray, x: np.ndarray, percentiles: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The ``percentiles`` of ``x`` in each group ``k`` (non-negative ints): the groups
    present, and one row of percentiles each, as ``np.percentile`` (linear) computes them.

    One stable sort by group (a radix sort when the groups fit 16 bits), each group's
    values sorted on their own, then numpy's interpolation for every group at once: a few
    milliseconds for a run's 300 intervals, where a call of ``np.percentile`` per
    interval took tens."""
    counts, xs = group_sort(k, x)
    return grouped_percentiles(counts, xs, percentiles)


def group_sort(k: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x`` grouped by ``k`` (groups in order), each group sorted, and the size of each
    group ``0 … max(k)``."""
    if not len(k):
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    key = k.astype(np.uint16) if k.max() < 2**16 else k
    order = np.argsort(key, kind="stable")
    k, x = k[order], x[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    bounds = [*starts.tolist(), len(k)]
    x = np.concatenate([np.sort(x[lo:hi]) for lo, hi in itertools.pairwise(bounds)])
    return np.bincount(k), x


def timeline_sums(
    edges: np.ndarray, w: float, r: Records, done: np.ndarray, batches: BatchLog, *, intervals: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A piece's per-interval sums (:data:`ROWS` × ``len(edges)``), the interval of
    each arrival, the response interval of each completed request (``done``, in request
    order), and their end-to-end latencies grouped by that interval (intervals in order;
    the group sizes are the ``COMPLETED`` row), each group sorted; its ``batches`` are
    counted by start. ``edges`` must cover every finite time given (``Bins._grow``).
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
