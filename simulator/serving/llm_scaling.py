"""The autoscaler of a pool of LLM replicas (``batching.kind: continuous`` with
``workers.autoscaler``): what it reads off the replicas, the replicas it asks for and
their cold starts, the ones it drains.

The pool itself (:class:`simulator.serving.continuous.Replicas`) evaluates it every
``sync_period_s`` and routes only to the replicas it says are serving.
"""

from __future__ import annotations

import math

import numpy as np

from simulator.rng import child
from simulator.scenario.distributions import Sampler
from simulator.serving.autoscaler import HPA, KPA, Observation
from simulator.serving.lives import FleetEvent, FleetLog, Worker
from simulator.serving.llm_replica import Replica


def _metric(r: Replica, metric: str) -> float:
    """What the autoscaler reads off one serving replica: its requests waiting
    (``queue_depth``), those and its running sequences (``in_flight``), or the share of its
    KV blocks in use (``utilization``)."""
    if metric == "utilization":
        return r.kv.usage
    waiting = len(r.pending) + len(r.waiting)
    return waiting if metric == "queue_depth" else waiting + len(r.running)


class Scaling:
    """An LLM pool's autoscaler (``workers.autoscaler``), evaluated every ``sync_period_s``
    on the replicas' state: ``in_flight`` (requests running or waiting per serving replica),
    ``queue_depth`` (waiting) or ``utilization`` (the share of KV blocks in use), or the
    fleet's total in flight for Knative. A new replica serves after its cold start
    (``workers.cold_start``, drawn in the order replicas are asked for; a warm-pool node
    skips provisioning and the image pull); scale-down cancels replicas still starting,
    newest first, then drains the newest serving ones: they take no new request and leave
    once their sequences are done."""

    def __init__(self, workers, rng: np.random.Generator, count: int):
        a = workers.autoscaler
        self.cfg, self.period_ms = a, a.sync_period_s * 1000.0
        self.policy = HPA(a, initial=count) if a.policy == "hpa" else KPA(a)
        self.next_ms = self.period_ms
        self.log = FleetLog([Worker(k, 0.0, 0.0, None) for k in range(count)])
        self.route = child(rng, 1 << 20)  # random routing among the serving replicas
        cold = child(rng, (1 << 20) + 1)
        cs = workers.cold_start
        self.warm_free = self.warm_cap = cs.warm_pool
        self.cold = [Sampler(d, cold) if d else None for d in (cs.provision, cs.image_pull)]
        self.load = [Sampler(d, cold) if d else None for d in (cs.model_load, cs.warmup)]

    def serving(self, t: float) -> list[int]:
        """The replicas serving at ``t`` (the oldest if none: a pool never goes empty)."""
        ks = [w.wid for w in self.log.workers if w.ready_at <= t < w.drain_at]
        return ks or [min(w.wid for w in self.log.workers if w.drain_at == math.inf)]

    def evaluate(self, t: float, replicas) -> None:
        workers = self.log.workers
        counted = [w for w in workers if w.drain_at == math.inf]
        ready = [w for w in counted if w.ready_at <= t]
        per = [_metric(replicas[w.wid], self.cfg.metric) for w in ready]
        total = self.cfg.policy == "knative"  # Knative scales on the fleet's total concurrency
        value = float(sum(per)) if total or not per else float(np.mean(per))
        want = self.policy.desired(t / 1000.0, Observation(len(counted), len(ready), value))
        if want > len(counted):
            for _ in range(want - len(counted)):
                warm = self.warm_free > 0
                stages = self.load + ([] if warm else self.cold)
                ready_at = t + sum(float(smp.draw(1)[0]) for smp in stages if smp is not None)
                if warm:
                    self.warm_free -= 1
                workers.append(Worker(len(workers), t, ready_at, None))
            self.log.events.append((t, FleetEvent.SCALE_UP, f"{len(counted)} -> {want}"))
        elif want < len(counted):
            starting = sorted((w for w in counted if w.ready_at > t), key=lambda w: -w.wid)
            serving = sorted((w for w in counted if w.ready_at <= t), key=lambda w: -w.wid)
            for w in (starting + serving)[: len(counted) - want]:
                w.drain_at = t
                if w.ready_at > t:  # cancelled before it served
                    w.gone_at = t
                    self._free_node()
            self.log.events.append((t, FleetEvent.SCALE_DOWN, f"{len(counted)} -> {want}"))
        self.next_ms += self.period_ms
        self.settle_drained(replicas, final=False)

    def _free_node(self) -> None:
        """A removed replica's node goes back to the warm pool."""
        self.warm_free = min(self.warm_free + 1, self.warm_cap)

    def settle_drained(self, replicas, *, final: bool) -> None:
        """Draining replicas with nothing left leave when their last sequence ended; at the
        end of the run every replica leaves when its work is done."""
        for w in self.log.workers:
            if w.gone_at != math.inf or w.wid >= len(replicas):
                continue
            r = replicas[w.wid]
            if (w.drain_at != math.inf or final) and not r.busy:
                w.gone_at = max(r.t, w.drain_at if w.drain_at != math.inf else r.t, w.ready_at)
                if w.drain_at != math.inf:
                    self._free_node()


__all__ = ["Scaling"]
