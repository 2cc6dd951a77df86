"""Fitting the simulator's models from measurements: pure functions, no I/O.

* the batch service time (the hand-off to the instance process and back, plus compute):
  affine ``base + per_item × B`` by least squares over batches, or a per-size table,
  located without the stalls (batches more than six robust sigmas above the fit, counted
  and listed); its noise is the measured ratios of batch time to the fit, as a mean-one
  factor the simulator resamples (``noise_ratios``), so the right tail that drives p99 is
  the one measured; the robust CV (MAD of the log ratios) is reported beside it;
* the front end as a station: its CPU per request (the server process's CPU over the
  requests it served, the instances being other processes), plus this load generator's when
  it shares the front end's cores, on as many servers as the front end has (fitted in
  :mod:`calibrate.station`, and offered here too);
* per-stage delays: log-normal, gamma or exponential by maximum likelihood, the best by
  the Kolmogorov–Smirnov statistic, or the empirical distribution when none fits
  (:func:`calibrate.samples.fit_distribution`);
* the request overhead outside the server's stages (network, HTTP, API): client latency
  minus the server's request time, at the lowest load level, where nothing queues for it;
* the Redis round trip per sequential trip, and the one-thread station (the server's
  event loop) those trips queue for under load;
* the front end as one event loop, from the server's clocks (:mod:`calibrate.loop_fit`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from calibrate import backlog, idle
from calibrate.cycle import fit_resume
from calibrate.loop_fit import fit_event_loop, loop_on_trips
from calibrate.samples import BATCH_STAGES_US, batch_time_us, fit_distribution
from calibrate.station import SPEED_ELASTICITY_MAX, fit_frontend, fit_speed
from calibrate.stats import robust_lognormal_cv, stalls

RATIO_POINTS = 1000

__all__ = [
    "SPEED_ELASTICITY_MAX",
    "batch_time_us",
    "batches_from_requests",
    "fit_affine",
    "fit_distribution",
    "fit_frontend",
    "fit_profile",
    "fit_round_trip",
    "fit_speed",
    "fit_table",
]


def _noise(y: np.ndarray, pred: np.ndarray) -> tuple[dict, np.ndarray]:
    """Robust noise of the batches around a fit, the stalls among them, and the residuals."""
    log_ratio = np.log(y / pred)
    stalled = stalls(log_ratio)
    ratio = y / pred
    return (
        {
            "noise_cv_robust": robust_lognormal_cv(log_ratio),
            "noise_cv_sd": float(np.std(ratio, ddof=1)) if len(y) > 1 else 0.0,  # the non-robust figure, for comparison
            "stalls": int(stalled.sum()),
            "stall_ms": [round(float(v), 2) for v in np.sort(y[stalled])[::-1][:20]],
            "residual_ratio_quantiles": {
                str(q): round(float(np.quantile(ratio, q)), 4) for q in (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
            },
        },
        stalled,
    )


def _ratios(y: np.ndarray, pred: np.ndarray) -> tuple[float, list[float]]:
    """The mean of the measured ratios to the fit (stalls included), and the ratios over it
    as :data:`RATIO_POINTS` quantiles averaging exactly 1."""
    r = y / pred
    m = float(r.mean())
    q = np.quantile(r / m, (np.arange(RATIO_POINTS) + 0.5) / RATIO_POINTS)
    return m, [round(float(v), 5) for v in q / q.mean()]


def _r2(y: np.ndarray, pred: np.ndarray) -> float:
    resid = y - pred
    ss = float(((y - y.mean()) ** 2).sum())
    return 1 - float(resid @ resid) / ss if len(y) > 1 and ss > 0 else 1.0


def _affine_coef(b: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    if len(np.unique(b)) < 2:  # one batch size: no slope to fit
        return 0.0, float(y.mean() / b[0])
    per, base = np.polyfit(b, y, 1)
    if base < 0:  # a negative intercept is noise: refit through the origin
        return 0.0, float((b @ y) / (b @ b))
    return float(base), float(per)


def fit_affine(batch_size: np.ndarray, service_ms: np.ndarray) -> dict:
    """Affine batch service time with log-normal noise, from one row per batch; fitted again
    without the stalls the first fit shows."""
    b = np.asarray(batch_size, dtype=float)
    y = np.asarray(service_ms, dtype=float)
    base, per = _affine_coef(b, y)
    _, stalled = _noise(y, base + per * b)
    if stalled.any() and (~stalled).sum() >= 2:
        base, per = _affine_coef(b[~stalled], y[~stalled])
    pred = base + per * b
    noise, stalled = _noise(y, pred)
    keep = ~stalled
    m, ratios = _ratios(y, pred)
    return {
        "kind": "affine",
        "base_ms": base * m,
        "per_item_ms": per * m,
        "noise_cv": 0.0,
        "noise_ratios": ratios,
        **noise,
        "r2": _r2(y[keep], pred[keep]),
        "batches": len(y),
    }


def fit_table(batch_size: np.ndarray, service_ms: np.ndarray, *, min_batches: int = 20) -> dict | None:
    """Mean service time per batch size (interpolated between sizes by the simulator), the
    stalls left out of the means, with robust log-normal noise; None unless at least two
    sizes have ``min_batches`` batches each."""
    b = np.asarray(batch_size, dtype=int)
    y = np.asarray(service_ms, dtype=float)
    counts = pd.Series(b).value_counts()
    sizes = np.sort(counts[counts >= min_batches].index.to_numpy())
    if len(sizes) < 2:
        return None
    keep = np.isin(b, sizes)
    b, y = b[keep], y[keep]
    medians = pd.Series(y).groupby(b).median()
    _, stalled = _noise(y, medians.reindex(b).to_numpy())
    means = pd.Series(y[~stalled]).groupby(b[~stalled]).mean()
    pred = means.reindex(b).to_numpy()
    noise, stalled = _noise(y, pred)
    m, ratios = _ratios(y, pred)
    return {
        "kind": "table",
        "batch_ms": {int(k): round(float(v * m), 4) for k, v in means.items()},
        "noise_cv": 0.0,
        "noise_ratios": ratios,
        **noise,
        "r2": _r2(y[~stalled], pred[~stalled]),
        "batches": len(y),
    }


def predicted_ms(service: dict, batch_size: np.ndarray) -> np.ndarray:
    """A fitted batch-time model's mean time (ms) for each batch size (a table's sizes
    interpolated)."""
    b = np.asarray(batch_size, dtype=float)
    if service["kind"] == "affine":
        return service["base_ms"] + service["per_item_ms"] * b
    sizes = sorted(service["batch_ms"])
    return np.interp(b, sizes, [service["batch_ms"][k] for k in sizes])


def batches_from_requests(df: pd.DataFrame) -> pd.DataFrame:
    """One row per batch from per-request rows: requests of one batch share its timings.
    With the server's dispatch clock, ``idle_ms``: how long the instance sat idle before
    the batch, from the end of the slice's batch before it (NaN for a slice's first)."""
    cols = ["batch_size", *(c for c in BATCH_STAGES_US if c in df)]
    ok = df[(df["status"] == 200)].dropna(subset=cols)
    per_batch = ok.drop_duplicates(subset=[*cols, "slice"] if "slice" in ok else cols)
    out = pd.DataFrame(
        {"batch_size": per_batch["batch_size"].astype(int), "service_ms": batch_time_us(per_batch) / 1e3}
    )
    for c in ("level", "compute_infer_us", "handoff_us", "rate_rps", "rate_since_ms", "rate_scheduled", "waiting"):
        if c in per_batch:
            out[c] = per_batch[c].to_numpy()
    before = idle.idle_before_ms(per_batch, out["service_ms"].to_numpy())
    if before is not None:
        out["idle_ms"] = before
        if idle.AFTER_BATCH:  # the batch before's size, for its factor
            out["size_before"] = idle.previous_size(per_batch)
    return out


FIT_ROUNDS = 2  # rounds of the idle and throughput factors' backfitting


def start_rates(requests: pd.DataFrame) -> dict[int, float] | None:
    """Each slice's instance's throughput as the slice began, from every successful
    request of the run (``requests``: all its levels, the held-out ones' batch sizes
    included, as the instance served them; their times are not read), where the fit
    carries it (:data:`calibrate.idle.RATE_START`); None where it starts from none."""
    if idle.RATE_START != "carried":
        return None
    return idle.slice_start_rates(requests[requests["status"] == 200].dropna(subset=["batch_size"]))


def with_rates(
    requests: pd.DataFrame, initial: dict[int, float] | None = None, service: dict | None = None
) -> pd.DataFrame:
    """``requests`` (successful ones, their slices whole) with ``rate_rps``, their
    instance's recent throughput before their batch, and ``rate_since_ms``, how long into
    their slice (:func:`calibrate.idle.rate_before`, each slice's from ``initial``'s rate
    where given; counted as a fitted ``service`` time's ``by_rate`` counts, where given, else
    as the fit does: :func:`calibrate.idle.rate_source`), and ``waiting``, the requests queued as their batch was taken
    (:func:`calibrate.backlog.waiting_at_dispatch`); as given without the server's clocks,
    or when they already have them (a slice's rates are its own: a subset keeps them)."""
    if "rate_rps" in requests:
        return requests
    ok = requests.dropna(subset=["batch_size"])
    waiting = backlog.waiting_at_dispatch(ok) if backlog.BY_QUEUE else None
    if waiting is not None:  # the requests queued as each batch was taken (by_queue's count)
        requests = requests.assign(waiting=pd.Series(waiting, index=ok.index))
    kind, window = idle.rate_source(ok, service)
    got = idle.rate_before(ok, window, initial, kind) if idle.BY_RATE else None
    if got is None:
        return requests
    sent = idle.scheduled_rate(ok) if idle.BY_RATE_FIT == "schedule" else None
    if sent is not None:  # the schedule's rate before each batch: by_rate's instrument
        requests = requests.assign(rate_scheduled=pd.Series(sent, index=ok.index))
    return requests.assign(rate_rps=pd.Series(got[0], index=ok.index), rate_since_ms=pd.Series(got[1], index=ok.index))


def fit_round_trip(keys: np.ndarray, trips: np.ndarray, feature_ms: np.ndarray) -> dict:
    """Feature fetch time ≈ trips × per_trip_ms + keys × per_key_ms (least squares, ≥ 0)."""
    a = np.column_stack([trips, keys]).astype(float)
    coef, *_ = np.linalg.lstsq(a, np.asarray(feature_ms, dtype=float), rcond=None)
    coef = np.clip(coef, 0, None)
    return {"per_round_trip_ms": float(coef[0]), "per_key_ms": float(coef[1])}


def _batch_time(b: np.ndarray, y: np.ndarray) -> tuple[dict, dict | None, dict]:
    """Both batch-time fits and the one kept: the table when it explains the batches better
    (batch time is rarely linear from 1)."""
    affine, table = fit_affine(b, y), fit_table(b, y)
    return affine, table, table if table is not None and table["r2"] > affine["r2"] else affine


def fitted_requests(requests: pd.DataFrame, fit_levels: list[int]) -> pd.DataFrame:
    """The successful requests of ``fit_levels``, warm-up excluded, with their instance's
    recent throughput and the requests queued as their batch was taken (:func:`with_rates`,
    from their slices whole)."""
    df = with_rates(requests[requests["level"].isin(fit_levels) & (requests["status"] == 200)], start_rates(requests))
    df = df[~df["warmup"]]
    if df.empty:
        raise ValueError("no successful requests in the fitting levels")
    return df


def fit_batch_time(df: pd.DataFrame, queue_slope: float | None = None) -> tuple[dict, dict]:
    """The batch time (``service_time``: the table or the line, and its factors after an
    idle instance, by recent throughput and after a big batch, fitted in turn on what the
    others leave) from :func:`fitted_requests`, and both fits. With ``queue_slope`` (log per
    request waiting, :func:`calibrate.backlog.slope`), ``by_queue`` too, divided out of
    every batch before the rest is fitted."""
    batches = batches_from_requests(df)
    b, y = batches["batch_size"].to_numpy(), batches["service_ms"].to_numpy()
    rate_of, rate_window = idle.rate_source(df)  # what with_rates counted, over how long
    by_queue = None
    if queue_slope is not None and "waiting" in batches:  # the backlog's part, measured apart: divided out
        by_queue = backlog.table(queue_slope, batches["waiting"].to_numpy())
        if by_queue is not None:
            y = y / backlog.queue_factor(batches["waiting"].to_numpy(), by_queue)
    affine, table, service = _batch_time(b, y)
    idle_f = rate_f = after_f = np.ones(len(y))
    after_idle = by_rate = after_batch = None
    for _ in range(FIT_ROUNDS):  # each factor on what the table and the others leave (they move together: idle, quiet)
        if idle.AFTER_IDLE and "idle_ms" in batches:  # a batch after its instance idled runs slower
            ratio = y / predicted_ms(service, b) / rate_f / after_f
            after_idle = idle.fit_after_idle(batches["idle_ms"].to_numpy(), ratio)
            if after_idle is not None:
                idle_f = idle.idle_factor(batches["idle_ms"].to_numpy(), after_idle)
        if idle.BY_RATE and "rate_rps" in batches:  # and one after a quiet spell; a busy one faster
            settled = batches["rate_since_ms"].to_numpy() >= (0.0 if idle.RATE_START == "carried" else 2 * rate_window)
            ratio = y / predicted_ms(service, b) / idle_f / after_f
            if idle.BY_RATE_FIT == "levels" and "level" in batches:
                lv = batches["level"].to_numpy()[settled]
                by_rate = idle.fit_by_level(batches["rate_rps"].to_numpy()[settled], ratio[settled], lv)
            else:  # the schedule's bands where it has them
                z = batches["rate_scheduled"].to_numpy()[settled] if "rate_scheduled" in batches else None
                by_rate = idle.fit_by_rate(batches["rate_rps"].to_numpy()[settled], ratio[settled], instrument=z)
            if by_rate is not None:
                rate_f = idle.rate_factor_at(batches["rate_rps"].to_numpy(), by_rate)
        if idle.AFTER_BATCH and "size_before" in batches:  # and one after a big batch slower
            before = batches["size_before"].to_numpy()
            after_batch = idle.fit_after_batch(before, y / predicted_ms(service, b) / idle_f / rate_f)
            if after_batch is not None:
                after_f = idle.after_batch_factor(before, after_batch)
        affine, table, service = _batch_time(b, y / idle_f / rate_f / after_f)
        if by_rate is None and after_batch is None:  # the idle factor alone: once, on the pooled table
            break
    if after_idle is not None:
        service["after_idle"] = after_idle
    if by_rate is not None:
        service["by_rate"] = by_rate
        service["rate_window_ms"] = rate_window
        if rate_of != "batches":
            service["rate_of"] = rate_of
    if after_batch is not None:
        service["after_batch"] = after_batch
    if by_queue is not None:
        service["by_queue"] = by_queue
    return service, {"affine": affine, "table": table}


def fit_profile(
    requests: pd.DataFrame,
    *,
    fit_levels: list[int],
    rng: np.random.Generator,
    features: dict | None = None,
    frontend: dict | None = None,
    fetch_cost: dict | None = None,
) -> dict:
    """The service-time models from the requests of ``fit_levels`` (warm-up excluded); the
    batch time by :func:`fit_batch_time`.

    With the server's feature-store settings (``features``: keys, batch_size, parallelism),
    also the Redis round trip: each request's fetch time over its sequential round trips.
    With the front end's CPU per request (``frontend``, from :func:`fit_frontend`), the
    front end as a station: per request, the preprocessing time measured at the lightest
    fitting level plus the rest of its CPU; the request's remaining time outside the batch
    at that level (network, HTTP, waiting on I/O) becomes a pure delay.
    """
    df = fitted_requests(requests, fit_levels)
    service, fits = fit_batch_time(df)
    lowest = df[df["level"] == min(fit_levels)]
    overhead = lowest["latency_ms"] - lowest["request_us"] / 1e3
    fetch_us = df["feature_us"].fillna(0.0) if "feature_us" in df else 0.0
    # after the batch: back on the event loop, encoding and sending the response
    after = (df["request_us"] - fetch_us - df["preprocess_us"] - df["queue_us"] - batch_time_us(df)) / 1e3
    stages = {
        "preprocess": fit_distribution(df["preprocess_us"].to_numpy() / 1e3, rng=rng),
        "postprocess": fit_distribution(after.to_numpy(), rng=rng),
        "overhead": fit_distribution(overhead.to_numpy(), rng=rng),
    }
    out = {"service_time": service, "service_time_fits": fits, "stages": stages}
    if frontend is not None:
        pre = lowest["preprocess_us"].to_numpy() / 1e3
        station = frontend["station_ms_per_request"]
        if pre.mean() <= station:  # the rest of the CPU (HTTP, parsing, encoding) on top
            service, extra = pre + (station - pre.mean()), station - pre.mean()
        else:  # the preprocessing's wall time holds waits (a decode thread's GIL hand-offs):
            service, extra = pre * (station / pre.mean()), 0.0  # its CPU share; the waits are delay
        rest = (overhead + after.loc[lowest.index]).to_numpy() + pre - service
        # the hub's time (--frontends) is in what the light level measured outside the batch:
        # it moves to the hub's station, so light-load latency stays as measured
        rest = rest - (frontend.get("hub_station_ms_per_request") or 0.0)
        out["frontend"] = {
            **frontend,
            "service": fit_distribution(service, rng=rng),
            "other_cpu_ms": extra,
            "preprocess_wait_ms": float((pre - service).clip(min=0).mean()),
            "fixed_delay": fit_distribution(np.maximum(rest, 0.01), rng=rng),
            "fixed_delay_clipped": float((rest < 0.01).mean()),
        }
        loop = fit_event_loop(df, lowest, service, rest, rng=rng)
        if loop is not None:
            out["frontend"]["event_loop"] = loop
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
            if fetch_cost is not None and "frontend" in out and features["parallelism"] == 1:
                loop_on_trips(out, light, per_trip, fetch_cost, overhead, after, rng=rng)
                loop = out["frontend"].get("event_loop")
                if loop is not None:  # the handler awaits its fetch: its resumption, off the clocks
                    loop["resume_ms"] = fit_resume(df, fit_levels)
    return out
