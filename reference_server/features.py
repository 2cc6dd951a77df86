"""Online feature fetch from a real Redis: the ranker's sparse ids, per entity.

Each item needs ``keys`` ids stored under ``feat:{entity}:{j}``. They are fetched in
round trips of ``batch_size`` keys (1: one GET per key; more: MGET), ``parallelism``
round trips in flight at once: the seed articles' unbatched-lookup effect, measurable.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FeatureStoreConfig:
    url: str = "redis://127.0.0.1:6379/0"
    keys: int = 26  # ids per item (the ranker's sparse inputs)
    batch_size: int = 1  # keys per round trip
    parallelism: int = 1  # round trips in flight per request
    entities: int = 10_000  # entities populated at start-up
    max_connections: int = 32  # pooled connections; round trips beyond wait for one


def key(entity: int, j: int) -> str:
    return f"feat:{entity}:{j}"


class FeatureStore:
    """An async Redis client fetching ids in batched, parallel round trips."""

    def __init__(self, cfg: FeatureStoreConfig):
        import redis.asyncio as aioredis

        if min(cfg.keys, cfg.batch_size, cfg.parallelism, cfg.max_connections) < 1:
            raise ValueError("feature keys, batch_size, parallelism and max_connections must be >= 1")
        self.cfg = cfg
        # a bounded pool: under overload, round trips queue for a connection instead of
        # opening hundreds of sockets that Redis and this event loop then serve in turn
        pool = aioredis.BlockingConnectionPool.from_url(cfg.url, max_connections=cfg.max_connections, timeout=None)
        self.client = aioredis.Redis(connection_pool=pool)
        self.round_trips = 0

    async def populate(self, vocab: int, seed: int = 0) -> None:
        """Write ids for ``entities`` entities (seeded), in MSET chunks."""
        rng = np.random.default_rng(seed)
        ids = rng.integers(0, vocab, (self.cfg.entities, self.cfg.keys))
        chunk: dict[str, int] = {}
        for e in range(self.cfg.entities):
            for j in range(self.cfg.keys):
                chunk[key(e, j)] = int(ids[e, j])
            if len(chunk) >= 5000:
                await self.client.mset(chunk)
                chunk = {}
        if chunk:
            await self.client.mset(chunk)

    async def fetch(self, entities: np.ndarray) -> tuple[np.ndarray, dict]:
        """The ids of each entity, (len(entities), keys) int64, and fetch statistics."""
        names = [key(int(e), j) for e in entities.ravel() for j in range(self.cfg.keys)]
        b = self.cfg.batch_size
        trips = [names[i : i + b] for i in range(0, len(names), b)]
        results: list[list] = [None] * len(trips)  # type: ignore[list-item]
        cursor = iter(range(len(trips)))
        t0 = time.perf_counter_ns()

        async def lane() -> None:
            for k in cursor:
                keys = trips[k]
                results[k] = [await self.client.get(keys[0])] if len(keys) == 1 else await self.client.mget(keys)

        await asyncio.gather(*(lane() for _ in range(min(self.cfg.parallelism, len(trips)))))
        self.round_trips += len(trips)
        flat = [v for part in results for v in part]
        missing = [n for n, v in zip(names, flat, strict=True) if v is None]
        if missing:
            raise KeyError(f"no features for {missing[0]} (entity out of the populated range?)")
        ids = np.array([int(v) for v in flat], dtype=np.int64).reshape(len(entities.ravel()), self.cfg.keys)
        return ids, {"feature_us": (time.perf_counter_ns() - t0) / 1e3, "feature_round_trips": len(trips)}

    async def close(self) -> None:
        await self.client.aclose()
