"""Replications: independent runs of one scenario, their headline numbers, and intervals.

Seeds derive from the scenario's root seed, a stable key of the cell (its overrides, as
text) and the replication number through :class:`numpy.random.SeedSequence`, so a cell's
results do not depend on the order of a sweep or on where it runs.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
from scipy import stats

from simulator.planning.runner import Chunks, Sample, run
from simulator.results.sketch import LatencySketch
from simulator.scenario.config import Scenario


def derive_seed(root: int, cell_key: str, replication: int) -> int:
    """A 32-bit seed for replication ``replication`` of the cell named ``cell_key``."""
    key = int.from_bytes(hashlib.sha256(cell_key.encode()).digest()[:8], "little")
    return int(np.random.SeedSequence([root, key, replication]).generate_state(1)[0])


def headline(
    s: Scenario,
    *,
    sample: Sample = None,
    workers_billed: float | None = None,
    sketch: LatencySketch | None = None,
    chunk_s: Chunks = "auto",
) -> dict:
    """Simulate ``s`` once (:func:`simulator.planning.runner.run`, no timeline): its SLA
    percentile, verdict, throughput and cost, as one flat row (:meth:`Result.headline`).

    ``sample`` fleet-samples the run (throughputs restated for the whole fleet);
    ``workers_billed`` is the fleet the cost is for (default: what the run billed, as in
    :func:`simulator.summarize`). ``sketch``, if given, takes the
    completed requests' end-to-end latencies (to pool them across replications).
    """
    result = run(s, sample=sample, chunk_s=chunk_s, interval_s=None, e2e_sketch=sketch)
    return result.headline(workers_billed)


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
