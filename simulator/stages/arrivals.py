"""Arrival sources: open-loop Poisson (constant or shaped over time), or replayed timestamps.

An arrival source turns a :class:`~simulator.scenario.config.Traffic` section into sorted arrival
times in ms over ``[0, duration)``. Poisson gaps are generated in bulk, in chunks, and
never clipped (a clipped gap would silently raise the rate).
"""

from __future__ import annotations

import numpy as np

from simulator.scenario.config import Traffic
from simulator.scenario.distributions import read_numbers
from simulator.scenario.shapes import Constant, RateFn, Shape, rate_bound, rate_function


def poisson_arrivals(rate_rps: float, duration_ms: float, *, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (ms) of a Poisson process of ``rate_rps`` over ``[0, duration_ms)``."""
    mean_gap = 1000.0 / rate_rps
    expected = rate_rps * duration_ms / 1000.0
    chunk = int(expected + 6 * np.sqrt(expected) + 16)
    parts, t0 = [], 0.0
    while True:
        times = t0 + np.cumsum(rng.exponential(mean_gap, chunk))
        if times[-1] >= duration_ms:
            parts.append(times[: np.searchsorted(times, duration_ms, side="left")])
            break
        parts.append(times)
        t0 = times[-1]
        chunk = max(1024, chunk // 4)
    return np.concatenate(parts)


def trace_arrivals(path: str, duration_ms: float) -> np.ndarray:
    """Replayed arrival timestamps (file in seconds), sorted, within ``[0, duration_ms)``."""
    times = np.sort(read_numbers(path) * 1000.0)
    return times[times < duration_ms]


def nhpp_arrivals(rate: RateFn, bound_rps: float, duration_ms: float, *, rng: np.random.Generator) -> np.ndarray:
    """Non-homogeneous Poisson arrivals (ms) with rate ``rate(t_s)`` ≤ ``bound_rps``, by thinning.

    Exact: candidates from a Poisson stream at the bound, each kept with probability
    λ(t)/bound (Lewis and Shedler).
    """
    if bound_rps <= 0:
        return np.empty(0)
    candidates = poisson_arrivals(bound_rps, duration_ms, rng=rng)
    keep = rng.random(len(candidates)) * bound_rps < rate(candidates / 1000.0)
    return candidates[keep]


def shaped_arrivals(rate_rps: float | None, shape: Shape, duration_ms: float, *, rng: np.random.Generator):
    """Poisson arrivals (ms) at ``rate_rps`` shaped by ``shape``."""
    if isinstance(shape, Constant):
        return poisson_arrivals(rate_rps, duration_ms, rng=rng)
    rate = rate_function(shape, rate_rps, duration_ms / 1000.0, rng=rng)
    return nhpp_arrivals(rate, rate_bound(shape, rate_rps), duration_ms, rng=rng)


def arrivals(traffic: Traffic, duration_ms: float, *, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times for the configured source, and each arrival's traffic class (0 without classes).

    Each class draws from its own child of ``rng``, so changing one class's rate leaves
    the other classes' arrivals as they were.
    """
    if traffic.classes:
        children = rng.spawn(len(traffic.classes))
        parts = [
            shaped_arrivals(c.rate_rps, c.shape, duration_ms, rng=g)
            for c, g in zip(traffic.classes.values(), children, strict=True)
        ]
        times = np.concatenate(parts)
        klass = np.repeat(np.arange(len(parts), dtype=np.int8), [len(p) for p in parts])
        order = np.argsort(times, kind="stable")
        return times[order], klass[order]
    if traffic.arrivals_file is not None:
        times = trace_arrivals(traffic.arrivals_file, duration_ms)
    else:
        times = shaped_arrivals(traffic.rate_rps, traffic.shape, duration_ms, rng=rng)
    return times, np.zeros(len(times), dtype=np.int8)
