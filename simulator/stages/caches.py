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

from simulator.rng import child
from simulator.scenario.config import Cache
from simulator.scenario.distributions import Sampler


def zipf_probabilities(keys: int, s: float) -> np.ndarray:
    """P(key k) ∝ 1 / k^s for k = 1..keys."""
    w = np.arange(1, keys + 1, dtype=float) ** -s
    return w / w.sum()


def draw_keys(cfg: Cache, n: int, *, rng: np.random.Generator) -> np.ndarray:
    """Key ids (0 = most popular) of ``n`` lookups."""
    cdf = np.cumsum(zipf_probabilities(cfg.keys, cfg.zipf_s))
    cdf[-1] = 1.0
    return np.searchsorted(cdf, rng.random(n), side="right")


def draw(cfg: Cache, n: int, *, rng: np.random.Generator) -> np.ndarray:
    """What ``n`` lookups (in request order) draw: each one's key, or with ``hit_rate`` a
    uniform for its coin flip."""
    return rng.random(n) if cfg.hit_rate is not None else draw_keys(cfg, n, rng=rng)


class CacheDraws:
    """What requests draw at a cache, in request order, chunk after chunk: keys (or coin
    flips) from the cache's stream, hit and miss latencies from its child streams 0 and 1
    (:func:`simulator.rng.child`)."""

    def __init__(self, cfg: Cache, rng: np.random.Generator):
        self.cfg = cfg
        self.rng = rng
        self.hit = Sampler(cfg.hit, child(rng, 0)) if cfg.hit is not None else None
        self.miss = Sampler(cfg.miss, child(rng, 1)) if cfg.miss is not None else None

    def __call__(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The next ``n`` requests' draws: (keys or uniforms, hit ms, miss ms)."""
        lat = [s.draw(n) if s is not None else np.zeros(n) for s in (self.hit, self.miss)]
        return draw(self.cfg, n, rng=self.rng), *lat


class CacheState:
    """A cache's contents (each key's insertion time; an LRU's order), carried from one
    run of lookups to the next, so a stream of lookups replayed in parts hits exactly as
    it does in one pass."""

    def __init__(self, cfg: Cache):
        self.cfg = cfg
        self.ttl = cfg.ttl_s * 1000.0 if cfg.ttl_s is not None else np.inf
        self.flush = np.asarray(sorted(cfg.invalidate_at_s), dtype=float) * 1000.0
        self.inserted = np.full(cfg.keys, -np.inf).tolist() if cfg.capacity is None else None
        self.lru: OrderedDict[int, float] = OrderedDict()

    def resolve(self, times_ms: np.ndarray, drawn: np.ndarray) -> np.ndarray:
        """Whether each lookup (at ``times_ms``, any order; ``drawn`` as :func:`draw` made
        them) hits; lookups at equal times in the order given. Later calls must bring
        later lookups."""
        if self.cfg.hit_rate is not None:
            return drawn < self.cfg.hit_rate
        order = np.argsort(times_ms, kind="stable")
        hits = np.empty(len(times_ms), dtype=bool)
        hits[order] = self.replay(times_ms[order], drawn[order])
        return hits

    def replay(self, times: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Hits of a time-ordered lookup stream (one pass; O(1) per lookup)."""
        ttl = self.ttl
        # time of the last invalidation at or before each lookup (-inf if none)
        last_flush = np.concatenate(([-np.inf], self.flush))[np.searchsorted(self.flush, times, side="right")]
        out: list[bool] = []
        record = out.append
        if self.inserted is not None:
            inserted = self.inserted
            for t, k, f in zip(times.tolist(), keys.tolist(), last_flush.tolist(), strict=True):
                at = inserted[k]
                hit = t - at < ttl and at >= f
                record(hit)
                if not hit:
                    inserted[k] = t
            return np.asarray(out, dtype=bool)
        lru = self.lru
        cap = self.cfg.capacity
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


def lookup(cfg: Cache, times_ms: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
    """Whether each lookup (at ``times_ms``, any order) hits, on an empty cache."""
    return CacheState(cfg).resolve(times_ms, draw(cfg, len(times_ms), rng=rng))


def _replay(cfg: Cache, times: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Hits of a time-ordered lookup stream on an empty cache."""
    return CacheState(cfg).replay(times, keys)


def look_up(
    cfg: Cache | None, t: np.ndarray, rng: np.random.Generator, need: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The cache as a stage of a whole run: hits of a cache looked up at ``t`` by the
    requests that ``need`` it (default: all), and when each lookup is done (the others: at
    ``t``). Every request draws its key and its hit and miss latencies, in request order,
    looked up or not (:class:`CacheDraws`)."""
    n = len(t)
    if cfg is None:
        return np.zeros(n, dtype=bool), t
    drawn, hit_ms, miss_ms = CacheDraws(cfg, rng)(n)
    idx = np.arange(n) if need is None else np.flatnonzero(need)
    hit = np.zeros(n, dtype=bool)
    hit[idx] = CacheState(cfg).resolve(t[idx], drawn[idx])
    return hit, cache_done(t, hit, hit_ms, miss_ms, idx)


def cache_done(t: np.ndarray, hit: np.ndarray, hit_ms: np.ndarray, miss_ms: np.ndarray, idx) -> np.ndarray:
    """When the lookups of requests ``idx`` are done (the others keep ``t``)."""
    end = t.copy()
    end[idx] = t[idx] + np.where(hit[idx], hit_ms[idx], miss_ms[idx])
    return end
