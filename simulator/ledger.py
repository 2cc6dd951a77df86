"""The bottom of the model: what becomes of a request, and the columns serving leaves.

Every layer above reads these types (the schedulers write them, the engine assembles
them, the summaries count them), so they import nothing of the model themselves.

Every scheduler (a fixed pool's, the traffic classes', the dynamic fleet's, the exact
FCFS recursion of the fast path) returns its requests as one :class:`Served`, in the
order of the requests it was given; the callers put the pieces together with
:meth:`Served.empty` and :meth:`Served.scatter`, by name, never by position.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import IntEnum
from typing import NamedTuple

import numpy as np


class Outcome(IntEnum):
    """What became of a request."""

    COMPLETED = 0
    REJECTED = 1  # the batch queue was full
    TIMED_OUT = 2  # queued longer than batching.timeout_ms
    FAILED = 3  # the feature fetch timed out with on_timeout: fail
    CRASHED = 4  # queued or in service on a worker that crashed
    ERROR = 5  # answered with an error (a version's error rate)

    @property
    def label(self) -> str:
        """The name a summary counts it under: ``rejected``, ``timed_out``, ..., ``errors``."""
        return "errors" if self is Outcome.ERROR else self.name.lower()


DROPS: dict[str, Outcome] = {o.label: o for o in Outcome if o is not Outcome.COMPLETED}
"""Every way a request can end without a response, by the name a summary counts it under."""


class Served(NamedTuple):
    """Per-request columns of the serving stage, one entry per request.

    A request that never ran keeps NaN times, batch size 0 and instance -1; its outcome
    (:class:`Outcome`) says why, and ``t_dropped`` when. A scheduler does not write the
    arrays once it has returned them: the ledger may keep them as its columns.
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
class TokenGaps:
    """The gaps between an LLM's consecutive output tokens (its inter-token latencies), as
    steps make them: at ``end`` (ms) ``tokens`` tokens came ``ms`` after the token before
    each in its sequence (a step's decodes mostly share one gap, so a row holds many)."""

    end: np.ndarray
    ms: np.ndarray
    tokens: np.ndarray

    @classmethod
    def of(cls, rows: list[tuple[float, float, int]]) -> TokenGaps:
        return cls(*table_columns(rows, 3, ints=(2,)))


def table_columns(rows: list[tuple], width: int, *, ints: tuple[int, ...] = ()) -> list[np.ndarray]:
    """Rows of numbers as one array per column, the columns ``ints`` as int64 and the rest
    as float, converted as one table (a column at a time took half as long again). Exact for
    counts: an int64 column passes through float64, exact below 2**53."""
    if not rows:
        return [np.zeros(0, dtype=np.int64 if k in ints else float) for k in range(width)]
    table = np.array(rows, dtype=float)
    return [table[:, k].astype(np.int64) if k in ints else table[:, k].copy() for k in range(width)]


@dataclass
class BatchLog:
    """Columnar record of every batch: when it ran, how big, on which instance; an LLM
    replica's steps also say the share of its KV blocks in use after each and the share of
    each's time its prompt tokens took (None otherwise), and carry the gaps between the
    tokens they made (``gaps``, a table of its own, not a row per step). A batch on a front
    end's event loop also says when its instance finished it (``computed``): the loop took
    it back from then to ``end``."""

    start: np.ndarray
    end: np.ndarray
    size: np.ndarray
    instance: np.ndarray
    kv_usage: np.ndarray | None = None
    prefill_share: np.ndarray | None = None  # an LLM step: the share of its time its prompt tokens took
    computed: np.ndarray | None = None  # a batch on an event loop: its instance done, before the loop took it back
    gaps: TokenGaps | None = None

    @classmethod
    def empty(cls) -> BatchLog:
        return cls(np.zeros(0), np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64))

    def take(self, idx) -> BatchLog:
        """The batches ``idx`` (an index array or a mask); the token gaps all go along."""
        rows = [None if (v := getattr(self, f.name)) is None else v[idx] for f in fields(self) if f.name != "gaps"]
        return BatchLog(*rows, gaps=self.gaps)


def concat_logs(logs) -> BatchLog:
    """One batch log from several (a column some lack is left out)."""
    if not logs:
        return BatchLog.empty()
    if len(logs) == 1:
        return logs[0]
    names = [f.name for f in fields(BatchLog) if f.name != "gaps"]
    cols = [[getattr(p, name) for p in logs] for name in names]
    out = BatchLog(*(None if any(v is None for v in c) else np.concatenate(c) for c in cols))
    if all(p.gaps is not None for p in logs):
        out.gaps = TokenGaps(*(np.concatenate([getattr(p.gaps, f.name) for p in logs]) for f in fields(TokenGaps)))
    return out
