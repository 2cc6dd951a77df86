"""A plain event-per-request SimPy model of the same serving system, for checking the fast engine.

Written independently of ``simulator.engine``: every request is a process that walks the
stages with ``yield env.timeout(...)``, the CPU pool is a ``simpy.Resource``, and the
batcher is a scheduler process that reacts to arrivals and timers. Slow, obvious, and
only used on small inputs.

It consumes random inputs the way the engine documents them (one stream per stage,
drawn in request order; service times in dispatch order), so with ``order: sequential``
empirical inputs both models see identical numbers and must agree to float precision.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import simpy

from simulator.engine import streams
from simulator.scenario.config import Scenario
from simulator.scenario.distributions import Sampler
from simulator.serving.dispatch import assign_workers
from simulator.serving.workers import ServiceModel
from simulator.stages.arrivals import arrivals as make_arrivals
from simulator.stages.features import trip_keys

COMPLETED, REJECTED, TIMED_OUT = 0, 1, 2


class RefBatcher:
    """One batch queue and its instances, event per request."""

    def __init__(self, env, cfg, instances, service, log):
        self.env = env
        self.cfg = cfg
        self.queue: deque = deque()  # (request id, arrival time, done event, end-to-end deadline)
        self.free = simpy.Store(env)
        self.free.items.extend(instances)
        self.service = service
        self.log = log
        self.signal = env.event()
        env.process(self.scheduler())

    def _expire(self):
        to = self.cfg.timeout_ms
        while to is not None and self.queue and self.queue[0][1] + to <= self.env.now:
            _rid, t, ev, deadline = self.queue.popleft()
            ev.succeed((TIMED_OUT, min(t + to, deadline), None, None))

    def _shed_late(self):
        """Requests past their deadline among the next batch's worth leave, timed out."""
        while self.cfg.deadline_ms is not None:
            head = list(self.queue)[: self.cfg.max_batch_size]
            late = [item for item in head if item[3] <= self.env.now]
            if not late:
                return
            for item in late:
                self.queue.remove(item)
                item[2].succeed((TIMED_OUT, item[3], None, None))

    def submit(self, rid: int, deadline: float = float("inf")):
        """Called by a request process at its arrival; returns the event it waits on."""
        ev = self.env.event()
        self._expire()
        cap = self.cfg.max_queue_size
        if cap is not None and len(self.queue) >= cap:
            ev.succeed((REJECTED, self.env.now, None, None))
            return ev
        self.queue.append((rid, self.env.now, ev, deadline))
        if not self.signal.triggered:
            self.signal.succeed()
        return ev

    def scheduler(self):
        cfg = self.cfg
        pref = sorted(set(cfg.preferred_batch_sizes))
        while True:
            inst = yield self.free.get()
            while True:
                self._expire()
                self._shed_late()
                n = len(self.queue)
                take = 0
                if n >= cfg.max_batch_size:
                    take = cfg.max_batch_size
                elif pref and n >= pref[0]:
                    take = max(p for p in pref if p <= n)
                elif n and self.queue[0][1] + cfg.max_queue_delay_ms <= self.env.now:
                    take = n
                if take:
                    break
                self.signal = self.env.event()
                waits = [self.signal]
                if n:
                    head_t = self.queue[0][1]
                    waits.append(self.env.timeout(head_t + cfg.max_queue_delay_ms - self.env.now))
                    if cfg.timeout_ms is not None:
                        waits.append(self.env.timeout(head_t + cfg.timeout_ms - self.env.now))
                yield self.env.any_of(waits)
            batch = [self.queue.popleft() for _ in range(take)]
            svc = self.service(take)
            self.log.append((self.env.now, tuple(item[0] for item in batch), inst))
            self.env.process(self.run_batch(inst, svc, batch))

    def run_batch(self, inst, svc, batch):
        start = self.env.now
        yield self.env.timeout(svc)
        for _rid, _t, ev, _ in batch:
            ev.succeed((COMPLETED, start, self.env.now, (len(batch), inst)))
        yield self.free.put(inst)


def simulate_reference(s: Scenario, seed: int | None = None) -> dict:
    """Run the reference model; returns per-request arrays (request order) and the batch log."""
    seed = s.seed if seed is None else seed
    rng = streams(seed)
    env = simpy.Environment()
    t0, _ = make_arrivals(s.traffic, s.duration_s * 1000.0, rng=rng.arrivals)
    n = len(t0)

    def draws(dist, stream):
        return Sampler(dist, getattr(rng, stream)).draw(n) if dist is not None else np.zeros(n)

    net_in = draws(s.network.client_to_api, "network_in")
    router = draws(s.router.overhead, "router")
    f = s.features
    keys = trip_keys(f) if f.lookups_per_request else np.zeros(0, dtype=int)
    if f.lookups_per_request:
        lat = Sampler(f.round_trip, rng.features).draw(n * len(keys)).reshape(n, len(keys))
        lat = lat + f.per_key_ms * keys
    pre = draws(s.preprocess.service, "preprocess")
    service = ServiceModel(s.workers, s.batching.max_batch_size, rng.service)
    assign = assign_workers(s, n, rng.routing)
    post = draws(s.postprocess.service, "postprocess")
    net_out = draws(s.network.api_to_client, "network_out")
    if s.network.bandwidth_gbps is not None or f.store is not None:
        raise NotImplementedError("the reference model covers the uncontended, bandwidth-free case")

    cpu = simpy.Resource(env, capacity=s.preprocess.cpu_workers) if s.preprocess.cpu_workers else None
    log: list = []
    per = s.workers.instances
    if assign is None:
        batchers = [RefBatcher(env, s.batching, list(range(s.workers.count * per)), service, log)]
    else:
        batchers = [
            RefBatcher(env, s.batching, list(range(w * per, (w + 1) * per)), service, log)
            for w in range(s.workers.count)
        ]
    cols = {
        k: np.full(n, np.nan)
        for k in (
            "t_dropped",
            "t_api",
            "t_router",
            "t_features",
            "t_preprocessed",
            "t_dispatch",
            "t_inferred",
            "t_postprocessed",
            "t_response",
        )
    }
    outcome = np.zeros(n, dtype=np.int8)

    def fetch(i):
        slots = min(f.parallelism, len(keys))
        cursor = [0]

        def lane():
            while cursor[0] < len(keys):
                j = cursor[0]
                cursor[0] += 1
                yield env.timeout(lat[i, j])

        yield env.all_of([env.process(lane()) for _ in range(slots)])

    def request(i):
        yield env.timeout(net_in[i])
        cols["t_api"][i] = env.now
        yield env.timeout(router[i])
        cols["t_router"][i] = env.now
        if f.lookups_per_request:
            yield from fetch(i)
        cols["t_features"][i] = env.now
        if cpu is None:
            yield env.timeout(pre[i])
        else:
            with cpu.request() as req:
                yield req
                yield env.timeout(pre[i])
        cols["t_preprocessed"][i] = env.now
        batcher = batchers[0 if assign is None else assign[i]]
        deadline = t0[i] + s.batching.deadline_ms if s.batching.deadline_ms is not None else float("inf")
        status, a, b, _ = yield batcher.submit(i, deadline)
        outcome[i] = status
        if status != COMPLETED:
            cols["t_dropped"][i] = a
            return
        cols["t_dispatch"][i], cols["t_inferred"][i] = a, b
        yield env.timeout(post[i])
        cols["t_postprocessed"][i] = env.now
        yield env.timeout(net_out[i])
        cols["t_response"][i] = env.now

    def source():
        for i in range(n):
            if t0[i] > env.now:
                yield env.timeout(t0[i] - env.now)
            env.process(request(i))

    env.process(source())
    env.run()
    return {"arrival": t0, **cols, "outcome": outcome, "log": log}
