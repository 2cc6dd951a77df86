"""Where latency lives: tidy tables of a run's latency anatomy, for charts and reports.

* :func:`stage_bands`: for the requests whose end-to-end latency sits around a percentile
  (p50, p99), the mean time of each stage. Unlike a sum of per-stage percentiles, these
  contributions add up to the percentile itself, so a stacked bar shows what the tail
  request was doing.
* :func:`e2e_cdf`: the end-to-end latency distribution at fixed probabilities.
* :func:`batch_histogram`: batches started per size.
* :func:`tail_stage`: the stage with the largest share around a percentile, and
  :data:`STAGE_WORDS`, each stage as people say it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simulator.results.records import STAGES, Records

if TYPE_CHECKING:
    import pandas as pd

# the stages of :data:`simulator.results.records.STAGES`, as people say them
STAGE_WORDS = {
    "network_in": "the network in",
    "router": "the router",
    "cache": "the cache lookup",
    "features": "the feature fetch",
    "preprocess": "preprocessing",
    "queue": "queueing",
    "inference": "inference",
    "postprocess": "postprocessing",
    "network_out": "the network out",
}


def stage_bands(records: Records, mask: np.ndarray, percentiles=(50.0, 99.0), width: float = 1.0) -> pd.DataFrame:
    """One row per (percentile, stage): the stage's mean ms among completed requests whose
    end-to-end latency lies within ``width`` percentile points around the percentile,
    with ``start_ms`` and ``end_ms`` of the stacked bar. Columns: percentile, stage, order,
    ms, start_ms, end_ms, e2e_ms."""
    import pandas as pd

    done = mask & records.completed
    e2e = (records.t_response - records.arrival)[done]
    rows = []
    if len(e2e) == 0:
        return pd.DataFrame(columns=["percentile", "stage", "order", "ms", "start_ms", "end_ms", "e2e_ms"])
    per_stage = {name: np.nan_to_num(records.stage_ms(name)[done]) for name, _, _ in STAGES}
    for q in percentiles:
        lo, hi, at = np.percentile(e2e, [max(q - width / 2, 0), min(q + width / 2, 100), q])
        band = (e2e >= lo) & (e2e <= hi)
        start = 0.0
        for order, (name, _, _) in enumerate(STAGES):
            ms = float(per_stage[name][band].mean())
            rows.append(
                {
                    "percentile": f"p{q:g}",
                    "stage": name,
                    "order": order,
                    "ms": ms,
                    "start_ms": start,
                    "end_ms": start + ms,
                    "e2e_ms": float(at),
                }
            )
            start += ms
    return pd.DataFrame(rows)


def e2e_cdf(records: Records, mask: np.ndarray, points: int = 200) -> pd.DataFrame:
    """Columns latency_ms, probability: the empirical CDF of completed requests' latency at
    ``points`` probabilities spaced evenly in log(1 − p) from 0.5% to 99.99%."""
    import pandas as pd

    done = mask & records.completed
    e2e = (records.t_response - records.arrival)[done]
    if len(e2e) == 0:
        return pd.DataFrame(columns=["latency_ms", "probability"])
    tail = np.geomspace(0.995, 1e-4, points)
    p = 1.0 - tail
    return pd.DataFrame({"latency_ms": np.percentile(e2e, p * 100), "probability": p})


def batch_histogram(sizes: np.ndarray, starts: np.ndarray, t0_ms: float, t1_ms: float) -> pd.DataFrame:
    """Columns batch_size, batches, share: batches started inside [t0_ms, t1_ms) per size."""
    import pandas as pd

    inside = (starts >= t0_ms) & (starts < t1_ms)
    counts = np.bincount(sizes[inside].astype(int)) if inside.any() else np.zeros(1, dtype=int)
    sizes_seen = np.flatnonzero(counts)
    total = counts.sum() or 1
    return pd.DataFrame({"batch_size": sizes_seen, "batches": counts[sizes_seen], "share": counts[sizes_seen] / total})


def tail_stage(bands: pd.DataFrame, percentile: str = "p99") -> tuple[str, float] | None:
    """The stage with the largest share of the requests around ``percentile`` (a
    :func:`stage_bands` table) and that share; None when the band is empty."""
    band = bands[bands["percentile"] == percentile]
    total = float(band["ms"].sum()) if len(band) else 0.0
    if total <= 0:
        return None
    top = band.loc[band["ms"].idxmax()]
    return str(top["stage"]), float(top["ms"]) / total
