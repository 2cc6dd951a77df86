"""The streaming engine: the model of :mod:`simulator.engine`, in time chunks, in bounded memory.

:func:`simulate` holds every request of a run; an hour of a 200k req/s platform would need
tens of GB. :func:`stream` simulates the same model chunk by chunk of arrival time and
hands out each request's record once it is settled, so a caller can reduce the records
(:class:`simulator.results.reduce.Reduction`) or write them out, and drop them.

**Exact carry-over.** Every stage keeps its state from one chunk to the next: the arrival
source's blocks, each random stream (a request's draws are made in request order when it
arrives, as the whole-run engine makes them), the FCFS stations' free times and Lindley
sums, a fixed pool's compiled batch queues (:mod:`simulator.serving.compiled`) with their
instances, and a dynamic pool's SimPy environment with its batch queues, schedulers and
batches in flight.
Any request arriving after time H reaches every stage after H (delays are never
negative), so an order-dependent stage processes, in each chunk, exactly its inputs
earlier than the chunk's end H and keeps the rest for the next: a *horizon*. The batch
queues are told that every arrival before H is known, and the environment runs to H. A
request's record is the same, bit for bit, as the whole-run engine's on the same seed
(``tests/test_streaming.py`` checks it request for request on every supported scenario).

**Caches.** A cache's hits depend on the order of all lookups, so each cache is a stage
with a horizon too (:class:`_CacheStage`): lookups before the chunk's end are replayed in
time order against the contents carried from the last chunk. Every request draws its key,
its hit and miss latencies and its feature round trips when it arrives, looked up or not
(the whole-run engine draws them the same way), so a request's draws do not depend on
which others hit.

**What it covers:** one version (no canary or shadow), a fixed fleet or one under an
autoscaler with cold starts, failures and the activator (the pools of
:mod:`simulator.serving.streamed`), result and feature caches, the host's speed
(``platform.speed``: its paths are drawn for the whole run up front, a few bytes per step),
no traffic classes, and feature fetches from an uncontended store.
:func:`~simulator.chunks.unsupported` names what a scenario uses beyond that; such runs keep the
whole-run engine.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from simulator.chunks import chunk_ms, unsupported
from simulator.ledger import BatchLog, Outcome
from simulator.results.records import Records
from simulator.rng import streams
from simulator.scenario.config import Cache, Scenario
from simulator.scenario.distributions import Sampler
from simulator.serving.fleet import FleetLog
from simulator.serving.router import Router
from simulator.serving.streamed import Horizon, StreamedDynamicPool, StreamedPool
from simulator.serving.workers import ServiceModel
from simulator.stages.arrivals import source
from simulator.stages.caches import CacheDraws, CacheState, cache_done
from simulator.stages.features import Fetched, fetch, fetch_drawn, trips
from simulator.stages.network import Network
from simulator.stages.postprocess import Postprocessing
from simulator.stages.prediction_log import record_ms
from simulator.stages.preprocess import Preprocessing
from simulator.stages.router import RouterStage
from simulator.stages.speed import SpeedProcess
from simulator.stages.stations import Lindley


@dataclass
class Piece:
    """What one chunk of the run settled: records of requests ``first`` … (in request
    order, a contiguous run of ids), and the batches that started."""

    first: int  # id (arrival index) of the first record
    records: Records
    batches: BatchLog
    watermark_ms: float  # every later record's times are at or after this
    horizon_ms: float  # arrivals before this have been simulated
    fleet: FleetLog | None = None  # a dynamic pool's workers and events, with the last piece


class _Ledger:
    """Per-request columns of the requests not handed out yet: ids ``lo`` … ``lo + len``."""

    def __init__(self, logging: bool):
        self.lo = 0
        self.cols: dict[str, np.ndarray] = {}
        self.logging = logging

    def __len__(self) -> int:
        return len(self.cols["arrival"]) if self.cols else 0

    def append(self, **cols: np.ndarray) -> None:
        if not self.cols:
            self.cols = cols
        else:
            self.cols = {k: np.concatenate([self.cols[k], cols[k]]) for k in self.cols}

    def settle(self, rid: np.ndarray, served: dict[str, np.ndarray]) -> np.ndarray:
        """Record the serving columns of requests ``rid``; returns their rows."""
        row = rid - self.lo
        c = self.cols
        c["t_dispatch"][row] = served["t_dispatch"]
        c["t_inferred"][row] = served["t_done"]
        c["batch_size"][row] = served["batch_size"]
        c["instance"][row] = served["instance"]
        c["outcome"][row] = served["outcome"]
        c["t_dropped"][row] = served["t_dropped"]
        c["settled"][row] = True
        return row

    def hand_out(self) -> tuple[int, dict[str, np.ndarray]]:
        """The settled (and, with logging, shipped) requests at the front, removed."""
        c = self.cols
        done = c["settled"] & (c["shipped"] if self.logging else True)
        k = int(np.argmin(done)) if not done.all() else len(done)
        first = self.lo
        out = {name: v[:k] for name, v in c.items()}
        self.cols = {name: v[k:] for name, v in c.items()}
        self.lo += k
        return first, out


def stream(
    scenario: Scenario,
    *,
    seed: int | None = None,
    chunk_s: float | None = None,
    progress: Callable[[float], None] | None = None,
) -> Iterator[Piece]:
    """Simulate ``scenario`` chunk by chunk; yields each chunk's settled records.

    Parameters
    ----------
    scenario : Scenario
        What to simulate; :func:`~simulator.chunks.unsupported` must be None for it.
    seed : int, optional
        Overrides ``scenario.seed``; the same streams as :func:`simulator.simulate`.
    chunk_s : float, optional
        Simulated seconds of arrivals per chunk (default: about 250,000 arrivals).
    progress : callable, optional
        Called with the simulated time reached (s) after each chunk.

    Yields
    ------
    Piece
        The records settled in the chunk (a contiguous run of request ids, in order) and
        the batches started. Concatenated, the pieces' records equal
        ``simulate(scenario, seed=seed).records``.
    """
    why = unsupported(scenario)
    if why is not None:
        raise ValueError(f"the streaming engine does not simulate {why}")
    step = chunk_ms(scenario) if chunk_s is None else chunk_s * 1000.0
    if step <= 0:
        raise ValueError("chunk_s must be positive")
    run = _Run(scenario, scenario.seed if seed is None else seed)
    end_ms = scenario.duration_s * 1000.0
    lo = 0.0
    while True:
        hi = min(lo + step, end_ms)
        final = hi >= end_ms
        yield run.chunk(hi, final)
        if progress is not None:
            progress(hi / 1000.0)
        if final:
            return
        lo = hi


class _Run:
    """One streamed run's state between chunks: the arrival source, one sampler per stage,
    the stations with their horizons, the pool, and the ledger of unsettled requests."""

    def __init__(self, s: Scenario, seed: int):
        self.s = s
        rng = streams(seed)
        self.arrivals = source(s.traffic, s.duration_s * 1000.0, rng=rng.arrivals)
        # the stages of the request path, as the whole-run engine calls them
        speed = None if s.platform.speed is None else SpeedProcess(s.platform.speed, s.duration_s * 1000.0, rng.speed)
        self.network = Network(s, rng)
        self.router_stage = RouterStage(s, rng)
        self.pre = Preprocessing(s, rng, None if speed is None else speed.frontend)
        self.post = Postprocessing(s, rng)
        self.trips = Sampler(s.features.round_trip, rng.features) if s.features.round_trip is not None else None
        service = ServiceModel(s.workers, s.batching.max_batch_size, rng.service, speed)
        self.pool = StreamedDynamicPool(s, service, rng) if s.workers.dynamic else StreamedPool(s, service)
        # a dynamic pool routes by itself; a fixed one is routed here, as the whole-run engine does
        self.router = (
            None if s.router.balancing == "shared" or s.workers.dynamic else Router(s.router.balancing, rng.routing)
        )
        self.caches = {
            name: _CacheStage(cfg, g)
            for name, cfg, g in (
                ("result", s.caches.result, rng.result_cache),
                ("feature", s.caches.feature, rng.feature_cache),
            )
            if cfg is not None
        }
        # past a cache, requests reach the later stages out of request order: ties by id
        tie = "id" if self.caches else None
        self.pool.waiting = Horizon(tie)
        self.cpu_wait = Horizon(tie)
        self.log_station = Lindley() if s.logging else None
        self.log_wait = Horizon()
        self.ship_ms = record_ms(s.logging) if s.logging else 0.0
        self.ledger = _Ledger(s.logging is not None)
        self.next_id = 0

    def chunk(self, hi: float, final: bool) -> Piece:
        """Arrivals before ``hi`` through every stage; the requests settled by then."""
        done_ids, f_id, f_t, failed = self._arrive(hi, final)
        ledger = self.ledger
        c = ledger.cols
        live = ~failed
        p_id, p_t = self._preprocess(f_id[live], f_t[live], c["svc"][f_id[live] - ledger.lo], hi, final)
        rows = p_id - ledger.lo
        c["t_preprocessed"][rows] = p_t
        settled, batches = self.pool.run(p_t, p_id, c["worker"][rows], c["deadline"][rows], hi, final)
        new_rows = [done_ids - ledger.lo, f_id[failed] - ledger.lo]
        if settled is not None:
            new_rows.append(ledger.settle(*settled))
        rows = np.concatenate(new_rows).astype(np.int64)
        c["t_emitted"][rows] = np.where(
            c["outcome"][rows] == Outcome.COMPLETED,
            c["t_inferred"][rows] + c["post"][rows] + c["back"][rows],
            c["t_dropped"][rows],
        )
        if self.log_station is not None:
            self._ship(rows, hi, final)
        first, cols = ledger.hand_out()
        watermark = hi if not len(ledger) else min(hi, float(ledger.cols["arrival"].min()))
        fleet = self.pool.fleet if final and self.s.workers.dynamic else None
        return Piece(first, _records(cols), batches, math.inf if final else watermark, hi, fleet)

    def _arrive(self, hi: float, final: bool):
        """The chunk's arrivals and their draws (in request order, as the whole-run engine
        makes them) into the ledger, then the caches and the feature stage for the
        requests that reach them before ``hi``. Returns the ids of the requests served from
        the result cache, and of those past the feature stage (when, and whether they
        failed)."""
        s = self.s
        t0 = self.arrivals.take(hi)
        n = len(t0)
        rid = np.arange(self.next_id, self.next_id + n, dtype=np.int64)
        self.next_id += n

        t_api = self.network.inbound(t0)
        t_router = self.router_stage.leave(t_api)
        post = np.broadcast_to(self.post.draw(n), (n,)).copy()
        back = np.broadcast_to(self.network.back_ms(n), (n,))
        worker = self.router.pick(n, s.workers.count) if self.router is not None else np.zeros(n, dtype=np.int64)
        deadline = t0 + s.batching.deadline_ms if s.batching.deadline_ms is not None else np.zeros(n)
        nan = np.full(n, np.nan)
        cached = {}
        for name, cache in self.caches.items():
            cached[name], cached[name + "_hit_ms"], cached[name + "_miss_ms"] = cache.draws(n)
        if self.caches:  # the round trips of every request, used once it passes the caches
            cached["trips"] = trips(s.features, self.trips, n)
        self.ledger.append(
            arrival=t0,
            t_api=t_api,
            t_router=t_router,
            t_cache=t_router.copy(),
            t_features=nan.copy(),
            t_preprocessed=nan.copy(),
            svc=np.asarray(self.pre.draw(n), dtype=float),
            post=post,
            back=np.asarray(back, dtype=float).copy(),
            t_dispatch=nan.copy(),
            t_inferred=nan.copy(),
            t_dropped=nan.copy(),
            t_emitted=nan.copy(),
            t_logged=nan.copy(),
            outcome=np.zeros(n, dtype=np.int8),
            degraded=np.zeros(n, dtype=bool),
            result_hit=np.zeros(n, dtype=bool),
            feature_hit=np.zeros(n, dtype=bool),
            batch_size=np.zeros(n, dtype=np.int64),
            instance=np.full(n, -1, dtype=np.int64),
            settled=np.zeros(n, dtype=bool),
            shipped=np.zeros(n, dtype=bool),
            worker=worker,
            deadline=deadline,
            **cached,
        )
        if not self.caches:  # every arrival reaches the feature stage now, in request order
            return rid[:0], *self._features(rid, t_router, fetch(s.features, t_router, self.trips))
        horizon = math.inf if final else hi
        ledger = self.ledger
        c = ledger.cols
        served_ids = rid[:0]
        f_id, f_t = rid, t_router
        if "result" in self.caches:
            f_id, f_t, hit = self.caches["result"].resolve(ledger, "result", rid, t_router, horizon)
            rows = f_id - ledger.lo
            c["t_cache"][rows] = f_t
            served_ids = f_id[hit]
            r = rows[hit]  # served from the result cache: no time in the later stages
            for col in ("t_features", "t_preprocessed", "t_dispatch", "t_inferred"):
                c[col][r] = f_t[hit]
            c["result_hit"][r] = True
            c["settled"][r] = True
            f_id, f_t = f_id[~hit], f_t[~hit]
        go = np.ones(len(f_id), dtype=bool)
        if "feature" in self.caches:
            f_id, f_t, hit = self.caches["feature"].resolve(ledger, "feature", f_id, f_t, horizon)
            c["feature_hit"][f_id - ledger.lo] = hit
            go = ~hit
        lat = c["trips"][f_id - ledger.lo][go]
        fetched = fetch_drawn(s.features, f_t[go], lat)
        end, degraded, failed = f_t.copy(), np.zeros(len(f_id), dtype=bool), np.zeros(len(f_id), dtype=bool)
        end[go], degraded[go], failed[go] = fetched
        return served_ids, *self._features(f_id, f_t, Fetched(end, degraded, failed))

    def _features(self, ids: np.ndarray, start: np.ndarray, fetched: Fetched):
        """Write the feature stage's columns of requests ``ids``; returns the ids, when
        their stage ended and whether they failed (those are settled: they go no further)."""
        c = self.ledger.cols
        rows = ids - self.ledger.lo
        failed = fetched.failed
        c["t_features"][rows] = np.where(failed, np.nan, fetched.end)
        c["degraded"][rows] = fetched.degraded
        f = rows[failed]
        c["t_dropped"][f] = fetched.end[failed]
        c["outcome"][f] = Outcome.FAILED
        c["settled"][f] = True
        return ids, fetched.end, failed

    def _preprocess(self, ids, t_feat, svc, hi: float, final: bool):
        """Preprocessing: a pure delay, or an FCFS pool of CPU workers (with a horizon).
        The requests that leave it now, and when."""
        if self.pre.station is None:
            return ids, self.pre.leave_sorted(t_feat, svc)
        self.cpu_wait.push(t=t_feat, s=np.asarray(svc, dtype=float), id=ids)
        if self.cpu_wait.cols is None:
            return ids[:0], t_feat[:0]
        r = self.cpu_wait.ready("t", math.inf if final else hi)
        return r["id"], self.pre.leave_sorted(r["t"], r["s"])

    def _ship(self, rows: np.ndarray, hi: float, final: bool) -> None:
        """The prediction log: records of the requests settled now join its FCFS pipeline,
        which ships those emitted before any unsettled request could emit."""
        ledger = self.ledger
        c = ledger.cols
        self.log_wait.push(t=c["t_emitted"][rows], id=rows + ledger.lo)
        open_rows = ~c["settled"]
        bound = hi if not open_rows.any() else min(hi, float(c["arrival"][open_rows].min()))
        if self.log_wait.cols is None:
            return
        r = self.log_wait.ready("t", math.inf if final else bound)
        if len(r["t"]):
            shipped = self.log_station.run(r["t"], np.full(len(r["t"]), self.ship_ms)) + self.ship_ms
            c["t_logged"][r["id"] - ledger.lo] = shipped
            c["shipped"][r["id"] - ledger.lo] = True


class _CacheStage:
    """A cache on the streamed path: its contents carried between chunks, and the lookups
    waiting for their turn (a :class:`Horizon`: they are replayed in time order)."""

    def __init__(self, cfg: Cache, rng: np.random.Generator):
        self.draws = CacheDraws(cfg, rng)
        self.state = CacheState(cfg)
        self.wait = Horizon(tie="id")

    def resolve(self, ledger: _Ledger, name: str, ids: np.ndarray, t: np.ndarray, horizon: float):
        """Lookups of requests ``ids`` at ``t`` join those waiting; those before
        ``horizon`` are looked up now, in time order: their ids, when done, and hits."""
        self.wait.push(t=t, id=ids)
        r = self.wait.ready("t", horizon)
        rows = r["id"] - ledger.lo
        c = ledger.cols
        hit = self.state.resolve(r["t"], c[name][rows])
        return r["id"], cache_done(r["t"], hit, c[name + "_hit_ms"][rows], c[name + "_miss_ms"][rows], slice(None)), hit


def _records(c: dict[str, np.ndarray]) -> Records:
    """The ledger's columns as records (the engine's arithmetic, for identical times)."""
    n = len(c["arrival"])
    t_post = c["t_inferred"] + c["post"]
    t_resp = t_post + c["back"]
    return Records(
        arrival=c["arrival"],
        t_api=c["t_api"],
        t_router=c["t_router"],
        t_cache=c["t_cache"],
        t_features=c["t_features"],
        t_preprocessed=c["t_preprocessed"],
        t_dispatch=c["t_dispatch"],
        t_inferred=c["t_inferred"],
        t_postprocessed=t_post,
        t_response=t_resp,
        t_dropped=c["t_dropped"],
        t_logged=c["t_logged"],
        outcome=c["outcome"],
        degraded=c["degraded"],
        result_hit=c["result_hit"],
        feature_hit=c["feature_hit"],
        batch_size=c["batch_size"],
        instance=c["instance"],
        version=np.zeros(n, dtype=np.int8),
        traffic_class=np.zeros(n, dtype=np.int8),
    )


def simulate_streaming(scenario: Scenario, *, seed: int | None = None, chunk_s: float | None = None):
    """All of a streamed run's records at once, as :func:`simulator.simulate` returns them
    (for checks on runs small enough to keep): ``(Records, BatchLog, wall_s)``."""
    wall0 = time.perf_counter()
    pieces = list(stream(scenario, seed=seed, chunk_s=chunk_s))
    fields_ = [f for f in Records.__dataclass_fields__]
    records = Records(*(np.concatenate([getattr(p.records, f) for p in pieces]) for f in fields_))
    log = BatchLog(
        *(np.concatenate([getattr(p.batches, f) for p in pieces]) for f in ("start", "end", "size", "instance"))
    )
    return records, log, time.perf_counter() - wall0


def summarize_stream(
    scenario: Scenario,
    *,
    seed: int | None = None,
    interval_s: float = 1.0,
    chunk_s: float | None = None,
    on_piece: Callable[[Piece], None] | None = None,
    progress: Callable[[float], None] | None = None,
    e2e_sketch=None,
):
    """Stream ``scenario`` and reduce it: the run's summary, in bounded memory.

    Parameters
    ----------
    scenario : Scenario
        What to simulate (:func:`~simulator.chunks.unsupported` must be None).
    seed : int, optional
        Overrides ``scenario.seed``.
    interval_s : float
        Width of the timeline's intervals, s.
    chunk_s : float, optional
        Simulated seconds per chunk (default: about 250,000 arrivals).
    on_piece : callable, optional
        Called with each :class:`Piece` before it is dropped (``--records`` writes it).
    progress : callable, optional
        Called with the simulated time reached (s) after each chunk.
    e2e_sketch : LatencySketch, optional
        Takes the end-to-end latencies of the window's completed requests (merged in), to
        pool them across replications.

    Notes
    -----
    Each piece is handed to ``on_piece`` and reduced on a second thread while the next
    chunk is simulated (numpy and the compiled loops release the GIL), one piece at a
    time and in order, so the summary is the same as a sequential reduction's. On the
    two-core machines of ``benchmarks/README.md`` that takes a quarter off the wall time.

    Returns
    -------
    Summary
        As :func:`simulator.summarize` returns it; latency percentiles from mergeable
        sketches (within 0.5% of the exact rank value), counts and timeline exact.
    """
    from simulator.results.reduce import Reduction

    wall0 = time.perf_counter()
    seed = scenario.seed if seed is None else seed
    reduction = Reduction(scenario, seed, interval_s=interval_s)

    def take(piece: Piece) -> None:
        if on_piece is not None:
            on_piece(piece)
        reduction.add(piece.records, piece.batches, piece.watermark_ms)

    fleet = None
    # a piece is written and reduced on a second thread while the next chunk is simulated
    # (numpy and the compiled loops release the GIL); pieces are taken one by one, in order
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="servesim-reduce") as pipeline:
        pending = None
        for piece in stream(scenario, seed=seed, chunk_s=chunk_s, progress=progress):
            if pending is not None:
                pending.result()
            pending = pipeline.submit(take, piece)
            fleet = piece.fleet or fleet
        if pending is not None:
            pending.result()
    if e2e_sketch is not None:
        e2e_sketch.merge(reduction.e2e)
    return reduction.summary(time.perf_counter() - wall0, fleet)
