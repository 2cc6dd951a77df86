"""Arrival sources: open-loop Poisson (constant or shaped over time), or replayed timestamps.

An arrival source turns a :class:`~simulator.scenario.config.Traffic` section into sorted arrival
times in ms over ``[0, duration)``. Poisson gaps are drawn in blocks of a fixed size and
never clipped (a clipped gap would silently raise the rate). Because the blocks do not
depend on how far ahead anyone asks, a source read in time chunks
(:meth:`ArrivalSource.take`, as the engine does) gives exactly the times it
gives read in one piece.
"""

from __future__ import annotations

import numpy as np

from simulator.scenario.config import Traffic
from simulator.scenario.distributions import read_numbers
from simulator.scenario.shapes import Constant, RateFn, Shape, rate_bound, rate_function

BLOCK = 1 << 16  # Poisson gaps drawn per block


class ArrivalSource:
    """Sorted arrival times (ms) of one source, handed out in successive time chunks.

    ``take(until)`` returns the arrivals in ``[previous until, until)``. A Poisson source
    at ``rate_rps`` draws its gaps ``BLOCK`` at a time; with ``rate`` (a shape) each block
    of candidates is thinned with ``BLOCK`` uniforms drawn right after it (Lewis and
    Shedler: a candidate at t is kept with probability λ(t)/bound). A trace replays
    ``times``.
    """

    def __init__(
        self,
        *,
        rate_rps: float | None = None,
        rate: RateFn | None = None,
        rng: np.random.Generator | None = None,
        times: np.ndarray | None = None,
    ):
        self._rate, self._bound, self._rng = rate, rate_rps, rng
        self._buf = np.empty(0) if times is None else np.asarray(times, dtype=float)
        self._last = 0.0  # the last candidate drawn
        self._parts: list[np.ndarray] = []
        self._finite = times is not None or not rate_rps or rate_rps <= 0

    def rate_at(self, t_ms: float) -> float:
        """The source's rate (per second) at ``t_ms``."""
        if self._rate is None:
            return float(self._bound or 0.0)
        return float(self._rate(np.array([t_ms / 1000.0]))[0])

    def _block(self) -> None:
        rng, bound = self._rng, self._bound
        cand = rng.exponential(1000.0 / bound, BLOCK)
        np.cumsum(cand, out=cand)  # in place: one array a block, where three were made
        cand += self._last
        self._last = float(cand[-1])
        if self._rate is not None:
            cand = cand[rng.random(BLOCK) * bound < self._rate(cand / 1000.0)]
        self._parts.append(cand)

    def take(self, until_ms: float) -> np.ndarray:
        """The arrivals before ``until_ms`` not handed out yet, sorted."""
        if not self._finite and self._last < until_ms:
            self._parts = [self._buf]
            while self._last < until_ms:
                self._block()
            self._buf = np.concatenate(self._parts)
            self._parts = []
        cut = int(np.searchsorted(self._buf, until_ms, side="left"))
        out, self._buf = self._buf[:cut], self._buf[cut:]
        return out


def poisson_arrivals(rate_rps: float, duration_ms: float, *, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (ms) of a Poisson process of ``rate_rps`` over ``[0, duration_ms)``."""
    return ArrivalSource(rate_rps=rate_rps, rng=rng).take(duration_ms)


def trace_arrivals(path: str, duration_ms: float) -> np.ndarray:
    """Replayed arrival timestamps (file in seconds), sorted, within ``[0, duration_ms)``."""
    times = read_numbers(path) * 1000.0
    times = times[np.argsort(times, kind="stable")]  # ties as in the file (an LLM trace's rows stay with them)
    return times[times < duration_ms]


def nhpp_arrivals(rate: RateFn, bound_rps: float, duration_ms: float, *, rng: np.random.Generator) -> np.ndarray:
    """Non-homogeneous Poisson arrivals (ms) with rate ``rate(t_s)`` ≤ ``bound_rps``, by thinning.

    Exact: candidates from a Poisson stream at the bound, each kept with probability
    λ(t)/bound (Lewis and Shedler).
    """
    return ArrivalSource(rate_rps=bound_rps, rate=rate, rng=rng).take(duration_ms)


def shaped_source(
    rate_rps: float | None, shape: Shape, duration_ms: float, *, rng: np.random.Generator, per: float = 1.0
):
    """The :class:`ArrivalSource` of Poisson arrivals at ``rate_rps`` shaped by ``shape``,
    every rate divided by ``per`` (sessions of ``per`` requests on average start at the
    requests' rate over ``per``)."""
    if isinstance(shape, Constant):
        return ArrivalSource(rate_rps=rate_rps / per, rng=rng)
    rate = rate_function(shape, rate_rps, duration_ms / 1000.0, rng=rng)
    if per != 1.0:
        whole = rate
        rate = lambda t: whole(t) / per  # noqa: E731
    return ArrivalSource(rate_rps=rate_bound(shape, rate_rps) / per, rate=rate, rng=rng)


def shaped_arrivals(rate_rps: float | None, shape: Shape, duration_ms: float, *, rng: np.random.Generator):
    """Poisson arrivals (ms) at ``rate_rps`` shaped by ``shape``."""
    return shaped_source(rate_rps, shape, duration_ms, rng=rng).take(duration_ms)


def source(traffic: Traffic, duration_ms: float, *, rng: np.random.Generator) -> ArrivalSource:
    """The arrival source of a traffic section without classes (a trace, or Poisson)."""
    if traffic.classes:
        raise ValueError("traffic classes have one source each; see arrivals()")
    if traffic.arrivals_file is not None:
        return ArrivalSource(times=trace_arrivals(traffic.arrivals_file, duration_ms))
    return shaped_source(traffic.rate_rps, traffic.shape, duration_ms, rng=rng)


class Arrivals:
    """A traffic section's arrivals, handed out in successive time chunks with each one's
    traffic class: one :class:`ArrivalSource` per class (or one for the section), merged in
    time order. Each class draws from its own child of the stream, so changing one class's
    rate leaves the other classes' arrivals as they were. Ties between classes go in class
    order, and a tie never straddles a chunk's end, so the merge is the same read in one
    piece or in chunks."""

    def __init__(self, traffic: Traffic, duration_ms: float, *, rng: np.random.Generator):
        if traffic.classes:
            children = rng.spawn(len(traffic.classes))
            self.sources = [
                shaped_source(c.rate_rps, c.shape, duration_ms, rng=g)
                for c, g in zip(traffic.classes.values(), children, strict=True)
            ]
        else:
            self.sources = [source(traffic, duration_ms, rng=rng)]

    def take(self, until_ms: float) -> tuple[np.ndarray, np.ndarray]:
        """The arrivals before ``until_ms`` not handed out yet (sorted), and their classes."""
        if len(self.sources) == 1:
            times = self.sources[0].take(until_ms)
            return times, np.zeros(len(times), dtype=np.int8)
        parts = [s.take(until_ms) for s in self.sources]
        times = np.concatenate(parts)
        klass = np.repeat(np.arange(len(parts), dtype=np.int8), [len(p) for p in parts])
        order = np.argsort(times, kind="stable")
        return times[order], klass[order]


def arrivals(traffic: Traffic, duration_ms: float, *, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times for the configured source over ``[0, duration_ms)``, and each
    arrival's traffic class (0 without classes): :class:`Arrivals` read in one piece."""
    return Arrivals(traffic, duration_ms, rng=rng).take(duration_ms)
