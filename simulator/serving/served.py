"""What serving leaves: per-request columns from the batch queue on, and the batch log.

Every scheduler (a fixed pool's, the traffic classes', the dynamic fleet's, the exact
FCFS recursion of the fast path) returns its requests as one :class:`Served`, in the
order of the requests it was given; the callers put the pieces together with
:meth:`Served.empty` and :meth:`Served.scatter`, by name, never by position.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from simulator.serving.fleet import FleetLog


class Served(NamedTuple):
    """Per-request columns of the serving stage, one entry per request.

    A request that never ran keeps NaN times, batch size 0 and instance -1; its outcome
    (:class:`~simulator.serving.batcher.Outcome`) says why, and ``t_dropped`` when.
    """

    t_dispatch: np.ndarray  # its batch started (ms)
    t_done: np.ndarray  # its batch finished (ms)
    batch_size: np.ndarray  # the size of its batch
    instance: np.ndarray  # the model instance that ran it (global id within its pool)
    outcome: np.ndarray  # Outcome codes (int8)
    t_dropped: np.ndarray  # when it was rejected, timed out or lost (NaN if it was not)

    @classmethod
    def empty(cls, n: int) -> Served:
        """``n`` requests that have not run yet."""
        return cls(
            t_dispatch=np.full(n, np.nan),
            t_done=np.full(n, np.nan),
            batch_size=np.zeros(n, dtype=np.int64),
            instance=np.full(n, -1, dtype=np.int64),
            outcome=np.zeros(n, dtype=np.int8),
            t_dropped=np.full(n, np.nan),
        )

    def scatter(self, idx, part: Served) -> None:
        """Write ``part`` (one entry per index) into the entries ``idx``, in place."""
        for full, values in zip(self, part, strict=True):
            full[idx] = values

    def take(self, idx) -> Served:
        """The requests ``idx`` (an index array, a mask or a slice)."""
        return Served(*(column[idx] for column in self))


@dataclass
class BatchLog:
    """Columnar record of every batch: when it ran, how big, on which instance."""

    start: np.ndarray
    end: np.ndarray
    size: np.ndarray
    instance: np.ndarray

    @classmethod
    def empty(cls) -> BatchLog:
        return cls(np.zeros(0), np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64))

    def take(self, idx) -> BatchLog:
        """The batches ``idx`` (an index array or a mask)."""
        return BatchLog(*(getattr(self, f.name)[idx] for f in fields(self)))


class PoolRun(NamedTuple):
    """One pool's run: its requests (in the order it was given them), its batch log, and
    its fleet log (None for a fixed pool)."""

    served: Served
    batches: BatchLog
    fleet: FleetLog | None = None


class ClassesRun(NamedTuple):
    """The traffic classes' run: the requests, the shared pool's batch log, and each
    class's batch log by name."""

    served: Served
    batches: BatchLog
    pools: dict[str, BatchLog]


class ServingLog(NamedTuple):
    """What the serving stage leaves besides the per-request columns."""

    version: np.ndarray  # each request's version: 0 the primary, 1 the canary
    batches: BatchLog  # the primary pool's
    pools: dict[str, BatchLog]  # the canary's, an own shadow's, or each class's
    fleet: FleetLog | None  # the primary's, when it changes during the run
    shadow: dict[str, np.ndarray] | None  # the shadow copies: source request, times, outcome
    counterfactual: np.ndarray | None  # primary completion times without the shared shadow


class VersionsRun(NamedTuple):
    """The versions' run: the live requests served (their indices and columns), and the rest."""

    idx: np.ndarray
    served: Served
    log: ServingLog


def concat_logs(logs) -> BatchLog:
    """One batch log from several."""
    if not logs:
        return BatchLog.empty()
    return BatchLog(*(np.concatenate([getattr(p, f.name) for p in logs]) for f in fields(BatchLog)))
