"""The statistics of a calibration: intervals for percentiles and a noise fit that stalls cannot inflate.

* :func:`quantile_ci`: the distribution-free interval for a quantile from order
  statistics: with ``n`` independent samples, ``#{x_i <= q_p}`` is Binomial(n, p), so
  ``[x_(l), x_(u)]`` with ``l, u`` from its quantiles covers ``q_p`` with at least the
  stated confidence (Hahn & Meeker, *Statistical Intervals*, ch. 5).
* :func:`replication_interval`: the interval that a *new* measurement falls in with the
  stated chance, from ``n`` replications of its design: for exchangeable draws a new one
  falls between the j-th smallest and the j-th largest of ``n`` with probability
  ``(n + 1 - 2j) / (n + 1)``, so with 20 replications a 90% interval is their range (the
  5th to 95th percentile of 20 holds a new draw only about 81% of the time).
* :func:`slice_bootstrap_ci`: latencies within a slice are correlated (a queue carries
  over from one request to the next), so the order-statistic interval is too narrow; the
  slices of a randomized block design are close to independent, so resampling whole
  slices (a block bootstrap) gives an honest interval for the pooled percentile.
* :func:`robust_lognormal_cv`: the batch-time noise from the median absolute deviation of
  the log ratios (measured / fitted), so a few stalled batches do not inflate the noise
  that every simulated batch then carries; :func:`stalls` names those batches.
* :func:`level_summary`: what a load generator's records say per level: offered and
  achieved rate, errors, latency percentiles.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

MAD_SIGMA = 1.4826  # MAD of a normal sample / its standard deviation
STALL_SIGMAS = 6.0  # a batch this many robust sigmas above the fit is a stall, not noise


def quantile_ci(x: np.ndarray, q: float, confidence: float = 0.95) -> tuple[float, float]:
    """Order-statistic interval for the ``q`` quantile (0 < q < 1) of iid samples ``x``:
    (nan, nan) when ``x`` is too small for the stated coverage."""
    x = np.sort(np.asarray(x, dtype=float))
    n = len(x)
    alpha = 1.0 - confidence
    lo = int(stats.binom.ppf(alpha / 2, n, q))  # x_(lo) with 1-based lo: P(B <= lo-1) <= alpha/2
    hi = int(stats.binom.ppf(1 - alpha / 2, n, q)) + 1
    if lo < 1 or hi > n:
        return float("nan"), float("nan")
    return float(x[lo - 1]), float(x[hi - 1])


def order_statistic_coverage(n: int, q: float, confidence: float = 0.95) -> float:
    """The exact coverage of :func:`quantile_ci`'s interval for ``n`` samples (continuous
    distributions): P(l <= B < u) with B ~ Binomial(n, q)."""
    alpha = 1.0 - confidence
    lo = int(stats.binom.ppf(alpha / 2, n, q))
    hi = int(stats.binom.ppf(1 - alpha / 2, n, q)) + 1
    return float(stats.binom.cdf(hi - 1, n, q) - stats.binom.cdf(lo - 1, n, q))


def replication_interval(values, coverage: float = 0.9) -> tuple[float, float, float]:
    """(low, median, high) of ``values`` (replications of a design; NaNs dropped), with
    ``[low, high]`` the widest pair of symmetric order statistics ``x_(j), x_(n+1-j)`` that
    still holds a new draw with at least ``coverage``: ``(n + 1 - 2j) / (n + 1) >= coverage``.
    With too few replications for that, the range (whose coverage is then below it)."""
    x = np.sort(np.asarray(values, dtype=float))
    x = x[np.isfinite(x)]
    n = len(x)
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    j = max(math.floor((n + 1) * (1.0 - coverage) / 2.0 + 1e-9), 1)
    return float(x[j - 1]), float(np.median(x)), float(x[n - j])


def slice_bootstrap_ci(
    values: np.ndarray,
    slices: np.ndarray,
    q: float,
    *,
    rng: np.random.Generator,
    confidence: float = 0.95,
    reps: int = 2000,
) -> tuple[float, float]:
    """Percentile interval for the pooled ``q`` quantile, resampling whole slices."""
    values = np.asarray(values, dtype=float)
    labels, idx = np.unique(np.asarray(slices), return_inverse=True)
    k = len(labels)
    if k < 2:
        return quantile_ci(values, q, confidence)
    order = np.argsort(idx, kind="stable")
    groups = np.split(values[order], np.cumsum(np.bincount(idx, minlength=k))[:-1])
    groups = [np.sort(g) for g in groups]
    draws = rng.integers(0, k, size=(reps, k))
    est = np.empty(reps)
    for r in range(reps):
        est[r] = np.quantile(np.concatenate([groups[j] for j in draws[r]]), q)
    alpha = 1.0 - confidence
    lo, hi = np.quantile(est, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def t_interval(x: np.ndarray, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and its t-interval over replications."""
    x = np.asarray(x, dtype=float)
    m = float(x.mean())
    if len(x) < 2:
        return m, float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return m, m - half, m + half


def robust_sigma(log_ratio: np.ndarray) -> float:
    """Robust standard deviation of log ratios: 1.4826 × MAD."""
    r = np.asarray(log_ratio, dtype=float)
    return float(MAD_SIGMA * np.median(np.abs(r - np.median(r))))


def robust_lognormal_cv(log_ratio: np.ndarray) -> float:
    """The CV of a log-normal whose sigma is the robust sigma of ``log_ratio``."""
    s = robust_sigma(log_ratio)
    return float(math.sqrt(math.expm1(s * s)))


def stalls(log_ratio: np.ndarray) -> np.ndarray:
    """Which batches took longer than the fit by more than :data:`STALL_SIGMAS` robust sigmas."""
    r = np.asarray(log_ratio, dtype=float)
    s = robust_sigma(r)
    return r - np.median(r) > STALL_SIGMAS * max(s, 1e-3)


def _span(g: pd.DataFrame, ok: pd.DataFrame) -> float:
    done = (ok["scheduled_s"] + ok["latency_ms"] / 1e3).max() if len(ok) else g["scheduled_s"].max()
    return float(max(done, g["scheduled_s"].max()) - g["scheduled_s"].min())


def level_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per level: offered and achieved rate, errors, latency percentiles (after warm-up)."""
    rows = []
    for level, g in df[~df["warmup"]].groupby("level"):
        ok = g[g["status"] == 200]
        lat = ok["latency_ms"].to_numpy()
        # completions over the time from the first send to the last answer: a server that
        # falls behind finishes after the schedule ends, so the schedule's span overstates it;
        # with interleaved slices, the sum of the slices' spans
        span = sum(
            _span(part, part[part["status"] == 200]) for _, part in (g.groupby("slice") if "slice" in g else [(0, g)])
        )
        rows.append(
            {
                "level": level,
                "offered_rps": float(g["offered_rps"].iloc[0]),
                "achieved_rps": len(ok) / span if span > 0 else float("nan"),
                "requests": len(g),
                "errors": int((g["status"] != 200).sum()),
                "p50_ms": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
                "p95_ms": float(np.percentile(lat, 95)) if len(lat) else float("nan"),
                "p99_ms": float(np.percentile(lat, 99)) if len(lat) else float("nan"),
                "mean_batch": float(ok["batch_size"].mean()) if len(ok) else float("nan"),
                "send_lag_p99_ms": float(np.percentile(g["send_lag_ms"], 99)),
            }
        )
    return pd.DataFrame(rows)
