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
    connect_timeout_s: float = 1.0  # opening a connection
    timeout_s: float = 1.0  # one round trip's reply
    pool_timeout_s: float = 1.0  # waiting for a pooled connection


class StoreUnavailable(Exception):
    """The feature store cannot answer (down, stalled, or restarted without its data): a
    503 to the client, readiness false until it answers again."""


MARKER = "feat:__populated__"  # written last by populate(): its absence means the data is gone


def key(entity: int, j: int) -> str:
    return f"feat:{entity}:{j}"


class FeatureStore:
    """An async Redis client fetching ids in batched, parallel round trips."""

    def __init__(self, cfg: FeatureStoreConfig):
        import redis.asyncio as aioredis
        import redis.exceptions as rex
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        if min(cfg.keys, cfg.batch_size, cfg.parallelism, cfg.max_connections, cfg.entities) < 1:
            raise ValueError("feature keys, batch_size, parallelism, entities and max_connections must be >= 1")
        self.cfg = cfg
        # a bounded pool behind a first-come first-served gate: under overload, round trips
        # queue for a connection in the order they asked instead of opening hundreds of
        # sockets that Redis and this event loop then serve in turn. Not redis-py's
        # BlockingConnectionPool: its condition lets a newcomer take a connection just freed
        # before the waiter it was meant for, which then waits again at the back of the line;
        # with 40 fetches in flight on 32 connections, 8 of them waited out the pool's timeout
        # again and again (calibrate/README, "A fair wait for a connection").
        # A pooled connection made before Redis restarted fails on its next use: the command is
        # retried once on a fresh connection (a timeout is not retried: a stalled Redis gets its
        # 503 within one timeout), so no request fails once Redis is back
        pool = aioredis.ConnectionPool.from_url(
            cfg.url,
            max_connections=cfg.max_connections,
            socket_connect_timeout=cfg.connect_timeout_s,
            socket_timeout=cfg.timeout_s,
            retry=Retry(NoBackoff(), 1),
            retry_on_error=[rex.ConnectionError],
        )
        # FIFO (Python 3.11.1 on): a release hands its slot to the oldest waiter, a newcomer queues
        self._gate = asyncio.Semaphore(cfg.max_connections)
        self.client = aioredis.Redis(connection_pool=pool)
        self.round_trips = 0
        self.down: str | None = None  # why the store is unavailable, while it is
        self._vocab_seed: tuple[int, int] | None = None
        self._refill: asyncio.Task | None = None

    async def populate(self, vocab: int, seed: int = 0) -> None:
        """Write ids for ``entities`` entities (seeded), in MSET chunks."""
        rng = np.random.default_rng(seed)
        ids = rng.integers(0, vocab, (self.cfg.entities, self.cfg.keys))
        chunk: dict[str, int] = {}
        for e in range(self.cfg.entities):
            for j in range(self.cfg.keys):
                chunk[key(e, j)] = int(ids[e, j])
            if len(chunk) >= 5000:
                await self._call(self.client.mset(chunk))
                chunk = {}
        if chunk:
            await self._call(self.client.mset(chunk))
        await self._call(self.client.set(MARKER, 1))
        self._vocab_seed = (vocab, seed)

    async def _call(self, coro):
        """A Redis call, once a connection is free for it (first come, first served), whose
        failure (refused, reset, timed out, no connection within ``pool_timeout_s``) marks
        the store down and becomes :class:`StoreUnavailable`, without the host in the message."""
        import redis.exceptions as rex

        try:
            try:
                async with asyncio.timeout(self.cfg.pool_timeout_s):
                    await self._gate.acquire()
            except BaseException:
                coro.close()
                raise
            try:
                return await coro
            finally:
                self._gate.release()
        except (rex.ConnectionError, rex.TimeoutError, TimeoutError, OSError) as err:
            self.down = f"feature store unavailable ({type(err).__name__})"
            raise StoreUnavailable(self.down) from err

    async def healthy(self) -> bool:
        """Whether the store answers with its data (a ping and the marker); clears ``down``."""
        if self.down is None:
            return True
        if self._refill is not None and not self._refill.done():
            return False
        try:
            ok = bool(await self._call(self.client.exists(MARKER)))
        except StoreUnavailable:
            return False
        if not ok:
            self._start_refill()
            return False
        self.down = None
        return True

    def _start_refill(self) -> None:
        """The store restarted empty: write the data again, in the background (this server
        owns it), while readiness stays false and requests get 503s."""
        self.down = "feature store has lost its data (restarted empty?); refilling"
        if self._vocab_seed is None or (self._refill is not None and not self._refill.done()):
            return

        async def refill():
            try:
                await self.populate(*self._vocab_seed)
                self.down = None
            except Exception:  # still down: the next readiness probe or request tries again
                self.down = "feature store unavailable while refilling"

        self._refill = asyncio.get_running_loop().create_task(refill())

    async def fetch(self, entities: np.ndarray) -> tuple[np.ndarray, dict]:
        """The ids of each entity, (len(entities), keys) int64, and fetch statistics."""
        names = [key(int(e), j) for e in entities.ravel() for j in range(self.cfg.keys)]
        b = self.cfg.batch_size
        trips = [names[i : i + b] for i in range(0, len(names), b)]
        results: list[list] = [None] * len(trips)  # type: ignore[list-item]
        cursor = iter(range(len(trips)))
        t0 = time.perf_counter_ns()

        if self.down is not None and not await self.healthy():
            raise StoreUnavailable(self.down)

        async def lane() -> None:
            for k in cursor:
                keys = trips[k]
                call = self.client.get(keys[0]) if len(keys) == 1 else self.client.mget(keys)
                got = await self._call(call)
                results[k] = [got] if len(keys) == 1 else got

        lanes = min(self.cfg.parallelism, len(trips))
        if lanes == 1:  # in this task: a task of its own costs the reply two more passes of the loop
            await lane()
        else:
            await asyncio.gather(*(lane() for _ in range(lanes)))
        self.round_trips += len(trips)
        flat = [v for part in results for v in part]
        missing = [n for n, v in zip(names, flat, strict=True) if v is None]
        if missing:
            if not await self._call(self.client.exists(MARKER)):  # not this entity: the whole store
                self._start_refill()
                raise StoreUnavailable(self.down)
            raise KeyError(f"no features for {missing[0]} (entity out of the populated range?)")
        ids = np.array([int(v) for v in flat], dtype=np.int64).reshape(len(entities.ravel()), self.cfg.keys)
        return ids, {"feature_us": (time.perf_counter_ns() - t0) / 1e3, "feature_round_trips": len(trips)}

    async def close(self) -> None:
        await self.client.aclose()
