"""One way to run a scenario: sample the fleet where that is exact, simulate it whole or
in time chunks, summarize it, and restate the summary for the whole fleet.

Every caller goes through :func:`run`: the command line (``servesim run``, ``explain``,
``plan``, ``sweep``, ``practice``), the dashboard and the replications of
:mod:`simulator.planning.replicate`. :func:`prepare` is its first half, for a caller
that must know before the run what will be simulated (the CLI prices the run and says
that it samples).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

import numpy as np

from simulator import jit
from simulator.chunks import prefer_streaming
from simulator.ledger import DROPS
from simulator.planning.sampling import auto_sample_size, sample_fleet, scale_summary
from simulator.results.metrics import cost, worker_price
from simulator.results.reduce import summarize
from simulator.results.stats import window
from simulator.scenario.config import Scenario

if TYPE_CHECKING:
    from collections.abc import Callable

    import pandas as pd

    from simulator.results.records import Records
    from simulator.results.run import Run
    from simulator.results.sketch import LatencySketch
    from simulator.results.summary import Summary
    from simulator.streaming import Piece

Chunks = Literal["auto", "whole"] | float
Sample = Literal["auto"] | int | None


class Prepared(NamedTuple):
    """What :func:`run` will simulate: the scenario asked about (its seed set), the one
    simulated (it, or its fleet sample), whether it runs in chunks, and their length
    (s; None for the default, about 250,000 arrivals a chunk)."""

    scenario: Scenario
    simulated: Scenario
    streamed: bool
    chunk_s: float | None = None


def prepare(
    scenario: Scenario, *, seed: int | None = None, sample: Sample = "auto", chunk_s: Chunks = "auto"
) -> Prepared:
    """Decide what :func:`run` simulates, before anything runs.

    Raises ValueError when ``sample`` asks for a fleet sample that would be wrong, when
    ``chunk_s`` is not one of its choices.
    """
    s = scenario if seed is None else scenario.model_copy(update={"seed": int(seed)})
    n = s.workers.count
    if sample == "auto":
        k = auto_sample_size(s)
    elif sample is None:
        k = n
    elif isinstance(sample, int) and not isinstance(sample, bool):
        k = min(sample, n)
    else:
        raise ValueError(f"sample must be 'auto', None or a number of workers, not {sample!r}")
    simulated = sample_fleet(s, k)
    if chunk_s == "auto":
        return Prepared(s, simulated, prefer_streaming(simulated))
    if chunk_s == "whole":
        return Prepared(s, simulated, False)
    if isinstance(chunk_s, bool) or not isinstance(chunk_s, int | float) or not chunk_s > 0:
        raise ValueError(f"chunk_s must be 'auto', 'whole' or a positive number of seconds, not {chunk_s!r}")
    return Prepared(s, simulated, True, float(chunk_s))


@dataclass(frozen=True)
class Result:
    """A run's outcome.

    Attributes
    ----------
    scenario : Scenario
        The scenario asked about (the whole fleet, its seed set).
    simulated : Scenario
        What was simulated: ``scenario``, or its fleet sample.
    summary : Summary
        The summary, restated for the whole fleet where sampled (latency and utilization
        as measured; throughput, workers and cost scaled).
    run : Run or None
        The run held whole, in one chunk (records, batch logs, fleet, shadow copies);
        None when it ran in chunks (its pieces went to ``on_piece``).
    streamed : bool
        Whether it ran in time chunks (percentiles from sketches, within 0.5%).
    """

    scenario: Scenario
    simulated: Scenario
    summary: Summary
    run: Run | None
    streamed: bool

    @property
    def sampled(self) -> int | None:
        """Workers simulated when the fleet was sampled, else None."""
        k = self.simulated.workers.count
        return k if k < self.scenario.workers.count else None

    @property
    def records(self) -> Records | None:
        """Per-request records of the simulated fleet (None when streamed)."""
        return None if self.run is None else self.run.records

    @property
    def timeline(self) -> pd.DataFrame:
        """The summary's per-interval rows as a frame."""
        import pandas as pd

        return pd.DataFrame(self.summary["timeline"])

    def headline(self, workers_billed: float | None = None) -> dict:
        """The numbers a sweep or a plan compares, as one flat row: the SLA percentile and
        verdict (an LLM's TTFT and TPOT at that percentile too, and its verdict includes
        them), p50/p95/p99, completed throughput, drops and cost (for ``workers_billed``
        workers when given, else for the fleet the run billed)."""
        m = self.summary
        r, e2e, sla, sim = m["requests"], m["latency_ms"]["e2e"], m["sla"], m["sim"]
        completed_rps = r["throughput_rps"]
        if workers_billed is None:
            price = m["cost"]
        else:
            price = cost(workers_billed, worker_price(self.scenario), completed_rps)
        llm = m.get("llm")
        verdicts = [] if llm is None else [v for v in (llm["sla"]["ttft"], llm["sla"]["tpot"]) if v is not None]
        tokens = {}
        if llm is not None:  # the LLM targets at the SLA's percentile, and the goodput
            tokens = {
                "ttft_ms": llm["sla"]["ttft"]["attained_ms"] if llm["sla"]["ttft"] else llm["ttft_ms"]["p99"],
                "tpot_ms": llm["sla"]["tpot"]["attained_ms"] if llm["sla"]["tpot"] else llm["tpot_ms"]["p99"],
                "goodput_rps": llm["sla"]["goodput_rps"],
            }
        return {
            "seed": self.scenario.seed,
            "p50_ms": e2e["p50"],
            "p95_ms": e2e["p95"],
            "p99_ms": e2e["p99"],
            "sla_ms": sla["attained_ms"],
            "attainment": sla["attainment"],
            "met": sla["met"] and all(v["met"] for v in verdicts),
            **tokens,
            "completed_rps": completed_rps,
            "dropped": sum(r[k] for k in DROPS),
            "arrived": r["arrived"],
            "cost_per_hour_usd": price["per_hour_usd"],
            "cost_per_million_usd": price["per_million_requests_usd"],
            "requests": sim["requests"],
            "wall_s": sim["wall_s"],
        }


def run(
    scenario: Scenario,
    *,
    seed: int | None = None,
    sample: Sample = "auto",
    chunk_s: Chunks = "auto",
    interval_s: float | None = 1.0,
    on_piece: Callable[[Piece], None] | None = None,
    progress: Callable[[float], None] | None = None,
    e2e_sketch: LatencySketch | None = None,
) -> Result:
    """Simulate ``scenario`` and summarize it, for the whole fleet.

    Parameters
    ----------
    scenario : Scenario
        What to simulate (:func:`simulator.load_scenario`).
    seed : int, optional
        Overrides ``scenario.seed``.
    sample : "auto", int or None
        Fleet sampling: ``"auto"`` simulates enough workers for about 100,000 requests in
        the window where sampling is exact in law (a fixed fleet under random routing;
        all of them elsewhere); a number simulates that many (ValueError where sampling
        would be wrong); None simulates every worker.
    chunk_s : "auto", "whole" or float
        How the run is cut (one engine either way, the same records): ``"whole"`` is one
        chunk, every request held (exact percentiles, the records in the result); a
        number of simulated seconds runs chunks of that length in bounded memory
        (percentiles within 0.5%); ``"auto"`` is one chunk up to 5M requests and
        chunks of about 250,000 arrivals beyond, where nothing holds the run to its end.
    interval_s : float or None
        Width of the timeline's intervals, s; None leaves the timeline out of a whole
        run's summary (what a replication needs is cheaper without it).
    on_piece : callable, optional
        In chunks: called with each piece of records before it is dropped.
    progress : callable, optional
        In chunks: called with the simulated time reached (s) after each chunk.
    e2e_sketch : LatencySketch, optional
        Takes the end-to-end latencies of the window's completed requests, to pool them
        across replications.

    Returns
    -------
    Result
        The summary (restated for the whole fleet), the run where held, and what was
        simulated.
    """
    from simulator.engine import simulate
    from simulator.streaming import summarize_stream

    p = prepare(scenario, seed=seed, sample=sample, chunk_s=chunk_s)
    s, sim = p.scenario, p.simulated
    # numba's start, once per process, before the run's clock; LLM replicas compile nothing
    start_s = 0.0 if s.batching.kind == "continuous" else jit.load()
    whole = None
    if p.streamed:
        summary = summarize_stream(
            sim,
            interval_s=interval_s or 1.0,
            chunk_s=p.chunk_s,
            on_piece=on_piece,
            progress=progress,
            e2e_sketch=e2e_sketch,
        )
    else:
        whole = simulate(sim)
        t = time.perf_counter()
        summary = summarize(whole, interval_s=interval_s)
        summary["sim"] = _with_wall(summary["sim"], whole.wall_s + time.perf_counter() - t)
        summary["sim"]["simulate_s"] = whole.wall_s
        if e2e_sketch is not None:
            rec = whole.records
            done = window(rec, sim) & rec.completed
            e2e_sketch.add((rec.t_response - rec.arrival)[done])
    if start_s:
        summary["sim"] = {**summary["sim"], "start_s": start_s}
    if sim.workers.count < s.workers.count:
        summary = scale_summary(summary, s.workers.count, sim.workers.count)
    return Result(s, sim, summary, whole, p.streamed)


def _with_wall(sim: dict, wall_s: float) -> dict:
    """The summary's ``sim`` section with the wall time of the run and its summary."""
    n = sim["requests"]
    return {**sim, "wall_s": wall_s, "requests_per_wall_s": n / wall_s if wall_s > 0 else float(np.inf)}
