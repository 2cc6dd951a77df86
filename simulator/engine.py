"""The engine: scenario + seed → per-request records, along one request path.

    arrivals → network in → router → result cache → features (feature cache, KV store)
             → preprocess → batching queue → GPU workers → postprocess → network out
             (→ prediction log, off the response path)

The path is written once and runs in chunks of arrival time (:func:`stream`); a whole
run (:func:`simulate`) is one chunk. Each stage is an object of :mod:`simulator.stages`
or :mod:`simulator.serving`, built from the scenario and its random streams; it draws
each request's inputs in request order when the request arrives, and keeps its state
from one chunk to the next: the arrival sources, each random stream, the FCFS stations'
free times and Lindley sums, the caches' contents, the batch queues with their batches in
flight (a fixed pool's compiled, :mod:`simulator.serving.compiled`; a dynamic pool's in
SimPy), the autoscaler's fleet. Every random stream derives from the one seed
(:mod:`simulator.rng`), one stream per stage, so variants of a scenario share their
random inputs (common random numbers), and a request's record is the same, bit for bit,
for any chunk length (``tests/test_streaming.py``).

**Closed loops.** Where a conversation's next turn waits for the answer before it
(``turn_gap_from: answer``) the arrivals depend on what the chunk computes: :meth:`_Run.reach`
ends a chunk before any turn not known yet could arrive, and the answers settled in a
chunk release the next turns (:class:`~simulator.stages.closed_loop.ClosedLoop`). Such a run is
cut so even when it is simulated whole.

**Horizons.** Any request arriving after time H reaches every stage after H (delays are
never negative), so an order-dependent stage processes, in each chunk, exactly its inputs
earlier than the chunk's end H and keeps the rest for the next
(:class:`~simulator.serving.streamed.Horizon`). The batch queues are told that every
arrival before H is known, and the SimPy environment runs to H. A cache's hits depend on
the order of all lookups, so a cache is a stage with a horizon too (:mod:`simulator.front`).

**The ledger** (:class:`~simulator.columns.Ledger`) holds the typed columns of the
requests not handed out yet; a request is handed out once it is settled (served, dropped,
or answered from the result cache) and, with a prediction log, shipped.

**Every stage runs chunk by chunk**, its state carried to the next chunk: a canary's and a
shadow's pools (:class:`~simulator.serving.versions.VersionsPool`), the traffic classes'
(:class:`~simulator.serving.classes.ClassesPool`), a feature store of finite capacity
(:class:`~simulator.stages.features.Store`) and the front end's event loop
(:class:`~simulator.serving.event_loop.Loop`). Which of these serve a run is decided in
:mod:`simulator.back`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

import numpy as np

from simulator.back import serving_of
from simulator.chunks import chunk_ms
from simulator.columns import Columns, Ledger, rows_of
from simulator.front import Front
from simulator.ledger import BatchLog, Outcome, Served, concat_logs
from simulator.pieces import Piece, concat_records, gather
from simulator.results.run import Run
from simulator.rng import STREAMS, Streams, streams
from simulator.scenario.config import Scenario
from simulator.serving.continuous import Replicas
from simulator.serving.served import TokensServed
from simulator.serving.streamed import Horizon
from simulator.stages.arrivals import Arrivals
from simulator.stages.network import Network
from simulator.stages.postprocess import Postprocessing
from simulator.stages.prediction_log import record_ms
from simulator.stages.preprocess import Preprocessing
from simulator.stages.router import RouterStage
from simulator.stages.speed import SpeedProcess
from simulator.stages.stations import Lindley
from simulator.stages.tokens import TokenDraws


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
        What to simulate.
    seed : int, optional
        Overrides ``scenario.seed``; the same streams as :func:`simulate`.
    chunk_s : float, optional
        Simulated seconds of arrivals per chunk (default: about 250,000 arrivals).
    progress : callable, optional
        Called with the simulated time reached (s) after each chunk.

    Yields
    ------
    Piece
        The records settled in the chunk (a contiguous run of request ids, in order) and
        the batches that started. Concatenated, the pieces' records equal
        ``simulate(scenario, seed=seed).records`` for any chunk length.
    """
    step = chunk_ms(scenario) if chunk_s is None else chunk_s * 1000.0
    if step <= 0:
        raise ValueError("chunk_s must be positive")
    run = _Run(scenario, scenario.seed if seed is None else seed)
    end_ms = scenario.duration_s * 1000.0
    lo = 0.0
    while True:
        hi = run.reach(lo, min(lo + step, end_ms))
        if hi <= lo:  # a closed loop's bound that cannot move: a bug, never a hang
            raise RuntimeError(f"a chunk from {lo} ms cannot end after it: the closed loop's bounds are stuck")
        final = hi >= end_ms
        yield run.chunk(hi, final)
        if progress is not None:
            progress(hi / 1000.0)
        if final:
            return
        lo = hi


def simulate(scenario: Scenario, *, seed: int | None = None) -> Run:
    """Run one scenario, whole: the request path of :func:`stream` in one chunk.

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
    pieces = list(stream(scenario, seed=seed, chunk_s=scenario.duration_s))
    records = pieces[0].records if len(pieces) == 1 else concat_records([p.records for p in pieces])
    pools, shadow, counterfactual = gather(pieces)
    return Run(
        scenario=scenario,
        seed=seed,
        records=records,
        batches=concat_logs([p.batches for p in pieces]),
        wall_s=time.perf_counter() - wall0,
        fleet=pieces[-1].fleet,
        pools=pools,
        shadow=shadow,
        response_without_shadow=counterfactual,
    )


class _Run:
    """One run's state between chunks: the arrival sources, the stages with their streams
    and horizons, the pool, and the ledger of requests not handed out yet."""

    def __init__(self, s: Scenario, seed: int):
        self.s, self.seed = s, seed
        self.rng = rng = streams(seed)
        self.tokens = TokenDraws(s, rng) if s.traffic.tokens is not None else None
        self.closed = None  # sessions whose turns wait for their answers
        if self.tokens is not None and self.tokens.sessions is not None:  # the sessions' turns arrive
            self.arrivals = self.tokens
            self.closed = self.tokens.sessions.closed
        else:
            self.arrivals = Arrivals(s.traffic, s.duration_s * 1000.0, rng=rng.arrivals)
        self.speed = speed = (
            None if s.platform.speed is None else SpeedProcess(s.platform.speed, s.duration_s * 1000.0, rng.speed)
        )
        self.network = Network(s, rng)
        self.router_stage = RouterStage(s, rng)
        self.pre = Preprocessing(s, rng, None if speed is None else speed.frontend)
        self.post = Postprocessing(s, rng)
        self.front = Front(s, rng, speed)  # the caches and the feature stage
        by_id = self.front.by_id  # past a cache, requests reach the later stages out of request order
        serving = serving_of(s, seed, rng, speed, by_id)
        self.loop, self.pool, self.router = serving.loop, serving.pool, serving.router
        self.versions, self.classes = serving.versions, serving.classes
        self.impact = self.versions is not None and self.versions.alone is not None
        self.cpu_wait = Horizon(by_id=by_id)
        self.hub_wait = Horizon(by_id=True)  # requests leave the pool out of order
        self.log_station = Lindley() if s.logging else None
        self.log_wait = Horizon()
        self.ship_ms = record_ms(s.logging) if s.logging else 0.0
        self.ledger = Ledger(logging=s.logging is not None)
        self.next_id = 0

    def reach(self, lo: float, hi: float) -> float:
        """Where a chunk from ``lo`` meant to end at ``hi`` ends: at ``hi``, or before the
        first time a closed-loop session's turn nobody knows yet could arrive."""
        if self.closed is None:
            return hi
        replicas = getattr(self.pool, "scheduler", None)
        if not isinstance(replicas, Replicas):
            return self.closed.reach(lo, hi)
        return self.closed.reach(lo, hi, replicas.answer_floors(), replicas.least_step(lo))

    def chunk(self, hi: float, final: bool) -> Piece:
        """Arrivals before ``hi`` through every stage; the requests settled by then."""
        done_ids, f_id, f_t, failed = self._arrive(hi, final)
        ledger = self.ledger
        c = ledger.cols
        new_rows = [done_ids - ledger.lo, f_id[failed] - ledger.lo]
        batches = BatchLog.empty()
        extra = None  # what the versions' pools settled besides the requests
        pools: dict[str, BatchLog] = {}  # the batches of the pools besides the primary's
        if self.loop is not None:  # the front end's one event loop admits, batches, serves and answers
            if failed.any():
                f_id, f_t = f_id[~failed], f_t[~failed]
            rows, batches = self.loop.run(ledger, self.pre.hub, f_id, f_t, math.inf if final else hi)
            new_rows.append(rows)
        else:
            if failed.any():
                f_id, f_t = f_id[~failed], f_t[~failed]
            p_id, p_t = self._preprocess(f_id, f_t, rows_of(c.svc, f_id - ledger.lo), hi, final)
            del f_id, f_t  # a whole run's columns: gone before the pool runs
            rows = p_id - ledger.lo
            c.t_preprocessed[rows] = p_t
            worker, deadline = (None if v is None else rows_of(v, rows) for v in (c.worker, c.deadline))
            if self.classes is not None:
                klass = c.traffic_class[rows]
                del rows
                settled, batches, pools = self.classes.run(p_t, p_id, worker, deadline, klass, hi, final)
            elif self.versions is None:
                work = None
                if self.tokens is not None:
                    asked = (c.prompt_tokens, c.output_tokens, c.prefix_group, c.shared_tokens, c.session, c.history)
                    work = tuple(None if v is None else v[rows] for v in asked)
                del rows
                settled, batches = self.pool.run(p_t, p_id, worker, deadline, hi, final, work)
                del work
            else:
                drawn = (c.arrival[rows], c.version[rows], c.versions.take(rows))
                del rows
                settled, batches, extra = self.versions.run(p_t, p_id, worker, deadline, *drawn, hi, final)
                del drawn
            del p_t, p_id, worker, deadline
            if settled is not None:
                new_rows.append(self._settle(*settled))
            if extra is not None and extra.alone is not None:
                alone = extra.alone[0] - ledger.lo
                c.t_alone[alone], c.alone[alone] = extra.alone[1], True
        c.with_serving()
        rows = np.concatenate(new_rows).astype(np.int64)
        if self.closed is not None:  # the answers their sessions' next turns wait for
            answer = c.t_inferred[rows] + c.post[rows] + c.back[rows]
            refused = np.isnan(answer)  # a refusal's answer is its error, back when it was dropped
            if refused.any():
                answer[refused] = np.nan_to_num(c.t_dropped[rows][refused] + c.back[rows][refused], nan=hi)
            ok = c.outcome[rows] == Outcome.COMPLETED
            self.closed.answered(hi, c.session[rows], c.turn[rows], answer, ok)
        if self.log_station is not None:
            if len(rows) == len(ledger):  # all settled now (each request settles once): by column, in request order
                rows = np.s_[:]
            answered = c.t_answered if self.loop is not None else c.t_inferred
            t_resp = answered[rows] + c.post[rows] + c.back[rows]
            c.t_emitted[rows] = np.where(np.isnan(t_resp), c.t_dropped[rows], t_resp)
            self._ship(rows, hi, final)
        first, cols = ledger.hand_out()
        shadow, counterfactual = None, None
        if extra is not None:
            pools, shadow = extra.pools, extra.shadow
        if cols.t_alone is not None:  # primary responses had the shadow not shared their queues
            counterfactual = cols.t_alone + cols.post + cols.back
        watermark = hi if not len(ledger) else min(hi, float(ledger.cols.arrival.min()))
        fleet = self.pool.fleet if final and self.pool is not None else None
        return Piece(
            first,
            cols.records(self.loop is not None),
            batches,
            math.inf if final else watermark,
            hi,
            fleet,
            pools,
            shadow,
            counterfactual,
        )

    def _arrive(self, hi: float, final: bool):
        """The chunk's arrivals and their draws (in request order) into the ledger, then the
        caches and the feature stage for the requests that reach them before ``hi``.
        Returns the ids of the requests served from the result cache, and of those past the
        feature stage (when, and whether they failed)."""
        s = self.s
        t0, klass = self.arrivals.take(hi)
        n = len(t0)
        rid = np.arange(self.next_id, self.next_id + n, dtype=np.int64)
        self.next_id += n

        t_api = self.network.inbound(t0, klass)
        t_router = self.router_stage.leave(t_api)
        # read only: one value for every request stays one value (no column of its own)
        post = np.broadcast_to(np.asarray(self.post.draw(n), dtype=float), (n,))
        back = np.broadcast_to(np.asarray(self.network.back_ms(n, klass), dtype=float), (n,))
        front = s.workers.count if self.tokens is None else s.batching.front(s.workers.count)
        worker = None if self.router is None else self.router.pick(n, front)
        if self.classes is not None:  # a class with a pool of its own draws its worker there
            worker = self.classes.arriving(klass, worker)
        version, versions = (None, None) if self.versions is None else self.versions.arriving(t_router)
        llm = {} if self.tokens is None else self.tokens.columns(n)
        self.ledger.append(
            Columns.arriving(
                t0,
                logging=s.logging is not None,
                serving=not (final and self.ledger.cols is None),  # a run in one chunk: once it settles
                t_api=t_api,
                t_router=t_router,
                t_cache=t_router if self.front.result_cache is None else t_router.copy(),  # written by that cache
                svc=np.asarray(self.pre.draw(n), dtype=float),
                post=post,
                back=back,
                deadline=None if s.batching.deadline_ms is None else t0 + s.batching.deadline_ms,
                worker=worker,
                traffic_class=klass,
                **self.front.draws(n),
                t_answered=np.full(n, np.nan) if self.loop is not None else None,
                version=version,
                versions=versions,
                t_alone=np.full(n, np.nan) if self.impact else None,
                alone=np.zeros(n, dtype=bool) if self.impact else None,
                **llm,
            )
        )
        return self.front.resolve(self.ledger, rid, t_router, math.inf if final else hi)

    def _settle(self, ids: np.ndarray, served: Served, tokens: TokensServed | None = None) -> np.ndarray:
        """Record what the pool settled (:meth:`Ledger.settle`), with an LLM replica's
        tokens; a canary's answers that drew an error on arrival become errors. Returns
        their rows."""
        rows = self.ledger.settle(ids, served)
        if tokens is not None:
            c = self.ledger.cols
            c.t_first_token[rows], c.preemptions[rows], c.cached_tokens[rows], c.max_itl_ms[rows] = tokens
        if self.versions is not None:
            c = self.ledger.cols
            err = c.versions.error[rows] & (c.version[rows] == 1) & (c.outcome[rows] == Outcome.COMPLETED)
            c.outcome[rows[err]] = Outcome.ERROR
        return rows

    def _preprocess(self, ids, t_feat, svc, hi: float, final: bool):
        """Preprocessing: a pure delay, or an FCFS pool of CPU workers (with a horizon),
        and the hub after it when there is one (with a horizon too: a request leaving the
        pool before ``hi`` arrived before it). The requests that leave it now, and when."""
        if not self.pre.pooled:
            t = self.pre.leave_sorted(t_feat, svc)
        else:
            self.cpu_wait.push(t_feat, ids, np.asarray(svc, dtype=float))
            t, ids, svc = self.cpu_wait.ready(math.inf if final else hi)
            t = self.pre.leave_sorted(t, svc)
        if self.pre.hub is None:
            return ids, t
        self.hub_wait.push(t, ids)
        t, ids = self.hub_wait.ready(math.inf if final else hi)
        return ids, self.pre.through_hub(t)

    def _ship(self, rows: np.ndarray | slice, hi: float, final: bool) -> None:
        """The prediction log: records of the requests settled now (``rows``, or all the
        ledger's) join its FCFS pipeline, which ships those emitted before any unsettled
        request could emit."""
        ledger = self.ledger
        c = ledger.cols
        ids = np.arange(ledger.lo, ledger.lo + len(ledger)) if isinstance(rows, slice) else rows + ledger.lo
        self.log_wait.push(c.t_emitted[rows], ids)
        open_rows = ~c.settled
        bound = hi if not open_rows.any() else min(hi, float(c.arrival[open_rows].min()))
        t, ids = self.log_wait.ready(math.inf if final else bound)
        if len(t):
            c.t_logged[ids - ledger.lo] = self.log_station.run(t, np.full(len(t), self.ship_ms)) + self.ship_ms
            c.shipped[ids - ledger.lo] = True


__all__ = [
    "STREAMS",
    "Outcome",
    "Run",
    "Streams",
    "simulate",
    "stream",
    "streams",
]
