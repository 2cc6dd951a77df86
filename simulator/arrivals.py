"""Arrival sources: open-loop Poisson, or replayed timestamps.

An arrival source turns a :class:`~simulator.config.Traffic` section into sorted arrival
times in ms over ``[0, duration)``. Poisson gaps are generated in bulk, in chunks, and
never clipped (a clipped gap would silently raise the rate).
"""

from __future__ import annotations

import numpy as np

from simulator.config import Traffic
from simulator.distributions import read_numbers


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


def arrivals(traffic: Traffic, duration_ms: float, *, rng: np.random.Generator) -> np.ndarray:
    """Arrival times for the configured source."""
    if traffic.arrivals_file is not None:
        return trace_arrivals(traffic.arrivals_file, duration_ms)
    return poisson_arrivals(traffic.rate_rps, duration_ms, rng=rng)
