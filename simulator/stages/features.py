"""Feature fetch from a remote KV store: fan-out in batched round trips.

A request needs ``lookups_per_request`` keys. They travel in ``ceil(L / batch_size)``
round trips, at most ``parallelism`` in flight; a round trip starts as soon as a slot
frees (list scheduling). With an uncontended store every round trip's latency is an
independent draw, so the whole stage is computed in bulk with numpy. A store of
finite capacity (``features.store``) couples requests: round trips queue FCFS for the
store's threads, and the fork-join is simulated with SimPy, one process per slot.
"""

from __future__ import annotations

import math
from collections import deque
from typing import NamedTuple

import numpy as np
import simpy

from simulator.scenario.config import Features
from simulator.scenario.distributions import Sampler
from simulator.stages.network import later
from simulator.stages.speed import SpeedPath

_CHUNK_CELLS = 1 << 22  # round trips sampled per numpy chunk


def trip_keys(cfg: Features) -> np.ndarray:
    """Keys carried by each round trip of one request."""
    n = math.ceil(cfg.lookups_per_request / cfg.batch_size)
    keys = np.full(n, cfg.batch_size, dtype=np.int64)
    keys[-1] = cfg.lookups_per_request - (n - 1) * cfg.batch_size
    return keys


def _trip_latency(cfg: Features, sampler: Sampler | None, rows: int, keys: np.ndarray) -> np.ndarray:
    n = len(keys)
    lat = sampler.draw(rows * n).reshape(rows, n) if sampler is not None else np.zeros((rows, n))
    if cfg.per_key_ms:
        lat = lat + cfg.per_key_ms * keys
    return lat


def _makespan(lat: np.ndarray, slots: int, start: np.ndarray | None = None, cfg: Features | None = None) -> np.ndarray:
    """Completion time of each row's round trips list-scheduled on ``slots`` slots.

    With ``cfg`` windows, a trip starting in a slowdown takes ``multiplier`` times longer
    and a trip overlapping an outage never returns (∞); ``start`` gives each row's
    absolute start time (ms) to place its trips against the windows.
    """
    rows, n = lat.shape
    if cfg is not None and (cfg.outages or cfg.slowdowns):
        return _makespan_windows(lat, slots, start, cfg)
    if slots >= n:
        return lat.max(axis=1)
    free = np.zeros((rows, slots))
    r = np.arange(rows)
    for j in range(n):
        k = free.argmin(axis=1)
        free[r, k] += lat[:, j]
    return free.max(axis=1)


def _makespan_windows(lat: np.ndarray, slots: int, start: np.ndarray, cfg: Features) -> np.ndarray:
    rows, n = lat.shape
    free = np.repeat(start[:, None], min(slots, n), axis=1)
    r = np.arange(rows)
    for j in range(n):
        k = free.argmin(axis=1)
        t0 = free[r, k]
        dur = lat[:, j].copy()
        for w in cfg.slowdowns:
            inside = (t0 >= w.start_s * 1000) & (t0 < (w.start_s + w.duration_s) * 1000)
            dur[inside] *= w.multiplier
        t1 = t0 + dur
        for w in cfg.outages:
            lo, hi = w.start_s * 1000, (w.start_s + w.duration_s) * 1000
            t1[(t0 < hi) & (t1 > lo)] = np.inf
        free[r, k] = t1
    return free.max(axis=1) - start


def fetch_uncontended(
    cfg: Features, start: np.ndarray, sampler: Sampler | None, need: np.ndarray | None = None
) -> np.ndarray:
    """Feature-fetch durations (ms) when the store never queues (∞: never returned).

    Every request draws its round trips, in request order, whether it fetches or not (a
    cache hit): with ``need`` (a mask), only those fetch, the others take 0 ms. So a
    request's draws do not depend on which others hit a cache."""
    if cfg.lookups_per_request == 0:
        return np.zeros_like(start)
    keys = trip_keys(cfg)
    rows_per_chunk = max(1, _CHUNK_CELLS // len(keys))
    out = np.zeros_like(start)
    for lo in range(0, len(start), rows_per_chunk):
        hi = min(lo + rows_per_chunk, len(start))
        lat = _trip_latency(cfg, sampler, hi - lo, keys)
        if need is None:
            out[lo:hi] = _makespan(lat, cfg.parallelism, start[lo:hi], cfg)
        else:
            sel = need[lo:hi]
            out[lo:hi][sel] = _makespan(lat[sel], cfg.parallelism, start[lo:hi][sel], cfg)
    return out


def trips(cfg: Features, sampler: Sampler | None, n: int) -> np.ndarray:
    """The round-trip latencies of ``n`` requests (a row each), drawn as
    :func:`fetch_uncontended` draws them, for :func:`fetch_drawn` to use later."""
    if cfg.lookups_per_request == 0:
        return np.zeros((n, 0))
    return _trip_latency(cfg, sampler, n, trip_keys(cfg))


class Fetched(NamedTuple):
    """The feature stage's columns, one entry per request."""

    end: np.ndarray  # when the stage ended (ms): fetched, or given up
    degraded: np.ndarray  # timed out and served with default features
    failed: np.ndarray  # timed out with on_timeout: fail


def fetch(cfg: Features, start: np.ndarray, sampler: Sampler | None, need: np.ndarray | None = None) -> Fetched:
    """Feature stage from an uncontended store: end times, and which requests were degraded
    (timed out, default features) or failed (timed out with ``on_timeout: fail``; end time
    = when they gave up). With ``need`` (a mask) only those fetch; the others end at
    ``start``. A store of finite capacity is a :class:`Store`."""
    if cfg.lookups_per_request == 0:  # no fetch: the stage ends where it began
        return _give_up(cfg, start, start)
    return _give_up(cfg, start, start + fetch_uncontended(cfg, start, sampler, need))


def fetch_drawn(cfg: Features, start: np.ndarray, lat: np.ndarray) -> Fetched:
    """:func:`fetch` from an uncontended store, with round trips drawn before (:func:`trips`)."""
    end = later(start, _makespan(lat, cfg.parallelism, start, cfg) if cfg.lookups_per_request else 0.0)
    return _give_up(cfg, start, end)


def _give_up(cfg: Features, start: np.ndarray, end: np.ndarray) -> Fetched:
    late = np.zeros(len(start), dtype=bool)
    if cfg.timeout_ms is not None:
        give_up = start + cfg.timeout_ms
        late = end > give_up
        end = np.where(late, give_up, end)
    return Fetched(end, late & (cfg.on_timeout == "default"), late & (cfg.on_timeout == "fail"))


class Store:
    """A feature store of finite capacity, run chunk after chunk: the round trips of the
    requests fed so far go through SimPy up to a horizon, and the state (threads, trips in
    flight) carries to the next chunk, so a run cut anywhere gives the same times.

    Each round trip spends half its network latency reaching the store, queues FCFS for
    one of ``cfg.store.threads`` threads, holds it for ``per_op_ms + per_key_ms × keys``,
    and spends the other half returning; a request's trips run at most ``parallelism`` at
    a time. Requests must be fed in order of start (ties by id), every one before the
    horizon of the :meth:`run` that follows; their trips are drawn in that order. With a
    speed ``path``, a thread's hold is stretched by the host's speed while it lasts.
    """

    def __init__(self, cfg: Features, sampler: Sampler | None, path: SpeedPath | None = None):
        self.cfg, self.sampler, self.path = cfg, sampler, path
        self.keys = trip_keys(cfg)
        self.hold = (cfg.store.per_op_ms + cfg.store.per_key_ms * self.keys).tolist()
        self.slots = min(cfg.parallelism, len(self.keys))
        self.env = simpy.Environment()
        self.threads = simpy.Resource(self.env, capacity=cfg.store.threads)
        self.fed: deque[tuple[int, float, list[float]]] = deque()  # (id, start, trips) not started yet
        self.more: simpy.Event | None = None  # what the feeder waits on when nothing is fed
        self.pending: dict[int, list] = {}  # id -> [start, done so far, trips left]
        self.finished: list[tuple[int, float, float]] = []  # (id, start, done) since the last run
        self.env.process(self._feeder())

    def feed(self, ids: np.ndarray, start: np.ndarray) -> None:
        """Requests ``ids`` reach the store at ``start`` (sorted, ties by id)."""
        n = len(self.keys)
        rows_per_chunk = max(1, _CHUNK_CELLS // n)
        for lo in range(0, len(ids), rows_per_chunk):
            hi = min(lo + rows_per_chunk, len(ids))
            lat = _trip_latency(self.cfg, self.sampler, hi - lo, self.keys).tolist()
            self.fed.extend(zip(ids[lo:hi].tolist(), start[lo:hi].tolist(), lat, strict=True))
        if self.fed and self.more is not None:
            self.more.succeed()
            self.more = None

    def _feeder(self):
        env = self.env
        while True:
            if not self.fed:
                self.more = env.event()
                yield self.more
                continue
            i, t, row = self.fed.popleft()
            if t > env.now:
                yield env.timeout(t - env.now)
            self.pending[i] = [t, t, self.slots]
            cursor = [0]
            for _ in range(self.slots):
                env.process(self._lane(i, row, cursor))

    def _lane(self, i: int, lat: list[float], cursor: list[int]):
        env, n = self.env, len(self.keys)
        while cursor[0] < n:
            j = cursor[0]
            cursor[0] += 1
            half = lat[j] / 2
            yield env.timeout(half)
            with self.threads.request() as req:
                yield req
                hold = self.hold[j]
                yield env.timeout(hold if self.path is None else self.path.finish_at(env.now, hold) - env.now)
            yield env.timeout(half)
        p = self.pending.get(i)
        if p is None:  # given up (timeout_ms) before its trips came back
            return
        p[1] = max(p[1], env.now)
        p[2] -= 1
        if not p[2]:
            del self.pending[i]
            self.finished.append((i, p[0], p[1]))

    def run(self, horizon: float) -> tuple[np.ndarray, Fetched]:
        """Simulate up to ``horizon`` (ms; inf: to the end). Returns the requests whose
        feature stage ended before it, unsorted, and their columns: those whose trips all
        returned, and those past ``timeout_ms`` whose trips are still out (given up; their
        trips go on holding the store's threads)."""
        if math.isinf(horizon):
            self.env.run()
        elif horizon > self.env.now:
            self.env.run(until=horizon)
        done, self.finished = self.finished, []
        if self.cfg.timeout_ms is not None:  # given up before the horizon: ended, trips still out
            late = [i for i, p in self.pending.items() if p[0] + self.cfg.timeout_ms < horizon]
            done += [(i, self.pending.pop(i)[0], math.inf) for i in late]
        ids = np.fromiter((d[0] for d in done), dtype=np.int64, count=len(done))
        start = np.fromiter((d[1] for d in done), dtype=float, count=len(done))
        end = np.fromiter((d[2] for d in done), dtype=float, count=len(done))
        return ids, _give_up(self.cfg, start, end)
