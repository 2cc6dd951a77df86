"""The front of the request path, between the router and preprocessing, as the engine runs
it chunk by chunk over its ledger:

    router → result cache → feature cache → feature fetch (or a store of finite capacity)

A cache's hits depend on the order of all lookups, and a store's round trips queue for its
threads, so each is a stage with a horizon (:class:`~simulator.serving.streamed.Horizon`):
in each chunk it processes exactly its inputs earlier than the chunk's end and keeps the
rest. The per-request draws (cache keys and latencies, the feature round trips) are made
as the requests arrive, in request order (:meth:`Front.draws`), so a request's record is
the same for any chunk length. A request answered by the result cache, or whose feature
fetch failed, is settled here.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from simulator.columns import CacheDrawn, Columns, Ledger
from simulator.ledger import Outcome
from simulator.rng import Streams
from simulator.scenario.config import Cache, Scenario
from simulator.scenario.distributions import Sampler
from simulator.serving.streamed import Horizon
from simulator.stages.caches import CacheDraws, CacheState, cache_done
from simulator.stages.features import Fetched, Store, fetch, fetch_drawn, trips
from simulator.stages.speed import SpeedProcess


class CacheStage:
    """A cache on the request path: its contents carried between chunks, and the lookups
    waiting for their turn (a :class:`Horizon`: they are replayed in time order)."""

    def __init__(self, cfg: Cache, rng: np.random.Generator, drawn: Callable[[Columns], CacheDrawn]):
        self.draws = CacheDraws(cfg, rng)
        self.state = CacheState(cfg)
        self.wait = Horizon(by_id=True)
        self.drawn = drawn  # the ledger's draws that are this cache's

    def resolve(self, ledger: Ledger, ids: np.ndarray, t: np.ndarray, horizon: float):
        """Lookups of requests ``ids`` at ``t`` join those waiting; those before
        ``horizon`` are looked up now, in time order: their ids, when done, and hits."""
        self.wait.push(t, ids)
        t, ids = self.wait.ready(horizon)
        rows = ids - ledger.lo
        mine = self.drawn(ledger.cols)
        hit = self.state.resolve(t, mine.drawn[rows])
        return ids, cache_done(t, hit, mine.hit_ms[rows], mine.miss_ms[rows], slice(None)), hit


class Front:
    """The caches and the feature stage of one run, with their streams and horizons."""

    def __init__(self, s: Scenario, rng: Streams, speed: SpeedProcess | None):
        self.features = s.features
        self.store = s.features.store is not None and s.features.lookups_per_request > 0
        result, feature = s.caches.result, s.caches.feature
        # past a cache, requests reach the later stages out of request order: ties by id
        self.by_id = result is not None or feature is not None
        self.trips = (
            Sampler(s.features.round_trip, rng.features)
            if s.features.round_trip is not None and not self.store
            else None
        )
        self.result_cache = None if result is None else CacheStage(result, rng.result_cache, lambda c: c.result_cache)
        self.feature_cache = (
            None if feature is None else CacheStage(feature, rng.feature_cache, lambda c: c.feature_cache)
        )
        if self.store:  # round trips drawn as requests reach the store, in time order (ties by id)
            sampler = None if s.features.round_trip is None else Sampler(s.features.round_trip, rng.features)
            self.store_stage = Store(s.features, sampler, None if speed is None else speed.frontend)
            self.store_wait = Horizon(by_id=True)

    def draws(self, n: int) -> dict:
        """The ledger's columns of ``n`` arriving requests that this stage draws for them:
        each cache's draws, and (past a cache, without a store) every round trip's latency,
        used once the request passes the caches."""
        return {
            "result_cache": None if self.result_cache is None else CacheDrawn(*self.result_cache.draws(n)),
            "feature_cache": None if self.feature_cache is None else CacheDrawn(*self.feature_cache.draws(n)),
            "trips": trips(self.features, self.trips, n) if self.by_id and not self.store else None,
        }

    def resolve(self, ledger: Ledger, rid: np.ndarray, t_router: np.ndarray, horizon: float):
        """Requests ``rid`` (in the ledger, leaving the router at ``t_router``) through the
        caches and the feature stage, up to ``horizon``. Returns the ids of the requests
        served from the result cache, and of those past the feature stage (when, and
        whether they failed)."""
        if not self.by_id and not self.store:  # every arrival reaches the feature stage now, in request order
            return rid[:0], *self._features(ledger, rid, fetch(self.features, t_router, self.trips))
        c = ledger.cols
        served_ids = rid[:0]
        f_id, f_t = rid, t_router
        if self.result_cache is not None:
            f_id, f_t, hit = self.result_cache.resolve(ledger, rid, t_router, horizon)
            rows = f_id - ledger.lo
            c.t_cache[rows] = f_t
            served_ids = f_id[hit]
            r = rows[hit]  # served from the result cache: no time in the later stages
            if len(r):
                c.with_serving()
                for column in (c.t_features, c.t_preprocessed, c.t_dispatch, c.t_inferred, c.t_answered):
                    if column is not None:  # t_answered: with the front end's event loop
                        column[r] = f_t[hit]
            c.result_hit[r] = True
            c.settled[r] = True
            f_id, f_t = f_id[~hit], f_t[~hit]
        go = np.ones(len(f_id), dtype=bool)
        if self.feature_cache is not None:
            f_id, f_t, hit = self.feature_cache.resolve(ledger, f_id, f_t, horizon)
            c.feature_hit[f_id - ledger.lo] = hit
            go = ~hit
        if self.store:
            return served_ids, *self._store(ledger, f_id, f_t, go, horizon)
        lat = c.trips[f_id - ledger.lo][go]
        fetched = fetch_drawn(self.features, f_t[go], lat)
        end, degraded, failed = f_t.copy(), np.zeros(len(f_id), dtype=bool), np.zeros(len(f_id), dtype=bool)
        end[go], degraded[go], failed[go] = fetched
        return served_ids, *self._features(ledger, f_id, Fetched(end, degraded, failed))

    def _store(self, ledger: Ledger, ids: np.ndarray, t: np.ndarray, go: np.ndarray, horizon: float):
        """The feature stage with a store of finite capacity: requests ``ids`` past the
        feature cache at ``t``, those that ``go`` fetch through the store (in time order,
        up to ``horizon``), the others (cache hits) end here. Returns what
        :meth:`_features` returns, for the requests whose stage ended before ``horizon``."""
        self.store_wait.push(t[go], ids[go])
        t_in, id_in = self.store_wait.ready(horizon)
        self.store_stage.feed(id_in, t_in)
        fetched_ids, fetched = self.store_stage.run(horizon)
        hits = ~go
        none = np.zeros(np.count_nonzero(hits), dtype=bool)
        return self._features(
            ledger,
            np.concatenate([ids[hits], fetched_ids]),
            Fetched(*(np.concatenate(pair) for pair in zip((t[hits], none, none), fetched, strict=True))),
        )

    @staticmethod
    def _features(ledger: Ledger, ids: np.ndarray, fetched: Fetched):
        """Write the feature stage's columns of requests ``ids``; returns the ids, when
        their stage ended and whether they failed (those are settled: they go no further)."""
        c = ledger.cols
        rows = ids - ledger.lo
        failed = fetched.failed
        c.t_features[rows] = np.where(failed, np.nan, fetched.end) if failed.any() else fetched.end
        c.degraded[rows] = fetched.degraded
        c.live[rows] = ~failed
        f = rows[failed]
        if len(f):
            c.with_serving()
            c.t_dropped[f] = fetched.end[failed]
            c.outcome[f] = Outcome.FAILED
            c.settled[f] = True
        return ids, fetched.end, failed


__all__ = ["CacheStage", "Front"]
