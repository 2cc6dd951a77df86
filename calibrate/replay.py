"""Replaying measured slices through the simulator: where the tail comes from.

A held-out slice is replayed with its exact arrival times (the load generator's schedule)
through the calibrated model, at speeds read from the server's own timings in that slice:

* ``frontend``: the front end's CPU per request over the fitted cost (the slice's
  ``frontend_cpu_s``, and the client's and a sidecar's where they share its core, less the
  fitted background), as the validation does per slice today;
* ``instance``: the slice's batch times over the fitted batch-time model (sum over sum);
* ``windowed``: the instance's and the front end's speed per window of the slice (the
  batches' ratios to the fit, averaged over ``window_s``), as a speed trace
  (:class:`simulator.scenario.platform.SpeedTrace`) shared by both stations, the front end
  with the fitted elasticity (the batches' own noise keeping only the share a fitted
  speed process leaves it).

The other modes run at constant speed (a profile's fitted speed process left out), with
the batch noise as measured.

Each variant changes one thing from the model as fitted, so the replay says which
mechanism the measured tail needs (README, "The decisive experiment"). Pure functions over
a profile and its measurements; files are written only to a temporary folder for the
arrival traces.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate import idle
from calibrate.fit import batches_from_requests, with_rates
from calibrate.scenario import scenario_dict
from calibrate.specs import scaled_batch_time
from calibrate.speed import batch_log_ratios, fitted_mean_ms
from calibrate.station import slice_cpu_s
from simulator.engine import simulate
from simulator.results.metrics import window
from simulator.scenario.config import Scenario

MODES = ("fitted", "frontend", "both", "windowed")


def batch_ratios(profile: dict, batches: pd.DataFrame) -> np.ndarray:
    """Each batch's time over the fitted mean for its size."""
    return batches["service_ms"].to_numpy() / fitted_mean_ms(profile["service_time"])(
        batches["batch_size"].to_numpy(int)
    )


def frontend_factor(profile: dict, row: pd.Series) -> float:
    """A slice's front-end CPU per request over the fitted marginal cost (1 without a fit)."""
    fe = profile.get("frontend")
    if fe is None or not np.isfinite(row.get("frontend_cpu_s", np.nan)) or row["requests"] <= 0:
        return 1.0
    shares = fe.get("client_shares_cores", False)
    cpu = float(slice_cpu_s(row.to_frame().T, client_shares_cores=shares).iloc[0])
    marginal = fe["cpu_ms_per_request"] + (fe["client_cpu_ms_per_request"] if shares else 0.0)
    if shares:
        marginal += fe.get("sidecar_cpu_ms_per_request") or 0.0
    per = (cpu - fe["background_cores"] * row["seconds"]) / row["requests"] * 1e3
    return float(max(per / marginal, 0.2)) if marginal > 0 else 1.0


def start_rates(ok: pd.DataFrame, service: dict) -> dict[int, float] | None:
    """Each slice's instance's recent throughput as it began
    (:func:`calibrate.idle.slice_start_rates`, over ``service``'s ``rate_window_ms``), or
    None where the batch time has no ``by_rate`` to read it."""
    if not service.get("by_rate"):
        return None
    kind, window = idle.rate_source(ok, service)
    return idle.slice_start_rates(ok, window, kind)


def window_trace(
    profile: dict, g: pd.DataFrame, duration_s: float, window_s: float, initial_rps: float | None = None
) -> dict:
    """A slice's speed per window as a ``platform.speed`` trace: the geometric mean of its
    batches' ratios to the fit (each batch once, placed at the middle of its run, from the
    client's clock; the fitted factors after an idle instance and by its recent throughput
    divided out, as the simulation applies them on top), windows without a batch at the
    slice's mean; the front end follows with the fitted speed process's elasticity (older
    profiles: the speed meter's)."""
    st = profile["service_time"]
    ok = g[g["status"] == 200]
    if st.get("by_rate"):  # the instance's throughput as it ran (from initial_rps: the slice before's)
        ok = with_rates(ok, None if initial_rps is None else {int(g["slice"].iloc[0]): initial_rps}, st)
    b = batch_log_ratios(
        ok, fitted_mean_ms(st), 0.0, st.get("after_idle"), st.get("by_rate"), st.get("after_batch"), st.get("by_queue")
    )
    nb = int(np.ceil(duration_s / window_s))
    k = np.clip((b["t_s"].to_numpy() / window_s).astype(int), 0, nb - 1)
    weight = b["weight"].to_numpy()  # a batch of B is B rows
    per = np.bincount(k, weights=weight * b["log_ratio"].to_numpy(), minlength=nb)
    cnt = np.bincount(k, weights=weight, minlength=nb)
    mean = per.sum() / cnt.sum()
    log_f = np.where(cnt > 0, per / np.maximum(cnt, 1e-12), mean)
    fitted = ((profile.get("speed_process") or {}).get("speed") or {}).get("frontend_elasticity")
    elasticity = (
        fitted if fitted is not None else ((profile.get("frontend") or {}).get("speed") or {}).get("elasticity", 1.0)
    )
    return {
        "kind": "trace",
        "step_ms": window_s * 1000.0,
        "factors": [round(float(v), 5) for v in np.exp(log_f)],
        "frontend_elasticity": float(min(elasticity, 3.0)),
    }


def write_arrivals(g: pd.DataFrame, row: pd.Series, folder: Path) -> tuple[Path, float]:
    """A measured slice's schedule (its requests' ``scheduled_s``, ``row`` its line of
    slices.csv) as an arrivals file in ``folder``, and the slice's length in s."""
    times_s = np.sort(g["scheduled_s"].to_numpy())
    path = folder / f"arrivals-{int(row['slice'])}.txt"
    np.savetxt(path, times_s, fmt="%.6f")
    return path, float(max(row["seconds"], times_s[-1] + 1e-3))


def replay_slice(
    profile: dict,
    g: pd.DataFrame,
    row: pd.Series,
    *,
    mode: str,
    warmup_s: float,
    seeds: int = 5,
    window_s: float = 0.25,
    folder: Path,
    initial_rps: float | None = None,
) -> dict:
    """One slice replayed ``seeds`` times: the replayed p50/p99 (mean over seeds) beside the
    measured ones, and the speed factors used. ``initial_rps``: the instance's recent
    throughput as the slice began (:func:`calibrate.idle.slice_start_rates`), which
    ``by_rate`` reads from there."""
    path, duration = write_arrivals(g, row, folder)
    batches = batches_from_requests(g)
    ratios = batch_ratios(profile, batches)
    f_inst = float(batches["service_ms"].sum() / (batches["service_ms"].to_numpy() / ratios).sum())
    f_fe = frontend_factor(profile, row)
    # constant speed but for what the mode reads from the slice: a fitted speed process is
    # left out, except that the windowed trace takes its place (the batch noise keeping the
    # share the process leaves it)
    model = profile if mode == "windowed" else {k: v for k, v in profile.items() if k != "speed_process"}
    doc = scenario_dict(
        model,
        float(row["rate_rps"]),
        duration_s=duration,
        warmup_s=warmup_s,
        speed=f_fe if mode in ("frontend", "both") else 1.0,
    )
    doc["traffic"] = {"arrivals_file": str(path)}
    if mode == "both":
        doc["workers"]["service_time"] = scaled_batch_time(doc["workers"]["service_time"], f_inst)
    if initial_rps is not None and doc["workers"]["service_time"].get("by_rate"):
        doc["workers"]["service_time"]["rate_initial_rps"] = initial_rps
    if mode == "windowed":
        doc["platform"] = {"speed": window_trace(profile, g, duration, window_s, initial_rps)}
    meas = g[~g["warmup"] & (g["status"] == 200)]["latency_ms"].to_numpy()
    p50, p99, pooled = [], [], []
    for k in range(seeds):
        doc["seed"] = k
        s = Scenario.model_validate(doc)
        rec = simulate(s).records
        lat = (rec.t_response - rec.arrival)[window(rec, s) & rec.completed]
        p50.append(np.percentile(lat, 50))
        p99.append(np.percentile(lat, 99))
        pooled.append(lat)
    return (
        {
            "slice": int(row["slice"]),
            "level": int(row["level"]),
            "mode": mode,
            "instance_factor": f_inst,
            "frontend_factor": f_fe,
            "measured_p50": float(np.percentile(meas, 50)),
            "measured_p99": float(np.percentile(meas, 99)),
            "replayed_p50": float(np.mean(p50)),
            "replayed_p99": float(np.mean(p99)),
        },
        meas,
        pooled,
    )


def replay(
    profile: dict,
    requests: pd.DataFrame,
    slices: pd.DataFrame,
    *,
    levels: list[int] | None = None,
    modes: tuple[str, ...] = MODES,
    seeds: int = 5,
) -> pd.DataFrame:
    """Every kept slice of the held-out ``levels`` (default: those not fitted), in each
    ``mode``: one row per slice and mode, replayed against measured p50/p99."""
    fitted = {f["level"] for f in profile["fit_levels"]}
    held = sorted(set(requests["level"].unique()) - fitted) if levels is None else levels
    warm = float((profile.get("design") or {}).get("warmup_s", 0.25))
    starts = start_rates(requests[requests["status"] == 200], profile["service_time"]) or {}
    rows, pooled = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _, row in slices[slices["kept"] & slices["level"].isin(held)].iterrows():
            g = requests[requests["slice"] == row["slice"]]
            if (~g["warmup"] & (g["status"] == 200)).sum() < 50:
                continue
            for mode in modes:
                one, meas, sim = replay_slice(
                    profile,
                    g,
                    row,
                    mode=mode,
                    warmup_s=warm,
                    seeds=seeds,
                    folder=Path(tmp),
                    initial_rps=starts.get(int(row["slice"])),
                )
                rows.append(one)
                pooled.append((one["level"], mode, meas, sim))
    per_slice = pd.DataFrame(rows)
    per_slice["error_p99_pct"] = (per_slice["replayed_p99"] / per_slice["measured_p99"] - 1) * 100
    per_slice["error_p50_pct"] = (per_slice["replayed_p50"] / per_slice["measured_p50"] - 1) * 100
    return per_slice, pooled_levels(pooled, seeds)


def pooled_levels(pooled: list, seeds: int) -> pd.DataFrame:
    """Per level and mode: the pooled p50/p99 measured and replayed (each seed's pooled
    percentile, averaged), with the Spearman correlation of the slices' p99s."""
    rows = []
    keys = sorted({(lv, mode) for lv, mode, _, _ in pooled})
    for lv, mode in keys:
        parts = [(m, sim) for l2, m2, m, sim in pooled if (l2, m2) == (lv, mode)]
        meas = np.concatenate([m for m, _ in parts])
        row = {"level": lv, "mode": mode, "slices": len(parts)}
        for q in (50, 99):
            row[f"measured_p{q}"] = float(np.percentile(meas, q))
            sims = [np.percentile(np.concatenate([sim[k] for _, sim in parts]), q) for k in range(seeds)]
            row[f"replayed_p{q}"] = float(np.mean(sims))
            row[f"error_p{q}_pct"] = (row[f"replayed_p{q}"] / row[f"measured_p{q}"] - 1) * 100
        rows.append(row)
    return pd.DataFrame(rows)
