"""The tiny LLM engine's step time: profiled through the running server, and fitted.

A step's time depends on its work as the simulator's linear step model says
(:class:`simulator.scenario.llm.LinearStep`):

    t = c0 + c_prefill·P + c_attn·Σ p_i(ctx_i + p_i/2) + c_decode·D + c_kv·Σ ctx_j

with ``P`` prompt (or recomputed) tokens in chunks of ``p_i`` after ``ctx_i`` cached ones,
and ``D`` decoding sequences over ``Σ ctx_j`` tokens of context.

:func:`profile` drives the server with a grid of workloads (``d`` requests at once, each
with an ``L``-token prompt of random tokens and 32 output tokens: prefill chunks of every
size up to the token budget, then decode batches of ``d`` sequences whose context grows
from ``L``) and reads the engine's own record of every step (``GET /servesim/steps``).
A step's time is its whole cycle in the engine's loop, from reading its pipe to sending
its tokens (the forward pass, the scheduler, the sampling, the hand-off), which is what
the requests in it wait for. :func:`fit` fits the five coefficients by non-negative least
squares on relative error, and the step's multiplicative noise from successive decode
steps of one batch (their shapes differ by ``D`` tokens of context, so the difference of
their log residuals is noise, not misfit).

The host's speed is in every step, and it shapes the steps: when the host runs slow,
requests pile up and batches grow; when it runs fast, the queue drains and the engine
steps small batches. So a step's shape and its speed are correlated, and a fit that
treats the speed as noise learns a false step time (in the simulator itself, with the
calibrated speed process: decode-only steps of 1-4 sequences 9-15% slower at 30% of the
knee than at 80%, 1-3% without it; calibrate/experiments/llm_selection.py). :func:`fit`
therefore takes the speed out first: a factor for each quarter-second of the clock (a
fixed effect), estimated with the coefficients by turns, so the coefficients come from
steps of different shapes at the same moment, and the factors average to one over the
quarter-seconds, as the simulator's speed process does over time.
"""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from calibrate.speed import window_var

FEATURES = ("prefill_tokens", "attention", "decodes", "decode_context")
COEFFICIENTS = ("c0_ms", "prefill_ms_per_token", "attention_ms_per_token2", "decode_ms_per_seq", "kv_ms_per_token")
OUTPUT_TOKENS = 32


def grid(max_num_seqs: int, capacity_tokens: int, max_model_len: int) -> list[tuple[int, int]]:
    """(requests at once, prompt tokens) pairs whose sequences fit the KV cache together:
    powers of two, and for each prompt length as many as fit (up to ``max_num_seqs``), so
    that the profile reaches the context an overloaded engine runs at, its KV cache full
    (the powers of two alone stop at 52-62% of it; beyond, the fit extrapolated)."""
    out = []
    for length in (16, 128, 512, 1024):
        if length + OUTPUT_TOKENS > max_model_len:
            continue
        most = min(max_num_seqs, capacity_tokens // (length + OUTPUT_TOKENS + 16))
        out += [(d, length) for d in (1, 2, 4, 8, 16, 32, 64, 128) if d <= most]
        if most >= 1 and most not in (1, 2, 4, 8, 16, 32, 64, 128):
            out.append((most, length))
    return sorted(out)  # as before: by requests at once, then prompt length


async def _complete(session, url: str, prompt: list[int], max_tokens: int) -> None:
    """One request, streamed and read to its end as a load's are: the front end's work on
    each token runs beside the engine as it does under load (measured: decode steps of 2 to
    32 sequences take 20-35% longer beside streamed requests than beside whole answers)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True}
    async with session.post(url + "/v1/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"the server answered {r.status}: {(await r.text())[:300]}")
        async for _line in r.content:
            pass


async def _profile(url: str, shapes: list[tuple[int, int]], repeats: int, rng: np.random.Generator) -> pd.DataFrame:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        async with session.get(url + "/servesim/steps") as r:  # the records so far: not the profile's
            await r.json()
        order = [shapes[k] for _ in range(repeats) for k in rng.permutation(len(shapes))]
        for d, length in order:
            prompts = [rng.integers(1, 256, length).tolist() for _ in range(d)]  # random: no prefix hits
            await asyncio.gather(*(_complete(session, url, p, OUTPUT_TOKENS) for p in prompts))
        async with session.get(url + "/servesim/steps") as r:
            steps = pd.DataFrame(await r.json())
    return steps[steps["done_ns"] > 0].reset_index(drop=True)


def profile(
    url: str, *, max_num_seqs: int, capacity_tokens: int, max_model_len: int, repeats: int = 2, seed: int = 0
) -> pd.DataFrame:
    """The engine's step records over the grid's workloads, each run ``repeats`` times in a
    random order, one workload at a time."""
    shapes = grid(max_num_seqs, capacity_tokens, max_model_len)
    return asyncio.run(_profile(url, shapes, repeats, np.random.default_rng(seed)))


def step_ms(steps: pd.DataFrame) -> np.ndarray:
    """Each step's whole cycle in the engine's loop, ms."""
    return (steps["done_ns"].to_numpy() - steps["begin_ns"].to_numpy()) / 1e6


THRESHOLDS = (None, 2, 4, 8, 16, 32)  # decode batch sizes where the per-sequence rate may change
SPEED_BIN_S = 0.25  # the clock's slices a speed factor each: shorter than the host's fast component (0.4 s)
SPEED_ROUNDS = 8  # turns of factors and coefficients (the coefficients settle to 0.1% in 4-5)


WAKE_STEPS = 3  # the steps after an idle engine that cost more (the 4th and later: within 0.05 ms)
WAKE_GAP_MS = 1.0  # a gap this long before a step means the engine idled (between busy steps: ~0.05 ms)


def wake_position(df: pd.DataFrame) -> np.ndarray:
    """Each step's place after the engine last idled (0: the first step after a gap of more
    than :data:`WAKE_GAP_MS`), in the steps' time order (``begin_ns``, ``done_ns``); a step
    whose predecessor is missing (a phase left out) counts from the gap that leaves."""
    begin = df["begin_ns"].to_numpy(dtype=np.int64)
    done = df["done_ns"].to_numpy(dtype=np.int64)
    order = np.argsort(begin, kind="stable")
    b, d = begin[order], done[order]
    gap = b[1:] - d[:-1] > WAKE_GAP_MS * 1e6
    starts = np.concatenate([[True], gap])
    run_start = np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))
    pos = np.empty(len(order), dtype=np.int64)
    pos[order] = np.arange(len(order)) - run_start
    return pos


def design(df: pd.DataFrame, threshold: int | None = None, wake_steps: int = 0) -> np.ndarray:
    """The step model's columns: 1, P, Σp(ctx+p/2), D (up to ``threshold``), Σctx, with a
    threshold the decodes beyond it, and with ``wake_steps`` one column for each of the first
    steps after the engine idled (1 for the k-th such step: its extra cost)."""
    d = df["decodes"].to_numpy(dtype=float)
    below = d if threshold is None else np.minimum(d, threshold)
    cols = [
        np.ones(len(df)),
        df["prefill_tokens"].to_numpy(float),
        df["attention"].to_numpy(float),
        below,
        df["decode_context"].to_numpy(float),
    ]
    if threshold is not None:
        cols.append(np.maximum(d - threshold, 0.0))
    if wake_steps:
        pos = wake_position(df)
        cols += [(pos == k).astype(float) for k in range(wake_steps)]
    return np.column_stack(cols)


def predict_ms(coef: dict, df: pd.DataFrame) -> np.ndarray:
    th = coef.get("decode_threshold")
    wake = list(coef.get("wake_ms") or [])
    c = [coef[k] for k in COEFFICIENTS] + ([coef["decode_ms_per_seq_above"]] if th is not None else []) + wake
    return design(df, th, len(wake)) @ np.array(c)


def tall_nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``scipy.optimize.nnls(a, b)`` for a tall ``a`` (n steps by k columns), solved on k
    rows: with the columns scaled to unit length (a positive scale keeps x ≥ 0) and
    ``aᵀa = v·diag(λ)·vᵀ``, ‖ax − b‖² = ‖m·x − d‖² + a constant for ``m = diag(√λ)·vᵀ``,
    ``d = diag(1/√λ)·vᵀaᵀb`` (the directions with λ ≈ 0 dropped: a has no length there),
    so the minimiser is the same, and scipy's active set works on k rows instead of n (a
    whole calibration's fit, 100k steps and 108 solves: 10 s of its 13 before)."""
    n, k = a.shape
    if n <= 4 * k:
        return nnls(a, b)[0]
    norm = np.sqrt(np.einsum("ij,ij->j", a, a))
    x = np.zeros(k)
    used = norm > 0  # a column of zeros (no step past a threshold): its coefficient stays 0, as scipy's does
    if not used.any():
        return x
    a_s = a[:, used] / norm[used]
    lam, v = np.linalg.eigh(a_s.T @ a_s)
    keep = lam > lam.max() * 1e-12
    m = np.sqrt(lam[keep])[:, None] * v[:, keep].T
    d = (v[:, keep].T @ (a_s.T @ b)) / np.sqrt(lam[keep])
    x[used] = nnls(m, d)[0] / norm[used]
    return x


def _nnls(x: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Non-negative least squares on relative error; ``weights``: each step's weight in the
    sum of squares (default: alike)."""
    sw = np.ones(len(y)) if weights is None else np.sqrt(weights)
    coef = tall_nnls(x / y[:, None] * sw[:, None], sw)
    # again, weighted by the fitted times instead of the measured ones: weights from noisy
    # times favour the steps that happened to be fast, a bias of about 2·cv² low
    pred = x @ coef
    return tall_nnls(x / pred[:, None] * sw[:, None], y / pred * sw)


def speed_bins(steps: pd.DataFrame, bin_s: float | None = SPEED_BIN_S) -> np.ndarray | None:
    """Each step's slice of the clock (``bin_s`` long, numbered from 0 over the slices with
    steps), or None without a clock (``begin_ns``) or ``bin_s``."""
    if bin_s is None or "begin_ns" not in steps:
        return None
    t = steps["begin_ns"].to_numpy(dtype=np.int64)
    return np.unique((t - t.min()) // int(bin_s * 1e9), return_inverse=True)[1]


def nnls_at_speed(
    x: np.ndarray, y: np.ndarray, bins: np.ndarray | None, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The coefficients and each step's speed factor (ones without ``bins``): by turns, the
    factor of each slice (the geometric mean of its steps' ratios to the line, scaled so the
    slices' factors average to one) and the line fitted to the times divided by them
    (``weights``: each step's in the fit, default alike)."""
    coef = _nnls(x, y, weights)
    factor = np.ones(len(y))
    if bins is None:
        return coef, factor
    n = np.bincount(bins)
    for _ in range(SPEED_ROUNDS):
        s = np.bincount(bins, weights=np.log(y / (x @ coef))) / n
        s -= np.log(np.mean(np.exp(s)))
        factor = np.exp(s[bins])
        coef = _nnls(x, y / factor, weights)
    return coef, factor


def fit(
    steps: pd.DataFrame,
    ms: np.ndarray | None = None,
    thresholds=THRESHOLDS,
    speed_bin_s: float | None = SPEED_BIN_S,
    wake_steps: int = WAKE_STEPS,
) -> dict:
    """The coefficients (ms) by non-negative least squares on relative error (weighted by a
    first fit's times), with the host's speed of each ``speed_bin_s`` of the clock taken out
    (None: not; see the module's note), and the decode threshold among ``thresholds`` that
    fits best (a CPU's batch of decodes costs less per sequence as it grows: one rate would
    be too high for small batches and too low for large ones); the extra cost of each of
    the first ``wake_steps`` steps after the engine idled (``wake_ms``; 0 or steps without
    a clock: none); the step's noise as a log-normal cv; how far the line is from the steps."""
    y = step_ms(steps) if ms is None else np.asarray(ms, dtype=float)
    bins = speed_bins(steps, speed_bin_s)
    if "begin_ns" not in steps or "done_ns" not in steps:  # no clock: no idle to tell
        wake_steps = 0
    best = None
    for th in thresholds:
        x = design(steps, th, wake_steps)
        coef, factor = nnls_at_speed(x, y, bins)
        rel = (y / factor - x @ coef) / (x @ coef)
        score = float(np.sum(rel**2))
        if best is None or score < best[0] - 1e-9 * abs(best[0]):
            best = (score, th, coef, x)
    _, th, coef, x = best
    pred = x @ coef
    log_res = np.log(y / pred)
    # successive decode-only steps of one batch (same D): their log residuals' differences
    dec = (steps["chunks"].to_numpy() == 0) & (steps["decodes"].to_numpy() > 0)
    same = dec[1:] & dec[:-1] & (np.diff(steps["decodes"].to_numpy()) == 0)
    diffs = np.diff(log_res)[same]
    sigma = float(np.std(diffs, ddof=1) / np.sqrt(2.0)) if len(diffs) > 2 else float(np.std(log_res, ddof=1))
    rel = np.abs(y - pred) / y
    out = {name: float(c) for name, c in zip(COEFFICIENTS, coef, strict=False)}
    out["decode_threshold"] = th
    out["decode_ms_per_seq_above"] = float(coef[5]) if th is not None else 0.0
    out["wake_ms"] = [float(c) for c in coef[len(coef) - wake_steps :]] if wake_steps else []
    return {
        **out,
        "noise_cv": float(np.sqrt(np.expm1(sigma**2))),
        "steps": len(y),
        "median_abs_rel_error": float(np.median(rel)),
        "p90_abs_rel_error": float(np.quantile(rel, 0.9)),
    }


def fit_speed(steps: pd.DataFrame, coef: dict) -> dict:
    """The host's speed as the steps show it: their log residuals against the fit, in time
    order, as a two-component log-AR(1) (``platform.speed``) plus white noise (the
    scenario's ``noise_cv``), fitted on their autocovariance as
    :mod:`calibrate.speed` fits the image server's batches. On these VMs the steps of one
    minute run 15-20% faster or slower than the next's, whatever the load: a slow
    component the simulator must draw, not a fixed factor."""
    from calibrate.speed import SIGMA_MIN, autocovariance, fit_components

    y = step_ms(steps)
    b = pd.DataFrame(
        {"t_s": steps["begin_ns"].to_numpy() / 1e9, "log_ratio": np.log(y / predict_ms(coef, steps)), "weight": 1.0}
    )
    cov, var = autocovariance(b.sort_values("t_s"))
    comp = fit_components(cov, var)
    parts = [
        {"sigma": round(comp[c]["sigma"], 5), "correlation_time_s": round(comp[c]["correlation_time_s"], 4)}
        for c in ("slow", "fast")
        if comp[c]["sigma"] >= SIGMA_MIN
    ]
    speed = {"kind": "log_ar1", "step_ms": 10.0, "components": parts} if parts else None
    return {"speed": speed, "noise_cv": float(np.sqrt(np.expm1(comp["noise_var"]))), "log_var": float(var)}


SLICE_GAP_S = 30.0  # within a phase, a gap this long separates two of its slices (minutes apart)
MINUTE_S = 600.0  # the drift's correlation time: constant over a slice, fresh for the next


def slice_labels(steps: pd.DataFrame) -> np.ndarray:
    """Each step's slice: ``phase#slice`` as the calibration recorded it (``slice``), else,
    within its phase (``phase``; one phase without it), a new slice wherever the phase's
    steps, in time order, leave a gap of :data:`SLICE_GAP_S` (a level's slices are minutes
    apart, the other phases' between them; two slices of a level that follow each other
    across a round's end then count as one)."""
    phase = steps["phase"].to_numpy() if "phase" in steps else np.zeros(len(steps), dtype=object)
    begin = steps["begin_ns"].to_numpy(dtype=np.int64)
    out = np.empty(len(steps), dtype=object)
    recorded = steps["slice"].to_numpy(dtype=float) if "slice" in steps else np.full(len(steps), np.nan)
    known = np.isfinite(recorded)
    out[known] = [f"{p}#{int(k)}" for p, k in zip(phase[known], recorded[known], strict=True)]
    for p in pd.unique(phase[~known]):
        idx = np.flatnonzero((phase == p) & ~known)
        idx = idx[np.argsort(begin[idx], kind="stable")]
        k = np.concatenate([[0], np.cumsum(np.diff(begin[idx]) > SLICE_GAP_S * 1e9)])
        out[idx] = [f"{p}#{j}" for j in k]
    return out


def minute_drift(steps: pd.DataFrame, coef: dict, speed: dict | None, skip=("profile",)) -> dict:
    """The host's drift between slices that the fitted components do not hold: each slice's
    mean speed (its quarter-seconds' mean log residual against ``coef``, averaged over its
    quarter-seconds), about its phase's mean (the load's own effect cancels), pooled over the
    phases with two slices or more (not those in ``skip``: the profile is one long series of
    workloads); less what the components of ``speed`` give a window as long as the slice.
    Returns the drift's sigma (0 when the components hold it all), the slices' spread, the
    components' share and the degrees of freedom."""
    none = {"sigma": 0.0, "observed_var": 0.0, "components_var": 0.0, "dof": 0}
    s = steps[~steps["phase"].isin(skip)] if "phase" in steps else steps
    if len(s) == 0:
        return none
    s = s.reset_index(drop=True)
    log_res = np.log(step_ms(s) / predict_ms(coef, s))
    bins = np.asarray((s["begin_ns"].to_numpy(dtype=np.int64) // int(SPEED_BIN_S * 1e9)), dtype=np.int64)
    t = pd.DataFrame({"slice": slice_labels(s), "bin": bins, "r": log_res})
    t["phase"] = t["slice"].str.rsplit("#", n=1).str[0]
    per_bin = t.groupby(["phase", "slice", "bin"], sort=False)["r"].mean().reset_index()
    per_slice = per_bin.groupby(["phase", "slice"], sort=False).agg(m=("r", "mean"), n=("bin", "size"))
    per_slice = per_slice.reset_index()
    per_slice["dev"] = per_slice["m"] - per_slice.groupby("phase")["m"].transform("mean")
    counts = per_slice.groupby("phase")["m"].transform("size")
    keep = counts >= 2
    dof = int((per_slice[keep].groupby("phase").size() - 1).sum())
    if dof < 1:
        return none
    observed = float((per_slice.loc[keep, "dev"] ** 2).sum() / dof)
    comps = (speed or {}).get("components", [])
    windows = per_slice.loc[keep, "n"].to_numpy() * SPEED_BIN_S
    model = float(np.mean([sum(window_var(c["sigma"], c["correlation_time_s"], w) for c in comps) for w in windows]))
    return {
        "sigma": float(math.sqrt(max(observed - model, 0.0))),
        "observed_var": observed,
        "components_var": model,
        "dof": dof,
    }


def slice_speeds(steps: pd.DataFrame, coef: dict, phase: str) -> dict:
    """The host's speed in each slice of ``phase`` (``slice``; one slice without it), in log,
    against ``coef`` (a fit of the other phases): the slice's steps' log residuals averaged
    within each quarter-second of the clock, then over its quarter-seconds (the host's
    speed over the slice's time: the batches' make-up selects which steps a moment holds,
    not which moments count), less the same over every other phase's steps. > 0: the slice
    ran on a slower host than the steps the fit saw."""
    r = np.log(step_ms(steps) / predict_ms(coef, steps))
    bins = steps["begin_ns"].to_numpy(dtype=np.int64) // int(SPEED_BIN_S * 1e9)
    t = pd.DataFrame({"r": r, "bin": bins})
    mine = (steps["phase"] == phase).to_numpy()
    if not mine.any():
        raise ValueError(f"no steps of phase {phase!r}")

    def over_time(mask: np.ndarray) -> float:
        return float(t[mask].groupby("bin")["r"].mean().mean())

    ref = over_time(~mine) if (~mine).any() else 0.0
    labels = steps["slice"].to_numpy(dtype=float) if "slice" in steps else np.zeros(len(steps))
    labels = np.where(np.isfinite(labels), labels, 0.0)
    return {int(k): over_time(mine & (labels == k)) - ref for k in np.unique(labels[mine])}
