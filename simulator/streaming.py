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

**What it covers:** one version (no canary or shadow), a fixed fleet or one under an
autoscaler with cold starts, failures and the activator (the pools of
:mod:`simulator.serving.streamed`), no traffic classes, no caches, and feature fetches
from an uncontended store.
:func:`unsupported` names what a scenario uses beyond that; such runs keep the
whole-run engine.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from simulator.engine import _per_class, _transfer_ms
from simulator.results.records import Records
from simulator.rng import streams
from simulator.scenario.config import Scenario
from simulator.scenario.distributions import Sampler
from simulator.serving.batcher import Outcome
from simulator.serving.fleet import FleetLog
from simulator.serving.router import Router
from simulator.serving.served import BatchLog
from simulator.serving.streamed import Horizon, StreamedDynamicPool, StreamedPool
from simulator.serving.workers import ServiceModel
from simulator.stages.arrivals import source
from simulator.stages.features import fetch
from simulator.stages.prediction_log import record_ms
from simulator.stages.stations import FcfsStation, Lindley

TARGET_CHUNK_REQUESTS = 250_000  # requests per chunk, by default


def unsupported(s: Scenario) -> str | None:
    """What in ``s`` the streaming engine does not simulate, or None when it covers ``s``."""
    reasons = [
        (bool(s.traffic.classes), "traffic classes"),
        (s.router.canary is not None, "a canary"),
        (s.router.shadow is not None, "a shadow"),
        (s.caches.result is not None or s.caches.feature is not None, "caches"),
        (s.features.store is not None and s.features.lookups_per_request > 0, "a feature store of finite capacity"),
    ]
    found = [why for cond, why in reasons if cond]
    return ", ".join(found) if found else None


def chunk_ms(s: Scenario, requests_per_chunk: int = TARGET_CHUNK_REQUESTS) -> float:
    """A chunk length (ms) holding about ``requests_per_chunk`` arrivals at the peak rate."""
    from simulator.planning.budget import expected_requests

    rate = max(expected_requests(s) / s.duration_s, 1.0)
    return float(min(max(requests_per_chunk / rate * 1000.0, 50.0), 60_000.0))


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
        What to simulate; :func:`unsupported` must be None for it.
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
        self.draw = {
            name: (Sampler(dist, g) if dist is not None else None)
            for name, dist, g in (
                ("in", s.network.client_to_api, rng.network_in),
                ("router", s.router.overhead, rng.router),
                ("pre", s.preprocess.service, rng.preprocess),
                ("post", s.postprocess.service, rng.postprocess),
                ("back", s.network.api_to_client, rng.network_out),
            )
        }
        self.trips = Sampler(s.features.round_trip, rng.features) if s.features.round_trip is not None else None
        self.pay_in = _transfer_ms(_per_class(s.traffic, "payload_kb", None), s.network.bandwidth_gbps)
        self.pay_out = _transfer_ms(_per_class(s.traffic, "response_kb", None), s.network.bandwidth_gbps)
        service = ServiceModel(s.workers, s.batching.max_batch_size, rng.service)
        self.pool = StreamedDynamicPool(s, service, rng) if s.workers.dynamic else StreamedPool(s, service)
        # a dynamic pool routes by itself; a fixed one is routed here, as the whole-run engine does
        self.router = (
            None if s.router.balancing == "shared" or s.workers.dynamic else Router(s.router.balancing, rng.routing)
        )
        self.cpu = FcfsStation(s.preprocess.cpu_workers) if s.preprocess.cpu_workers is not None else None
        self.cpu_wait = Horizon()
        self.log_station = Lindley() if s.logging else None
        self.log_wait = Horizon()
        self.ship_ms = record_ms(s.logging) if s.logging else 0.0
        self.ledger = _Ledger(s.logging is not None)
        self.next_id = 0

    def chunk(self, hi: float, final: bool) -> Piece:
        """Arrivals before ``hi`` through every stage; the requests settled by then."""
        rid, live, failed, t_feat, svc = self._arrive(hi)
        p_id, p_t = self._preprocess(rid, live, t_feat, svc, hi, final)
        ledger = self.ledger
        c = ledger.cols
        rows = p_id - ledger.lo
        c["t_preprocessed"][rows] = p_t
        settled, batches = self.pool.run(p_t, p_id, c["worker"][rows], c["deadline"][rows], hi, final)
        new_rows = [np.flatnonzero(failed) + (rid[0] - ledger.lo if len(rid) else 0)]
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

    def _arrive(self, hi: float):
        """The chunk's arrivals, their draws (in request order, as the whole-run engine makes
        them), the stages nothing contends for, and their rows in the ledger."""
        s = self.s
        t0 = self.arrivals.take(hi)
        n = len(t0)
        rid = np.arange(self.next_id, self.next_id + n, dtype=np.int64)
        self.next_id += n

        def d(name):
            return 0.0 if self.draw[name] is None else self.draw[name].draw(n)

        t_api = t0 + d("in") + self.pay_in
        t_router = t_api + d("router")
        fetched = fetch(s.features, t_router, self.trips)
        failed = fetched.failed
        svc = np.broadcast_to(d("pre"), (n,))
        post = np.broadcast_to(d("post"), (n,)).copy()
        back = np.broadcast_to(d("back"), (n,)) + self.pay_out
        worker = self.router.pick(n, s.workers.count) if self.router is not None else np.zeros(n, dtype=np.int64)
        deadline = t0 + s.batching.deadline_ms if s.batching.deadline_ms is not None else np.zeros(n)
        t_feat = fetched.end.copy()
        nan = np.full(n, np.nan)
        self.ledger.append(
            arrival=t0,
            t_api=t_api,
            t_router=t_router,
            t_features=np.where(failed, np.nan, t_feat),
            t_preprocessed=nan.copy(),
            post=post,
            back=np.asarray(back, dtype=float).copy(),
            t_dispatch=nan.copy(),
            t_inferred=nan.copy(),
            t_dropped=np.where(failed, t_feat, np.nan),
            t_emitted=nan.copy(),
            t_logged=nan.copy(),
            outcome=np.where(failed, np.int8(Outcome.FAILED), np.int8(0)).astype(np.int8),
            degraded=fetched.degraded,
            batch_size=np.zeros(n, dtype=np.int64),
            instance=np.full(n, -1, dtype=np.int64),
            settled=failed.copy(),
            shipped=np.zeros(n, dtype=bool),
            worker=worker,
            deadline=deadline,
        )
        return rid, ~failed, failed, t_feat, svc

    def _preprocess(self, rid, live, t_feat, svc, hi: float, final: bool):
        """Preprocessing: a pure delay, or an FCFS pool of CPU workers (with a horizon).
        The requests that leave it now, and when."""
        if self.cpu is None:
            return rid[live], t_feat[live] + svc[live]
        self.cpu_wait.push(t=t_feat[live], s=np.asarray(svc[live], dtype=float), id=rid[live])
        if self.cpu_wait.cols is None:
            return rid[:0], t_feat[:0]
        r = self.cpu_wait.ready("t", math.inf if final else hi)
        return r["id"], self.cpu.run(r["t"], r["s"])[0] + r["s"]

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


def _records(c: dict[str, np.ndarray]) -> Records:
    """The ledger's columns as records (the engine's arithmetic, for identical times)."""
    n = len(c["arrival"])
    t_post = c["t_inferred"] + c["post"]
    t_resp = t_post + c["back"]
    return Records(
        arrival=c["arrival"],
        t_api=c["t_api"],
        t_router=c["t_router"],
        t_cache=c["t_router"],
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
        result_hit=np.zeros(n, dtype=bool),
        feature_hit=np.zeros(n, dtype=bool),
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


STREAM_ABOVE_REQUESTS = 5_000_000  # "auto" streams runs expected to be larger than this


def prefer_streaming(s: Scenario) -> bool:
    """Whether ``engine="auto"`` streams ``s``: the streaming engine covers it and the run
    is large (over :data:`STREAM_ABOVE_REQUESTS` arrivals, about 1.2 GB held whole).
    Smaller runs keep the whole-run engine and its exact percentiles."""
    from simulator.planning.budget import expected_requests

    return unsupported(s) is None and expected_requests(s) > STREAM_ABOVE_REQUESTS


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
        What to simulate (:func:`unsupported` must be None).
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
