"""What one chunk of a run settles (:class:`Piece`), and a run's pieces put together: the
records in request order, the other pools' batch logs, the shadow copies.

:func:`simulator.engine.stream` yields the pieces; :func:`simulator.engine.simulate` (one
piece) and :mod:`simulator.streaming` (many, reduced as they come) put them together.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from simulator.ledger import BatchLog, concat_logs
from simulator.results.records import Records
from simulator.serving.lives import FleetLog


@dataclass
class Piece:
    """What one chunk of the run settled: records of requests ``first`` … (in request
    order, a contiguous run of ids), the batches that started, and the other pools'
    batches and the shadow copies settled in it. The last piece carries the fleet."""

    first: int  # id (arrival index) of the first record
    records: Records
    batches: BatchLog
    watermark_ms: float  # every later record's times are at or after this
    horizon_ms: float  # arrivals before this have been simulated
    fleet: FleetLog | None = None  # a dynamic pool's workers and events, with the last piece
    pools: dict[str, BatchLog] = field(default_factory=dict)  # the canary's, a shadow's, each class's
    shadow: dict[str, np.ndarray] | None = None  # the shadow copies
    response_without_shadow: np.ndarray | None = None  # the records' responses without shared shadow copies


def gather(pieces: list[Piece]) -> tuple[dict[str, BatchLog], dict[str, np.ndarray] | None, np.ndarray | None]:
    """What the pieces settled besides their records, as one run's: the other pools'
    batch logs by name, the shadow copies (in request order) and the responses without
    the shared shadow's copies (None where the run has none)."""
    names = dict.fromkeys(name for p in pieces for name in p.pools)
    pools = {name: concat_logs([p.pools[name] for p in pieces if name in p.pools]) for name in names}
    parts = [p.shadow for p in pieces if p.shadow is not None]
    shadow = None
    if parts:
        shadow = {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}
        order = np.argsort(shadow["request"], kind="stable")
        shadow = {k: v[order] for k, v in shadow.items()}
    alone = [p.response_without_shadow for p in pieces if p.response_without_shadow is not None]
    return pools, shadow, np.concatenate(alone) if alone else None


def concat_records(parts: list[Records]) -> Records:
    """One set of records from consecutive pieces."""
    return Records(
        *(
            None if getattr(parts[0], f.name) is None else np.concatenate([getattr(p, f.name) for p in parts])
            for f in fields(Records)
        )
    )


__all__ = ["Piece", "concat_records", "gather"]
