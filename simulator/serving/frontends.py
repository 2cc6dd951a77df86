"""Several front ends, each an event loop, relaying to one hub that batches and answers
(``preprocess.relay``: ``servesim serve --frontends N``).

A server of N front-end processes before one batcher (uvicorn's workers before Triton's
scheduler, or the reference server's hub) does a request's work in three places, each one
thread that runs its jobs one at a time in the order they became ready:

* its **front end** (one of N, dealt every N-th request) reads, parses and preprocesses it
  (``preprocess.service``) and relays the item to the hub; later it reads the answer and
  writes the response (``relay.respond_ms``). So an answer that reaches a front end busy
  with another request's parsing waits for it, and a request arriving while its front end
  writes responses waits in the socket;
* the **hub** takes each item in (``preprocess.hub``) and queues it for the batcher; when
  an instance has computed a batch, the instance is free at once (the reference server
  hands the next batch over in the callback that reads the outputs, and the batch time
  measured holds that hand-back), and the hub takes the outputs in (``relay.hub_return_ms``)
  and sends each request's answer to its front end (``relay.hub_answer_ms`` each, in the
  batch's order); the batching window's timer waits for the hub's job in progress;
* the **instances** compute the batches (``workers.service_time``).

A front end modelled as a station before the queue (``cpu_workers`` with ``hub``) has none
of the way back: on the H200 calibration the time from a batch's end to its request's
handler resuming grew with the load (0.38 → 0.65 ms at the median from 20% to 50%) and
with the request's place in its batch, and an answer that reached a front end busy with
another request's preprocessing waited 0.17-0.23 ms longer at the median
(calibrate/README, "The way back through the hub").

:func:`_kernel` runs the whole server as one compiled loop over events up to a horizon,
its state carried from one chunk of the run to the next (:class:`Frontends`): the events
are processed in time order, so a run cut at any horizons makes the same decisions as one
call to infinity. Times on the front ends and the hub are nominal work stretched by the
front end's speed path, batch times by the instances' (:mod:`simulator.stages.speed`).
"""

from __future__ import annotations

import math

import numpy as np

from simulator import jit
from simulator.ledger import BatchLog, Outcome, Served
from simulator.scenario.config import Batching
from simulator.scenario.path import Relay
from simulator.serving.compiled import arrive, finish_on_path
from simulator.serving.event_loop import _grow, instance_state, settled, shift_batches
from simulator.serving.loop_kernel import _FPOS, _NB, _QH, _QT, _dispatch, _earliest

_REJECTED = int(Outcome.REJECTED)
_ENQ, _ANS, _TIMER = 1, 2, 3  # the hub's jobs, as they end
_ADMIT, _RESPOND = 1, 2  # a front end's

# the kernel's scalar state (an int64 array), the batch queue's four where a Loop keeps
# them (shift_batches); its clock holds when the hub is free
_HH, _HT, _SEQC, _TIMED = range(5, 9)


def _kernel_py(
    n, horizon, st, clock, t, cost, hub_in, lp, nxt, rnext, rready,
    ret, ans, resp, max_b, delay, cap, preferred, factors, means, idle_t, idle_f, rk, rf, rtau, rst, ak, af, qk, qf,
    ip_t, ip_w, ip_f, fp_t, fp_w, fp_f, free_at, busy, seq, ends, bid,
    lfree, lrun, lkind, larg, ahead, rhead, rtail, hq_t, hq_k, hq_a,
    t_enq, t_disp, t_resp, outcome, t_drop, pb, buf, b_pos, b_size, b_start, b_end, b_inst, b_done,
):  # fmt: skip
    """The server's events before ``horizon``, for the ``n`` requests known (each ready at
    its front end ``lp[i]`` at ``t[i]``, sorted; every later one at or after the horizon).
    Ties between events go: the hub's job ending, an instance's batch, the window's timer,
    a front end's job ending, a front end taking its next job."""
    inf = math.inf
    n_inst = len(free_at)
    n_loops = len(lfree)
    qh, qt, nb, fpos = st[_QH], st[_QT], st[_NB], st[_FPOS]
    hh, ht, seqc, timed = st[_HH], st[_HT], st[_SEQC], st[_TIMED]
    hub_free = clock[0]
    while True:
        te, ie = _earliest(ends)  # the next batch to end, and its instance
        th = hq_t[hh] if hh < ht else inf
        tdue = inf
        if timed == 0 and max_b > qt - qh > 0:
            for j in range(n_inst):
                if not busy[j]:  # the window's timer
                    tdue = t_enq[buf[qh]] + delay
                    break
        tl = inf  # the earliest front-end event: a job's end, or a job's start
        il = -1
        for k in range(n_loops):
            if lrun[k]:
                ev = lfree[k]
            else:
                ra = t[ahead[k]] if 0 <= ahead[k] < n else inf
                rr = rready[rhead[k]] if rhead[k] >= 0 else inf
                r = min(ra, rr)
                if r == inf:
                    continue
                ev = max(lfree[k], r)
            if ev < tl or (ev == tl and lrun[k] and not lrun[il]):
                tl, il = ev, k
        now = min(th, te, tdue, tl)
        if now == inf or now >= horizon:
            break
        if th == now:  # the hub ends a job
            kind, arg = hq_k[hh], hq_a[hh]
            hh += 1
            if kind == _ENQ:
                if cap >= 0 and qt - qh >= cap:  # the queue is full: refused
                    outcome[arg] = _REJECTED
                    t_drop[arg] = now
                    continue
                t_enq[arg] = now
                buf[qt] = arg
                qt += 1
                if rst[0, 3] > 0.0:  # by_rate counts the queue's arrivals
                    arrive(rst, now, rtau)
            elif kind == _ANS:  # the answer reached its front end: its response waits there
                k = lp[arg]
                rready[arg] = now
                rnext[arg] = -1
                if rhead[k] < 0:
                    rhead[k] = arg
                else:
                    rnext[rtail[k]] = arg
                rtail[k] = arg
                continue
            else:
                timed = 0
            qh, fpos, nb = _dispatch(
                now, buf, qh, qt, t_enq, t_disp, pb, max_b, delay, preferred, free_at, busy, seq, ends,
                bid, factors, fpos, means, idle_t, idle_f, rk, rf, rtau, rst, ak, af, qk, qf, ip_t, ip_w, ip_f,
                b_pos, b_size, b_start, b_done, b_inst, nb,
            )  # fmt: skip
            continue
        if te == now:  # an instance has computed its batch: it is free (the next batch goes as
            # the hub takes the outputs, a hand-back the batch time holds); the hub takes the
            # outputs in, then sends the answers one after another
            ends[ie] = inf
            b = bid[ie]
            b_end[b] = now
            busy[ie] = False
            free_at[ie] = now
            seq[ie] = seqc
            seqc += 1
            hub_free = finish_on_path(max(now, hub_free), ret, fp_t, fp_w, fp_f)
            for p in range(b_pos[b], b_pos[b] + b_size[b]):
                hub_free = finish_on_path(hub_free, ans, fp_t, fp_w, fp_f)
                hq_t[ht], hq_k[ht], hq_a[ht] = hub_free, _ANS, buf[p]
                ht += 1
            qh, fpos, nb = _dispatch(
                now, buf, qh, qt, t_enq, t_disp, pb, max_b, delay, preferred, free_at, busy, seq, ends,
                bid, factors, fpos, means, idle_t, idle_f, rk, rf, rtau, rst, ak, af, qk, qf, ip_t, ip_w, ip_f,
                b_pos, b_size, b_start, b_done, b_inst, nb,
            )  # fmt: skip
            continue
        if tdue == now:  # the timer is due: it fires when the hub gets to it
            timed = 1
            hub_free = max(now, hub_free)
            hq_t[ht], hq_k[ht], hq_a[ht] = hub_free, _TIMER, -1
            ht += 1
            continue
        k = il
        if lrun[k]:  # a front end ends a job
            lrun[k] = False
            arg = larg[k]
            if lkind[k] == _ADMIT:  # the item goes to the hub
                hub_free = finish_on_path(max(now, hub_free), hub_in[arg], fp_t, fp_w, fp_f)
                hq_t[ht], hq_k[ht], hq_a[ht] = hub_free, _ENQ, arg
                ht += 1
            else:
                t_resp[arg] = now
            continue
        # a front end takes its oldest ready job (an answer first on a tie)
        ra = t[ahead[k]] if 0 <= ahead[k] < n else inf
        rr = rready[rhead[k]] if rhead[k] >= 0 else inf
        lrun[k] = True
        if rr <= ra:
            arg = rhead[k]
            rhead[k] = rnext[arg]
            if rhead[k] < 0:
                rtail[k] = -1
            lkind[k] = _RESPOND
            lfree[k] = finish_on_path(now, resp, fp_t, fp_w, fp_f)
        else:
            arg = ahead[k]
            ahead[k] = nxt[arg]
            lkind[k] = _ADMIT
            lfree[k] = finish_on_path(now, cost[arg], fp_t, fp_w, fp_f)
        larg[k] = arg
    st[_QH], st[_QT], st[_NB], st[_FPOS] = qh, qt, nb, fpos
    st[_HH], st[_HT], st[_SEQC], st[_TIMED] = hh, ht, seqc, timed
    clock[0] = hub_free


_kernel = jit.njit(cache=True, nogil=True)(_kernel_py)

_PER_REQUEST = (
    ("t", 0.0), ("cost", 0.0), ("hub_in", 0.0), ("lp", -1), ("nxt", -1), ("rnext", -1),
    ("rready", np.nan), ("t_enq", np.nan), ("t_disp", np.nan), ("t_resp", np.nan), ("t_drop", np.nan),
    ("outcome", 0), ("pb", -1), ("ids", -1), ("rep", False),
)  # fmt: skip


class Frontends:
    """The front ends, the hub, its batch queue and model instances, run chunk by chunk:
    requests are :meth:`push`-ed in the order they reach the front ends (dealt in turn),
    and :meth:`run` simulates up to a horizon, keeping only the requests and batches not
    answered yet (bounded memory).

    ``service`` (a :class:`~simulator.serving.workers.ServiceModel` feed) draws the batch
    times in dispatch order; ``front`` is the speed path of the front ends and the hub."""

    def __init__(self, relay: Relay, batching: Batching, loops: int, instances: int, service, front=None):
        self.relay, self.batching, self.service = relay, batching, service
        instance_state(self, batching, instances, service, front)
        self.lfree = np.full(loops, -math.inf)
        self.lrun = np.zeros(loops, dtype=np.bool_)
        self.lkind = np.zeros(loops, dtype=np.int64)
        self.larg, self.ahead, self.rhead, self.rtail, self.last = (
            np.full(loops, -1, dtype=np.int64) for _ in range(5)
        )
        self.turn = 0  # the front end dealt the next request
        self.st = np.zeros(9, dtype=np.int64)
        self.st[_SEQC] = instances
        self.clock = np.array([-math.inf])
        self.n = 0
        for name, fill in _PER_REQUEST:
            setattr(self, name, np.zeros(0, dtype=np.asarray(fill).dtype))
        self.hq_t, self.hq_k, self.hq_a = np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        self.buf = np.zeros(0, dtype=np.int64)
        self.b_pos, self.b_size, self.b_inst = (np.zeros(0, dtype=np.int64) for _ in range(3))
        self.b_start, self.b_end, self.b_done = (np.zeros(0) for _ in range(3))
        self.b_out = np.zeros(0, dtype=np.bool_)
        self.factors = np.zeros(0)

    def push(self, ids: np.ndarray, t: np.ndarray, cost: np.ndarray, hub_in: np.ndarray) -> None:
        """Requests ``ids`` reaching the front ends at ``t`` (sorted, at or after every
        earlier push's), dealt in turn; each takes ``cost`` ms of its front end's work,
        then ``hub_in`` of the hub's."""
        k, n = len(ids), self.n
        for name, fill in _PER_REQUEST:
            setattr(self, name, _grow(getattr(self, name), n + k, fill))
        self.t[n : n + k], self.cost[n : n + k], self.hub_in[n : n + k], self.ids[n : n + k] = t, cost, hub_in, ids
        loops = len(self.lfree)
        which = (self.turn + np.arange(k)) % loops
        self.turn = int((self.turn + k) % loops)
        self.lp[n : n + k] = which
        self.nxt[n : n + k] = -1
        for j in range(loops):  # each front end's requests in the order dealt, linked
            mine = n + np.flatnonzero(which == j)
            if not len(mine):
                continue
            self.nxt[mine[:-1]] = mine[1:]
            if self.last[j] >= 0:
                self.nxt[self.last[j]] = mine[0]
            if self.ahead[j] < 0:
                self.ahead[j] = mine[0]
            self.last[j] = mine[-1]
        self.n += k
        while len(self.factors) - int(self.st[_FPOS]) < self.n + 1:
            self.factors = np.concatenate([self.factors, self.service.block()])

    def run(self, horizon: float) -> tuple[np.ndarray, np.ndarray, Served, np.ndarray, BatchLog]:
        """Simulate up to ``horizon`` (ms; inf: to the end). Returns the requests answered
        or refused since the last call, unsorted: their ids, when each was queued at the
        hub, the serving columns, and when its front end wrote its response (NaN if
        refused); and the batches answered since the last call."""
        st, n = self.st, self.n
        room = int(st[_NB]) + n + 1
        for name in ("b_pos", "b_size", "b_inst"):
            setattr(self, name, _grow(getattr(self, name), room, 0))
        for name in ("b_start", "b_end", "b_done"):
            setattr(self, name, _grow(getattr(self, name), room, np.nan))
        self.b_out = _grow(self.b_out, room, False)
        self.buf = _grow(self.buf, int(st[_QT]) + n + 1, 0)
        hub = int(st[_HT]) + 3 * n + room + 1  # each request's way in and answer, each batch's return, timers
        self.hq_t, self.hq_k, self.hq_a = (_grow(a, hub, 0) for a in (self.hq_t, self.hq_k, self.hq_a))
        r, b = self.relay, self.batching
        _kernel(
            n, float(horizon), st, self.clock, self.t, self.cost, self.hub_in, self.lp, self.nxt,
            self.rnext, self.rready, float(r.hub_return_ms), float(r.hub_answer_ms), float(r.respond_ms),
            int(b.max_batch_size), float(b.max_queue_delay_ms), self.cap, self.preferred, self.factors, self.means,
            self.idle_t, self.idle_f, *self.rate,
            *self.path, *self.front, self.free_at, self.busy, self.seq, self.ends, self.bid,
            self.lfree, self.lrun, self.lkind, self.larg, self.ahead, self.rhead, self.rtail,
            self.hq_t, self.hq_k, self.hq_a,
            self.t_enq, self.t_disp, self.t_resp, self.outcome, self.t_drop, self.pb, self.buf,
            self.b_pos, self.b_size, self.b_start, self.b_end, self.b_inst, self.b_done,
        )  # fmt: skip
        return self._settle()

    def _settle(self):
        """What ended since the last call, out; the state kept from the first request and
        the first batch not out yet, indices shifted to match."""
        n, nb = self.n, int(self.st[_NB])
        p, served = settled(self)
        out = (self.ids[p].copy(), self.t_enq[p].copy(), served, self.t_resp[p].copy())
        # a batch is out once every one of its requests is answered
        waiting = self.pb[:n][(self.pb[:n] >= 0) & np.isnan(self.t_resp[:n])]
        answered = ~np.isnan(self.b_end[:nb]) & (np.bincount(waiting, minlength=nb)[:nb] == 0)
        b = np.flatnonzero(answered & ~self.b_out[:nb])
        self.b_out[b] = True
        log = BatchLog(self.b_start[b].copy(), self.b_end[b].copy(), self.b_size[b].copy(), self.b_inst[b].copy())
        p0 = int(np.argmin(self.rep[:n])) if not self.rep[:n].all() else n
        b0 = int(np.argmin(self.b_out[:nb])) if not self.b_out[:nb].all() else nb
        self._shift(p0, b0)
        return (*out, log)

    def _shift(self, p0: int, b0: int) -> None:
        """Drop requests before ``p0`` and batches before ``b0`` (all out), and the queue's
        entries, the hub's ended jobs and the batch times no longer needed."""
        st = self.st
        for name, _ in _PER_REQUEST:
            setattr(self, name, getattr(self, name)[p0 : self.n].copy())
        self.n -= p0
        for links in (self.nxt, self.rnext):
            links[links >= 0] -= p0
        for heads in (self.ahead, self.rhead, self.rtail, self.larg):  # requests not out yet
            heads[heads >= 0] -= p0
        self.last = np.where(self.last >= p0, self.last - p0, -1)  # a front end's last request dealt may be out
        shift_batches(self, p0, b0, ("b_pos", "b_size", "b_start", "b_end", "b_inst", "b_done", "b_out"))
        hh, ht = int(st[_HH]), int(st[_HT])
        self.hq_t, self.hq_k, self.hq_a = self.hq_t[hh:ht].copy(), self.hq_k[hh:ht].copy(), self.hq_a[hh:ht].copy()
        self.hq_a[(self.hq_k == _ENQ) | (self.hq_k == _ANS)] -= p0
        st[_HH], st[_HT] = 0, ht - hh
