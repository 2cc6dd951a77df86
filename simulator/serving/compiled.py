"""The fixed pool's batch scheduler, compiled: one batch queue and its instances, no events.

In a fixed pool each batch queue and its instances form a system of their own: given
the queue's arrival times, its batches depend only on its own state and on its own
batch-time stream (:meth:`~simulator.serving.workers.ServiceModel.feed`). The SimPy
scheduler (:func:`~simulator.serving.workers.schedule` with
:class:`~simulator.serving.batcher.BatchQueue`) spends about 20 µs of interpreter per
batch on events; this module runs the same decisions in a numba loop, a fraction of a
microsecond per batch.

**The same decisions, in the same order.** :func:`_run` is :func:`schedule` and
:meth:`BatchQueue.decide` written as one loop over arrays: the free instance that has
been idle longest (a SimPy FIFO of releases, so the earliest free time, ties in
dispatch order) takes the next batch; the queue admits, rejects at ``max_queue_size``,
expires at ``timeout_ms``, dispatches at ``max_batch_size``, a preferred size or the
end of the batching window, and otherwise waits for the next of those moments, or
stops (*extend*) when that moment is past the arrivals known so far (it never decides
at or after the horizon: the SimPy environment runs only to it). Batch times are
the same stream's values in the same dispatch order. The results are bit for bit the
SimPy scheduler's (``tests/test_compiled.py``, on closed queues and on queues fed in
parts), so the SimPy path stays the reference and the model new features are written in.

**What it covers:** every fixed pool's batch queue except end-to-end deadlines
(``batching.deadline_ms``), which keep the SimPy scheduler (:func:`covers`).
"""

from __future__ import annotations

import math

import numpy as np

from simulator import jit
from simulator.ledger import BatchLog, Outcome, Served
from simulator.scenario.config import Batching
from simulator.serving.served import PoolRun

DONE, EXTEND, NEED_FACTORS, FULL = 0, 1, 2, 3  # why _run returned
_REJECTED, _TIMED_OUT = int(Outcome.REJECTED), int(Outcome.TIMED_OUT)
_QH, _QT, _SCAN, _HELD, _SEQ, _FPOS, _NB = range(7)  # its integer state


def _finish_on_path_py(start, work, pt, pw, pf):
    """When ``work`` ms of nominal work started at ``start`` is done on the host's speed
    path (pt, pw, pf): W⁻¹(W(start) + work), as SpeedPath.finish; at full speed without one."""
    if len(pt) == 0:
        return start + work
    k = max(np.searchsorted(pt, start, side="right") - 1, 0)
    target = pw[k] + (start - pt[k]) / pf[k] + work
    j = max(np.searchsorted(pw, target, side="right") - 1, 0)
    return pt[j] + (target - pw[j]) * pf[j]


finish_on_path = jit.njit(cache=True, nogil=True)(_finish_on_path_py)


def _rate_factor_py(now, size, j, rk, rf, rtau, rst, ak, af, qk, qf, waiting):
    """``service_time.by_rate``'s factor for a batch of ``size`` that instance ``j`` starts
    at ``now``: at its throughput before the batch (requests/s: ``rst[j, 0]``, requests a
    ms averaged over ``rtau`` ms, decayed from ``rst[j, 1]``), interpolated on (rk, rf),
    flat beyond the ends; the batch's requests then join the average. Where the average
    counts arrivals (``rst[j, 3]``, the instance's share of each, is positive:
    ``rate_of: arrivals``), :func:`arrive` keeps it and the batch only reads it. Times
    ``service_time.after_batch``'s at the size of the instance's batch before it
    (``rst[j, 2]``; none before its first), interpolated on (ak, af); times
    ``service_time.by_queue``'s at the ``waiting`` requests in the queue as the batch is
    taken, its own included, interpolated on (qk, qf). 1 without the tables."""
    f = 1.0
    if len(rk) > 0:
        x = rst[j, 0] * math.exp(-(now - rst[j, 1]) / rtau)
        if rst[j, 3] <= 0.0:
            rst[j, 0] = x + size / rtau
            rst[j, 1] = now
        f = np.interp(x * 1000.0, rk, rf)
    if len(ak) > 0:
        if rst[j, 2] > 0:
            f *= np.interp(rst[j, 2], ak, af)
        rst[j, 2] = size
    if len(qk) > 0:
        f *= np.interp(waiting, qk, qf)
    return f


rate_factor = jit.njit(cache=True, nogil=True)(_rate_factor_py)


def _arrive_py(rst, t, rtau):
    """A request reaches the batch queue at ``t``: where ``by_rate`` counts arrivals
    (``rst[:, 3]``, each instance's share, positive), the share joins every instance's
    average (requests a ms over ``rtau`` ms). Exact in any order: an arrival older than an
    average's last joins it decayed to then."""
    for j in range(rst.shape[0]):
        w = rst[j, 3]
        if w <= 0.0:
            continue
        if t >= rst[j, 1]:
            rst[j, 0] = rst[j, 0] * math.exp(-(t - rst[j, 1]) / rtau) + w / rtau
            rst[j, 1] = t
        else:
            rst[j, 0] += w / rtau * math.exp(-(rst[j, 1] - t) / rtau)


arrive = jit.njit(cache=True, nogil=True)(_arrive_py)


def covers(cfg: Batching) -> bool:
    """Whether the compiled scheduler runs a queue with this batching (numba is there, and
    no end-to-end deadlines)."""
    return jit.AVAILABLE and cfg.deadline_ms is None


def _expire_py(q, buf, outcome, drop, qh, qt, timeout, t):
    """Time out the queued requests whose wait reaches ``timeout`` by ``t``; the new head."""
    while qh < qt:
        i = buf[qh]
        e = q[i] + timeout
        if e > t:
            break
        outcome[i] = _TIMED_OUT
        drop[i] = e
        qh += 1
    return qh


_expire = jit.njit(cache=True, nogil=True)(_expire_py) if jit.AVAILABLE else None


def _kernel(
    q, m, horizon, closed, cap, max_b, delay, timeout, thresholds, preferred,
    buf, outcome, drop, ist, clock0, inst_free, inst_seq, factors, means, idle_t, idle_f,
    rk, rf, rtau, rst, ak, af, qk, qf,
    b_pos, b_size, b_start, b_end, b_inst, sp_t, sp_w, sp_f,
):  # fmt: skip
    """:func:`schedule` over :meth:`BatchQueue.decide`, until done, more arrivals are
    needed (EXTEND), the factors run out or the batch columns are full. State in ``ist``
    (queue head, tail, scan, held instance, release counter, factor cursor, batches) and
    the returned clock."""
    qh, qt, scan, held, seq, fpos, nb = ist[0], ist[1], ist[2], ist[3], ist[4], ist[5], ist[6]
    clock = clock0
    per_size = len(means) > 0
    n_inst = len(inst_free)
    arrivals = len(rk) > 0 and rst[0, 3] > 0.0  # by_rate counts the queue's arrivals
    status = DONE
    while True:
        if held < 0:  # the instance idle longest: earliest release, ties in release order
            held = 0
            for j in range(1, n_inst):
                if inst_free[j] < inst_free[held] or (inst_free[j] == inst_free[held] and inst_seq[j] < inst_seq[held]):
                    held = j
            if inst_free[held] > clock:
                clock = inst_free[held]
        if fpos >= len(factors):
            status = NEED_FACTORS
            break
        if nb >= len(b_pos):
            status = FULL
            break
        # --- decide(clock): advance, then dispatch, wait or stop ---------------
        size = 0
        while True:
            if clock >= horizon:  # arrivals from the horizon on are not known yet
                status = EXTEND
                break
            now = clock
            end = scan + np.searchsorted(q[scan:m], now, side="right")
            if cap < 0:
                while scan < end:
                    buf[qt] = scan
                    qt += 1
                    if arrivals:
                        arrive(rst, q[scan], rtau)
                    scan += 1
            else:
                while scan < end:
                    if timeout >= 0.0:  # expire up to this arrival
                        qh = _expire(q, buf, outcome, drop, qh, qt, timeout, q[scan])
                    space = cap - (qt - qh)
                    if space >= end - scan:
                        stop = end
                    elif space > 0:
                        stop = scan + space
                    else:
                        stop = -1
                    if stop >= 0:
                        while scan < stop:
                            buf[qt] = scan
                            qt += 1
                            if arrivals:
                                arrive(rst, q[scan], rtau)
                            scan += 1
                    else:  # full: every arrival before the next expiry is rejected
                        nxt = q[buf[qh]] + timeout if timeout >= 0.0 else np.inf
                        stop = min(end, scan + np.searchsorted(q[scan:m], nxt, side="left"))
                        while scan < stop:
                            outcome[scan] = _REJECTED
                            drop[scan] = q[scan]
                            scan += 1
            if timeout >= 0.0:
                qh = _expire(q, buf, outcome, drop, qh, qt, timeout, now)
            n = qt - qh
            if n == 0:
                if scan < m:
                    clock = q[scan]
                    continue
                status = DONE if closed else EXTEND
                break
            if n >= max_b:
                size = max_b
                break
            if len(preferred) > 0 and n >= preferred[0]:
                size = preferred[np.searchsorted(preferred, n, side="right") - 1]
                break
            head = buf[qh]
            deadline = q[head] + delay
            if deadline <= now:
                size = n
                break
            idx = scan + thresholds[np.searchsorted(thresholds, n, side="right")] - n - 1
            wake = deadline if idx >= m else min(deadline, q[idx])
            if timeout >= 0.0:
                wake = min(wake, q[head] + timeout)
            if wake > horizon:
                status = EXTEND
                break
            clock = wake
        if size == 0:
            break
        # --- dispatch: the batch takes the head, the instance its service time ---
        x = factors[fpos]
        fpos += 1
        work = means[size] * x if per_size else x
        if len(idle_t) > 0:  # the instance idle since its last batch: a slower batch
            work *= np.interp(clock - inst_free[held], idle_t, idle_f)
        work *= rate_factor(clock, size, held, rk, rf, rtau, rst, ak, af, qk, qf, n)  # and by its recent throughput
        done = finish_on_path(clock, work, sp_t, sp_w, sp_f)
        b_pos[nb] = qh
        b_size[nb] = size
        b_start[nb] = clock
        b_end[nb] = done
        b_inst[nb] = held
        nb += 1
        qh += size
        inst_free[held] = done
        inst_seq[held] = seq
        seq += 1
        held = -1
    ist[0], ist[1], ist[2], ist[3], ist[4], ist[5], ist[6] = qh, qt, scan, held, seq, fpos, nb
    return status, clock


_run = jit.njit(cache=True, nogil=True)(_kernel) if jit.AVAILABLE else None


def _grown(a: np.ndarray, need: int, fill=0) -> np.ndarray:
    """``a`` with room for at least ``need`` entries (doubling), the rest ``fill``."""
    if len(a) >= need:
        return a
    out = np.full(max(need, 2 * len(a), 16), fill, dtype=a.dtype)
    out[: len(a)] = a
    return out


class CompiledFeed:
    """One batch queue and its ``instances`` (global ids), scheduled by :func:`_run`.

    Fed like :class:`~simulator.serving.batcher.BatchQueue`: :meth:`extend` with sorted
    arrivals (and the horizon before which all are known), :meth:`close`, then
    :meth:`run`. :meth:`results` are :meth:`Feed.results`'s columns (queue order) and
    batch log; :meth:`settled` and :meth:`trim` let a streamed run hand out and forget
    the front.
    """

    def __init__(self, cfg: Batching, instances: list[int], service):
        self.cap = -1 if cfg.max_queue_size is None else int(cfg.max_queue_size)
        self.max_b = int(cfg.max_batch_size)
        self.delay = float(cfg.max_queue_delay_ms)
        self.timeout = -1.0 if cfg.timeout_ms is None else float(cfg.timeout_ms)
        self.thresholds = np.asarray(sorted(set(cfg.preferred_batch_sizes) | {cfg.max_batch_size}), dtype=np.int64)
        self.preferred = np.asarray(sorted(set(cfg.preferred_batch_sizes)), dtype=np.int64)
        self.ids = np.asarray(instances, dtype=np.int64)
        self.service = service
        means = service.means
        self.means = means if means is not None else np.zeros(0)
        path = service.path
        self.speed = (path.t, path.w, path.f) if path is not None else (np.zeros(0), np.zeros(0), np.zeros(0))
        self.factors = np.zeros(0)
        self.m = 0
        self.q = np.zeros(0)
        self.buf = np.zeros(0, dtype=np.int64)
        self.outcome = np.zeros(0, dtype=np.int8)
        self.drop = np.zeros(0)
        self.horizon = -math.inf
        self.closed = False
        self.clock = 0.0
        self.ist = np.array([0, 0, 0, -1, len(instances), 0, 0], dtype=np.int64)
        self.inst_free = np.zeros(len(instances))
        self.rst = service.rate_state(len(instances))  # each instance's recent throughput and last batch
        self.inst_seq = np.arange(len(instances), dtype=np.int64)
        self.nb = 0
        self.b_pos = np.zeros(0, dtype=np.int64)
        self.b_size = np.zeros(0, dtype=np.int64)
        self.b_start = np.zeros(0)
        self.b_end = np.zeros(0)
        self.b_inst = np.zeros(0, dtype=np.int64)

    def extend(self, arrivals: np.ndarray, horizon: float) -> None:
        """Append sorted arrivals (none earlier than those known); every arrival before
        ``horizon`` is now known."""
        k = len(arrivals)
        if k:
            need = self.m + k
            self.q = _grown(self.q, need)
            self.buf = _grown(self.buf, need)
            self.outcome = _grown(self.outcome, need)
            self.drop = _grown(self.drop, need, np.nan)
            self.q[self.m : need] = arrivals
            self.outcome[self.m : need] = 0
            self.drop[self.m : need] = np.nan
            self.m = need
        self.horizon = max(self.horizon, horizon)

    def close(self) -> None:
        """No more arrivals will come."""
        self.closed = True
        self.horizon = math.inf

    def run(self) -> int:
        """Schedule every batch that the arrivals known so far decide; DONE or EXTEND."""
        while True:
            room = self.nb + max(self.m - int(self.ist[_QH]), 1)  # at most one batch per request queued
            for name in ("b_pos", "b_size", "b_inst"):
                setattr(self, name, _grown(getattr(self, name), room))
            self.b_start = _grown(self.b_start, room, np.nan)
            self.b_end = _grown(self.b_end, room, np.nan)
            self.ist[_NB] = self.nb
            status, self.clock = _run(
                self.q, self.m, self.horizon, self.closed, self.cap, self.max_b, self.delay, self.timeout,
                self.thresholds, self.preferred, self.buf, self.outcome, self.drop, self.ist, self.clock,
                self.inst_free, self.inst_seq, self.factors, self.means, self.service.idle_ms, self.service.idle_factor,
                *self.service.rate_args(self.rst),
                self.b_pos, self.b_size, self.b_start, self.b_end, self.b_inst, *self.speed,
            )  # fmt: skip
            self.nb = int(self.ist[_NB])
            if status == NEED_FACTORS:
                rest = self.factors[int(self.ist[_FPOS]) :]
                self.factors = np.concatenate([rest, self.service.block()])
                self.ist[_FPOS] = 0
            elif status != FULL:
                return status

    def settled(self) -> int:
        """How many arrivals, from the first, have left the queue for good."""
        qh, qt, scan = (int(v) for v in self.ist[:3])
        if qt == qh:
            return scan
        return min(scan, int(self.buf[qh]))

    def members(self, nb: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Arrival indices of the first ``nb`` batches (default: all) in dispatch order,
        and each batch's size."""
        nb = self.nb if nb is None else nb
        sizes = self.b_size[:nb]
        first = np.cumsum(sizes) - sizes
        pos = np.repeat(self.b_pos[:nb] - first, sizes) + np.arange(int(sizes.sum()))
        return self.buf[pos], sizes

    def results(self, cut: int | None = None) -> PoolRun:
        """The first ``cut`` arrivals (default: all), in queue order, as serving columns
        (global instance ids), and the log of every batch dispatched so far."""
        cut = self.m if cut is None else cut
        nb = self.nb
        members, sizes = self.members(nb)
        log = BatchLog(self.b_start[:nb].copy(), self.b_end[:nb].copy(), sizes.copy(), self.ids[self.b_inst[:nb]])
        served = Served.empty(cut)._replace(outcome=self.outcome[:cut].copy(), t_dropped=self.drop[:cut].copy())
        keep = members < cut
        at = members[keep]
        served.t_dispatch[at] = np.repeat(log.start, sizes)[keep]
        served.t_done[at] = np.repeat(log.end, sizes)[keep]
        served.batch_size[at] = np.repeat(sizes, sizes)[keep]
        served.instance[at] = np.repeat(log.instance, sizes)[keep]
        return PoolRun(served, log)

    def trim(self, cut: int) -> None:
        """Forget the first ``cut`` arrivals (settled, and read) and every batch so far
        (their requests must be among the first ``cut``); later arrivals are renumbered."""
        qh, qt = int(self.ist[_QH]), int(self.ist[_QT])
        keep = self.m - cut
        for name in ("q", "outcome", "drop"):
            a = getattr(self, name)
            a[:keep] = a[cut : self.m]
        self.buf[: qt - qh] = self.buf[qh:qt] - cut
        self.m = keep
        self.ist[_QH], self.ist[_QT], self.ist[_SCAN] = 0, qt - qh, int(self.ist[_SCAN]) - cut
        self.nb = 0


def drain(feeds: list[CompiledFeed]) -> None:
    """Run closed feeds to the end."""
    for feed in feeds:
        feed.close()
        if feed.run() != DONE:  # pragma: no cover - a closed queue always finishes
            raise RuntimeError("a closed batch queue did not finish")


__all__ = ["CompiledFeed", "covers", "drain"]
