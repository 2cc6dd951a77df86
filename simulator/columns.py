"""The request path's typed ledger: the per-request columns a run fills in, stage by
stage, and the ledger of the requests not handed out yet.

:class:`Columns` is one array per field, one entry per request: when each stage ended,
what the request drew when it arrived, and what became of it; serving's columns are
allocated once a request settles. :class:`Ledger` holds the columns of the requests not
handed out yet (ids ``lo`` ... ``lo + len``): the engine (:mod:`simulator.engine`) appends a
chunk's arrivals, each stage writes its columns, and a request leaves, as a record
(:meth:`Columns.records`), once it is settled and, with a prediction log, shipped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

from simulator.ledger import Served
from simulator.results.records import Records
from simulator.serving.versions import VersionDrawn
from simulator.stages.network import later


@dataclass
class CacheDrawn:
    """What requests drew at a cache when they arrived: each one's key (or coin flip), and
    its hit and miss latencies (ms)."""

    drawn: np.ndarray
    hit_ms: np.ndarray
    miss_ms: np.ndarray


@dataclass
class Columns:
    """The per-request columns the request path fills in, one entry per request."""

    # when each stage ended (ms), as in the records
    arrival: np.ndarray
    t_api: np.ndarray
    t_router: np.ndarray
    t_cache: np.ndarray
    t_features: np.ndarray
    t_preprocessed: np.ndarray
    # what each request drew when it arrived
    svc: np.ndarray  # CPU time of preprocessing
    post: np.ndarray
    back: np.ndarray
    traffic_class: np.ndarray
    # what became of it
    degraded: np.ndarray
    result_hit: np.ndarray
    feature_hit: np.ndarray
    live: np.ndarray  # past the feature stage, to be served
    version: np.ndarray
    settled: np.ndarray
    # what serving leaves: allocated once a request settles (with_serving), so that a run in
    # one chunk does not hold them while its pool runs
    t_dispatch: np.ndarray | None = None
    t_inferred: np.ndarray | None = None
    t_dropped: np.ndarray | None = None
    t_logged: np.ndarray | None = None
    outcome: np.ndarray | None = None
    batch_size: np.ndarray | None = None
    instance: np.ndarray | None = None
    # draws for the caches and the round trips, where those stages run chunk by chunk
    result_cache: CacheDrawn | None = None
    feature_cache: CacheDrawn | None = None
    trips: np.ndarray | None = None
    deadline: np.ndarray | None = None  # with batching.deadline_ms: when it gives up, end to end
    worker: np.ndarray | None = None  # its worker in the primary pool, where the engine routes to one
    # with a canary or a shadow: what it drew for them; with measure_impact, its completion
    # without the shared shadow's copies (NaN until known), and whether that is settled
    versions: VersionDrawn | None = None
    t_alone: np.ndarray | None = None
    alone: np.ndarray | None = None
    # with a prediction log: when its response left, or it was dropped (what the log ships); shipped yet
    t_emitted: np.ndarray | None = None
    shipped: np.ndarray | None = None
    t_answered: np.ndarray | None = None  # with the front end's event loop: when the loop answered it
    # an LLM request's work (drawn on arrival) and what its replica left
    prompt_tokens: np.ndarray | None = None
    output_tokens: np.ndarray | None = None
    prefix_group: np.ndarray | None = None
    shared_tokens: np.ndarray | None = None
    session: np.ndarray | None = None  # its conversation (-1: none), its turn there, and the turns before it
    turn: np.ndarray | None = None
    history: np.ndarray | None = None
    t_first_token: np.ndarray | None = None
    preemptions: np.ndarray | None = None
    cached_tokens: np.ndarray | None = None
    max_itl_ms: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.arrival)

    @classmethod
    def arriving(
        cls, t0: np.ndarray, *, logging: bool, serving: bool, version: np.ndarray | None = None, **drawn
    ) -> Columns:
        """New requests arriving at ``t0`` with what they drew; the rest not yet known
        (serving's columns left out unless ``serving``: see :meth:`with_serving`)."""
        n = len(t0)
        if logging:
            drawn |= {"t_emitted": np.full(n, np.nan), "shipped": np.zeros(n, dtype=bool)}
        no = np.zeros(n, dtype=bool)
        cols = cls(
            arrival=t0,
            t_features=np.full(n, np.nan),
            t_preprocessed=np.full(n, np.nan),
            degraded=no,
            result_hit=no.copy(),
            feature_hit=no.copy(),
            live=no.copy(),
            version=np.zeros(n, dtype=np.int8) if version is None else version,
            settled=no.copy(),
            **drawn,
        )
        return cols.with_serving() if serving else cols

    def with_serving(self) -> Columns:
        """Serving's columns, allocated where they are not yet (NaN times, outcome 0,
        batch size 0, instance -1): before anything settles, and before records are read."""
        if self.outcome is None:
            n = len(self)
            self.t_dispatch, self.t_inferred, self.t_dropped, self.t_logged = (np.full(n, np.nan) for _ in range(4))
            self.outcome = np.zeros(n, dtype=np.int8)
            self.batch_size = np.zeros(n, dtype=np.int64)
            self.instance = np.full(n, -1, dtype=np.int64)
        return self

    def map(self, fn: Callable[..., np.ndarray], *others: Columns) -> Columns:
        """A new set of columns, ``fn`` applied to each column (with the others' same column)."""

        def each(mine, theirs):
            if mine is None:
                return None
            if isinstance(mine, CacheDrawn | VersionDrawn):
                return type(mine)(
                    *(each(getattr(mine, f.name), [getattr(o, f.name) for o in theirs]) for f in fields(mine))
                )
            return fn(mine, *theirs)

        return Columns(*(each(getattr(self, f.name), [getattr(o, f.name) for o in others]) for f in fields(self)))

    def records(self, loop: bool) -> Records:
        """The columns as records: the columns of the same name, and the times after the
        model (answered by the front end's event loop, with one, else when inference ended)."""
        t_post = later(self.t_answered if loop else self.t_inferred, self.post)
        after = {"t_postprocessed": t_post, "t_response": later(t_post, self.back)}
        return Records(*(after[f.name] if f.name in after else getattr(self, f.name) for f in fields(Records)))


class Ledger:
    """The columns of the requests not handed out yet: ids ``lo`` … ``lo + len``."""

    def __init__(self, *, logging: bool):
        self.lo = 0
        self.cols: Columns | None = None
        self.logging = logging

    def __len__(self) -> int:
        return 0 if self.cols is None else len(self.cols)

    def append(self, cols: Columns) -> None:
        self.cols = cols if self.cols is None else self.cols.map(lambda a, b: np.concatenate([a, b]), cols)

    def settle(self, rid: np.ndarray, served: Served) -> np.ndarray:
        """Record the serving columns of requests ``rid``; returns their rows."""
        row = rid - self.lo
        c = self.cols
        if c.outcome is None and in_order(row, len(c)) and _owned(served):
            # every request at once, nothing settled before (a run in one chunk): the
            # columns are the scheduler's own arrays, not copies into NaN columns
            c.t_dispatch, c.t_inferred, c.batch_size = served.t_dispatch, served.t_done, served.batch_size
            c.instance, c.outcome, c.t_dropped = served.instance, served.outcome, served.t_dropped
            c.t_logged = np.full(len(c), np.nan)
            c.settled[:] = True
            return row
        c.with_serving()
        c.t_dispatch[row] = served.t_dispatch
        c.t_inferred[row] = served.t_done
        c.batch_size[row] = served.batch_size
        c.instance[row] = served.instance
        c.outcome[row] = served.outcome
        c.t_dropped[row] = served.t_dropped
        c.settled[row] = True
        return row

    def hand_out(self) -> tuple[int, Columns]:
        """The settled (and, with logging, shipped) requests at the front, removed."""
        c = self.cols
        done = c.settled & c.shipped if self.logging else c.settled
        if c.alone is not None:  # a served primary request waits for its completion without the copies
            done = done & (c.alone | ~c.live | (c.version != 0))
        k = int(np.argmin(done)) if not done.all() else len(done)
        first = self.lo
        out = c.map(lambda v: v[:k])
        self.cols = c.map(lambda v: v[k:])
        self.lo += k
        return first, out


_SERVED_DTYPES = tuple(column.dtype for column in Served.empty(0))


def _owned(served: Served) -> bool:
    """Whether ``served``'s columns own their memory and have the ledger's types."""
    return all(v.base is None and v.dtype == d for v, d in zip(served, _SERVED_DTYPES, strict=True))


def in_order(rows: np.ndarray, n: int) -> bool:
    """Whether ``rows`` are ``0 … n - 1`` in order."""
    return len(rows) == n and (n == 0 or (rows[0] == 0 and rows[-1] == n - 1 and bool(np.all(rows[1:] > rows[:-1]))))


def rows_of(column: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``column[rows]``, without a copy when ``rows`` are all of it in order (a whole run's
    requests, or a chunk's with nothing ahead of them)."""
    return column if in_order(rows, len(column)) else column[rows]


__all__ = ["CacheDrawn", "Columns", "Ledger", "in_order", "rows_of"]
