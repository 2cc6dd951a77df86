"""The statistics every summary section uses: the measurement window, percentiles with
the mean, the SLA verdict, and the overlap of intervals with the window. Pure functions."""

from __future__ import annotations

import numpy as np

from simulator.results import summary
from simulator.results.records import Records
from simulator.scenario.config import Scenario

PERCENTILES = {"p50": 50.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}


def window(records: Records, scenario: Scenario) -> np.ndarray:
    """Mask of the requests that arrived inside the measurement window."""
    return (records.arrival >= scenario.warmup_s * 1000.0) & (records.arrival < scenario.duration_s * 1000.0)


def grouped_percentiles(
    counts: np.ndarray, xs: np.ndarray, percentiles: tuple[float, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """The ``percentiles`` of each group of ``xs`` (``counts[g]`` values of group ``g``,
    groups in order, each sorted): the groups present, and one row each, as
    ``np.percentile`` (linear) computes them."""
    counts = np.asarray(counts, dtype=np.int64)
    present = np.flatnonzero(counts)
    starts = (np.cumsum(counts) - counts)[present]
    n = counts[present][:, None]
    q = np.true_divide(np.asarray(percentiles, dtype=float), 100)[None, :]
    virtual = (n - 1) * q  # numpy's "linear" method, step for step (_quantile, _lerp)
    prev = np.floor(virtual).astype(np.intp)
    top = virtual >= n - 1
    prev[top] = (n - 1).repeat(q.shape[1], axis=1)[top]
    nxt = np.where(top, prev, prev + 1)
    gamma = virtual - np.floor(virtual)
    a, b = xs[starts[:, None] + prev], xs[starts[:, None] + nxt]
    diff = b - a
    out = np.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma)
    return present, out


def summary_stats(x: np.ndarray, *, sort_in_place: bool = False) -> dict[str, float]:
    """p50/p95/p99/p99.9 and mean of ``x`` (NaN-free); NaN when empty. ``sort_in_place``:
    ``x`` may be sorted where it is (its caller lets it go), instead of a sorted copy."""
    if len(x) == 0:
        return {**dict.fromkeys(PERCENTILES, float("nan")), "mean": float("nan")}
    lo = x.min()
    mean = float(x.mean())  # before any sort: the mean adds in the values' order
    if lo == x.max():  # a stage the scenario leaves out: every percentile is its one value
        return {**dict.fromkeys(PERCENTILES, float(lo)), "mean": mean}
    # numpy's sort beats the partition np.percentile makes for four percentiles (2.4 against
    # 3.8 ms over 232,000 values); the same linear interpolation, so the same values
    if sort_in_place:
        x.sort()
    else:
        x = np.sort(x)
    _, qs = grouped_percentiles(np.array([len(x)]), x, tuple(PERCENTILES.values()))
    return {**dict(zip(PERCENTILES, map(float, qs[0]), strict=True)), "mean": mean}


class ExactSample:
    """Percentiles and the mean of values added piece by piece, kept whole: the exact
    counterpart of :class:`simulator.results.sketch.LatencySketch`, with its interface,
    for a run held in memory (its percentiles are ``np.percentile``'s of every value).
    :meth:`seal` computes them once the last piece is in and lets the values go."""

    def __init__(self):
        self._parts: list[np.ndarray] = []
        self.count = 0
        self._summary: dict[str, float] | None = None
        self._extra: dict[float, float] = {}  # percentiles besides PERCENTILES, computed at seal()
        self._sealed = False
        self._given = False  # whether its one part was given (the sample may reorder it)

    def add(self, values: np.ndarray, counts: np.ndarray | None = None, *, give: bool = False) -> None:
        """Take ``values`` (each ``counts`` times); ``give``: the caller lets the sample
        keep the array and sort it where it is (nothing else reads it)."""
        if self._sealed:
            raise RuntimeError("a sealed sample takes no more values")
        x = np.asarray(values, dtype=float)
        if x.ndim != 1:  # one value broadcast to many stays a view
            x = x.ravel()
        if counts is not None:  # each value that many times
            x = np.repeat(x, np.asarray(counts, dtype=np.int64).ravel())
            give = True
        if len(x):
            self._given = give and not self._parts
            self._parts.append(x)
            self.count += len(x)
            self._summary = None

    def seal(self, extra: tuple[float, ...] = ()) -> None:
        """The last value is in: compute :data:`PERCENTILES`, the mean and the ``extra``
        percentiles now, and drop the values."""
        self.summary(PERCENTILES)
        for p in extra:
            self._extra[p] = self.percentile(p)
        self._parts, self._sealed = [], True

    @property
    def values(self) -> np.ndarray:
        if self._sealed:
            raise RuntimeError("a sealed sample keeps no values")
        if len(self._parts) != 1:
            self._parts = [np.concatenate(self._parts)] if self._parts else [np.zeros(0)]
            self._given = True  # the concatenation is its own
        return self._parts[0]

    def percentile(self, p: float) -> float:
        """The ``p`` percentile (0 ≤ p ≤ 100), NaN when empty (one of :data:`PERCENTILES`
        from the summary's, the same value without a second pass)."""
        name = next((k for k, v in PERCENTILES.items() if v == p), None)
        if name is not None:
            return self.summary(PERCENTILES)[name]
        if p in self._extra:
            return self._extra[p]
        return float(np.percentile(self.values, p)) if self.count else float("nan")

    @property
    def mean(self) -> float:
        return self.summary(PERCENTILES)["mean"]

    def summary(self, percentiles: dict[str, float]) -> dict[str, float]:
        """:data:`PERCENTILES` and the mean, as :func:`summary_stats` gives them."""
        if percentiles != PERCENTILES:
            raise ValueError("an exact sample summarizes PERCENTILES")
        if self._summary is None:
            x = self.values
            self._summary = summary_stats(x, sort_in_place=self._given and x.flags.writeable)
        return dict(self._summary)


def sla_verdict(e2e_ms: np.ndarray, percentile: float, target_ms: float, dropped: int) -> summary.SLAVerdict:
    """The SLA verdict over completed latencies ``e2e_ms`` plus ``dropped`` requests.

    ``attained_ms`` is the SLA percentile of completed requests. ``attainment`` is the
    fraction of all requests answered within target, rejected and timed-out ones
    counting as misses. ``met`` needs both: attained within target, and attainment of
    at least ``percentile``% (so shedding load cannot buy a good percentile).
    """
    attained = float(np.percentile(e2e_ms, percentile)) if len(e2e_ms) else float("nan")
    total = len(e2e_ms) + dropped
    attainment = int(np.count_nonzero(e2e_ms <= target_ms)) / total if total else float("nan")
    met = bool(len(e2e_ms)) and attained <= target_ms and attainment >= percentile / 100
    return {
        "percentile": percentile,
        "target_ms": target_ms,
        "attained_ms": attained,
        "met": bool(met),
        "attainment": attainment,
    }


def overlap(start: np.ndarray, end: np.ndarray, t0: float, t1: float) -> np.ndarray:
    """Per interval [start, end): its overlap with [t0, t1), ms."""
    out = np.minimum(end, t1)
    out -= np.maximum(start, t0)
    return np.clip(out, 0.0, None, out=out)
