"""Runs in bounded memory: the engine's chunks (:func:`simulator.engine.stream`) reduced
as they come, or gathered for checks.

:func:`summarize_stream` reduces each chunk's records (:class:`simulator.results.reduce.
Reduction`) and drops them, so an hour of a 200k req/s platform fits in half a GB;
:func:`simulate_streaming` gathers them, for runs small enough to keep. Both cut the run in
chunks of about 250,000 arrivals by default; the records are the same for any chunk length.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from simulator.engine import stream
from simulator.ledger import concat_logs
from simulator.pieces import Piece, concat_records
from simulator.scenario.config import Scenario


def simulate_streaming(scenario: Scenario, *, seed: int | None = None, chunk_s: float | None = None):
    """All of a streamed run's records at once, as :func:`simulator.simulate` returns them
    (for checks on runs small enough to keep): ``(Records, BatchLog, wall_s)``."""
    wall0 = time.perf_counter()
    pieces = list(stream(scenario, seed=seed, chunk_s=chunk_s))
    records = concat_records([p.records for p in pieces])
    return records, concat_logs([p.batches for p in pieces]), time.perf_counter() - wall0


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
        What to simulate.
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
        reduction.add(
            piece.records,
            piece.batches,
            piece.watermark_ms,
            shadow=piece.shadow,
            alone=piece.response_without_shadow,
            pools=piece.pools,
        )

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


__all__ = ["Piece", "simulate_streaming", "stream", "summarize_stream"]
