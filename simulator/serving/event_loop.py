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

The state is small (one loop, one FIFO queue, a few instances), so :func:`_kernel` runs
the whole run in one compiled loop over events: the loop's jobs (an admission, a batch's
responses, the window's timer), each started when the loop is free in the order of the
time it became ready, and the instances' batch ends, which happen at their time whatever
the loop is doing (the batch time fitted on a server holds the hand-back). The batcher's
rule is :class:`~simulator.serving.batcher.BatchQueue`'s (max batch, preferred sizes,
the window from the oldest queued request, the queue cap), decided when a request is
queued, when an instance frees and when the timer runs. Times on the loop are nominal
work stretched by the front end's speed path, batch times by the instances' path
(:mod:`simulator.stages.speed`).
"""

from __future__ import annotations

import math

import numpy as np

from simulator.ledger import BatchLog, Outcome, Served
from simulator.scenario.config import Batching
from simulator.scenario.path import EventLoop
from simulator.serving.compiled import finish_on_path

try:
    from numba import njit
except ImportError:  # pragma: no cover - numba is a core dependency
    njit = None

_REJECTED = int(Outcome.REJECTED)
_NONE, _ADMIT, _RETURN, _RESPOND, _TIMER = 0, 1, 2, 3, 4


def _dispatch_py(
    now, buf, qh, qt, t_enq, t_disp, max_b, delay, preferred, free_at, busy, seq, ends, bid,
    factors, fpos, means, ip_t, ip_w, ip_f, b_pos, b_size, b_start, b_done, b_inst, nb,
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
        done = finish_on_path(now, work, ip_t, ip_w, ip_f)
        for p in range(qh, qh + size):
            t_disp[buf[p]] = now
        b_pos[nb], b_size[nb], b_start[nb], b_done[nb], b_inst[nb] = qh, size, now, done, held
        busy[held] = True
        ends[held] = done
        bid[held] = nb
        nb += 1
        qh += size
    return qh, fpos, nb


_dispatch = njit(cache=True, nogil=True)(_dispatch_py) if njit is not None else _dispatch_py


def _kernel_py(
    t, cost, ret, resp_b, resp_k, max_b, delay, cap, preferred, n_inst, factors, means,
    ip_t, ip_w, ip_f, fp_t, fp_w, fp_f,
    t_enq, t_disp, t_resp, outcome, t_drop, buf, b_pos, b_size, b_start, b_end, b_inst, b_done,
):  # fmt: skip
    """The whole run; arrivals ``t`` sorted. Returns the number of batches."""
    n = len(t)
    inf = math.inf
    free_at = np.zeros(n_inst)
    busy = np.zeros(n_inst, dtype=np.bool_)  # computing, or waiting for the loop to take its batch back
    seq = np.arange(n_inst)
    ends = np.full(n_inst, inf)  # when each instance's batch is computed
    bid = np.full(n_inst, -1)
    seqc = n_inst
    back = np.zeros(len(b_pos), dtype=np.int64)  # batches computed, not yet taken back (FIFO)
    bh = bt = 0
    resp = np.zeros(len(b_pos), dtype=np.int64)  # batches back, their responses not begun (FIFO)
    rh = rt = 0
    qh = qt = 0
    nb = fpos = 0
    i = 0
    loop_free = -inf
    running = False
    kind = _NONE
    arg = -1
    while True:
        te = inf
        ie = -1
        for j in range(n_inst):
            if ends[j] < te:
                te, ie = ends[j], j
        if not running:
            ra = t[i] if i < n else inf
            rb = b_done[back[bh]] if bh < bt else inf
            rr = b_end[resp[rh]] if rh < rt else inf
            rtim = inf
            if max_b > qt - qh > 0:
                for j in range(n_inst):
                    if not busy[j]:
                        rtim = t_enq[buf[qh]] + delay
                        break
            r = min(ra, rb, rr, rtim)
            if r == inf and te == inf:
                break
            start = max(loop_free, r)
            if te > start:  # the loop takes its next job, the oldest ready, before any batch is computed
                if rb == r:
                    arg = back[bh]
                    bh += 1
                    loop_free = finish_on_path(start, ret, fp_t, fp_w, fp_f)
                    kind = _RETURN
                elif rr == r:
                    b = resp[rh]
                    rh += 1
                    for p in range(b_pos[b], b_pos[b] + b_size[b]):
                        t_resp[buf[p]] = finish_on_path(start, resp_b + resp_k * (p - b_pos[b] + 1), fp_t, fp_w, fp_f)
                    loop_free = finish_on_path(start, resp_b + resp_k * b_size[b], fp_t, fp_w, fp_f)
                    kind = _RESPOND
                elif rtim == r:
                    loop_free = start
                    kind = _TIMER
                else:
                    arg = i
                    i += 1
                    if cap >= 0 and qt - qh >= cap:  # refused at the door
                        outcome[arg] = _REJECTED
                        t_drop[arg] = start
                        loop_free = start
                        kind = _NONE
                    else:
                        loop_free = finish_on_path(start, cost[arg], fp_t, fp_w, fp_f)
                        kind = _ADMIT
                running = True
                continue
        elif te > loop_free:  # the job in progress ends first
            if kind == _ADMIT:
                t_enq[arg] = loop_free
                buf[qt] = arg
                qt += 1
            elif kind == _RETURN:  # the batch is back: its instance is free, its responses wait
                b_end[arg] = loop_free
                j = b_inst[arg]
                busy[j] = False
                free_at[j] = loop_free
                seq[j] = seqc
                seqc += 1
                resp[rt] = arg
                rt += 1
            if kind != _RESPOND and kind != _NONE:
                qh, fpos, nb = _dispatch(
                    loop_free, buf, qh, qt, t_enq, t_disp, max_b, delay, preferred, free_at, busy, seq, ends, bid,
                    factors, fpos, means, ip_t, ip_w, ip_f, b_pos, b_size, b_start, b_done, b_inst, nb,
                )  # fmt: skip
            running = False
            continue
        # an instance has computed its batch: the loop takes it back when it gets to it
        ends[ie] = inf
        back[bt] = bid[ie]
        bt += 1
    return nb


_kernel = njit(cache=True, nogil=True)(_kernel_py) if njit is not None else _kernel_py

_NO_PATH = (np.zeros(0), np.zeros(0), np.zeros(0))


def _arrays(path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _NO_PATH if path is None else (path.t, path.w, path.f)


def serve_on_loop(
    t_ready: np.ndarray,
    cost_ms: np.ndarray,
    loop: EventLoop,
    batching: Batching,
    instances: int,
    service,
    front=None,
) -> tuple[np.ndarray, Served, BatchLog, np.ndarray]:
    """The requests ready for the loop at ``t_ready`` (ms, any order), each admitted in
    ``cost_ms`` of nominal loop work, batched and served by ``instances`` model instances
    whose batch times ``service`` (a :class:`~simulator.serving.workers.ServiceModel`
    feed) draws in dispatch order, and answered on the loop; ``front``: the loop's speed
    path. Returns, in the requests' order, when each was queued (admission done), the
    serving columns, the batch log and when each response was written (NaN if refused)."""
    n = len(t_ready)
    order = np.argsort(t_ready, kind="stable")
    t = np.ascontiguousarray(t_ready[order], dtype=float)
    cost = np.ascontiguousarray(np.broadcast_to(cost_ms, (n,))[order], dtype=float)
    factors = np.zeros(0)
    while len(factors) < n + 1:  # at most one batch per request
        factors = np.concatenate([factors, service.block()])
    means = service.means if service.means is not None else np.zeros(0)
    t_enq, t_disp, t_resp, t_drop = (np.full(n, np.nan) for _ in range(4))
    outcome = np.zeros(n, dtype=np.int8)
    buf = np.zeros(n, dtype=np.int64)
    b_pos, b_size, b_inst = (np.zeros(n, dtype=np.int64) for _ in range(3))
    b_start, b_end = np.zeros(n), np.zeros(n)
    cap = -1 if batching.max_queue_size is None else int(batching.max_queue_size)
    preferred = np.asarray(sorted(set(batching.preferred_batch_sizes)), dtype=np.int64)
    b_done = np.zeros(n)
    nb = _kernel(
        t, cost, float(loop.return_ms), float(loop.respond_per_batch_ms), float(loop.respond_per_request_ms),
        int(batching.max_batch_size), float(batching.max_queue_delay_ms), cap, preferred, int(instances),
        factors, means,
        *_arrays(service.path), *_arrays(front),
        t_enq, t_disp, t_resp, outcome, t_drop, buf, b_pos, b_size, b_start, b_end, b_inst, b_done,
    )  # fmt: skip
    sizes = b_size[:nb]
    log = BatchLog(b_start[:nb].copy(), b_end[:nb].copy(), sizes.copy(), b_inst[:nb].copy())
    members = buf[: int(sizes.sum())]
    served = Served.empty(n)._replace(outcome=outcome, t_dropped=t_drop, t_dispatch=t_disp)
    served.t_done[members] = np.repeat(log.end, sizes)
    served.batch_size[members] = np.repeat(sizes, sizes)
    served.instance[members] = np.repeat(log.instance, sizes)
    back = np.empty(n, dtype=np.int64)
    back[order] = np.arange(n)
    return t_enq[back], served.take(back), log, t_resp[back]
