"""Wiring and run loop: scenario + seed → per-request records.

Stages run in request order, each from the previous stage's output times:

    arrivals → network in → router → result cache → features (feature cache, KV store)
             → preprocess → batching queue → GPU workers → postprocess → network out
             (→ prediction log, off the response path)

Delays nothing contends for are drawn in bulk. The CPU pool is an exact FCFS
recursion. The KV store, when it has finite capacity, and the batcher with its workers
are simulated with SimPy, with events per round trip and per batch
(:mod:`simulator.serving.dispatch`: fixed pools, versions, and the dynamic fleet of
:mod:`simulator.serving.pool`). A result-cache hit skips to postprocessing; a failed feature
fetch ends the request there.

Every random stream derives from the one seed (:mod:`simulator.rng`), one stream per
stage, so variants of a scenario share their random inputs (common random numbers).
"""

from __future__ import annotations

import time

import numpy as np

from simulator.ledger import Outcome, Served
from simulator.results.records import Records
from simulator.results.run import Run
from simulator.rng import STREAMS, Streams, streams
from simulator.scenario.config import Scenario
from simulator.serving.classes import serve_by_class
from simulator.serving.dispatch import assign_workers, serve_versions
from simulator.serving.event_loop import serve_on_loop
from simulator.serving.served import ServingLog
from simulator.serving.workers import ServiceModel
from simulator.stages.arrivals import arrivals as make_arrivals
from simulator.stages.caches import look_up
from simulator.stages.features import feature_stage
from simulator.stages.network import Network
from simulator.stages.postprocess import Postprocessing
from simulator.stages.prediction_log import ship
from simulator.stages.preprocess import Preprocessing
from simulator.stages.router import RouterStage
from simulator.stages.speed import SpeedProcess


def _serve(
    s: Scenario,
    seed: int,
    t_router: np.ndarray,
    t_pre: np.ndarray,
    t_feat: np.ndarray,
    klass,
    live,
    deadlines,
    rng,
    speed: SpeedProcess | None = None,
) -> tuple[Served, ServingLog]:
    """Batching and the GPU pools, for the ``live`` requests (not served from the result cache,
    features fetched): every request's serving columns, and the rest of what serving leaves.
    ``deadlines``: each request's end-to-end deadline (with ``batching.deadline_ms``), or None."""
    n = len(t_pre)
    everyone = bool(live.all())
    live_idx = np.arange(n) if everyone else np.flatnonzero(live)
    # a dynamic pool routes by itself, from the same stream, at each epoch
    assign = None if s.workers.dynamic and not s.traffic.classes else assign_workers(s, n, rng.routing)
    if s.traffic.classes:
        classes = serve_by_class(
            s.traffic.classes,
            s.workers,
            s.batching,
            s.router,
            t_pre[live_idx],
            klass[live_idx],
            None if assign is None else assign[live_idx],
            rng,
            None if deadlines is None else deadlines[live_idx],
            speed,
        )
        on_pool = classes.served
        rest = ServingLog(np.zeros(n, np.int8), classes.batches, classes.pools, None, None, None)
    else:
        service = ServiceModel(s.workers, s.batching.max_batch_size, rng.service, speed)
        versions = serve_versions(
            s.router, s.workers, s.batching, seed, t_router, t_pre, live_idx, assign, service, rng, deadlines
        )
        live_idx, on_pool, rest = versions.idx, versions.served, versions.log
    if everyone and len(live_idx) == n and np.array_equal(live_idx, np.arange(n)):
        return on_pool, rest
    # requests served from the result cache take zero time in the later stages
    pooled = Served.empty(n)._replace(t_dispatch=t_feat.copy(), t_done=t_feat.copy())
    pooled.scatter(live_idx, on_pool)
    return pooled, rest


def _on_loop(
    s: Scenario, t_feat: np.ndarray, live: np.ndarray, rng: Streams, speed: SpeedProcess | None
) -> tuple[np.ndarray, Served, ServingLog, np.ndarray]:
    """The front end as one event loop with its batch queue and instances
    (``preprocess.event_loop``, :mod:`simulator.serving.event_loop`), for the ``live``
    requests: when each was queued, the serving columns, the log, and when each was
    answered (the others keep their feature-stage time, as served from the cache)."""
    n = len(t_feat)
    cost = Preprocessing(s, rng).draw(n)  # one draw per request
    service = ServiceModel(s.workers, s.batching.max_batch_size, rng.service, speed).feed(0)
    idx = np.flatnonzero(live)
    t_enq, served, log, t_resp = serve_on_loop(
        t_feat[idx],
        cost[idx],
        s.preprocess.event_loop,
        s.batching,
        s.workers.count * s.workers.instances,
        service,
        None if speed is None else speed.frontend,
    )
    t_pre, answered = t_feat.copy(), t_feat.copy()
    t_pre[idx], answered[idx] = t_enq, t_resp
    pooled = Served.empty(n)._replace(t_dispatch=t_feat.copy(), t_done=t_feat.copy())
    pooled.scatter(idx, served)
    serving = ServingLog(np.zeros(n, np.int8), log, {}, None, None, None)
    return t_pre, pooled, serving, answered


def simulate(scenario: Scenario, *, seed: int | None = None) -> Run:
    """Run one scenario.

    Parameters
    ----------
    scenario : Scenario
        What to simulate (see :func:`simulator.load_scenario`).
    seed : int, optional
        Overrides ``scenario.seed``. Every random draw flows from it through one
        ``numpy.random.Generator`` stream per purpose (:class:`simulator.rng.Streams`), so
        the same scenario and seed give identical records on any machine.

    Returns
    -------
    Run
        The per-request records (times in ms from the start of the run), the batch log,
        and what else the run left (fleet log, extra pools, shadow copies).
    """
    wall0 = time.perf_counter()
    seed = scenario.seed if seed is None else seed
    rng = streams(seed)
    s = scenario
    t0, klass = make_arrivals(s.traffic, s.duration_s * 1000.0, rng=rng.arrivals)
    n = len(t0)
    network = Network(s, rng)
    t_api = network.inbound(t0, klass)
    t_router = RouterStage(s, rng).leave(t_api)
    # result cache: a hit skips features, preprocessing and the model
    result_hit, t_cache = look_up(s.caches.result, t_router, rng.result_cache)
    need = ~result_hit
    speed = None if s.platform.speed is None else SpeedProcess(s.platform.speed, s.duration_s * 1000.0, rng.speed)
    front = None if speed is None else speed.frontend
    t_feat, degraded, failed, feature_hit = feature_stage(s.features, s.caches.feature, t_cache, need, rng, front)
    live = need & ~failed
    if s.preprocess.event_loop is None:
        pre = Preprocessing(s, rng, front)
        t_pre = pre.leave(t_feat, pre.draw(n), live)
        deadlines = None if s.batching.deadline_ms is None else t0 + s.batching.deadline_ms
        pooled, serving = _serve(s, seed, t_router, t_pre, t_feat, klass, live, deadlines, rng, speed)
        t_answered = pooled.t_done
    else:
        t_pre, pooled, serving, t_answered = _on_loop(s, t_feat, live, rng, speed)
    if failed.any():  # they gave up on their features and go no further
        pooled.outcome[failed] = Outcome.FAILED
        pooled.t_dropped[failed] = t_feat[failed]
        for column in (t_feat, t_pre, pooled.t_dispatch, pooled.t_done):
            column[failed] = np.nan
        t_answered[failed] = np.nan

    post = Postprocessing(s, rng).draw(n)
    back = network.back_ms(n, klass)
    t_post = t_answered + post
    t_resp = t_post + back
    counterfactual = serving.counterfactual
    if counterfactual is not None:  # primary responses had the shadow not shared their queues
        counterfactual = counterfactual + post + back
    if s.logging:  # each request is logged when it ends: with its response, or when it was dropped
        t_logged = ship(s.logging, np.where(np.isnan(t_resp), pooled.t_dropped, t_resp))
    else:
        t_logged = np.full(n, np.nan)
    records = Records(
        arrival=t0,
        t_api=t_api,
        t_router=t_router,
        t_cache=t_cache,
        t_features=t_feat,
        t_preprocessed=t_pre,
        t_dispatch=pooled.t_dispatch,
        t_inferred=pooled.t_done,
        t_postprocessed=t_post,
        t_response=t_resp,
        t_dropped=pooled.t_dropped,
        t_logged=t_logged,
        outcome=pooled.outcome,
        degraded=degraded,
        result_hit=result_hit,
        feature_hit=feature_hit,
        batch_size=pooled.batch_size,
        instance=pooled.instance,
        version=serving.version,
        traffic_class=klass,
    )
    return Run(
        scenario=s,
        seed=seed,
        records=records,
        batches=serving.batches,
        wall_s=time.perf_counter() - wall0,
        fleet=serving.fleet,
        pools=serving.pools,
        shadow=serving.shadow,
        response_without_shadow=counterfactual,
    )


__all__ = ["STREAMS", "Outcome", "Run", "simulate", "streams"]
