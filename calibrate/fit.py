"""Fitting the simulator's models from measurements: pure functions, no I/O.

* the batch service time: affine ``base + per_item × B`` by least squares over batches,
  with a mean-one log-normal noise whose CV comes from the residual ratios;
* per-stage delays: log-normal, gamma or exponential by maximum likelihood, the best by
  the Kolmogorov–Smirnov statistic, or the empirical distribution when none fits;
* the request overhead outside the server's stages (network, HTTP, API): client latency
  minus the server's request time, at the lowest load level, where nothing queues for it;
* the Redis round trip per sequential trip, and the one-thread station (the server's
  event loop) those trips queue for under load.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

KS_P_MIN = 0.01  # below this p-value every parametric candidate is rejected: empirical
EMPIRICAL_POINTS = 1000


def fit_affine(batch_size: np.ndarray, service_ms: np.ndarray) -> dict:
    """Affine batch service time with log-normal noise, from one row per batch."""
    b = np.asarray(batch_size, dtype=float)
    y = np.asarray(service_ms, dtype=float)
    if len(np.unique(b)) < 2:  # one batch size: no slope to fit
        base, per = 0.0, float(y.mean() / b[0])
    else:
        per, base = np.polyfit(b, y, 1)
        if base < 0:  # a negative intercept is noise: refit through the origin
            base, per = 0.0, float((b @ y) / (b @ b))
    pred = base + per * b
    ratio = y / pred
    resid = y - pred
    r2 = 1 - float(resid @ resid) / float(((y - y.mean()) ** 2).sum()) if len(y) > 1 and y.std() > 0 else 1.0
    return {
        "kind": "affine",
        "base_ms": float(base),
        "per_item_ms": float(per),
        "noise_cv": float(np.std(ratio, ddof=1)) if len(y) > 1 else 0.0,
        "r2": r2,
        "batches": len(y),
    }


def fit_table(batch_size: np.ndarray, service_ms: np.ndarray, *, min_batches: int = 20) -> dict | None:
    """Mean service time per batch size (interpolated between sizes by the simulator), with
    log-normal noise from the pooled ratios; None unless at least two sizes have
    ``min_batches`` batches each."""
    df = pd.DataFrame({"b": np.asarray(batch_size, dtype=int), "y": np.asarray(service_ms, dtype=float)})
    counts = df.groupby("b")["y"].count()
    sizes = counts[counts >= min_batches].index
    if len(sizes) < 2:
        return None
    df = df[df["b"].isin(sizes)]
    means = df.groupby("b")["y"].mean()
    ratio = df["y"] / df["b"].map(means)
    pred = df["b"].map(means)
    resid = df["y"] - pred
    r2 = 1 - float((resid**2).sum()) / float(((df["y"] - df["y"].mean()) ** 2).sum())
    return {
        "kind": "table",
        "batch_ms": {int(b): round(float(m), 4) for b, m in means.items()},
        "noise_cv": float(ratio.std(ddof=1)),
        "r2": r2,
        "batches": len(df),
    }


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


def batches_from_requests(df: pd.DataFrame) -> pd.DataFrame:
    """One row per batch from per-request rows: requests of one batch share its timings."""
    cols = ["batch_size", "compute_input_us", "compute_infer_us", "compute_output_us"]
    ok = df[(df["status"] == 200)].dropna(subset=cols)
    per_batch = ok.drop_duplicates(subset=cols)
    service_ms = (per_batch["compute_input_us"] + per_batch["compute_infer_us"] + per_batch["compute_output_us"]) / 1e3
    return pd.DataFrame({"batch_size": per_batch["batch_size"].astype(int), "service_ms": service_ms})


def fit_round_trip(keys: np.ndarray, trips: np.ndarray, feature_ms: np.ndarray) -> dict:
    """Feature fetch time ≈ trips × per_trip_ms + keys × per_key_ms (least squares, ≥ 0)."""
    a = np.column_stack([trips, keys]).astype(float)
    coef, *_ = np.linalg.lstsq(a, np.asarray(feature_ms, dtype=float), rcond=None)
    coef = np.clip(coef, 0, None)
    return {"per_round_trip_ms": float(coef[0]), "per_key_ms": float(coef[1])}


def fit_profile(
    requests: pd.DataFrame, *, fit_levels: list[int], rng: np.random.Generator, features: dict | None = None
) -> dict:
    """The service-time models from the requests of ``fit_levels`` (warm-up excluded).

    With the server's feature-store settings (``features``: keys, batch_size, parallelism),
    also the Redis round trip: each request's fetch time over its sequential round trips.
    """
    df = requests[requests["level"].isin(fit_levels) & ~requests["warmup"] & (requests["status"] == 200)]
    if df.empty:
        raise ValueError("no successful requests in the fitting levels")
    batches = batches_from_requests(df)
    b, y = batches["batch_size"].to_numpy(), batches["service_ms"].to_numpy()
    affine = fit_affine(b, y)
    table = fit_table(b, y)
    # the table when it explains the batches better (batch time is rarely linear from 1)
    service = table if table is not None and table["r2"] > affine["r2"] else affine
    lowest = df[df["level"] == min(fit_levels)]
    overhead = lowest["latency_ms"] - lowest["request_us"] / 1e3
    compute_us = df["compute_input_us"] + df["compute_infer_us"] + df["compute_output_us"]
    fetch_us = df["feature_us"].fillna(0.0) if "feature_us" in df else 0.0
    # after the batch: back on the event loop, encoding and sending the response
    after = (df["request_us"] - fetch_us - df["preprocess_us"] - df["queue_us"] - compute_us) / 1e3
    stages = {
        "preprocess": fit_distribution(df["preprocess_us"].to_numpy() / 1e3, rng=rng),
        "postprocess": fit_distribution(after.to_numpy(), rng=rng),
        "overhead": fit_distribution(overhead.to_numpy(), rng=rng),
    }
    out = {"service_time": service, "service_time_fits": {"affine": affine, "table": table}, "stages": stages}
    if features is not None and "feature_us" in df and df["feature_us"].notna().any():
        f = df.dropna(subset=["feature_us", "feature_round_trips"])
        sequential = np.ceil(f["feature_round_trips"].to_numpy() / features["parallelism"])
        out["features"] = {
            "lookups_per_request": features["keys"],
            "batch_size": features["batch_size"],
            "parallelism": features["parallelism"],
            "round_trip": fit_distribution(f["feature_us"].to_numpy() / 1e3 / sequential, rng=rng),
        }
        # Under load the round trips of concurrent requests queue for the server's one event
        # loop (and single-threaded Redis): a one-thread station whose time per trip is the
        # round trip measured at the lightest fitting load, where little queues.
        light = f[f["level"] == min(fit_levels)]
        if not light.empty:
            per_trip = (
                light["feature_us"].to_numpy()
                / 1e3
                / np.ceil(light["feature_round_trips"].to_numpy() / features["parallelism"])
            )
            out["features"]["store"] = {"threads": 1, "per_op_ms": float(np.median(per_trip))}
    return out
