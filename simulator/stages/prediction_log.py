"""Prediction logging: an asynchronous pipeline of finite bandwidth.

Every request that leaves the system (answered, or dropped) emits one log record of
``record_kb``. Records queue FCFS for the pipeline, which ships ``bandwidth_gbps``;
the user's response never waits for it. The pipeline is a single deterministic server,
so its departures follow exactly from the vectorised Lindley recursion.
"""

from __future__ import annotations

import numpy as np

from simulator.scenario.config import PredictionLog
from simulator.stages.stations import lindley


def record_ms(cfg: PredictionLog) -> float:
    """Time to ship one record, ms (1 KB = 8,000 bits; 1 Gbit/s = 1e6 bits per ms)."""
    return cfg.record_kb * 8000.0 / (cfg.bandwidth_gbps * 1e6)


def ship(cfg: PredictionLog, emitted: np.ndarray) -> np.ndarray:
    """When each record has been shipped (NaN where nothing was emitted)."""
    out = np.full(len(emitted), np.nan)
    finite = np.isfinite(emitted)
    order = np.argsort(emitted, kind="stable") if finite.all() else np.flatnonzero(finite)
    if not finite.all():
        order = order[np.argsort(emitted[order], kind="stable")]
    svc = record_ms(cfg)
    done = lindley(emitted[order], np.full(len(order), svc))
    done += svc
    out[order] = done
    return out
