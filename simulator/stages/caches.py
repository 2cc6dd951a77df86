"""Caches with TTL and LRU: which lookups hit.

A cache sees a stream of lookups (time, key). A miss inserts the key, stamped with the
lookup time (the fill latency is not modelled); a later lookup hits while the entry is
younger than ``ttl_s``, still held by the LRU (``capacity``), and not older than the
last invalidation (a deploy). Keys follow Zipf(s) popularity over a finite key space.
The hit ratio is not an input: it emerges from the stream, except with ``hit_rate``,
which draws hits as independent coin flips.

Theory the tests check this against: a TTL cache under Poisson requests at rate λ per
key hits with probability λT / (1 + λT); an LRU cache under Zipf follows Che's
approximation.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from simulator.scenario.config import Cache


def zipf_probabilities(keys: int, s: float) -> np.ndarray:
    """P(key k) ∝ 1 / k^s for k = 1..keys."""
    w = np.arange(1, keys + 1, dtype=float) ** -s
    return w / w.sum()


def draw_keys(cfg: Cache, n: int, *, rng: np.random.Generator) -> np.ndarray:
    """Key ids (0 = most popular) of ``n`` lookups."""
    cdf = np.cumsum(zipf_probabilities(cfg.keys, cfg.zipf_s))
    cdf[-1] = 1.0
    return np.searchsorted(cdf, rng.random(n), side="right")


def lookup(cfg: Cache, times_ms: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
    """Whether each lookup (at ``times_ms``, any order) hits."""
    n = len(times_ms)
    if cfg.hit_rate is not None:
        return rng.random(n) < cfg.hit_rate
    keys = draw_keys(cfg, n, rng=rng)
    order = np.argsort(times_ms, kind="stable")
    hits = np.empty(n, dtype=bool)
    hits[order] = _replay(cfg, times_ms[order], keys[order])
    return hits


def _replay(cfg: Cache, times: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Hits of a time-ordered lookup stream (one pass; O(1) per lookup)."""
    ttl = cfg.ttl_s * 1000.0 if cfg.ttl_s is not None else np.inf
    flush = np.asarray(sorted(cfg.invalidate_at_s), dtype=float) * 1000.0
    # time of the last invalidation at or before each lookup (-inf if none)
    last_flush = np.concatenate(([-np.inf], flush))[np.searchsorted(flush, times, side="right")]
    out: list[bool] = []
    record = out.append
    if cfg.capacity is None:
        inserted = np.full(cfg.keys, -np.inf).tolist()
        for t, k, f in zip(times.tolist(), keys.tolist(), last_flush.tolist(), strict=True):
            at = inserted[k]
            hit = t - at < ttl and at >= f
            record(hit)
            if not hit:
                inserted[k] = t
        return np.asarray(out, dtype=bool)
    lru: OrderedDict[int, float] = OrderedDict()
    cap = cfg.capacity
    for t, k, f in zip(times.tolist(), keys.tolist(), last_flush.tolist(), strict=True):
        at = lru.get(k)
        hit = at is not None and t - at < ttl and at >= f
        record(hit)
        if hit:
            lru.move_to_end(k)
        else:
            lru[k] = t
            lru.move_to_end(k)
            if len(lru) > cap:
                lru.popitem(last=False)
    return np.asarray(out, dtype=bool)
