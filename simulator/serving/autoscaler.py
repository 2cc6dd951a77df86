"""Autoscaling policies: Kubernetes HPA and Knative's KPA, as small pure state machines.

A policy (:class:`Policy`) sees one :class:`Observation` per evaluation (the replicas it
counts, those ready, and the scraped metric: averaged per ready worker, or the fleet total
for Knative) and answers with a desired replica count. The pool
(:mod:`simulator.serving.pool`) makes the observations, with a scrape delay, and carries the
decisions out through cold starts and drains. Keeping the policies free of simulation
lets the tests feed them a metric trace and check the replica sequence exactly.

HPA (``autoscaling/v2``): desired = ceil(current × metric / target), no change within
``tolerance``; scale-down takes the highest recommendation of the last
``scale_down_stabilization_s``; scale-up is limited per ``scale_up_period_s`` to the
larger of +``scale_up_percent``% and +``scale_up_pods`` (``selectPolicy: Max``).

KPA (Knative): desired = ceil(average concurrency / target) over a ``stable_window_s``;
a ``panic_window_s`` average that asks for ``panic_threshold`` × the ready pods enters
panic mode, in which the fleet never shrinks, until a stable window passes calmly. It
scales to zero (with ``min_replicas: 0``) only once a whole stable window has been
observed without traffic.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from simulator.scenario.autoscaling import Autoscaler


@dataclass(frozen=True)
class Observation:
    """What the autoscaler reads at one evaluation."""

    current: int  # replicas it counts: ready and starting
    ready: int  # replicas serving
    metric: float  # the scraped metric: per ready worker (HPA), or the fleet's total concurrency (Knative)


class Policy(Protocol):
    """An autoscaling policy: a desired replica count per evaluation."""

    def desired(self, t: float, obs: Observation) -> int:
        """Replicas wanted at time ``t`` (s)."""
        ...


class HPA:
    """Kubernetes Horizontal Pod Autoscaler decisions."""

    def __init__(self, cfg: Autoscaler, initial: int | None = None):
        self.cfg = cfg
        # the fleet ran at ``initial`` replicas before the run: that counts as a recommendation,
        # so the first scale-down waits out the stabilization window
        self.recommendations: deque[tuple[float, int]] = deque([(0.0, initial)] if initial is not None else [])
        self.scale_ups: deque[tuple[float, int]] = deque()  # (time, replicas before) for rate limits

    def desired(self, t: float, obs: Observation) -> int:
        """Replicas wanted at time ``t`` (s) with ``obs.current`` replicas and a per-worker metric."""
        cfg, current, metric = self.cfg, obs.current, obs.metric
        ratio = metric / cfg.target
        proposal = current if abs(ratio - 1.0) <= cfg.tolerance else math.ceil(current * ratio - 1e-9)
        if current == 0:  # scale from zero on any load
            proposal = 1 if metric > 0 else 0
        self.recommendations.append((t, proposal))
        while self.recommendations and self.recommendations[0][0] <= t - cfg.scale_down_stabilization_s:
            self.recommendations.popleft()
        down = max(r for _, r in self.recommendations)
        wanted = min(max(current, proposal), down)  # up: the proposal; down: the window's highest
        if wanted > current:
            while self.scale_ups and self.scale_ups[0][0] <= t - cfg.scale_up_period_s:
                self.scale_ups.popleft()
            base = self.scale_ups[0][1] if self.scale_ups else current
            limit = max(math.ceil(base * (1 + cfg.scale_up_percent / 100)), base + cfg.scale_up_pods)
            wanted = min(wanted, limit)
        wanted = min(max(wanted, cfg.min_replicas), cfg.max_replicas)
        if wanted > current:
            self.scale_ups.append((t, current))
        return wanted


class KPA:
    """Knative Pod Autoscaler decisions on total concurrency."""

    def __init__(self, cfg: Autoscaler):
        self.cfg = cfg
        self.samples: deque[tuple[float, float]] = deque()
        self.panic_since: float | None = None
        self.since: float | None = None  # first observation

    def desired(self, t: float, obs: Observation) -> int:
        """Replicas wanted at ``t`` (s) given the fleet's total in-flight concurrency (``obs.metric``)."""
        cfg, current, ready, concurrency = self.cfg, obs.current, obs.ready, obs.metric
        if self.since is None:
            self.since = t
        self.samples.append((t, concurrency))
        while self.samples[0][0] <= t - cfg.stable_window_s:
            self.samples.popleft()
        stable = [c for _, c in self.samples]
        panic = [c for s, c in self.samples if s > t - cfg.panic_window_s]
        want_stable = math.ceil(sum(stable) / len(stable) / cfg.target - 1e-9)
        want_panic = math.ceil(sum(panic) / len(panic) / cfg.target - 1e-9)
        if want_panic >= cfg.panic_threshold * max(ready, 1):
            if self.panic_since is None:
                self.panic_since = t
        elif self.panic_since is not None and t - self.panic_since >= cfg.stable_window_s:
            self.panic_since = None
        # never scale down while panicking
        wanted = max(want_panic, current) if self.panic_since is not None else want_stable
        if wanted == 0 and t - self.since < cfg.stable_window_s:
            wanted = min(current, 1)  # to zero only after a whole stable window without traffic
        return min(max(wanted, cfg.min_replicas), cfg.max_replicas)
