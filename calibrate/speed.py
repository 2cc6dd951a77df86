"""The host's speed as a process, fitted from the server's own batch timings.

Every batch's time over the fitted mean for its size is a ratio; its log is the host's log
speed at the time the batch ran plus the batch's own noise. Laid on one clock (each
slice at its place in the run, each batch at the middle of its run), the autocovariance of
those log ratios over lags of 20 ms to 50 s is, on the committed runs, a sum of two
exponentials and a spike at zero: a fast component (correlation time ~0.1–0.3 s), a
slow one (seconds), and independent noise (README, "The platform-speed process").
That is a log-AR(1) process with two components (:class:`~simulator.scenario.platform.LogAR1Speed`)
plus a per-batch factor: fitted here by least squares on the binned autocovariance, the
noise's share being what the two components leave of the variance. The front end follows
the same process with an elasticity, the slope of its slices' CPU per request on their
batches' mean log ratio (both relative to their level's median).

Only the ``fit_levels`` reach the fit: held-out slices are left out before anything is
computed (:func:`fit_slices_only`), and the clock places a slice by its position in the
design, not by anything measured in the others.

Such a process averaged over a window keeps a share of its variance (:func:`window_share`,
:func:`window_var`): what a slice's mean speed carries (the LLM calibration's minute drift,
a fit moved to a window's speed), and what is left about it once a factor holds the
window's mean (:func:`conditioned_speed`, the LLM twin's).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
from scipy import optimize

from calibrate.backlog import queue_factor
from calibrate.fit import batch_time_us, start_rates, with_rates
from calibrate.idle import after_batch_factor, idle_before_ms, idle_factor, previous_size, rate_factor_at
from calibrate.station import level_slope, slice_cpu_s
from simulator.scenario.servicetime import Affine, Table
from simulator.serving.workers import mean_service_ms

BIN_S = 0.02  # the clock's resolution for the autocovariance
# out to 50 s: the fitted slices' pairs across slices pin the slow component's decay (to
# 12 s only, its correlation time of 5 s came back anywhere from 1 to 120 s on synthetic runs)
LAGS_S = (0.02, 0.04, 0.06, 0.1, 0.16, 0.24, 0.4, 0.6, 1.0, 1.6, 2.4, 3.4, 5.0, 8.0, 12.0, 18.0, 25.0, 35.0, 50.0)
STEP_MS = 10.0
SIGMA_MIN = 1e-3  # a component with less spread than this is none
EPISODE_WINDOW_S = 0.1  # episodes are found in windows of this length
EPISODE_Z = 4.0  # a window this many robust sigmas slower than the median is in an episode
EPISODE_MIN_RATIO = 1.1  # and at least this much slower


def fitted_mean_ms(service_time: dict):
    """The fitted batch time by size (a function of an array of sizes), as the simulator
    computes it from a profile's ``service_time``."""
    model = Table if service_time["kind"] == "table" else Affine
    cfg = SimpleNamespace(
        service_time=model.model_validate({k: v for k, v in service_time.items() if k in model.model_fields})
    )
    table: dict[int, float] = {}

    def mean(sizes: np.ndarray) -> np.ndarray:
        for b in np.unique(sizes):
            table.setdefault(int(b), mean_service_ms(cfg, int(b)))
        return np.array([table[int(b)] for b in sizes])

    return mean


def fit_slices_only(requests: pd.DataFrame, fit_levels: list[int]) -> pd.DataFrame:
    """The successful, post-warm-up requests of the fitted levels: all the fit may see
    (with their instance's recent throughput, from their slices whole: :func:`with_rates`)."""
    mine = with_rates(requests[requests["level"].isin(fit_levels) & (requests["status"] == 200)], start_rates(requests))
    return mine[~mine["warmup"]]


def batch_log_ratios(
    requests: pd.DataFrame,
    mean_ms,
    period_s: float,
    after_idle: dict | None = None,
    by_rate: dict | None = None,
    after_batch: dict | None = None,
    by_queue: dict | None = None,
) -> pd.DataFrame:
    """One row per request's batch: its time on the run's clock (s), its log ratio to the
    fitted mean (``mean_ms(sizes)``, times the ``after_idle`` factor at its instance's idle
    time before it, the ``by_rate`` factor at its recent throughput, the ``after_batch``
    factor at the size of its batch before and the ``by_queue`` factor at the requests
    queued as it was taken, where the batch time has them) and its weight (1 / batch size,
    so a batch counts once); and that count (``waiting``) where the requests carry it."""
    ok = requests.dropna(subset=["batch_size", "compute_infer_us"])
    ms = measured = batch_time_us(ok).to_numpy() / 1e3
    idle = idle_before_ms(ok, ms) if after_idle else None
    if idle is not None:  # what the idle instance explains is not the host's speed
        ms = ms / idle_factor(idle, after_idle)
    if by_rate and "rate_rps" in ok:  # nor what its recent throughput does
        ms = ms / rate_factor_at(ok["rate_rps"].to_numpy(), by_rate)
    if after_batch:  # nor the size of its batch before
        ms = ms / after_batch_factor(previous_size(ok), after_batch)
    if by_queue and "waiting" in ok:  # nor the backlog waiting as it was taken
        ms = ms / queue_factor(ok["waiting"].to_numpy(), by_queue)
    sizes = ok["batch_size"].to_numpy(int)
    mean = mean_ms(sizes)
    known = (ms > 0) & (mean > 0)  # a batch without a positive time or fitted mean has no ratio
    ok, ms, sizes, mean, measured = ok[known], ms[known], sizes[known], mean[known], measured[known]
    # the batch at the middle of its run as it ran, whatever the factors explain of its time
    t = ok["slice"].to_numpy() * period_s + ok["scheduled_s"].to_numpy() + ok["latency_ms"].to_numpy() / 1e3
    t = t - measured / 2e3
    out = pd.DataFrame(
        {
            "t_s": t,
            "log_ratio": np.log(ms / mean),
            "weight": 1.0 / sizes,
            "slice": ok["slice"].to_numpy(),
            "level": ok["level"].to_numpy(),
        }
    )
    return out.assign(waiting=ok["waiting"].to_numpy()) if "waiting" in ok else out


def autocovariance(b: pd.DataFrame, lags_s=LAGS_S, bin_s: float = BIN_S) -> tuple[np.ndarray, float]:
    """The weighted autocovariance of the log ratios at ``lags_s`` (pairs of batches that
    far apart on the clock, binned at ``bin_s``), and their variance."""
    r = b["log_ratio"].to_numpy()
    w = b["weight"].to_numpy()
    r = r - np.average(r, weights=w)
    k = ((b["t_s"].to_numpy() - b["t_s"].min()) / bin_s).astype(np.int64)
    nb = int(k.max()) + 1
    s = np.bincount(k, weights=w * r, minlength=nb)
    c = np.bincount(k, weights=w, minlength=nb)
    size = 1 << math.ceil(math.log2(2 * nb))
    ss = np.fft.irfft(np.abs(np.fft.rfft(s, size)) ** 2, size)[:nb]
    cc = np.fft.irfft(np.abs(np.fft.rfft(c, size)) ** 2, size)[:nb]
    idx = np.minimum(np.round(np.asarray(lags_s) / bin_s).astype(int), nb - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cov = np.where(cc[idx] > 0, ss[idx] / cc[idx], np.nan)
    return cov, float(np.average(r * r, weights=w))


def _two_exp(tau, a_fast, t_fast, a_slow, t_slow):
    return a_fast * np.exp(-tau / t_fast) + a_slow * np.exp(-tau / t_slow)


def find_episodes(b: pd.DataFrame, window_s: float = EPISODE_WINDOW_S) -> tuple[dict | None, np.ndarray]:
    """Rare slow episodes: windows whose mean log ratio is ``EPISODE_Z`` robust sigmas
    (and ``EPISODE_MIN_RATIO``) above the median window's, runs of them (a gap of one
    window joins two), as an on/off process: the mean factor in an episode, the mean
    episode's length and the mean time between episodes over the windows observed. Also
    each batch's membership of an episode (its window's). None with fewer than two."""
    w = ((b["t_s"] - b["t_s"].min()) / window_s).astype(np.int64).to_numpy()
    s = np.bincount(w, weights=(b["log_ratio"] * b["weight"]).to_numpy())
    c = np.bincount(w, weights=b["weight"].to_numpy())
    seen = c >= 3  # windows with three batches or more
    x = np.where(seen, s / np.maximum(c, 1e-12), np.nan)
    med = np.nanmedian(x)
    sd = 1.4826 * np.nanmedian(np.abs(x - med))
    slow = seen & (x - med > max(EPISODE_Z * sd, math.log(EPISODE_MIN_RATIO)))
    idx = np.flatnonzero(slow)
    member = slow[w]
    if len(idx) == 0:
        return None, member
    runs = np.split(idx, np.flatnonzero(np.diff(idx) > 2) + 1)
    if len(runs) < 2:
        return None, member
    span = [r[-1] - r[0] + 1 for r in runs]
    observed = float(seen.sum()) * window_s
    factor = float(np.exp(np.nanmean(x[idx]) - med))
    duration = float(np.mean(span)) * window_s
    return {
        "factor": round(factor, 4),
        "mean_duration_s": round(duration, 4),
        "mean_interval_s": round(max(observed / len(runs) - duration, window_s), 3),
        "count": len(runs),
        "observed_s": round(observed, 1),
    }, member


def fit_components(cov: np.ndarray, var: float, lags_s=LAGS_S) -> dict:
    """Two AR(1) components and the noise from an autocovariance: the fast and slow
    components' variances and correlation times (least squares on the autocorrelation),
    the noise's variance what is left."""
    lags = np.asarray(lags_s, dtype=float)
    ok = np.isfinite(cov)
    rho = np.clip(cov[ok] / var, -1, 1)
    lags = lags[ok]
    p0 = (0.3, 0.15, 0.3, 4.0)
    bounds = ([0.0, 0.01, 0.0, 0.8], [1.0, 0.8, 1.0, 120.0])
    (a_f, t_f, a_s, t_s), _ = optimize.curve_fit(_two_exp, lags, rho, p0=p0, bounds=bounds, maxfev=20000)
    if a_f + a_s > 0.98:  # the components cannot hold more than the variance
        a_f, a_s = a_f * 0.98 / (a_f + a_s), a_s * 0.98 / (a_f + a_s)
    return {
        "fast": {"sigma": math.sqrt(a_f * var), "correlation_time_s": float(t_f)},
        "slow": {"sigma": math.sqrt(a_s * var), "correlation_time_s": float(t_s)},
        "noise_var": float(var * (1 - a_f - a_s)),
        "log_var": var,
        "autocorrelation": {f"{lag:g}": round(float(v), 4) for lag, v in zip(lags, rho, strict=True)},
    }


def frontend_elasticity(slices: pd.DataFrame, b: pd.DataFrame, fit_levels: list[int], *, client_shares_cores: bool):
    """The front end's CPU per request against its slice's mean batch log ratio: the
    least-squares slope of one log on the other over the fitted slices, each relative to its
    level's median (the load's own effect cancels), within [0, 3]; and the correlation."""
    per_slice = b.groupby("slice").apply(
        lambda g: np.average(g["log_ratio"], weights=g["weight"]), include_groups=False
    )
    sl = slices[slices["kept"] & slices["level"].isin(fit_levels) & slices["slice"].isin(per_slice.index)]
    if len(sl) < 3 or sl["frontend_cpu_s"].isna().any():
        return 1.0, float("nan")
    per = np.log(slice_cpu_s(sl, client_shares_cores=client_shares_cores) / sl["requests"])
    slope = level_slope(per_slice.reindex(sl["slice"]), per, sl["level"], hi=3.0)
    return slope if slope is not None else (1.0, float("nan"))


def fit_speed_process(
    requests: pd.DataFrame,
    slices: pd.DataFrame,
    mean_ms,
    fit_levels: list[int],
    *,
    period_s: float,
    client_shares_cores: bool,
    after_idle: dict | None = None,
    by_rate: dict | None = None,
    after_batch: dict | None = None,
    by_queue: dict | None = None,
) -> dict:
    """``platform.speed`` (a two-component log-AR(1); None where the batches show no
    correlated speed at all) and the batch noise's share of the log variance, from the
    fitted levels alone (``mean_ms``: the fitted batch time by size, ``after_idle`` its
    factor after an idle instance)."""
    b = batch_log_ratios(
        fit_slices_only(requests, fit_levels), mean_ms, period_s, after_idle, by_rate, after_batch, by_queue
    )
    episodes, member = find_episodes(b)
    # the wobble from the batches outside episodes: an episode's spike is not a Gaussian's tail
    cov, var = autocovariance(b[~member] if episodes is not None else b)
    comp = fit_components(cov, var)
    beta, r = frontend_elasticity(slices, b, fit_levels, client_shares_cores=client_shares_cores)
    parts = [{k: round(v, 5) for k, v in comp[c].items()} for c in ("slow", "fast")]
    parts = [c for c in parts if c["sigma"] >= SIGMA_MIN]  # a component the data do not show is left out
    speed = None
    if parts:
        speed = {"kind": "log_ar1", "step_ms": STEP_MS, "components": parts, "frontend_elasticity": round(beta, 4)}
        if episodes is not None:
            speed["episodes"] = {k: episodes[k] for k in ("factor", "mean_duration_s", "mean_interval_s")}
    return {
        "speed": speed,
        "noise_share": (comp["noise_var"] / var if var > 0 else 1.0) if speed is not None else 1.0,
        "log_var": var,
        "autocorrelation": comp["autocorrelation"],
        "episodes": episodes,
        "frontend_r": r,
        "requests": len(b),
    }


def fit_run_speed(
    requests: pd.DataFrame,
    slices: pd.DataFrame,
    service_time: dict,
    fit_levels: list[int],
    *,
    client_shares_cores: bool,
) -> dict:
    """:func:`fit_speed_process` for a run: the fitted batch time ``service_time`` (a
    profile's), the slices placed at the median fitted slice's length apart."""
    fitted = slices[slices["kept"] & slices["level"].isin(fit_levels)]
    return fit_speed_process(
        requests,
        slices,
        fitted_mean_ms(service_time),
        fit_levels,
        period_s=float(fitted["seconds"].median()),
        client_shares_cores=client_shares_cores,
        after_idle=service_time.get("after_idle"),
        by_rate=service_time.get("by_rate"),
        after_batch=service_time.get("after_batch"),
        by_queue=service_time.get("by_queue"),
    )


def shrink_ratios(ratios, share: float) -> list[float]:
    """Mean-one ratios whose log spread is scaled to ``share`` of its variance (the part
    of the batches' noise the speed process does not carry), their shape kept."""
    r = np.log(np.asarray(ratios, dtype=float))
    out = np.exp((r - r.mean()) * math.sqrt(max(share, 0.0)))
    return [round(float(v), 5) for v in out / out.mean()]


def window_share(window_s: float, correlation_time_s: float) -> float:
    """The share of a stationary AR(1)'s variance that its mean over ``window_s`` carries:
    ``2/x (1 - (1 - e^-x)/x)`` with ``x = window_s / correlation_time_s`` (1 for a window
    short against the correlation time, ``2 tau / window`` for a long one)."""
    x = window_s / correlation_time_s
    if x <= 0:
        return 0.0
    if x < 1e-4:
        return 1.0 - x / 3.0
    return float(np.clip(2.0 / x * (1.0 - -math.expm1(-x) / x), 0.0, 1.0))


def window_var(sigma: float, tau: float, t: float) -> float:
    """The variance of an AR(1)'s (σ, τ) time average over a window ``t`` long."""
    return sigma**2 * window_share(t, tau)


def conditioned_speed(components: list[dict], window_s: float) -> tuple[list[dict], float]:
    """The host's speed process as the twin simulates it once its factor is fitted on a
    window of ``window_s``: the factor already holds the window's mean of every component,
    so each keeps only the variance about that mean, ``sigma * sqrt(1 - share)``
    (:func:`window_share`); a component slower than the window is nearly all in the factor.
    Components left below 0.001 are dropped. Also the slowest correlation time among the
    components no slower than the window (the simulated span covers the LLM twin's ``speed_spans`` of it;
    the slower ones, left small, take one draw a seed)."""
    out, slowest = [], 0.0
    for c in components:
        tau = float(c["correlation_time_s"])
        sigma = float(c["sigma"]) * math.sqrt(1.0 - window_share(window_s, tau))
        if sigma >= 1e-3:
            out.append({**c, "sigma": round(sigma, 6)})
            if tau <= window_s or window_s <= 0:
                slowest = max(slowest, tau)
    return out, slowest
