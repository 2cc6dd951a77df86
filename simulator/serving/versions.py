"""A canary and a shadow, chunk by chunk: each version's pool fed as requests reach the
batching stage, like the primary's (:mod:`simulator.serving.streamed`).

What a request is drawn to do is decided when it arrives, in request order, each purpose
from its own stream (:mod:`simulator.rng`): its user and so its version (sticky by user,
:func:`~simulator.stages.canary.on_canary`), whether the shadow copies it and to which
worker, its worker in the canary's pool and whether the canary answers it with an error.
A request that never reaches the batching stage (answered from the result cache, or
failed at the feature stage) uses none of it: the shadow copies only served primary
traffic, and only served canary requests can fail. So a run's records are the same
for any chunk length.

- The primary's pool (fixed or dynamic) takes the primary's requests and, with
  ``shadow.pool: shared``, the shadow copies, in its own queues: a copy is fed under the
  id ``request + COPY``, so that at equal times it queues after every request.
- The canary's pool and a shadow's own pool are fixed pools of their own
  (:func:`~simulator.serving.dispatch.pool_workers`), with their own service and routing
  streams.
- With ``measure_impact``, a second primary pool, drawn from fresh streams of the same
  seed, serves the primary's requests without the copies: the completion times they would
  have had (:attr:`Served.t_done` of :func:`serve_alone`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from simulator.ledger import BatchLog, Served
from simulator.rng import Streams, streams
from simulator.scenario.config import Scenario
from simulator.serving.dispatch import pool_workers, sub
from simulator.serving.router import Router
from simulator.serving.streamed import Horizon, StreamedDynamicPool, StreamedPool
from simulator.serving.workers import ServiceModel
from simulator.stages.canary import on_canary
from simulator.stages.speed import SpeedProcess

COPY = 1 << 40  # a shadow copy's id in the primary's pool: its request's id + COPY


@dataclass
class VersionDrawn:
    """What each request drew for the versions when it arrived."""

    copy: np.ndarray  # bool: the shadow copies it, if it is served on the primary
    copy_worker: np.ndarray  # the copy's worker (-1: one shared queue, or a pool that routes itself)
    canary_worker: np.ndarray  # its worker in the canary's pool (-1: not on the canary, or a shared queue)
    error: np.ndarray  # bool: the canary answers it with an error, if it completes there (set as it settles)

    def take(self, rows) -> VersionDrawn:
        return VersionDrawn(*(getattr(self, f.name)[rows] for f in fields(self)))


@dataclass
class VersionsPiece:
    """What the versions settled in one chunk besides the requests' columns."""

    pools: dict[str, BatchLog]  # batches started in the canary's and a shadow's own pool
    shadow: dict[str, np.ndarray] | None  # copies settled: request, arrival, times, outcome
    alone: tuple[np.ndarray, np.ndarray] | None  # (request ids, completion without the copies)


def primary_pool(s: Scenario, service: ServiceModel, rng: Streams, by_id: bool):
    """The primary's pool as the engine feeds it, chunk by chunk."""
    # an LLM pool scales itself (serving/continuous.py): a fixed pool's scheduler
    dynamic = s.workers.dynamic and s.traffic.tokens is None
    pool = StreamedDynamicPool(s, service, rng) if dynamic else StreamedPool(s, service)
    pool.waiting = Horizon(by_id=by_id)
    return pool


class _Pending:
    """The shadow copies in a pool, by request id: when their request arrived and reached
    the batching stage (read back when the copy settles)."""

    def __init__(self) -> None:
        self.ids = np.zeros(0, np.int64)
        self.arrival = np.zeros(0)
        self.t_pre = np.zeros(0)

    def add(self, ids: np.ndarray, arrival: np.ndarray, t_pre: np.ndarray) -> None:
        if not len(ids):
            return
        ids = np.concatenate([self.ids, ids])
        order = np.argsort(ids, kind="stable")
        self.ids = ids[order]
        self.arrival = np.concatenate([self.arrival, arrival])[order]
        self.t_pre = np.concatenate([self.t_pre, t_pre])[order]

    def pop(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        at = np.searchsorted(self.ids, ids)
        out = self.arrival[at], self.t_pre[at]
        keep = np.ones(len(self.ids), dtype=bool)
        keep[at] = False
        self.ids, self.arrival, self.t_pre = self.ids[keep], self.arrival[keep], self.t_pre[keep]
        return out


class VersionsPool:
    """The pools of a canary and a shadow, and the primary's, fed chunk by chunk."""

    def __init__(self, s: Scenario, seed: int, rng: Streams, speed: SpeedProcess | None, *, by_id: bool):
        r, w, b = s.router, s.workers, s.batching.max_batch_size
        self.s, self.r, self.rng = s, r, rng
        self.primary = primary_pool(s, ServiceModel(w, b, rng.service, speed), rng, by_id)
        self.shared = r.shadow is not None and r.shadow.pool == "shared"
        self.routes_itself = w.dynamic  # a dynamic primary routes its requests (and shared copies) itself
        self.canary = self.shadow = self.alone = None
        if r.canary is not None:
            self.canary = self._own(r.canary, ServiceModel(self._pw(r.canary), b, rng.canary_service, speed), by_id)
            self.canary_router = Router(r.balancing, rng.canary_routing)
        if r.shadow is not None:
            self.copy_router = Router(r.balancing, rng.shadow_routing)
            self.copy_workers = w.count if self.shared else r.shadow.workers
            if not self.shared:
                self.shadow = self._own(r.shadow, ServiceModel(self._pw(r.shadow), b, rng.shadow_service, speed), by_id)
            elif r.shadow.measure_impact:
                fresh = streams(seed)
                self.alone = primary_pool(s, ServiceModel(w, b, fresh.service, speed), fresh, by_id)
        self.pending = _Pending()

    def _pw(self, version):
        return pool_workers(self.s.workers, version.workers, version.service_time)

    def _own(self, version, service: ServiceModel, by_id: bool) -> StreamedPool:
        pool = StreamedPool(self.s.model_copy(update={"workers": self._pw(version)}), service)
        pool.waiting = Horizon(by_id=by_id)
        return pool

    @property
    def fleet(self):
        return self.primary.fleet

    def arriving(self, t_router: np.ndarray) -> tuple[np.ndarray, VersionDrawn]:
        """Each new request's version (0 the primary, 1 the canary) and its draws."""
        n, r, rng = len(t_router), self.r, self.rng
        version = np.zeros(n, dtype=np.int8)
        drawn = VersionDrawn(
            np.zeros(n, dtype=bool), np.full(n, -1, np.int64), np.full(n, -1, np.int64), np.zeros(n, dtype=bool)
        )
        if r.canary is not None:
            users = rng.versions.integers(0, r.users, n)
            version[on_canary(r.canary, users, t_router)] = 1
            on = np.flatnonzero(version == 1)
            picked = self.canary_router.pick(len(on), r.canary.workers)
            if picked is not None:
                drawn.canary_worker[on] = picked
            drawn.error[:] = rng.canary_errors.random(n) < r.canary.error_rate
        if r.shadow is not None:
            drawn.copy[:] = (version == 0) & (rng.shadow_copies.random(n) < r.shadow.percent / 100)
            if not (self.shared and self.routes_itself):
                copies = np.flatnonzero(drawn.copy)
                picked = self.copy_router.pick(len(copies), self.copy_workers)
                if picked is not None:
                    drawn.copy_worker[copies] = picked
        return version, drawn

    def run(self, t, rid, worker, deadline, arrival, version, drawn: VersionDrawn, horizon: float, final: bool):
        """Feed the requests that reach the batching stage (request order: ``t``, ids,
        primary worker, deadline, arrival, version, draws) and run every pool to
        ``horizon``. Returns the settled requests (ids and columns, or None), the primary
        pool's batches, and the chunk's :class:`VersionsPiece`."""
        prim = version == 0
        copy = prim & drawn.copy
        prim_in = (t[prim], rid[prim], sub(worker, prim), sub(deadline, prim))
        ids, settled, pools = [], [], {}
        if self.shared:
            cw = drawn.copy_worker[copy]
            p_in = (
                np.concatenate([t[prim], t[copy]]),
                np.concatenate([rid[prim], rid[copy] + COPY]),
                None if worker is None else np.concatenate([worker[prim], cw]),
                None if deadline is None else np.concatenate([deadline[prim], deadline[copy]]),
            )
        else:
            p_in = prim_in
        if self.r.shadow is not None:
            self.pending.add(rid[copy], arrival[copy], t[copy])
        got, batches = self.primary.run(*p_in, horizon, final)
        copies = None
        if got is not None:
            g_ids, g_served = got
            is_copy = g_ids >= COPY
            if is_copy.any():
                copies = (g_ids[is_copy] - COPY, g_served.take(is_copy))
                g_ids, g_served = g_ids[~is_copy], g_served.take(~is_copy)
            ids.append(g_ids)
            settled.append(g_served)
        if self.shadow is not None:
            got_s, pools["shadow"] = self.shadow.run(
                t[copy], rid[copy], drawn.copy_worker[copy], sub(deadline, copy), horizon, final
            )
            copies = got_s
        if self.canary is not None:
            on = ~prim
            got_c, pools["canary"] = self.canary.run(
                t[on], rid[on], drawn.canary_worker[on], sub(deadline, on), horizon, final
            )
            if got_c is not None:  # its errors: drawn on arrival, applied as they settle (the engine)
                ids.append(got_c[0])
                settled.append(got_c[1])
        alone = None
        if self.alone is not None:
            got_a, _ = self.alone.run(*prim_in, horizon, final)
            if got_a is not None:
                alone = (got_a[0], got_a[1].t_done)
        shadow = None
        if self.r.shadow is not None:
            if copies is None:
                copies = (np.zeros(0, np.int64), Served.empty(0))
            shadow = _copies(*copies, self.pending)
        out = None
        if ids:
            out = (np.concatenate(ids), Served(*(np.concatenate(c) for c in zip(*settled, strict=True))))
        return out, batches, VersionsPiece(pools, shadow, alone)


def _copies(ids: np.ndarray, served: Served, pending: _Pending) -> dict[str, np.ndarray]:
    arrival, t_pre = pending.pop(ids)
    return {
        "request": ids,
        "arrival": arrival,
        "t_preprocessed": t_pre,
        "t_dispatch": served.t_dispatch,
        "t_inferred": served.t_done,
        "outcome": served.outcome,
    }


__all__ = ["COPY", "VersionDrawn", "VersionsPiece", "VersionsPool", "primary_pool"]
