"""The headroom: the highest rate that holds an SLA, by a twin's predictions
(:func:`highest_holding`, the image twin's and the LLM twin's search) or by a ramp's
measurements (:func:`monotone_crossing`, what the LLM twin is judged against)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np


def highest_holding(
    breaks: Callable[[float], bool],
    rate: float,
    broke_at_rate: bool,
    *,
    rel_tol: float = 0.01,
    ceiling: float = math.inf,
    guess: float | None = None,
) -> float:
    """The highest rate found not to break the SLA (``breaks(rate)`` False), to ``rel_tol``
    of the lowest found to break it, by bisection; ``broke_at_rate``: whether ``rate``
    itself breaks it. ``ceiling``: a rate known to break it (beyond the capacity); without
    one the bracket grows from ``rate`` by doublings (``inf`` past 10⁶ requests/s). With a
    ``guess`` inside the bracket (a last answer carried over) the search starts there and
    widens by 4, 8, 16% ... while each probe lands on the same side."""
    lo, hi = 0.0, ceiling  # the rates known to hold and to break
    if broke_at_rate:
        hi = rate
    else:
        lo = rate
    probe = guess if guess is not None and lo < guess < hi else None
    widen, direction = 0.04, 0  # from the guess: steps of 4, 8, 16% ... while on one side
    expanding = probe is not None
    while not (math.isfinite(hi) and hi - lo <= rel_tol * hi):
        if probe is None:
            if math.isfinite(hi):
                probe = (lo + hi) / 2
            else:  # nothing broke yet: double
                probe = max(lo, 0.1) * 2
                if probe > 1e6:
                    return math.inf
        broke = breaks(probe)
        if broke:
            hi = probe
        else:
            lo = probe
        step = -1 if broke else 1
        nxt = probe * (1 + step * widen)
        if expanding and direction in (0, step) and lo < nxt < hi:
            direction, widen, probe = step, widen * 2, nxt
        else:
            expanding, probe = False, None
    return lo


def monotone_crossing(rows: list[tuple[float, float]], sla_ms: float) -> float:
    """Where a ramp's measured percentile crosses ``sla_ms``: ``rows`` of (rate, percentile
    in ms) in rising rate, on their monotone (isotonic, least squares in log) fit,
    interpolated in log between the steps around the crossing (a short step's p99 is
    noisy, and the first raw crossing would take the first spike for it). The first rate
    when the fit starts above the SLA; NaN when it never crosses."""
    from scipy.optimize import isotonic_regression

    rates = np.array([r for r, _ in rows])
    fitted = np.exp(isotonic_regression(np.log([p for _, p in rows])).x)
    target = math.log(sla_ms)
    for i in range(len(rows) - 1):
        p0, p1 = math.log(fitted[i]), math.log(fitted[i + 1])
        if p1 > target >= p0:
            return float(rates[i] + (target - p0) / (p1 - p0) * (rates[i + 1] - rates[i]))
    return float(rates[0]) if fitted[0] > sla_ms else math.nan
