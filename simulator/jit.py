"""numba's start, paid once per process and named as such.

The first call of any compiled loop in a process loads numba's CPU target (its
registries, and the scipy BLAS that numba checks for): about 0.35 s on the machines of
``benchmarks/README.md``, the same whichever loop comes first, and nothing after. The
loops themselves load from numba's cache beside their modules. :func:`load` pays that
start up front, so that a run's wall time is the simulation's and the start is reported
beside it (``servesim run``: "numba started in …").
"""

from __future__ import annotations

import time

_started = False


def _noop(x: int) -> int:
    return x + 1


def load() -> float:
    """Start numba's CPU target, once per process; the seconds it took (0.0 after the
    first call, or without numba)."""
    global _started
    if _started:
        return 0.0
    t = time.perf_counter()
    try:
        from numba import njit
    except ImportError:  # pragma: no cover - numba is a core dependency
        _started = True
        return 0.0
    njit(cache=True)(_noop)(1)
    _started = True
    return time.perf_counter() - t
