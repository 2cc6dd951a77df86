"""A plain event-per-request SimPy model of the same serving system, for checking the fast engine.

Written independently of ``simulator.engine``: every request is a process that walks the
stages with ``yield env.timeout(...)``, the CPU pool is a ``simpy.Resource``, and the
batcher is a scheduler process that reacts to arrivals and timers. Slow, obvious, and
only used on small inputs.

It makes its inputs itself, from the scenario as documented, with none of the engine's
code: the arrival trace from its file (seconds, sorted, cut at the duration), every
delay and batch time from ``order: sequential`` empirical lists (replayed in request
order per stage, and batch times in each batch queue's dispatch order, cycling), and
the worker of each request by the documented balancing (``random`` from the routing stream, ``round_robin``
in turn, ``shared`` one queue). So a bug in the engine's arrivals, samplers, service
model or router cannot hide behind a reference that shares it; with those inputs the
two models must agree to float precision (``tests/test_reference.py``).

As the speed peer of ``benchmarks/bench_platform.py`` it also takes constant-rate
Poisson arrivals (exponential gaps), parametric delays (each distribution's own
``sample``) and an affine batch time with log-normal noise, drawn its own way: the
same system, not the same numbers.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import simpy

from simulator.rng import streams
from simulator.scenario.config import Scenario

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


def _sequential(dist) -> bool:
    return dist.kind == "empirical" and dist.order == "sequential"


def _replay(dist, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` values of a stage's delay: an ``order: sequential`` empirical list replayed in
    order, cycling; any other distribution drawn by its own ``sample`` (zeros for a stage
    the scenario leaves out)."""
    if dist is None:
        return np.zeros(n)
    if not _sequential(dist):
        return dist.sample(n, rng=rng)
    values = np.asarray(dist.samples_ms, dtype=float)
    return values[np.arange(n) % len(values)]


def _arrivals(traffic, duration_ms: float, rng: np.random.Generator) -> np.ndarray:
    """The arrival trace from its file (seconds, sorted, those before the end), in ms; or a
    constant-rate Poisson process, by exponential gaps."""
    if traffic.arrivals_file is not None:
        with open(traffic.arrivals_file, encoding="utf-8") as fh:
            times = np.sort(np.array([float(line) for line in fh if line.strip()]) * 1000.0)
        return times[times < duration_ms]
    if traffic.classes or traffic.shape.kind != "constant":
        raise NotImplementedError("the reference model takes a trace or constant-rate Poisson arrivals")
    mean_gap, chunk = 1000.0 / traffic.rate_rps, int(traffic.rate_rps * duration_ms / 1000.0 * 1.2) + 64
    times = np.cumsum(rng.exponential(mean_gap, chunk))
    while times[-1] < duration_ms:  # rarely: the first chunk fell short of the end
        times = np.concatenate([times, times[-1] + np.cumsum(rng.exponential(mean_gap, chunk))])
    return times[times < duration_ms]


def _batch_time(st, rng: np.random.Generator):
    """The batch time of a batch of ``size``, called in dispatch order: a sequential
    empirical list replayed (whatever the size), or ``base_ms + per_item_ms × size`` times
    a mean-one log-normal of CV ``noise_cv``."""
    if _sequential(st):
        values = np.asarray(st.samples_ms, dtype=float)
        dispatched = [0]

        def replayed(_size: int) -> float:
            k = dispatched[0]
            dispatched[0] += 1
            return float(values[k % len(values)])

        return replayed
    if st.kind != "affine" or st.noise_ratios is not None:
        raise NotImplementedError("the reference model takes a sequential empirical or an affine batch time")
    sigma = math.sqrt(math.log1p(st.noise_cv**2))

    def affine(size: int) -> float:
        noise = rng.lognormal(-sigma * sigma / 2, sigma) if st.noise_cv else 1.0
        return (st.base_ms + st.per_item_ms * size) * noise

    return affine


def _workers_of(balancing: str, count: int, n: int, rng: np.random.Generator) -> np.ndarray | None:
    """Each request's worker by the documented balancing; None for one shared queue."""
    if balancing == "shared":
        return None
    if balancing == "round_robin":
        return np.arange(n) % count
    return rng.integers(0, count, n)


def _trip_keys(lookups: int, per_trip: int) -> list[int]:
    """Keys per round trip: full trips of ``per_trip``, the remainder in the last."""
    full, rest = divmod(lookups, per_trip)
    return [per_trip] * full + ([rest] if rest else [])


def simulate_reference(s: Scenario, seed: int | None = None) -> dict:
    """Run the reference model; returns per-request arrays (request order) and the batch log."""
    seed = s.seed if seed is None else seed
    rng = streams(seed)
    env = simpy.Environment()
    t0 = _arrivals(s.traffic, s.duration_s * 1000.0, rng.arrivals)
    n = len(t0)
    net_in = _replay(s.network.client_to_api, n, rng.network_in)
    router = _replay(s.router.overhead, n, rng.router)
    f = s.features
    keys = np.asarray(_trip_keys(f.lookups_per_request, f.batch_size) if f.lookups_per_request else [], dtype=float)
    if f.lookups_per_request:
        lat = _replay(f.round_trip, n * len(keys), rng.features).reshape(n, len(keys)) + f.per_key_ms * keys
    pre = _replay(s.preprocess.service, n, rng.preprocess)
    assign = _workers_of(s.router.balancing, s.workers.count, n, rng.routing)
    post = _replay(s.postprocess.service, n, rng.postprocess)
    net_out = _replay(s.network.api_to_client, n, rng.network_out)
    if s.network.bandwidth_gbps is not None or f.store is not None:
        raise NotImplementedError("the reference model covers the uncontended, bandwidth-free case")

    cpu = simpy.Resource(env, capacity=s.preprocess.cpu_workers) if s.preprocess.cpu_workers else None
    log: list = []
    per = s.workers.instances
    if assign is None:
        batchers = [
            RefBatcher(
                env,
                s.batching,
                list(range(s.workers.count * per)),
                _batch_time(s.workers.service_time, rng.service),
                log,
            )
        ]
    else:  # each worker's batch times replayed in its own dispatch order
        batchers = [
            RefBatcher(
                env,
                s.batching,
                list(range(w * per, (w + 1) * per)),
                _batch_time(s.workers.service_time, rng.service),
                log,
            )
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
