"""The dynamic pool: a fleet that changes under an autoscaler, and the router in front of it.

One control process owns the pool. It wakes at every *epoch* — an autoscaler tick, a
metric scrape, a worker becoming ready, a crash — applies what happens there, then
routes every request that reaches the batching stage before the next epoch to the
workers serving now (vectorised: one draw per chunk, not per request). Worker
schedulers (:func:`simulator.serving.workers.schedule`) know every arrival up to that next epoch
and wait for the control process when a batching decision needs more. So the data plane
stays events-per-batch, and routing is exact: the set of serving workers only changes at
epochs.

The parts, each in its own module:

* :class:`~simulator.serving.fleet.Fleet`: workers' cold starts, drains and crashes;
* :class:`~simulator.serving.router.Router`: which serving worker gets each request;
* :class:`~simulator.serving.activator.Activator`: requests while no worker serves
  (rejected, or buffered by ``router.activator``);
* :func:`~simulator.serving.probe.scrape`: the autoscaler's metric, read with a scrape
  delay, and the policy of :mod:`simulator.serving.autoscaler` that turns it into a
  replica count.

After the last arrival the control process goes on while requests are buffered or
queued or in service, so crashes and scaling then still happen.
"""

from __future__ import annotations

import math

import numpy as np
import simpy

from simulator.ledger import Outcome, Served, concat_logs
from simulator.rng import Streams
from simulator.scenario.config import Batching, Workers
from simulator.scenario.config import Router as RouterConfig
from simulator.serving.activator import Activator
from simulator.serving.autoscaler import HPA, KPA, Observation, Policy
from simulator.serving.fleet import Fleet, Transition
from simulator.serving.lives import FleetEvent, FleetLog, Worker, WorkerState
from simulator.serving.probe import scrape
from simulator.serving.router import Router
from simulator.serving.served import PoolRun
from simulator.serving.workers import ServiceModel

INF = math.inf


class Shifted:
    """A growing array read by absolute position, whose front can be dropped: position p
    is ``values[p - base]``."""

    def __init__(self, values: np.ndarray):
        self.values = values
        self.base = 0

    def __len__(self) -> int:  # positions handed out so far: base + what is held
        return self.base + len(self.values)

    def __getitem__(self, p):
        return self.values[p - self.base]

    def append(self, more: np.ndarray) -> None:
        self.values = np.concatenate([self.values, more]) if len(self.values) else np.asarray(more)

    def searchsorted(self, t: float) -> int:
        return self.base + int(np.searchsorted(self.values, t, side="left"))

    def drop_before(self, p: int) -> None:
        """Forget positions before ``p``."""
        if p > self.base:
            self.values = self.values[p - self.base :]
            self.base = p


class DynamicPool:
    """Fleet, router, activator and autoscaler in one SimPy environment.

    ``workers``, ``batching`` and ``router`` are the scenario's sections; ``t_pre`` when
    each request reaches the batching stage.
    """

    def __init__(
        self,
        workers: Workers,
        batching: Batching,
        router: RouterConfig,
        t_pre: np.ndarray,
        service: ServiceModel,
        rng: Streams,
        deadlines: np.ndarray | None = None,
        *,
        final: bool = True,
    ):
        self.cfg = workers
        self.env = simpy.Environment()
        self.order = np.argsort(t_pre, kind="stable")
        self.q = Shifted(t_pre[self.order])  # queue-arrival times in order; positions count from the first
        self.dl = None if deadlines is None else Shifted(deadlines[self.order])
        self.ids = Shifted(self.order)  # the request behind each position
        self.final = final  # every arrival is in q
        self.known = INF if final else -INF  # every arrival before this is in q
        self.more: simpy.Event | None = None  # the control process waits here for arrivals
        self.pos = 0  # next request (in queue-arrival order) to route
        self.routed: dict[int, list[np.ndarray]] = {}  # worker id -> positions in self.q, in order
        self.fleet = Fleet(self.env, workers, batching, service, rng.fleet)
        self.router = Router(router.balancing, rng.routing)
        self.activator = Activator(router.activator, self.q)
        self.end_ms = float(self.q[len(self.q) - 1]) if len(self.q) else 0.0
        a = workers.autoscaler
        self.policy: Policy | None = (HPA(a, initial=workers.count) if a.policy == "hpa" else KPA(a)) if a else None
        self.observations: list[float] = []

    def push(self, t_pre: np.ndarray, ids: np.ndarray, deadlines: np.ndarray | None, known: float, final: bool):
        """More arrivals, sorted by ``t_pre`` (all at or after those pushed before), with their
        request ids: every arrival before ``known`` is now in (``final``: every arrival)."""
        self.q.append(t_pre)
        self.ids.append(ids)
        if self.dl is not None:
            self.dl.append(deadlines)
        self.known, self.final = (INF, True) if final else (known, False)
        if len(t_pre):
            self.end_ms = float(t_pre[-1])
        if self.more is not None:
            self.more.succeed()
            self.more = None

    @property
    def log(self) -> FleetLog:
        return self.fleet.log

    def _route(self, t: float, horizon: float, serving=None) -> None:
        """Send the requests that reach the batching stage in [t, horizon) to the workers
        serving at ``t`` (``serving``: the epoch's, when an epoch is routed in parts)."""
        horizon = min(horizon, self.known)
        stop = self.q.searchsorted(horizon)
        first = serving is None
        serving = self.fleet.serving(t) if first else serving
        chunk = np.arange(self.pos, stop)
        self.pos = stop
        if len(chunk) and not serving:
            self.activator.hold(chunk)
            chunk = chunk[:0]
        times = self.q[chunk]
        if first and serving and self.activator.buffering():  # a worker serves again: the buffer drains now
            released = self.activator.release(t)
            chunk = np.concatenate([released, chunk])
            times = np.concatenate([np.full(len(released), t), times])
        if serving and len(chunk):
            k = len(serving)
            pick = self.router.pick(len(chunk), k)
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

    def control(self):
        """The control process: epochs of transitions, scrapes and ticks, routing in between."""
        cfg, fleet = self.cfg, self.fleet
        a = cfg.autoscaler
        period = a.sync_period_s * 1000.0 if a else INF
        delay = a.scrape_delay_s * 1000.0 if a else 0.0
        for _ in range(cfg.count):
            fleet.start(0.0, ready_at=0.0)
        for c in cfg.failures.crashes if cfg.failures else ():
            fleet.push(c.at_s * 1000.0, Transition.SCHEDULED_CRASH, c.worker)
        next_tick, next_scrape = period, period - delay
        t = 0.0
        while True:
            fleet.apply(t)
            while t >= next_scrape:
                self.observations.append(scrape(a, fleet.serving(t), t, self.activator))
                next_scrape += period
            while t >= next_tick:
                self._tick(t, self.observations.pop(0))
                next_tick += period
            nxt = min(next_tick, next_scrape, fleet.next_transition())
            serving = fleet.serving(t)
            self._route(t, nxt)
            while self.known < nxt:  # streamed: the epoch's arrivals come in parts
                self.more = self.env.event()
                yield self.more
                self._route(self.env.now, nxt, serving)
            if self.final and self.pos >= len(self.q) and (not self.activator.buffering() or nxt == INF):
                # every arrival routed (or buffered with no worker ever to come): no more
                # arrivals for any queue; the fleet goes on while work is left
                if self.activator.buffering():
                    self.activator.expire(INF)
                fleet.close(t)
                if nxt == INF or not fleet.working(t):
                    return
            yield self.env.timeout(max(0.0, nxt - self.env.now))
            t = nxt

    def _tick(self, t: float, metric: float) -> None:
        obs = Observation(current=len(self.fleet.counting()), ready=len(self.fleet.serving(t)), metric=metric)
        self.fleet.scale(t, self.policy.desired(t / 1000.0, obs))

    def run(self) -> PoolRun:
        """Simulate; the requests in request order, the batch log and the fleet log."""
        self.env.process(self.control())
        self.env.run()
        n = len(self.q)
        self.order = self.ids[np.arange(n)]
        by_arrival = Served.empty(n)  # in the order the pool saw them
        logs = []
        for w in self.fleet.workers:
            run = w.feed.results()
            part, log = run.served, run.batches
            logs.append(log)
            if w.wid in self.routed:
                by_arrival.scatter(np.concatenate(self.routed[w.wid]), part)
            self.fleet.settle(w, float(log.end.max()) if len(log.end) else 0.0, self.end_ms)
        self.activator.mark(by_arrival.outcome, by_arrival.t_dropped, Outcome.REJECTED)
        served = Served.empty(n)
        served.scatter(self.order, by_arrival)
        return PoolRun(served, concat_logs(logs), self.fleet.log)


__all__ = ["DynamicPool", "FleetEvent", "FleetLog", "Transition", "Worker", "WorkerState"]
