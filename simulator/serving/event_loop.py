"""The front end as one event loop that admits requests and writes the responses, coupled
to its batch queue and the model instances it feeds (``preprocess.event_loop``).

An asyncio front end (the reference server, TorchServe's and Triton's HTTP front ends in
their own way) does all of its request work on one thread: it parses and decodes each
request and queues it for a batch; when a batch comes back it resumes the batch's
requests and encodes and writes each response. Those jobs run one at a time, in the
order they became ready, and the batching window's timer fires only between them. A
front end modelled as a station *before* the batch queue misses two things the one loop
does (calibrate/README, "The light-load gap"):

* right after a batch returns, the loop writes its responses, so requests arriving then
  wait in the socket and reach the queue later: into the running batch's last part,
  where they wait less for the next batch;
* a batch's responses wait behind the requests being admitted, so part of a request's
  front-end time overlaps the batch it waits for anyway.

The state is small (one loop, one FIFO queue, a few instances), so the model runs as
one compiled loop over events (:mod:`simulator.serving.loop_kernel`), up to a horizon
(:class:`Loop` carries its state, and only the requests and batches not answered yet,
from one chunk of the run to the next):
the loop's jobs (an admission, a batch's hand-back and its responses, the window's timer,
a handler's resumption after its fetch), each started when the loop is free in the order
of the time it became ready (with ``reads_first``, a resumption only when no request waits
to be read, or ``reads_first_ms`` after its fetch was back), and the instances' batch ends,
which happen at their time whatever the loop is doing (the batch time fitted on a server
holds the hand-back); with
``cost_per_in_flight``, each job's time grows with the other requests the loop holds (in
the server, not yet answered: with ``held_counts: read`` only those read) when it starts;
with ``cost_by_held``, it is scaled by the measured factor at the count held
(interpolated). The window's timer is ready ``timer_late`` after its due time, one draw per
request as it reaches the loop, used when that request is the oldest queued; with
``batcher_yields`` the batcher is a task: at its turn (its timer, or a request queued past
the window that woke it) the jobs ready by then run first, and their requests join its
batch. The batcher's rule is :class:`~simulator.serving.batcher.BatchQueue`'s (max batch,
preferred sizes, the window from the oldest queued request, the queue cap), decided when
a request is queued, when an instance frees and when the timer runs. Times on the loop are nominal
work stretched by the front end's speed path, batch times by the instances' path
(:mod:`simulator.stages.speed`).
"""

from __future__ import annotations

import math

import numpy as np

from simulator.ledger import BatchLog, Served
from simulator.scenario.config import Batching
from simulator.scenario.path import EventLoop
from simulator.serving.loop_kernel import (
    _ADMIT,
    _ARG,
    _BH,
    _BT,
    _FPOS,
    _I,
    _KIND,
    _NB,
    _QH,
    _QT,
    _REJECTED,
    _RESUME,
    _RETURN,
    _RH,
    _RT,
    _RUNNING,
    _SEQC,
    _WH,
    _WT,
    _kernel,
)

_NO_PATH = (np.zeros(0), np.zeros(0), np.zeros(0))


def _arrays(path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _NO_PATH if path is None else (path.t, path.w, path.f)


def _grow(a: np.ndarray, size: int, fill) -> np.ndarray:
    """``a`` with room for ``size`` entries (doubling), the new ones ``fill``."""
    if len(a) >= size:
        return a
    out = np.full(max(size, 2 * len(a)), fill, dtype=a.dtype)
    out[: len(a)] = a
    return out


def settled(server) -> tuple[np.ndarray, Served]:
    """The requests of ``server`` (a :class:`Loop` or a
    :class:`~simulator.serving.frontends.Frontends`) answered or refused and not yet
    handed out, marked as handed out, and their serving columns."""
    n = server.n
    done = ~np.isnan(server.t_resp[:n]) | (server.outcome[:n] == _REJECTED)
    p = np.flatnonzero(done & ~server.rep[:n])
    server.rep[p] = True
    served = Served.empty(len(p))._replace(
        outcome=server.outcome[p].copy(), t_dropped=server.t_drop[p].copy(), t_dispatch=server.t_disp[p].copy()
    )
    mine = server.pb[p]
    a = mine >= 0
    served.t_done[a] = server.b_end[mine[a]]
    served.batch_size[a] = server.b_size[mine[a]]
    served.instance[a] = server.b_inst[mine[a]]
    return p, served


def instance_state(server, batching: Batching, instances: int, service, front) -> None:
    """Set on ``server`` (a :class:`Loop` or a :class:`~simulator.serving.frontends.Frontends`)
    the state its batch queue and model instances share: the speed paths, the batch times'
    means, the queue's cap and preferred sizes, and each instance's free time, state,
    order and batch."""
    server.path, server.front = _arrays(service.path), _arrays(front)
    server.means = service.means if service.means is not None else np.zeros(0)
    server.idle_t, server.idle_f = service.idle_ms, service.idle_factor
    server.rate = service.rate_args(service.rate_state(instances))  # by_rate, after_batch: each instance's state
    server.cap = -1 if batching.max_queue_size is None else int(batching.max_queue_size)
    server.preferred = np.asarray(sorted(set(batching.preferred_batch_sizes)), dtype=np.int64)
    server.free_at = np.zeros(instances)
    server.busy = np.zeros(instances, dtype=np.bool_)  # computing (a Loop's: or waiting for it to take the batch back)
    server.seq = np.arange(instances, dtype=np.int64)
    server.ends = np.full(instances, math.inf)  # when each instance's batch is computed
    server.bid = np.full(instances, -1, dtype=np.int64)


def shift_batches(server, p0: int, b0: int, columns: tuple[str, ...]) -> None:
    """Drop from ``server`` the batches before ``b0`` (all out; ``columns``: its per-batch
    arrays), the queue's entries and the batch times no longer needed, with request indices
    shifted by ``p0`` (its per-request arrays already cut there)."""
    st = server.st
    qh, qt, nb = int(st[_QH]), int(st[_QT]), int(st[_NB])
    q0 = min(qh, int(server.b_pos[b0]) if b0 < nb else qh)
    server.pb[server.pb >= 0] -= b0
    for name in columns:
        setattr(server, name, getattr(server, name)[b0:nb].copy())
    st[_NB] = nb - b0
    server.b_pos -= q0
    server.bid = np.where(server.ends < math.inf, server.bid - b0, -1)
    server.buf = server.buf[q0:qt] - p0
    st[_QH], st[_QT] = qh - q0, qt - q0
    server.factors = server.factors[int(st[_FPOS]) :].copy()
    st[_FPOS] = 0


class Loop:
    """The front end's event loop with its batch queue and model instances, run chunk by
    chunk: requests are :meth:`push`-ed in the order they become ready for the loop, and
    :meth:`run` simulates up to a horizon, keeping only the requests and batches not
    answered yet (bounded memory: the loop's state is a few instances and its queue).

    ``service`` (a :class:`~simulator.serving.workers.ServiceModel` feed) draws the batch
    times in dispatch order; ``front`` is the loop's speed path."""

    def __init__(
        self, loop: EventLoop, batching: Batching, instances: int, service, front=None, timer_late=None, hand_back=None
    ):
        self.loop, self.batching, self.service = loop, batching, service
        instance_state(self, batching, instances, service, front)
        self.st = np.zeros(16, dtype=np.int64)
        self.st[_SEQC] = instances
        # when the loop is free; when the timer's turn came; when a request queued past the window woke the batcher
        self.clock = np.array([-math.inf, -math.inf, math.inf, -math.inf])  # loop free, turns, last work
        self.n = 0  # requests held (the first not yet answered, and those after it)
        self.t, self.cost, self.t_enq, self.t_disp, self.t_resp, self.t_drop = (np.zeros(0) for _ in range(6))
        # with ``resume_ms``: each request's fetch, off the loop between its admission and its resumption
        self.resume = -1.0 if loop.resume_ms is None else float(loop.resume_ms)
        self.wait, self.wdue, self.t_back, self.late = np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0)
        self.timer_late = timer_late  # a Sampler of how late the window's timer fires, or None
        self.hand_back = hand_back  # a Sampler of the hand-back's time (``return_time``), or None: ``return_ms``
        self.ret = np.zeros(0)  # each request's hand-back time, used when it heads its batch
        # how long after its fetch is back a resumption waits while any request waits to be read (0: not)
        self.reads_hold = (
            (math.inf if loop.reads_first_ms is None else float(loop.reads_first_ms)) if loop.reads_first else 0.0
        )
        self.responds_first = bool(loop.responds_first)  # a batch's responses before reads and resumptions
        self.batcher_yields = bool(loop.batcher_yields)  # the window's timer after the jobs ready at its turn
        self.held_k = float(loop.cost_per_in_flight)  # each job's work grows with the requests held
        by = loop.cost_by_held or {}  # or follows a measured factor by the count held
        self.hx = np.array(sorted(by), dtype=float)
        self.hf = np.array([by[h] for h in sorted(by)], dtype=float)
        cold = loop.after_idle or {}  # each job's time by how long the loop slept before it
        self.lx = np.array(sorted(cold), dtype=float)
        self.lf = np.array([cold[x] for x in sorted(cold)], dtype=float)
        # the unread requests count as held (counted only where the loop pays for what it holds)
        self.arrived = loop.held_counts == "arrived" and (self.held_k > 0 or len(self.hx) > 0)
        self.wq = np.zeros(0, dtype=np.int64)
        self.outcome = np.zeros(0, dtype=np.int8)
        self.pb, self.ids, self.buf = (np.zeros(0, dtype=np.int64) for _ in range(3))
        self.b_pos, self.b_size, self.b_inst, self.back, self.resp = (np.zeros(0, dtype=np.int64) for _ in range(5))
        self.b_start, self.b_end, self.b_done = (np.zeros(0) for _ in range(3))
        self.b_resp, self.b_out, self.rep = (np.zeros(0, dtype=np.bool_) for _ in range(3))
        self.factors = np.zeros(0)

    def push(self, ids: np.ndarray, t: np.ndarray, cost: np.ndarray, wait: np.ndarray | None = None) -> None:
        """Requests ``ids`` ready for the loop at ``t`` (sorted, at or after every earlier
        push's), each admitted in ``cost`` ms of nominal loop work; with ``resume_ms``, each
        then awaits its fetch of ``wait`` ms off the loop."""
        k, n = len(ids), self.n
        for name, fill in (("t", 0.0), ("cost", 0.0), ("wait", 0.0), ("late", 0.0), ("ret", 0.0), ("t_back", np.nan),
                           ("t_enq", np.nan), ("t_disp", np.nan), ("t_resp", np.nan), ("t_drop", np.nan),
                           ("outcome", 0), ("pb", -1), ("ids", -1), ("rep", False)):  # fmt: skip
            setattr(self, name, _grow(getattr(self, name), n + k, fill))
        self.t[n : n + k], self.cost[n : n + k], self.ids[n : n + k] = t, cost, ids
        if self.timer_late is not None:  # drawn in the order requests reach the loop, one each
            self.late[n : n + k] = self.timer_late.draw(k)
        # the hand-back's time, drawn in the same order, used for the batch the request heads
        self.ret[n : n + k] = float(self.loop.return_ms) if self.hand_back is None else self.hand_back.draw(k)
        if wait is not None:
            self.wait[n : n + k] = wait
        self.n += k
        # batch times for every batch the requests held could make (at most one each), drawn
        # in blocks as the run needs them: the same sequence as drawn all at once
        while len(self.factors) - int(self.st[_FPOS]) < self.n + 1:
            self.factors = np.concatenate([self.factors, self.service.block()])

    def run(self, horizon: float) -> tuple[np.ndarray, np.ndarray, Served, np.ndarray, BatchLog]:
        """Simulate up to ``horizon`` (ms; inf: to the end). Returns the requests answered
        or refused since the last call, unsorted: their ids, when each was queued
        (admission done), the serving columns, when each response was written (NaN if
        refused) and, with ``resume_ms``, when each one's fetch was back (else NaN); and the
        batches answered since the last call."""
        st, n = self.st, self.n
        room = int(st[_NB]) + n + 1
        for name in ("b_pos", "b_size", "b_inst", "back", "resp"):
            setattr(self, name, _grow(getattr(self, name), room, 0))
        for name in ("b_start", "b_end", "b_done"):
            setattr(self, name, _grow(getattr(self, name), room, 0.0))
        self.b_resp, self.b_out = _grow(self.b_resp, room, False), _grow(self.b_out, room, False)
        self.buf = _grow(self.buf, int(st[_QT]) + n + 1, 0)
        self.wq, self.wdue = _grow(self.wq, int(st[_WT]) + n + 1, 0), _grow(self.wdue, int(st[_WT]) + n + 1, 0.0)
        b = self.batching
        _kernel(
            n, float(horizon), st, self.clock, self.t, self.cost, self.wait, self.late, self.resume, self.reads_hold,
            self.responds_first, self.batcher_yields,
            self.held_k, self.hx, self.hf, self.lx, self.lf, self.arrived, self.wq, self.wdue, self.t_back,
            self.ret, float(self.loop.respond_per_batch_ms), float(self.loop.respond_per_request_ms),
            float(self.loop.read_behind_ms),
            int(b.max_batch_size), float(b.max_queue_delay_ms), self.cap, self.preferred, self.factors, self.means,
            self.idle_t, self.idle_f, *self.rate,
            *self.path, *self.front, self.free_at, self.busy, self.seq, self.ends, self.bid, self.back, self.resp,
            self.t_enq, self.t_disp, self.t_resp, self.outcome, self.t_drop, self.pb, self.buf,
            self.b_pos, self.b_size, self.b_start, self.b_end, self.b_inst, self.b_done, self.b_resp,
        )  # fmt: skip
        return self._settle()

    def _settle(self):
        """What ended since the last call, out; the state kept from the first request and
        the first batch not out yet, indices shifted to match."""
        n, nb = self.n, int(self.st[_NB])
        p, served = settled(self)
        out = (self.ids[p].copy(), self.t_enq[p].copy(), served, self.t_resp[p].copy(), self.t_back[p].copy())
        responded = self.b_resp[:nb]
        b = np.flatnonzero(responded & ~self.b_out[:nb])
        self.b_out[b] = True
        log = BatchLog(
            self.b_start[b].copy(), self.b_end[b].copy(), self.b_size[b].copy(), self.b_inst[b].copy(),
            computed=self.b_done[b].copy(),
        )  # fmt: skip
        p0 = int(np.argmin(self.rep[:n])) if not self.rep[:n].all() else n
        b0 = int(np.argmin(responded)) if not responded.all() else nb
        self._shift(p0, b0)
        return (*out, log)

    def _shift(self, p0: int, b0: int) -> None:
        """Drop requests before ``p0`` and batches before ``b0`` (all out), and the queue's
        entries and batch times no longer needed."""
        st = self.st
        if st[_RUNNING]:
            if st[_KIND] == _ADMIT or st[_KIND] == _RESUME:
                st[_ARG] -= p0
            elif st[_KIND] == _RETURN:
                st[_ARG] -= b0
        kept = ("t", "cost", "wait", "late", "ret", "t_back", "t_enq", "t_disp", "t_resp", "t_drop", "outcome", "pb",
                "ids", "rep")  # fmt: skip
        for name in kept:
            setattr(self, name, getattr(self, name)[p0 : self.n].copy())
        self.n -= p0
        st[_I] -= p0
        shift_batches(self, p0, b0, ("b_pos", "b_size", "b_start", "b_end", "b_inst", "b_done", "b_resp", "b_out"))
        bh, bt, rh, rt = (int(st[k]) for k in (_BH, _BT, _RH, _RT))
        self.back, self.resp = self.back[bh:bt] - b0, self.resp[rh:rt] - b0
        st[_BH], st[_BT], st[_RH], st[_RT] = 0, bt - bh, 0, rt - rh
        wh, wt = int(st[_WH]), int(st[_WT])
        self.wq, self.wdue = self.wq[wh:wt] - p0, self.wdue[wh:wt].copy()
        st[_WH], st[_WT] = 0, wt - wh
