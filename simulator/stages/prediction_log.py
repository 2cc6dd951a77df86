"""Prediction logging: an asynchronous pipeline of finite bandwidth.

Every request that leaves the system (answered, or dropped) emits one log record of
``record_kb``. Records queue FCFS for the pipeline, which ships ``bandwidth_gbps``;
the user's response never waits for it. The pipeline is a single deterministic server,
so its departures follow exactly from the Lindley recursion (the engine's
:class:`~simulator.stages.stations.Lindley`, carried from chunk to chunk).
"""

from __future__ import annotations

from simulator.scenario.config import PredictionLog


def record_ms(cfg: PredictionLog) -> float:
    """Time to ship one record, ms (1 KB = 8,000 bits; 1 Gbit/s = 1e6 bits per ms)."""
    return cfg.record_kb * 8000.0 / (cfg.bandwidth_gbps * 1e6)
