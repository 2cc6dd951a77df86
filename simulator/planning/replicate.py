"""Replications: independent runs of one scenario, their headline numbers, and intervals.

Seeds derive from the scenario's root seed, a stable key of the cell (its overrides, as
text) and the replication number through :class:`numpy.random.SeedSequence`, so a cell's
results do not depend on the order of a sweep or on where it runs.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np
import pandas as pd
from scipy import stats

from simulator.chunks import prefer_streaming
from simulator.engine import simulate
from simulator.ledger import DROPS, Outcome
from simulator.results.metrics import cost, extra_workers, fleet_summary, sla_verdict, window, worker_price
from simulator.results.sketch import LatencySketch
from simulator.scenario.config import Scenario
from simulator.streaming import summarize_stream


def derive_seed(root: int, cell_key: str, replication: int) -> int:
    """A 32-bit seed for replication ``replication`` of the cell named ``cell_key``."""
    key = int.from_bytes(hashlib.sha256(cell_key.encode()).digest()[:8], "little")
    return int(np.random.SeedSequence([root, key, replication]).generate_state(1)[0])


def headline(
    s: Scenario, *, workers_billed: int | None = None, scale: float = 1.0, sketch: LatencySketch | None = None
) -> dict:
    """Simulate ``s`` once; its SLA percentile, verdict, throughput and cost, as one flat row.

    ``scale`` multiplies throughputs back when ``s`` is a fleet sample (N/k), and
    ``workers_billed`` is the fleet the cost is for (default: what the run billed, as in
    :func:`simulator.results.metrics.summarize`). ``sketch``, if given, takes the
    completed requests' end-to-end latencies (to pool them across replications).
    """
    if prefer_streaming(s):  # a long run: in bounded memory, percentiles from its sketch
        return _headline_streamed(s, workers_billed, scale, sketch)
    t = time.perf_counter()
    run = simulate(s)
    wall = time.perf_counter() - t
    rec = run.records
    mask = window(rec, s)
    done = mask & rec.completed
    e2e = (rec.t_response - rec.arrival)[done]
    if sketch is not None:
        sketch.add(e2e)
    dropped = int(np.count_nonzero(mask & (rec.outcome != Outcome.COMPLETED)))
    verdict = sla_verdict(e2e, s.sla.percentile, s.sla.target_ms, dropped if s.sla.count_dropped else 0)
    span_s = s.duration_s - s.warmup_s
    completed_rps = np.count_nonzero(done) / span_s * scale
    if workers_billed is None:  # as summarize bills it: the fleet's billed mean, plus the experiment pools
        t0, t1 = s.warmup_s * 1000.0, s.duration_s * 1000.0
        workers_billed = fleet_summary(run, t0, t1)["billed_mean"] + extra_workers(s)
    price = cost(workers_billed, worker_price(s), completed_rps)
    p50, p95, p99 = np.percentile(e2e, [50, 95, 99]) if len(e2e) else (np.nan,) * 3
    return {
        "seed": s.seed,
        "p50_ms": float(p50),
        "p95_ms": float(p95),
        "p99_ms": float(p99),
        "sla_ms": verdict["attained_ms"],
        "attainment": verdict["attainment"],
        "met": verdict["met"],
        "completed_rps": completed_rps,
        "dropped": dropped,
        "arrived": int(np.count_nonzero(mask)),
        "cost_per_hour_usd": price["per_hour_usd"],
        "cost_per_million_usd": price["per_million_requests_usd"],
        "requests": len(rec),
        "wall_s": wall,
    }


def _headline_streamed(s: Scenario, workers_billed, scale: float, sketch: LatencySketch | None) -> dict:
    """:func:`headline` of a run too long to hold: streamed, its summary's numbers."""
    t = time.perf_counter()
    m = summarize_stream(s, e2e_sketch=sketch)
    wall = time.perf_counter() - t
    r = m["requests"]
    span_s = s.duration_s - s.warmup_s
    completed_rps = r["completed"] / span_s * scale
    if workers_billed is None:
        workers_billed = m["fleet"]["billed_mean"] + extra_workers(s)
    price = cost(workers_billed, worker_price(s), completed_rps)
    e2e = m["latency_ms"]["e2e"]
    dropped = sum(r[k] for k in DROPS)
    return {
        "seed": s.seed,
        "p50_ms": e2e["p50"],
        "p95_ms": e2e["p95"],
        "p99_ms": e2e["p99"],
        "sla_ms": m["sla"]["attained_ms"],
        "attainment": m["sla"]["attainment"],
        "met": m["sla"]["met"],
        "completed_rps": completed_rps,
        "dropped": dropped,
        "arrived": r["arrived"],
        "cost_per_hour_usd": price["per_hour_usd"],
        "cost_per_million_usd": price["per_million_requests_usd"],
        "requests": m["sim"]["requests"],
        "wall_s": wall,
    }


def interval(x: np.ndarray, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and two-sided Student-t confidence interval of the replication values ``x``."""
    x = np.asarray(x, dtype=float)
    m = float(np.mean(x))
    if len(x) < 2 or not np.all(np.isfinite(x)):  # unknown width, or a run with no answers
        return m, float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + confidence / 2, len(x) - 1) * np.std(x, ddof=1) / np.sqrt(len(x)))
    return m, m - half, m + half


def replicate(s: Scenario, replications: int, cell_key: str = "", *, start: int = 0, **kw) -> pd.DataFrame:
    """Replications ``start`` … ``replications - 1`` of ``s`` with derived seeds: one row
    each (see :func:`headline`)."""
    rows = []
    for r in range(start, replications):
        row = headline(s.model_copy(update={"seed": derive_seed(s.seed, cell_key, r)}), **kw)
        rows.append({"replication": r, **row})
    return pd.DataFrame(rows)
