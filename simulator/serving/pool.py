"""The dynamic fleet: workers that start cold, serve, drain and crash, under an autoscaler.

One control process owns the fleet. It wakes at every *epoch* — an autoscaler tick, a
metric scrape, a worker becoming ready, a crash — applies what happens there, then
routes every request that reaches the batching stage before the next epoch to the
workers serving now (vectorised: one draw per chunk, not per request). Worker
schedulers (:func:`simulator.serving.workers.schedule`) know every arrival up to that next epoch
and wait for the control process when a batching decision needs more. So the data plane
stays events-per-batch, and routing is exact: the set of serving workers only changes at
epochs.

Semantics worth knowing:

* a new worker is billed from the moment it is requested; it serves once provisioning,
  image pull, model load and warm-up are over (the first two skipped on a warm-pool node);
* scale-down drains: the worker gets no new requests, finishes its queue and its
  batches, then leaves (not-yet-ready workers are cancelled first);
* a crash loses the worker's queued and in-flight requests; a replacement serves
  ``mttr_s`` later;
* with no worker serving, the router has no backend and rejects (HTTP 503); with
  ``router.activator`` the requests wait in the activator's buffer instead and go to the
  workers when one serves again (their batch-queue wait then includes the buffer), or
  get an error after the activator's timeout;
* after the last arrival the control process goes on while requests are buffered or
  queued or in service, so crashes and scaling then still happen.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import simpy

from simulator.rng import Streams
from simulator.scenario.config import Scenario
from simulator.scenario.distributions import Sampler
from simulator.serving.autoscaler import HPA, KPA, Observation, Policy
from simulator.serving.batcher import BatchQueue, Outcome
from simulator.serving.served import BatchLog, Served, concat_logs
from simulator.serving.workers import Feed, ServiceModel, schedule

INF = math.inf


class Transition(StrEnum):
    """What happens to a worker at a scheduled time (the fleet's own event queue)."""

    READY = "ready"  # its cold start is over: it serves from now
    CRASH = "crash"  # a random failure (mean time between failures)
    SCHEDULED_CRASH = "scheduled_crash"  # a failure the scenario names (workers.failures.crashes)


class FleetEvent(StrEnum):
    """What the fleet log records, for reports and the timeline."""

    READY = "ready"
    CRASH = "crash"
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"


class WorkerState(StrEnum):
    """The spans of a worker's life that :meth:`FleetLog.intervals` measures."""

    WARMING = "warming"  # requested, not yet serving (cold start)
    ACTIVE = "active"  # serving
    DRAINING = "draining"  # taking no new requests, finishing its queue
    BILLED = "billed"  # from request to gone: what the fleet pays for


@dataclass
class Worker:
    """One GPU worker's life, in ms."""

    wid: int
    requested_at: float
    ready_at: float
    feed: Feed
    drain_at: float = INF
    gone_at: float = INF
    crashed_at: float = INF

    def serving(self, t: float) -> bool:
        return self.ready_at <= t < min(self.drain_at, self.crashed_at, self.gone_at)


@dataclass
class FleetLog:
    """What the fleet did: each worker's life and the control-plane events."""

    workers: list[Worker]
    events: list[tuple[float, FleetEvent, str]] = field(default_factory=list)

    def intervals(self, state: WorkerState | str) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) ms of every worker's stay in ``state``: warming, active, draining, billed."""
        w = self.workers
        req = np.array([x.requested_at for x in w])
        ready = np.array([x.ready_at for x in w])
        drain = np.array([x.drain_at for x in w])
        gone = np.array([min(x.gone_at, x.crashed_at) for x in w])
        match WorkerState(state):
            case WorkerState.WARMING:
                return req, np.minimum(ready, gone)
            case WorkerState.ACTIVE:
                return ready, np.minimum(drain, gone)
            case WorkerState.DRAINING:
                return np.minimum(drain, gone), gone
            case WorkerState.BILLED:
                return req, gone
        raise ValueError(state)


class DynamicPool:
    """Workers, router and autoscaler in one SimPy environment."""

    def __init__(
        self,
        s: Scenario,
        t_pre: np.ndarray,
        service: ServiceModel,
        rng: Streams,
        deadlines: np.ndarray | None = None,
    ):
        self.s = s
        self.env = simpy.Environment()
        self.service = service
        self.rng_route = rng.routing
        self.rng_fleet = rng.fleet
        self.order = np.argsort(t_pre, kind="stable")
        self.q = t_pre[self.order]
        self.dl = None if deadlines is None else deadlines[self.order]
        self.pos = 0  # next request (in queue-arrival order) to route
        self.routed: dict[int, list[np.ndarray]] = {}  # worker id -> positions in self.q, in order
        self.workers: list[Worker] = []
        self.log = FleetLog(self.workers)
        self.transitions: list[tuple[float, int, str, int]] = []  # heap of (time, seq, kind, worker)
        self.seq = 0
        self.rr = 0
        self.warm_free = s.workers.cold_start.warm_pool
        self.end_ms = float(self.q[-1]) if len(self.q) else 0.0
        a = s.workers.autoscaler
        self.policy: Policy | None = (HPA(a, initial=s.workers.count) if a.policy == "hpa" else KPA(a)) if a else None
        self.observations: list[float] = []
        self.rejected: list[np.ndarray] = []  # no backend, no activator: 503 at once
        self.held: deque[int] = deque()  # in the activator's buffer (positions in self.q), oldest first
        self.expired: list[int] = []  # buffered past the activator's timeout, or over its capacity
        cs = s.workers.cold_start
        self.cold = [Sampler(d, self.rng_fleet) if d else None for d in (cs.provision, cs.image_pull)]
        self.load = [Sampler(d, self.rng_fleet) if d else None for d in (cs.model_load, cs.warmup)]

    # --- the fleet -------------------------------------------------------------
    def _push(self, t: float, kind: Transition, arg: int) -> None:
        self.seq += 1
        heapq.heappush(self.transitions, (t, self.seq, kind, arg))

    def _start_worker(self, t: float, *, ready_at: float | None = None) -> Worker:
        wid = len(self.workers)
        warm = ready_at is None and self.warm_free > 0
        if ready_at is None:
            stages = self.load + ([] if warm else self.cold)
            ready_at = t + sum(float(smp.draw(1)[0]) for smp in stages if smp is not None)
        if warm:
            self.warm_free -= 1
        per = self.s.workers.instances
        queue = BatchQueue(np.zeros(0), self.s.batching, closed=False)
        feed = Feed(self.env, queue, list(range(wid * per, (wid + 1) * per)), start_at=ready_at)
        w = Worker(wid, t, ready_at, feed)
        self.workers.append(w)
        self._push(ready_at, Transition.READY, wid)
        return w

    def _crash_time(self, w: Worker) -> None:
        f = self.s.workers.failures
        if f is not None and f.mtbf_s is not None:
            self._push(w.ready_at + self.rng_fleet.exponential(f.mtbf_s * 1000.0), Transition.CRASH, w.wid)

    def _apply(self, t: float) -> None:
        """Carry out every transition due by ``t``: readiness, random and scheduled crashes."""
        while self.transitions and self.transitions[0][0] <= t:
            at, _, kind, arg = heapq.heappop(self.transitions)
            if kind is Transition.SCHEDULED_CRASH:
                serving = [w for w in self.workers if w.serving(at)]
                if arg < len(serving):
                    self._crash(serving[arg], at)
                continue
            w = self.workers[arg]
            if kind is Transition.READY and w.gone_at == INF and w.drain_at == INF:
                self.env.process(schedule(self.env, w.feed, self.service))
                self._crash_time(w)
                self.log.events.append((at, FleetEvent.READY, f"worker {arg}"))
            elif kind is Transition.CRASH and w.serving(at):
                self._crash(w, at)

    def _crash(self, w: Worker, at: float) -> None:
        w.crashed_at = w.feed.crashed_at = at
        w.feed.close(at)
        if w.feed.waiting is not None:
            w.feed.waiting.succeed()
            w.feed.waiting = None
        mttr = self.s.workers.failures.mttr_s * 1000.0
        self._start_worker(at, ready_at=at + mttr)
        self.log.events.append(
            (at, FleetEvent.CRASH, f"worker {w.wid}; replacement serves at {(at + mttr) / 1000:g} s")
        )

    def _counting(self, t: float) -> list[Worker]:
        """Workers the autoscaler counts as replicas: serving or starting, not draining."""
        return [w for w in self.workers if w.drain_at == INF and w.gone_at == INF and w.crashed_at == INF]

    def _scale(self, t: float, desired: int) -> None:
        current = self._counting(t)
        n = len(current)
        if desired > n:
            for _ in range(desired - n):
                self._start_worker(t)
            self.log.events.append((t, FleetEvent.SCALE_UP, f"{n} -> {desired}"))
        elif desired < n:
            # cancel workers still starting (newest first), then drain the newest serving ones
            victims = sorted(current, key=lambda w: (w.ready_at <= t, -w.wid))[: n - desired]
            for w in victims:
                if w.ready_at > t:
                    w.gone_at = t
                else:
                    w.drain_at = t
                    w.feed.close(t)
                pool = self.s.workers.cold_start.warm_pool
                self.warm_free = min(self.warm_free + 1, pool)  # the node goes back to the warm pool
            self.log.events.append((t, FleetEvent.SCALE_DOWN, f"{n} -> {desired}"))

    # --- metrics -----------------------------------------------------------------
    def _observe(self, t: float) -> float:
        a = self.s.workers.autoscaler
        serving = [w for w in self.workers if w.serving(t)]
        if a.metric == "p99_ms":
            lat = [self._recent_latency(w.feed, t, a.metric_window_s * 1000.0) for w in serving]
            lat = np.concatenate(lat) if lat else np.zeros(0)
            return float(np.percentile(lat, 99)) if len(lat) else 0.0
        total = 0.0
        for w in serving:
            w.feed.queue.advance(t)
            queued = len(w.feed.queue)
            match a.metric:
                case "in_flight":
                    total += queued + w.feed.busy
                case "queue_depth":
                    total += queued
                case "utilization":
                    total += 1 - len(w.feed.free) / w.feed.n_instances
        if self.held and a.metric in ("in_flight", "queue_depth"):  # the activator reports its buffer
            h = self.q[np.fromiter(self.held, dtype=np.int64, count=len(self.held))]
            total += np.count_nonzero((h <= t) & (h + self.s.router.activator.timeout_ms > t))
        if a.policy == "knative":
            return total
        return total / len(serving) if serving else 0.0

    @staticmethod
    def _recent_latency(feed: Feed, t: float, window: float) -> np.ndarray:
        """Queue + service time of requests whose batch ended in (t - window, t]."""
        q = feed.queue
        out = []
        for k in range(len(feed.b_end) - 1, -1, -1):
            end = feed.b_end[k]
            if end <= t - window:
                break
            if end <= t:
                pos0, size = q.batch_pos[k], q.batch_size[k]
                req = range(pos0, pos0 + size) if q.buf is None else q.buf[pos0 : pos0 + size]
                out.extend(end - q.q[i] for i in req)
        return np.asarray(out)

    # --- the activator ---------------------------------------------------------------
    def _expire_held(self, t: float) -> None:
        """Buffered requests whose activator timeout passed by ``t`` get an error."""
        timeout = self.s.router.activator.timeout_ms
        while self.held and self.q[self.held[0]] + timeout <= t:
            self.expired.append(self.held.popleft())

    def _hold(self, chunk: np.ndarray) -> None:
        """No worker serves: the activator buffers the chunk (up to its capacity), or 503s."""
        act = self.s.router.activator
        if act is None:
            self.rejected.append(chunk)
            return
        if act.capacity is None:
            self.held.extend(chunk.tolist())
            return
        for p in chunk.tolist():  # rare path (an empty fleet): one arrival at a time
            self._expire_held(self.q[p])
            if len(self.held) < act.capacity:
                self.held.append(p)
            else:
                self.rejected.append(np.array([p]))

    # --- routing -------------------------------------------------------------------
    def _route(self, t: float, horizon: float) -> None:
        stop = int(np.searchsorted(self.q, horizon, side="left"))
        serving = [w for w in self.workers if w.serving(t)]
        chunk = np.arange(self.pos, stop)
        self.pos = stop
        if len(chunk) and not serving:
            self._hold(chunk)
            chunk = chunk[:0]
        times = self.q[chunk]
        if serving and self.held:  # a worker serves again: the buffer drains into the queues now
            self._expire_held(t)
            released = np.fromiter(self.held, dtype=np.int64, count=len(self.held))
            self.held.clear()
            chunk = np.concatenate([released, chunk])
            times = np.concatenate([np.full(len(released), t), times])
        if serving and len(chunk):
            k = len(serving)
            if self.s.router.balancing == "round_robin":
                pick = (self.rr + np.arange(len(chunk))) % k
                self.rr = (self.rr + len(chunk)) % k
            else:
                pick = self.rng_route.integers(0, k, len(chunk))
            by = np.argsort(pick, kind="stable")
            cuts = np.searchsorted(pick[by], np.arange(1, k))
            for w, idx in zip(serving, np.split(by, cuts), strict=True):
                part = chunk[idx]
                if len(part):
                    self.routed.setdefault(w.wid, []).append(part)
                w.feed.extend(times[idx], horizon, t, None if self.dl is None else self.dl[part])
        else:
            for w in serving:
                w.feed.extend(self.q[chunk[:0]], horizon, t, None if self.dl is None else self.dl[chunk[:0]])

    # --- the control loop ------------------------------------------------------------
    def control(self):
        s = self.s
        a = s.workers.autoscaler
        period = a.sync_period_s * 1000.0 if a else INF
        delay = a.scrape_delay_s * 1000.0 if a else 0.0
        for _ in range(s.workers.count):
            self._start_worker(0.0, ready_at=0.0)
        for c in s.workers.failures.crashes if s.workers.failures else ():
            self._push(c.at_s * 1000.0, Transition.SCHEDULED_CRASH, c.worker)
        next_tick, next_scrape = period, period - delay
        t = 0.0
        while True:
            self._apply(t)
            while t >= next_scrape:
                self.observations.append(self._observe(t))
                next_scrape += period
            while t >= next_tick:
                self._tick(t, self.observations.pop(0))
                next_tick += period
            upcoming = self.transitions[0][0] if self.transitions else INF
            nxt = min(next_tick, next_scrape, upcoming)
            self._route(t, nxt)
            if self.pos >= len(self.q) and (not self.held or nxt == INF):
                # every arrival routed (or buffered with no worker ever to come): no more
                # arrivals for any queue; the fleet goes on while work is left
                if self.held:
                    self._expire_held(INF)
                for w in self.workers:
                    if not w.feed.queue.closed:
                        w.feed.close(t)
                if nxt == INF or not self._working(t):
                    return
            yield self.env.timeout(max(0.0, nxt - self.env.now))
            t = nxt

    def _working(self, t: float) -> bool:
        """Whether any live worker still has requests queued or in service at ``t``."""
        for w in self.workers:
            if w.crashed_at <= t or w.gone_at <= t:
                continue
            q = w.feed.queue
            q.advance(t)
            if w.feed.busy or len(q) or q.scan < q.m:
                return True
        return False

    def _tick(self, t: float, metric: float) -> None:
        ready = sum(1 for w in self.workers if w.serving(t))
        obs = Observation(current=len(self._counting(t)), ready=ready, metric=metric)
        self._scale(t, self.policy.desired(t / 1000.0, obs))

    def run(self) -> tuple[Served, BatchLog, FleetLog]:
        """Simulate; the requests in request order, the batch log and the fleet log."""
        self.env.process(self.control())
        self.env.run()
        n = len(self.q)
        by_arrival = Served.empty(n)  # in the order the pool saw them
        logs = []
        for w in self.workers:
            part, log = w.feed.results()
            logs.append(log)
            if w.wid in self.routed:
                by_arrival.scatter(np.concatenate(self.routed[w.wid]), part)
            last = float(log.end.max()) if len(log.end) else 0.0
            if w.drain_at < INF:
                w.gone_at = max(w.drain_at, last)
            elif w.gone_at == INF and w.crashed_at == INF:
                w.gone_at = max(self.end_ms, last, w.requested_at)  # still up when the traffic ended
        for chunk in self.rejected:
            by_arrival.outcome[chunk] = Outcome.REJECTED
            by_arrival.t_dropped[chunk] = self.q[chunk]
        if self.expired:
            gone = np.asarray(self.expired, dtype=np.int64)
            by_arrival.outcome[gone] = Outcome.REJECTED
            by_arrival.t_dropped[gone] = self.q[gone] + self.s.router.activator.timeout_ms
        served = Served.empty(n)
        served.scatter(self.order, by_arrival)
        return served, concat_logs(logs), self.log
