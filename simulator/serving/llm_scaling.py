"""The autoscaler of a pool of LLM replicas (``batching.kind: continuous`` with
``workers.autoscaler``, or each pool of a disaggregated fleet on its own): what it reads
off the replicas, the replicas it asks for and their cold starts, the ones it drains.

The fleet (:class:`simulator.serving.continuous.Replicas`) evaluates each pool's every
``sync_period_s`` and routes only to the replicas it says are serving; the pools share one
fleet log and the warm nodes.
"""

from __future__ import annotations

import math

import numpy as np

from simulator.scenario.distributions import Sampler
from simulator.serving.autoscaler import HPA, KPA, Observation
from simulator.serving.lives import FleetEvent, FleetLog, Worker
from simulator.serving.llm_replica import Replica


def _metric(r: Replica, metric: str) -> float:
    """What the autoscaler reads off one serving replica: its requests waiting
    (``queue_depth``), those and its running sequences (``in_flight``), or the share of its
    KV blocks in use (``utilization``); ``ttft_ms`` reads the pool's first tokens
    (:func:`recent_ttft`)."""
    if metric == "utilization":
        return r.kv.usage
    waiting = len(r.pending) + len(r.waiting)
    return waiting if metric == "queue_depth" else waiting + len(r.running)


def recent_ttft(replicas: list[Replica], t: float, window_ms: float) -> np.ndarray:
    """The times to first token (ms, from the request's arrival at its replica) of the first
    tokens ``replicas`` made in (t - window, t]; older ones are forgotten."""
    out = []
    for r in replicas:
        firsts = r.firsts
        while firsts and firsts[0][0] <= t - window_ms:
            firsts.popleft()
        out.extend(ms for at, ms in firsts if at <= t)
    return np.asarray(out)


class WarmNodes:
    """The nodes kept warm for new replicas (``workers.cold_start.warm_pool``), shared by
    every pool of the fleet: a new replica on one skips provisioning and the image pull, and
    a replica that leaves gives its node back."""

    def __init__(self, n: int):
        self.free = self.cap = n

    def take(self) -> bool:
        if self.free > 0:
            self.free -= 1
            return True
        return False

    def give(self) -> None:
        self.free = min(self.free + 1, self.cap)


class Scaling:
    """One pool's autoscaler (``workers.autoscaler``, or a disaggregated fleet's
    ``prefill_autoscaler`` and ``decode_autoscaler``), evaluated every ``sync_period_s`` on
    the state of the pool's replicas (``ids``, global replica ids in the fleet's ``log``):
    ``in_flight`` (requests running or waiting per serving replica), ``queue_depth``
    (waiting) or ``utilization`` (the share of KV blocks in use), or the pool's total in
    flight for Knative. A new replica (of type ``gpu``: ``workers.instance_type``, in a
    mixed fleet too) serves after its cold start (``workers.cold_start``, drawn from
    ``cold`` in the order the pool asks for replicas; a warm node skips provisioning and
    the image pull); scale-down cancels replicas still starting, newest first, then drains
    the newest serving ones: they take no new request and leave once their sequences are
    done."""

    def __init__(
        self,
        autoscaler,
        cold_start,
        cold: np.random.Generator,
        log: FleetLog,
        ids: list[int],
        nodes: WarmNodes,
        pool: str = "",
        gpu: str = "",
    ):
        a = autoscaler
        self.cfg, self.period_ms = a, a.sync_period_s * 1000.0
        self.policy = HPA(a, initial=len(ids)) if a.policy == "hpa" else KPA(a)
        self.next_ms = self.period_ms
        self.log, self.ids, self.nodes, self.pool = log, ids, nodes, pool  # ids: the pool's list, grown here
        self.gpu = gpu  # the GPU type of the replicas it adds
        cs = cold_start
        self.cold = [Sampler(d, cold) if d else None for d in (cs.provision, cs.image_pull)]
        self.load = [Sampler(d, cold) if d else None for d in (cs.model_load, cs.warmup)]
        self.ttft_window = a.metric_window_s * 1000.0 if a.metric == "ttft_ms" else 0.0

    def watch(self, replica: Replica) -> None:
        """A replica of the pool keeps what the metric reads (its recent first tokens)."""
        replica.ttft_window = self.ttft_window

    def workers(self) -> list[Worker]:
        return [self.log.workers[k] for k in self.ids]

    def serving(self, t: float) -> list[int]:
        """The pool's replicas serving at ``t`` (its oldest if none: a pool never goes empty)."""
        ws = self.workers()
        ks = [w.wid for w in ws if w.ready_at <= t < w.drain_at]
        return ks or [min(w.wid for w in ws if w.drain_at == math.inf)]

    def _why(self, value: float) -> str:
        """What the decision read, for the event: a latency metric's value (the others are
        the replicas' own state, read off the timeline)."""
        return f" ({self.cfg.metric} {value:,.0f})" if self.cfg.metric == "ttft_ms" else ""

    def evaluate(self, t: float, replicas) -> list[int]:
        """One evaluation at ``t``; returns the ids of the replicas it asked for."""
        log = self.log
        counted = [w for w in self.workers() if w.drain_at == math.inf]
        ready = [w for w in counted if w.ready_at <= t]
        if self.cfg.metric == "ttft_ms":  # the p99 over the pool's first tokens (0: none in the window)
            ttft = recent_ttft([replicas[w.wid] for w in ready], t, self.ttft_window)
            value = float(np.percentile(ttft, 99)) if len(ttft) else 0.0
        else:
            per = [_metric(replicas[w.wid], self.cfg.metric) for w in ready]
            total = self.cfg.policy == "knative"  # Knative scales on the pool's total concurrency
            value = float(sum(per)) if total or not per else float(np.mean(per))
        want = self.policy.desired(t / 1000.0, Observation(len(counted), len(ready), value))
        name = f"{self.pool} " if self.pool else ""
        new = []
        if want > len(counted):
            for _ in range(want - len(counted)):
                warm = self.nodes.take()
                stages = self.load + ([] if warm else self.cold)
                ready_at = t + sum(float(smp.draw(1)[0]) for smp in stages if smp is not None)
                new.append(len(log.workers))
                log.workers.append(Worker(len(log.workers), t, ready_at, None, pool=self.pool, gpu=self.gpu))
            self.ids += new
            log.events.append((t, FleetEvent.SCALE_UP, f"{name}{len(counted)} -> {want}{self._why(value)}"))
        elif want < len(counted):
            starting = sorted((w for w in counted if w.ready_at > t), key=lambda w: -w.wid)
            serving = sorted((w for w in counted if w.ready_at <= t), key=lambda w: -w.wid)
            for w in (starting + serving)[: len(counted) - want]:
                w.drain_at = t
                if w.ready_at > t:  # cancelled before it served
                    w.gone_at = t
                    self.nodes.give()
            log.events.append((t, FleetEvent.SCALE_DOWN, f"{name}{len(counted)} -> {want}{self._why(value)}"))
        self.next_ms += self.period_ms
        return new


def settle(log: FleetLog, ids, replicas, nodes: WarmNodes, *, final: bool) -> None:
    """Replicas ``ids`` of the fleet that leave: a draining one with nothing left when its
    last sequence ended; at the end of the run (``final``) every one when its work is done.
    A drained replica's node goes back to the warm pool."""
    for k in ids:
        w = log.workers[k]
        if w.gone_at != math.inf or k >= len(replicas):
            continue
        r = replicas[k]
        if (w.drain_at != math.inf or final) and not r.busy:
            w.gone_at = max(r.t, w.drain_at if w.drain_at != math.inf else r.t, w.ready_at)
            if w.drain_at != math.inf:
                nodes.give()


__all__ = ["Scaling", "WarmNodes", "settle"]
