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
from typing import NamedTuple

import numpy as np
import simpy

from simulator.rng import Streams
from simulator.scenario.config import Cache, Features
from simulator.scenario.distributions import Sampler
from simulator.stages.caches import look_up
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


def fetch(
    cfg: Features, start: np.ndarray, sampler: Sampler | None, need: np.ndarray | None = None, path=None
) -> Fetched:
    """Feature stage: end times, and which requests were degraded (timed out, default
    features) or failed (timed out with ``on_timeout: fail``; end time = when they gave up).
    With ``need`` (a mask) only those fetch; the others end at ``start``. ``path``: the
    host's speed (a :class:`~simulator.stages.speed.SpeedPath`) on the store's threads."""
    if cfg.lookups_per_request and cfg.store is not None:
        idx = np.arange(len(start)) if need is None else np.flatnonzero(need)
        order = np.argsort(start[idx], kind="stable")
        end = start.copy()
        end[idx[order]] = fetch_contended(cfg, start[idx][order], sampler, path)
    else:
        end = start + fetch_uncontended(cfg, start, sampler, need)
    return _give_up(cfg, start, end)


def fetch_drawn(cfg: Features, start: np.ndarray, lat: np.ndarray) -> Fetched:
    """:func:`fetch` from an uncontended store, with round trips drawn before (:func:`trips`)."""
    end = start + (_makespan(lat, cfg.parallelism, start, cfg) if cfg.lookups_per_request else 0.0)
    return _give_up(cfg, start, end)


def _give_up(cfg: Features, start: np.ndarray, end: np.ndarray) -> Fetched:
    late = np.zeros(len(start), dtype=bool)
    if cfg.timeout_ms is not None:
        give_up = start + cfg.timeout_ms
        late = end > give_up
        end = np.where(late, give_up, end)
    return Fetched(end, late & (cfg.on_timeout == "default"), late & (cfg.on_timeout == "fail"))


def fetch_contended(cfg: Features, start: np.ndarray, sampler: Sampler | None, path=None) -> np.ndarray:
    """Feature-fetch completion times through a store with ``cfg.store.threads`` threads.

    Each round trip spends half its network latency reaching the store, queues FCFS for
    a thread, holds it for ``per_op_ms + per_key_ms × keys``, and spends the other half
    returning. ``start`` must be sorted. With a speed ``path``, a thread's hold is
    stretched by the host's speed while it lasts.
    """
    store_cfg = cfg.store
    keys = trip_keys(cfg)
    n = len(keys)
    env = simpy.Environment()
    threads = simpy.Resource(env, capacity=store_cfg.threads)
    hold = (store_cfg.per_op_ms + store_cfg.per_key_ms * keys).tolist()
    done = np.empty_like(start)
    slots = min(cfg.parallelism, n)

    def lane(i: int, lat: list[float], cursor: list[int]):
        while cursor[0] < n:
            j = cursor[0]
            cursor[0] += 1
            half = lat[j] / 2
            yield env.timeout(half)
            with threads.request() as req:
                yield req
                yield env.timeout(hold[j] if path is None else float(path.finish(env.now, hold[j])) - env.now)
            yield env.timeout(half)
        done[i] = max(done[i], env.now)

    def feeder():
        rows_per_chunk = max(1, _CHUNK_CELLS // n)
        for lo in range(0, len(start), rows_per_chunk):
            hi = min(lo + rows_per_chunk, len(start))
            lat = _trip_latency(cfg, sampler, hi - lo, keys)
            for i in range(lo, hi):
                t = start[i]
                if t > env.now:
                    yield env.timeout(t - env.now)
                done[i] = t
                row, cursor = lat[i - lo].tolist(), [0]
                for _ in range(slots):
                    env.process(lane(i, row, cursor))

    env.process(feeder())
    env.run()
    return done


def feature_stage(
    f: Features, cache: Cache | None, start: np.ndarray, need: np.ndarray, rng: Streams, path: SpeedPath | None = None
) -> tuple[np.ndarray, ...]:
    """The feature stage of a whole run, for the requests that ``need`` it (the feature
    cache, then the fetch): end times, degraded, failed, cache hits. ``path``: the front
    end's speed, on a store's threads."""
    hit, end = look_up(cache, start, rng.feature_cache, need)
    sampler = Sampler(f.round_trip, rng.features) if f.round_trip is not None else None
    fetched = fetch(f, end, sampler, need & ~hit, path)
    return fetched.end, fetched.degraded, fetched.failed, hit
