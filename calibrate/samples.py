"""Fitting a distribution to measured samples, and a request's batch time: the pieces
every fitting module reads (:mod:`calibrate.fit`, :mod:`calibrate.loop_fit`)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

KS_P_MIN = 0.01  # below this p-value every parametric candidate is rejected: empirical
EMPIRICAL_POINTS = 1000


def fit_distribution(samples_ms: np.ndarray, *, rng: np.random.Generator) -> dict:
    """The simulator distribution (as a scenario dict) that best fits positive samples, ms.

    Returns the spec plus ``fit``: the chosen family, its KS statistic and p-value, and
    the sample count. KS on a random subsample of at most 5,000 keeps the test from
    rejecting every model on huge samples for differences nobody would notice.
    """
    x = np.asarray(samples_ms, dtype=float)
    x = x[np.isfinite(x) & (x > 0)]
    if len(x) < 20:
        raise ValueError(f"need at least 20 positive samples to fit a distribution, got {len(x)}")
    test = x if len(x) <= 5000 else rng.choice(x, 5000, replace=False)
    candidates = {}
    s, _, scale = stats.lognorm.fit(x, floc=0)
    mean, var = stats.lognorm.stats(s, 0, scale, moments="mv")
    candidates["lognormal"] = (
        {"kind": "lognormal", "mean_ms": float(mean), "cv": float(math.sqrt(var) / mean)},
        stats.kstest(test, "lognorm", args=(s, 0, scale)),
    )
    a, _, scale = stats.gamma.fit(x, floc=0)
    candidates["gamma"] = (
        {"kind": "gamma", "mean_ms": float(a * scale), "cv": float(1 / math.sqrt(a))},
        stats.kstest(test, "gamma", args=(a, 0, scale)),
    )
    candidates["exponential"] = (
        {"kind": "exponential", "mean_ms": float(x.mean())},
        stats.kstest(test, "expon", args=(0, x.mean())),
    )
    family, (spec, ks) = min(candidates.items(), key=lambda kv: kv[1][1].statistic)
    if ks.pvalue < KS_P_MIN:
        qs = np.quantile(x, (np.arange(EMPIRICAL_POINTS) + 0.5) / EMPIRICAL_POINTS)
        spec, family = {"kind": "empirical", "samples_ms": [round(float(q), 4) for q in qs]}, "empirical"
    fit = {"family": family, "ks": float(ks.statistic), "p_value": float(ks.pvalue), "n": len(x)}
    return {**spec, "fit": fit}


BATCH_STAGES_US = ("handoff_us", "compute_input_us", "compute_infer_us", "compute_output_us")


def batch_time_us(df: pd.DataFrame) -> pd.Series:
    """A request's batch time: the hand-off to the instance and back (when the server has
    one), plus compute."""
    return sum((df[c].fillna(0.0) if c in df else 0.0) for c in BATCH_STAGES_US)
