"""The front end's event loop as one compiled loop over events (:func:`_kernel`), and the
batcher's rule at a point of it (:func:`_dispatch`): the kernels of
:class:`~simulator.serving.event_loop.Loop` (one loop) and
:class:`~simulator.serving.frontends.Frontends` (several, sharing one batch queue), which
keep their state between calls in the arrays they pass (``st``: the scalar state, indexed
by the names below). What the loop models is :mod:`simulator.serving.event_loop`'s story.
"""

from __future__ import annotations

import math

import numpy as np

from simulator import jit
from simulator.ledger import Outcome
from simulator.serving.compiled import arrive, finish_on_path, rate_factor

_REJECTED = int(Outcome.REJECTED)
_NONE, _ADMIT, _RETURN, _RESPOND, _TIMER, _RESUME = 0, 1, 2, 3, 4, 5


# the kernel's scalar state, kept between calls (an int64 array, and the loop's clock)
_I, _QH, _QT, _NB, _FPOS, _BH, _BT, _RH, _RT, _RUNNING, _KIND, _ARG, _SEQC, _WH, _WT, _HELD = range(16)


def _earliest_py(ends):
    """The earliest of the instances' batch ends (inf: none running), and its instance (-1)."""
    te, ie = math.inf, -1
    for j in range(len(ends)):
        if ends[j] < te:
            te, ie = ends[j], j
    return te, ie


_earliest = jit.njit(cache=True, nogil=True)(_earliest_py)


def _dispatch_py(
    now, buf, qh, qt, t_enq, t_disp, pb, max_b, delay, preferred, free_at, busy, seq, ends, bid,
    factors, fpos, means, idle_t, idle_f, rk, rf, rtau, rst, ak, af, qk, qf, ip_t, ip_w, ip_f,
    b_pos, b_size, b_start, b_done, b_inst, nb,
):  # fmt: skip
    """Every batch the rule sends at ``now`` to a free instance (the one idle longest), and
    when each will be computed (``b_done``).
    Returns the queue head, the factor cursor and the batch count."""
    n_inst = len(free_at)
    while qt > qh:
        held = -1
        for j in range(n_inst):
            if busy[j]:
                continue
            if held < 0 or free_at[j] < free_at[held] or (free_at[j] == free_at[held] and seq[j] < seq[held]):
                held = j
        if held < 0:
            break
        n = qt - qh
        if n >= max_b:
            size = max_b
        elif len(preferred) > 0 and n >= preferred[0]:
            size = preferred[np.searchsorted(preferred, n, side="right") - 1]
        elif t_enq[buf[qh]] + delay <= now:
            size = n
        else:
            break
        x = factors[fpos]
        fpos += 1
        work = means[size] * x if len(means) > 0 else x
        if len(idle_t) > 0:  # the instance idle since it was taken back: a slower batch
            work *= np.interp(now - free_at[held], idle_t, idle_f)
        work *= rate_factor(now, size, held, rk, rf, rtau, rst, ak, af, qk, qf, n)  # and by its recent throughput
        done = finish_on_path(now, work, ip_t, ip_w, ip_f)
        for p in range(qh, qh + size):
            t_disp[buf[p]] = now
            pb[buf[p]] = nb
        b_pos[nb], b_size[nb], b_start[nb], b_done[nb], b_inst[nb] = qh, size, now, done, held
        busy[held] = True
        ends[held] = done
        bid[held] = nb
        nb += 1
        qh += size
    return qh, fpos, nb


_dispatch = jit.njit(cache=True, nogil=True)(_dispatch_py)


def _kernel_py(
    n, horizon, st, clock, t, cost, wait, late, resume, reads_hold, responds_first, batcher_yields, held_k, hx, hf,
    lx, lf, arrived, wq, wdue, t_back, rets, resp_b, resp_k, behind,
    max_b, delay, cap, preferred, factors, means, idle_t, idle_f, rk, rf, rtau, rst, ak, af, qk, qf,
    ip_t, ip_w, ip_f, fp_t, fp_w, fp_f, free_at, busy, seq, ends, bid, back, resp,
    t_enq, t_disp, t_resp, outcome, t_drop, pb, buf, b_pos, b_size, b_start, b_end, b_inst, b_done, b_resp,
):  # fmt: skip
    """The loop's events before ``horizon``, for the ``n`` requests known (``t`` sorted;
    every later one ready at or after the horizon); the scalar state in ``st`` and
    ``clock`` (when the loop is free, the batcher's turn, when its last job with work
    ended) carries to the next call. Every event runs in time
    order, so a run cut at any horizons makes the same decisions as one call to infinity."""
    inf = math.inf
    n_inst = len(free_at)
    i, qh, qt, nb, fpos = st[_I], st[_QH], st[_QT], st[_NB], st[_FPOS]
    bh, bt, rh, rt = st[_BH], st[_BT], st[_RH], st[_RT]
    running, kind, arg, seqc = st[_RUNNING] != 0, st[_KIND], st[_ARG], st[_SEQC]
    wh, wt = st[_WH], st[_WT]  # requests off the loop, awaiting their fetch (``resume`` >= 0), in order
    held = st[_HELD]  # requests read and not yet answered
    loop_free = clock[0]
    while True:
        te, ie = _earliest(ends)  # the next batch to end, and its instance
        if not running:
            ra = t[i] if i < n else inf
            rb = b_done[back[bh]] if bh < bt else inf
            rr = b_end[resp[rh]] if rh < rt else inf
            rw = wdue[wh] if wh < wt else inf
            rtim = inf
            if max_b > qt - qh > 0:
                for j in range(n_inst):
                    if not busy[j]:  # the window's timer, as late as the loop's timers fire
                        rtim = t_enq[buf[qh]] + delay + late[buf[qh]]
                        if batcher_yields:  # or a request queued past the window woke the batcher
                            rtim = min(rtim, clock[2])
                        break
            r = min(ra, rb, rr, rtim, rw)
            if r == inf and te == inf:
                break
            start = max(loop_free, r)
            if min(start, te) >= horizon:  # the next event waits for the arrivals before it
                break
            if rtim == inf:  # no window open on a free instance: no turn pending
                clock[1] = -inf
                clock[2] = inf
            elif batcher_yields and rtim == r and te > start:
                # the timer's turn: the jobs ready by now go first, then the batch (clock[1])
                if clock[1] == -inf:
                    clock[1] = start
                other = min(ra, rb, rr, rw)
                if other <= clock[1]:
                    r, rtim = other, inf
            if te > start:  # the loop takes its next job, the oldest ready, before any batch is computed
                # with ``arrived``, the requests waiting to be read count as held too
                unread = np.searchsorted(t[i:n], start, side="right") if arrived else 0
                more = 1.0 + held_k * max(held + unread - 1, 0)  # its work grows with the others the loop holds
                if len(hx) > 0:  # or by the factor measured at the count held
                    more *= np.interp(float(held + unread), hx, hf)
                # the loop slept since its last job with work (a timer's turn does none): slower
                cold = np.interp(start - clock[3], lx, lf) if len(lx) > 0 else 1.0
                if rb == r:
                    arg = back[bh]
                    bh += 1
                    ret = rets[buf[b_pos[arg]]]  # the hand-back's time, drawn for the request heading the batch
                    loop_free = finish_on_path(start, ret * more * cold, fp_t, fp_w, fp_f)
                    kind = _RETURN
                elif rr == r or (responds_first and rr <= start):  # a batch's responses (first, if asked)
                    b = resp[rh]
                    rh += 1
                    for p in range(b_pos[b], b_pos[b] + b_size[b]):
                        work = (resp_b + resp_k * (p - b_pos[b] + 1)) * more * cold
                        later = b_pos[b] + b_size[b] - 1 - p  # the batch's responses written after it
                        t_resp[buf[p]] = finish_on_path(start, work, fp_t, fp_w, fp_f) + behind * later
                    loop_free = finish_on_path(start, (resp_b + resp_k * b_size[b]) * more * cold, fp_t, fp_w, fp_f)
                    held -= b_size[b]
                    b_resp[b] = True
                    kind = _RESPOND
                elif rtim == r:
                    loop_free = start
                    clock[1] = -inf
                    kind = _TIMER
                elif rw == r and not (ra <= start < rw + reads_hold):  # a fetch is back: resume, queue
                    arg = wq[wh]
                    wh += 1
                    loop_free = finish_on_path(start, resume * more * cold, fp_t, fp_w, fp_f)
                    kind = _RESUME
                else:
                    arg = i
                    i += 1
                    if cap >= 0 and qt - qh >= cap:  # refused at the door
                        outcome[arg] = _REJECTED
                        t_drop[arg] = start
                        loop_free = start
                        kind = _NONE
                    else:
                        held += 1
                        inside = held + max(unread - 1, 0)  # itself was among the unread
                        grow = 1.0 + held_k * (inside - 1)
                        if len(hx) > 0:
                            grow *= np.interp(float(inside), hx, hf)
                        loop_free = finish_on_path(start, cost[arg] * grow * cold, fp_t, fp_w, fp_f)
                        kind = _ADMIT
                if kind != _TIMER and kind != _NONE:
                    clock[3] = loop_free
                running = True
                continue
        elif min(loop_free, te) >= horizon:
            break
        elif te > loop_free:  # the job in progress ends first
            if kind == _ADMIT and resume >= 0:  # the handler awaits its fetch off the loop; answers in order
                due = loop_free + wait[arg]
                wq[wt] = arg
                wdue[wt] = max(due, wdue[wt - 1]) if wt > 0 else due
                t_back[arg] = wdue[wt]  # when its fetch is back
                wt += 1
            elif kind in (_ADMIT, _RESUME):
                t_enq[arg] = loop_free
                buf[qt] = arg
                qt += 1
                if rst[0, 3] > 0.0:  # by_rate counts the queue's arrivals
                    arrive(rst, loop_free, rtau)
            elif kind == _RETURN:  # the batch is back: its instance is free, its responses wait
                b_end[arg] = loop_free
                j = b_inst[arg]
                busy[j] = False
                free_at[j] = loop_free
                seq[j] = seqc
                seqc += 1
                resp[rt] = arg
                rt += 1
            # the batcher looks at its queue when a request is queued, an instance frees or
            # its timer fires: not after a read whose request is still awaiting its fetch
            queued = kind == _RESUME or (kind == _ADMIT and resume < 0)
            if batcher_yields and queued and max_b > qt - qh > 0 and t_enq[buf[qh]] + delay <= loop_free:
                # a request queued past the window wakes the batcher, a task: the batch goes at
                # its turn, after the jobs ready by then (the timer's path)
                clock[2] = min(clock[2], loop_free)
            elif queued or kind in (_RETURN, _TIMER):
                sent = nb
                qh, fpos, nb = _dispatch(
                    loop_free, buf, qh, qt, t_enq, t_disp, pb, max_b, delay, preferred, free_at, busy, seq, ends,
                    bid, factors, fpos, means, idle_t, idle_f, rk, rf, rtau, rst, ak, af, qk, qf, ip_t, ip_w, ip_f,
                    b_pos, b_size, b_start, b_done, b_inst, nb,
                )  # fmt: skip
                if nb > sent:  # a batch went: the timer's next turn is its next window's
                    clock[1] = -inf
                    clock[2] = inf
            running = False
            continue
        # an instance has computed its batch: the loop takes it back when it gets to it
        ends[ie] = inf
        back[bt] = bid[ie]
        bt += 1
    st[_I], st[_QH], st[_QT], st[_NB], st[_FPOS] = i, qh, qt, nb, fpos
    st[_BH], st[_BT], st[_RH], st[_RT] = bh, bt, rh, rt
    st[_RUNNING], st[_KIND], st[_ARG], st[_SEQC] = 1 if running else 0, kind, arg, seqc
    st[_WH], st[_WT], st[_HELD] = wh, wt, held
    clock[0] = loop_free


_kernel = jit.njit(cache=True, nogil=True)(_kernel_py)
