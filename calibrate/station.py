"""The front end as a station: its CPU per request and in the background, from the
slices (:func:`fit_frontend`), and the platform's speed per slice as a factor on that CPU
(:func:`fit_speed`). Pure functions, no I/O."""

from __future__ import annotations

import numpy as np
import pandas as pd


def fit_frontend(slices: pd.DataFrame, *, servers: int, client_shares_cores: bool, cores: int | None = None) -> dict:
    """The front end's CPU: per request, and in the background, from the slices.

    Each slice gives CPU seconds per second against requests per second; a least-squares
    line through them separates the marginal CPU per request (its slope) from the CPU the
    front end's cores spend whatever the load (its intercept, in cores: timers, the metrics
    scrape, the platform meter, the client's own loop). With ``sidecar_cpu_s`` (a
    redis-server's CPU), and on a front end of one core, the client's and the sidecar's CPU
    count as the front end's. The station's service time is the
    marginal cost stretched by the share of the cores that background leaves, as a CPU
    shared round-robin would stretch it. With ``hub_cpu_s`` (``servesim serve --frontends
    N``: the one process between the N front ends and the batcher, its CPU counted in the
    server's), the hub's line is fitted alone and taken out of the servers': it is a
    station of one server, stretched by its own background. With ``cores`` (the cores the
    front end runs on), the capacity is also bounded by them: N servers and a hub on fewer
    cores share them. With a single rate the line cannot be drawn and the mean cost per
    request stands in for the slope.
    """
    ok = slices[slices["frontend_cpu_s"].notna() & (slices["requests"] > 0)]
    if ok.empty:
        raise ValueError("no slice recorded the server's CPU time (its /metrics has no process_cpu_seconds_total)")
    secs = ok["seconds"] if "seconds" in ok else ok["requests"] / ok["rate_rps"]
    rate = (ok["requests"] / secs).to_numpy()
    parts = {"server": ok["frontend_cpu_s"] / secs, "client": ok["client_cpu_s"] / secs}
    if "sidecar_cpu_s" in ok and ok["sidecar_cpu_s"].notna().all():
        parts["sidecar"] = ok["sidecar_cpu_s"] / secs
    if "hub_cpu_s" in ok and ok["hub_cpu_s"].notna().all():  # --frontends: the batcher's process, in the total
        parts["hub"] = ok["hub_cpu_s"] / secs
    fits = {}
    for name, busy in parts.items():
        if np.ptp(rate) > 0.2 * rate.mean():
            slope, intercept = np.polyfit(rate, busy.to_numpy(), 1)
        else:
            slope, intercept = float(busy.mean() / rate.mean()), 0.0
        fits[name] = (max(float(slope), 0.0) * 1e3, max(float(intercept), 0.0))
    # on a front end of one core, this client and a redis-server pinned there take its CPU too
    shared = [p for p in ("client", "sidecar") if p in fits] if client_shares_cores else []
    # --frontends N: the hub's CPU is in the server's; it is a station of its own, one
    # process every request passes, so the N servers carry the rest
    hub_ms, hub_bg = fits.get("hub", (0.0, 0.0))
    marginal = max(fits["server"][0] - hub_ms, 0.0) + sum(fits[p][0] for p in shared)
    background = max(fits["server"][1] - hub_bg, 0.0) + sum(fits[p][1] for p in shared)
    left = max(servers - background, 0.05 * servers) / servers  # share of each core the requests get
    hub_left = max(1.0 - hub_bg, 0.05)  # of the hub's one core
    capacity = servers * left / marginal * 1e3 if marginal > 0 else float("inf")
    if hub_ms > 0:
        capacity = min(capacity, hub_left / hub_ms * 1e3)
    total_ms = fits["server"][0] + sum(fits[p][0] for p in shared)  # the hub's included
    if cores is not None and total_ms > 0:
        total_bg = fits["server"][1] + sum(fits[p][1] for p in shared)
        capacity = min(capacity, max(cores - total_bg, 0.05 * cores) / total_ms * 1e3)
    return {
        "servers": servers,
        "cpu_ms_per_request": fits["server"][0],
        "client_cpu_ms_per_request": fits["client"][0],
        "sidecar_cpu_ms_per_request": fits["sidecar"][0] if "sidecar" in fits else None,
        # one process every request passes (servesim serve --frontends): its share of the server's
        # CPU per request and in the background, and its time per request as a one-server station
        "hub_cpu_ms_per_request": fits["hub"][0] if "hub" in fits else None,
        "hub_background_cores": fits["hub"][1] if "hub" in fits else None,
        "hub_station_ms_per_request": hub_ms / hub_left if "hub" in fits else None,
        "background_cores": background,
        "client_shares_cores": client_shares_cores,
        "station_ms_per_request": marginal / left,
        "capacity_rps": capacity,
    }


SPEED_ELASTICITY_MAX = 1.5  # a fitted elasticity above this is noise, not the platform


def slice_cpu_s(slices: pd.DataFrame, *, client_shares_cores: bool) -> pd.Series:
    """Each slice's front-end CPU seconds: the server's, and on a front end of one core the
    load generator's and a sidecar's (a redis-server's) that share it."""
    cpu = slices["frontend_cpu_s"] + (slices["client_cpu_s"] if client_shares_cores else 0.0)
    if client_shares_cores and "sidecar_cpu_s" in slices:
        cpu = cpu + slices["sidecar_cpu_s"].fillna(0.0)
    return cpu


def level_slope(x, y, levels, *, hi: float, rows=None) -> tuple[float, float] | None:
    """The least-squares slope of ``y`` on ``x`` through the origin, each relative to its
    level's median (so the load's own effect cancels), over ``rows`` (default: all), within
    [0, ``hi``], and the correlation; None with fewer than three rows or no spread in x."""
    x = pd.Series(np.asarray(x, dtype=float))
    y = pd.Series(np.asarray(y, dtype=float))
    lv = np.asarray(levels)
    x = (x - x.groupby(lv).transform("median")).to_numpy()
    y = (y - y.groupby(lv).transform("median")).to_numpy()
    if rows is not None:
        x, y = x[rows], y[rows]
    if len(x) < 3 or float(x @ x) <= 0:
        return None
    r = float(np.corrcoef(x, y)[0, 1]) if np.std(y) > 0 else 0.0
    return float(np.clip((x @ y) / (x @ x), 0.0, hi)), r


def fit_speed(slices: pd.DataFrame, fit_levels: list[int], *, client_shares_cores: bool) -> dict | None:
    """The platform's speed per slice, as the factor it puts on the front end's CPU.

    The speed meter gives each slice run its mean slowdown ``s`` (chunk time over the run's
    usual). On the 2-core VM a slice's CPU per request tracked it within every level
    (r 0.78–0.98), the platform running some slices ~30% slower than others: a slow slice
    is a busier front end, and at 70–85% load that is the difference between a p99 of 40
    and of 400 ms. The elasticity ``beta`` comes from the fitted levels' slices: the least-
    squares slope of log(CPU per request) on log(s), each relative to its level's median (so
    the load's own effect on the CPU cancels). Each fitted slice's factor is ``s ** beta``
    over the mean of those, so the factors average one, as the CPU per request they scale
    does; the held-out slices give nothing. None without a speed meter or with too few
    slices to fit."""
    if "slowdown_mean" not in slices:
        return None
    ok = slices[slices["kept"] & slices["slowdown_mean"].notna() & (slices["requests"] > 0)]
    if len(ok) < 3:
        return None
    per = np.log(slice_cpu_s(ok, client_shares_cores=client_shares_cores) / ok["requests"])
    fit = ok["level"].isin(fit_levels).to_numpy()
    slope = level_slope(np.log(ok["slowdown_mean"]), per, ok["level"], hi=SPEED_ELASTICITY_MAX, rows=fit)
    if slope is None:
        return None
    beta, r = slope
    raw = ok["slowdown_mean"].to_numpy()[fit] ** beta
    return {
        "elasticity": beta,
        "r": r,
        "slices_fitted": int(fit.sum()),
        "slices": [int(k) for k in ok["slice"].to_numpy()[fit]],
        "slice_factors": [round(float(v), 4) for v in raw / raw.mean()],
    }
