"""``service_time.by_queue``'s slope, measured against the load generator's schedule, and
the batch time fitted again with it (:mod:`calibrate.backlog`, whose docstring says why
the schedule and not the measured backlog)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate import backlog, idle
from calibrate.backlog import WINDOW_S, iv_slope, waiting_at_dispatch
from calibrate.fit import fit_batch_time, fitted_requests, with_rates
from calibrate.replay import start_rates, write_arrivals
from calibrate.scenario import scenario_dict
from calibrate.speed import batch_log_ratios, fitted_mean_ms
from simulator.engine import simulate
from simulator.scenario.config import Scenario


def _per_window(t_s: np.ndarray, weight: np.ndarray, values: np.ndarray, windows: int) -> np.ndarray:
    k = np.clip((t_s / WINDOW_S).astype(int), 0, windows - 1)
    cnt = np.bincount(k, weights=weight, minlength=windows)
    per = np.bincount(k, weights=weight * values, minlength=windows)
    return np.where(cnt > 0, per / np.maximum(cnt, 1e-12), np.nan)


def _simulated(profile: dict, g: pd.DataFrame, row: pd.Series, start: float | None, folder: Path, windows: int):
    """The slice's arrivals through ``profile`` at a constant speed: the requests waiting
    as each batch was taken, per window (batch-weighted)."""
    arrivals, duration = write_arrivals(g, row, folder)
    doc = scenario_dict(profile, float(row["rate_rps"]), duration_s=duration, warmup_s=0.0, seed=1)
    doc["traffic"] = {"arrivals_file": str(arrivals)}
    doc["workers"]["service_time"].pop("by_queue", None)
    if start is not None and profile["service_time"].get("by_rate"):
        doc["workers"]["service_time"]["rate_initial_rps"] = start
    doc["platform"] = {"speed": {"kind": "trace", "step_ms": WINDOW_S * 1e3, "factors": [1.0] * windows}}
    rec = simulate(Scenario.model_validate(doc)).records
    ok = rec.completed & np.isfinite(rec.t_dispatch)
    enq, disp, done = rec.t_preprocessed[ok], rec.t_dispatch[ok], rec.t_inferred[ok]
    t, first = np.unique(disp, return_index=True)  # one row per batch
    waiting = np.searchsorted(np.sort(enq), t, side="right") - np.searchsorted(np.sort(disp), t, side="left")
    middle = (t + (done[first] - t) / 2) / 1e3
    return _per_window(middle, np.ones(len(t)), waiting.astype(float), windows)


def slope(profile: dict, requests: pd.DataFrame, slices: pd.DataFrame, fit_levels: list[int]) -> dict | None:
    """The instrumented slope of the log batch speed on the requests waiting (module
    docstring) over the kept slices of ``fit_levels``, with its first stage and the windows
    it read; None without the server's clocks."""
    ok_all = requests[requests["status"] == 200]
    if not idle._clocked(ok_all) or "enqueued_at_ns" not in ok_all:
        return None
    st = profile["service_time"]
    starts = start_rates(ok_all, st) or {}
    lf_all, x_all, z_all = [], [], []
    kept = slices[slices["kept"] & slices["level"].isin(fit_levels)]
    with tempfile.TemporaryDirectory() as tmp:
        for _, row in kept.iterrows():
            g = requests[requests["slice"] == row["slice"]]
            ok = g[g["status"] == 200].dropna(subset=["batch_size"])
            waiting = waiting_at_dispatch(ok)
            if waiting is None or len(ok) < 20:
                continue
            start = starts.get(int(row["slice"]))
            ok = with_rates(ok, None if start is None else {int(row["slice"]): start}).assign(waiting=waiting)
            b = batch_log_ratios(
                ok, fitted_mean_ms(st), 0.0, st.get("after_idle"), st.get("by_rate"), st.get("after_batch")
            )
            windows = int(np.ceil(float(row["seconds"]) / WINDOW_S))
            t, w = b["t_s"].to_numpy(), b["weight"].to_numpy()
            lf = _per_window(t, w, b["log_ratio"].to_numpy(), windows)
            x = _per_window(t, w, b["waiting"].to_numpy(), windows)
            z = _simulated(profile, g, row, start, Path(tmp), windows)
            inner = np.zeros(windows, dtype=bool)
            inner[1 : windows - 1] = True
            use = inner & np.isfinite(lf) & np.isfinite(x) & np.isfinite(z)
            if use.sum() < 3:
                continue
            lf_all.append(lf[use] - lf[use].mean())
            x_all.append(x[use] - x[use].mean())
            z_all.append(z[use] - z[use].mean())
    if not z_all:
        return None
    got = iv_slope(np.concatenate(lf_all), np.concatenate(x_all), np.concatenate(z_all))
    if got["first"] <= 0.2:  # the schedule does not move the backlog: no instrument
        return None
    return {
        "slope": got["iv"],
        "first_stage": got["first"],
        "least_squares": got["ols"],
        "windows": int(sum(len(a) for a in lf_all)),
        "slices": len(lf_all),
    }


def fit(profile: dict, requests: pd.DataFrame, slices: pd.DataFrame, fit_levels: list[int]) -> dict | None:
    """``profile``'s batch time fitted again with ``by_queue`` (:func:`slope`, measured with
    the profile as fitted without it; then :func:`calibrate.fit.fit_batch_time`), in place,
    and the slope's record as ``profile["by_queue_fit"]``; None (the profile untouched)
    where it is off, the server's clocks are missing or the schedule moves no backlog. Its
    speed process is the caller's to fit after."""
    profile.pop("by_queue_fit", None)
    got = slope(profile, requests, slices, fit_levels) if backlog.BY_QUEUE else None
    if got is None:
        return None
    service, fits = fit_batch_time(fitted_requests(requests, fit_levels), got["slope"])
    profile["service_time"], profile["service_time_fits"] = service, fits
    profile["by_queue_fit"] = {k: round(v, 6) if isinstance(v, float) else v for k, v in got.items()}
    return got
