"""Latency percentiles in bounded memory: a mergeable quantile sketch.

A streamed run (:mod:`simulator.streaming`) never holds all its latencies, so it cannot
sort them. :class:`LatencySketch` keeps them in a DDSketch (Masson, Rim and Lee, VLDB
2019; the ``ddsketch`` package, Datadog's maintained implementation): logarithmic
buckets such that every quantile it returns is within a relative error α of the exact
one (α = 0.5% here; ``tests/test_sketch.py`` checks p50 to p99.9 against sorted data).
Sketches merge exactly, so replications, sweep cells and Dask workers can pool theirs.

The library adds one value per Python call (about a microsecond each), too slow for the
millions of latencies a chunk holds. :meth:`LatencySketch.add` computes the buckets
with numpy, using the library's own mapping (``key = ceil(log2(v) · m)``), and counts
them; when a percentile, a merge or a pickle needs the library's sketch, it hands the
library one weighted value per occupied bucket, the bucket's own representative, which
the library maps back to the same bucket. The exact sum and count
are kept beside it for the mean.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
from ddsketch import DDSketch
from ddsketch.mapping import LogarithmicMapping

RELATIVE_ACCURACY = 0.005


class LatencySketch:
    """Percentiles (within ``relative_accuracy``) and the exact mean of many values, merged
    in any order."""

    def __init__(self, relative_accuracy: float = RELATIVE_ACCURACY):
        self.relative_accuracy = relative_accuracy
        self._dd = DDSketch(relative_accuracy)
        self._mapping = LogarithmicMapping(relative_accuracy)
        gamma_mantissa = 2 * relative_accuracy / (1 - relative_accuracy)
        self._multiplier = math.log(2) / math.log1p(gamma_mantissa)  # the mapping's, in log2 units
        self.count = 0
        self.total = 0.0
        self._zeros = 0  # values mapped to zero, not handed to the library yet
        self._pending: dict[float, tuple[int, np.ndarray]] = {}  # sign -> (first key, counts per key)

    def add(self, values: np.ndarray, counts: np.ndarray | None = None, *, give: bool = False) -> None:
        """Add every value of ``values`` (finite; NaNs are a caller's bug and are refused),
        each ``counts`` times where given (whole numbers). ``give`` is
        :class:`~simulator.results.stats.ExactSample`'s (a sketch keeps no values)."""
        x = np.asarray(values, dtype=float).ravel()
        if not len(x):
            return
        if not np.isfinite(x).all():
            raise ValueError("a latency sketch takes finite values only")
        w = np.ones(len(x), dtype=np.int64) if counts is None else np.asarray(counts, dtype=np.int64).ravel()
        self.count += int(w.sum())
        self.total += float((x * w).sum()) if counts is not None else float(x.sum())
        tiny = self._mapping.min_possible
        pos, neg = x > tiny, x < -tiny
        self._zeros += int(w[~(pos | neg)].sum())
        for mask, sign in ((pos, 1.0), (neg, -1.0)):
            if mask.any():
                keys = np.ceil(np.log2(sign * x[mask]) * self._multiplier).astype(np.int64)
                first = int(keys.min())
                bins = np.bincount(keys - first, weights=None if counts is None else w[mask])
                self._counted(sign, first, bins.astype(np.int64))  # a few thousand buckets: no sort

    def _counted(self, sign: float, first: int, counts: np.ndarray) -> None:
        """Add ``counts`` of the buckets ``first``… to the pending counts of that sign."""
        have = self._pending.get(sign)
        if have is None:
            self._pending[sign] = (first, counts)
            return
        lo = min(first, have[0])
        hi = max(first + len(counts), have[0] + len(have[1]))
        out = np.zeros(hi - lo, dtype=np.int64)
        out[have[0] - lo : have[0] - lo + len(have[1])] += have[1]
        out[first - lo : first - lo + len(counts)] += counts
        self._pending[sign] = (lo, out)

    def _flush(self) -> None:
        """Hand the pending bucket counts to the library: one weighted value per occupied
        bucket, its representative (the same calls, whenever they are made)."""
        if self._zeros:
            self._dd.add(0.0, float(self._zeros))
            self._zeros = 0
        for sign, (first, counts) in sorted(self._pending.items()):
            for k in np.flatnonzero(counts).tolist():
                self._dd.add(sign * self._mapping.value(k + first), float(counts[k]))
        self._pending = {}

    def merge(self, other: LatencySketch) -> None:
        """Add ``other``'s values to this sketch (same relative accuracy)."""
        if other.relative_accuracy != self.relative_accuracy:
            raise ValueError("sketches of different accuracy do not merge")
        if other.count:
            self._zeros += other._zeros
            for sign, (first, counts) in other._pending.items():
                self._counted(sign, first, counts)
            self._flush()
            self._dd.merge(other._dd)
        self.count += other.count
        self.total += other.total

    def __getstate__(self) -> dict:
        self._flush()
        return self.__dict__

    def __eq__(self, other: object) -> bool:
        """Equal state: the same accuracy, values and buckets (as from the same inputs)."""
        if not isinstance(other, LatencySketch):
            return NotImplemented
        same = (self.relative_accuracy, self.count, self.total) == (other.relative_accuracy, other.count, other.total)
        return same and pickle.dumps(self) == pickle.dumps(other)

    __hash__ = None  # mutable

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0 ≤ q ≤ 1), NaN when empty; the value of rank ⌊q (n − 1)⌋,
        within the relative accuracy."""
        if not self.count:
            return float("nan")
        self._flush()
        return float(self._dd.get_quantile_value(q))

    def percentile(self, p: float) -> float:
        """The ``p`` percentile (0 ≤ p ≤ 100), as :meth:`quantile` gives it."""
        return self.quantile(p / 100.0)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")

    def summary(self, percentiles: dict[str, float]) -> dict[str, float]:
        """``{name: percentile}`` (percentiles in %) and the mean, as ``summary_stats`` gives them."""
        return {**{k: self.quantile(p / 100.0) for k, p in percentiles.items()}, "mean": self.mean}
