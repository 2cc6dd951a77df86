"""Is the 50% p99's miss the slices' spread? (calibrate/README, "A busy instance runs
faster", what is left.)

For a run folder of ``servesim calibrate run``: the spread of the fitted slices' mean
speed about their level's mean (each slice's batches' log ratio to the fitted batch time,
its factors out, averaged within quarter-seconds and then over them), against what the
profile's speed components give a window as long as the slice. The excess, if any,
becomes one more component of correlation time ``TAU_S`` (``sigma`` such that its
window variance is the excess). Then each held-out level is simulated with and without
it, the median p50 and p99 over ``SEEDS`` designs with the fitted parameters (no draws),
against the measurement.

    python calibrate/experiments/slice_drift.py RUN [RUN ...]   # ~8 s a run
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.interval import SliceDesign, design_percentiles
from calibrate.speed import batch_log_ratios, fit_slices_only, fitted_mean_ms, window_share, window_var
from calibrate.validate import design

TAU_S = 5.0  # constant over a slice, nearly independent at the next slice of its level (~29 s on)
SEEDS = 40
BIN_S = 0.25
say = print


def slice_spread(profile: dict, requests: pd.DataFrame, period_s: float) -> tuple[float, float, np.ndarray]:
    """The fitted slices' mean log speed's variance about their level's mean, what the
    speed components give it, and each slice's length (s)."""
    fit_levels = [f["level"] for f in profile["fit_levels"]]
    st = profile["service_time"]
    b = batch_log_ratios(
        fit_slices_only(requests, fit_levels),
        fitted_mean_ms(st),
        period_s,
        st.get("after_idle"),
        st.get("by_rate"),
        st.get("after_batch"),
    )
    b = b.assign(bin=np.floor(b["t_s"] / BIN_S), wr=b["log_ratio"] * b["weight"])
    per_bin = b.groupby(["level", "slice", "bin"])[["wr", "weight"]].sum()
    per_bin = (per_bin["wr"] / per_bin["weight"]).rename("r").reset_index()
    per = per_bin.groupby(["level", "slice"]).agg(m=("r", "mean"), n=("bin", "size")).reset_index()
    dev = per["m"] - per.groupby("level")["m"].transform("mean")
    observed = float((dev**2).sum() / (per.groupby("level").size() - 1).sum())
    lengths = per["n"].to_numpy() * BIN_S
    comps = profile["speed_process"]["speed"]["components"]
    model = float(np.mean([sum(window_var(c["sigma"], c["correlation_time_s"], t) for c in comps) for t in lengths]))
    return observed, model, lengths


def main(run: Path) -> None:
    profile = json.loads((run / "profile.json").read_text())
    requests = pd.read_csv(run / "measurements.csv.gz")
    slices = pd.read_csv(run / "slices.csv")
    fit_levels = [f["level"] for f in profile["fit_levels"]]
    period = float(slices.loc[slices["kept"] & slices["level"].isin(fit_levels), "seconds"].median())
    observed, model, lengths = slice_spread(profile, requests, period)
    share = float(np.mean([window_share(t, TAU_S) for t in lengths]))
    sigma = float(np.sqrt(max(observed - model, 0.0) / share))
    say(f"{run}: slices' sd {np.sqrt(observed):.3f}, the components' {np.sqrt(model):.3f}; one more: sigma {sigma:.3f}")
    drift = copy.deepcopy(profile)
    comps = drift["speed_process"]["speed"]["components"]
    drift["speed_process"]["speed"]["components"] = [*comps, {"sigma": round(sigma, 5), "correlation_time_s": TAU_S}]
    slice_s, warmup_s = design(requests, profile)
    levels = int((profile.get("design") or {}).get("levels", requests["level"].nunique()))
    ok = requests[~requests["warmup"] & (requests["status"] == 200)]
    for lv in sorted(set(ok["level"]) - set(fit_levels)):
        g = ok[ok["level"] == lv]
        shape = SliceDesign(g["slice"].nunique(), slice_s, warmup_s, (levels - 1) * period)
        rate = float(g["offered_rps"].iloc[0])
        meas = {"p50": g["latency_ms"].median(), "p99": float(np.percentile(g["latency_ms"], 99))}
        cells = [f"  level {lv}: measured p50 {meas['p50']:.1f}, p99 {meas['p99']:.1f} ms"]
        for name, p in (("as fitted", profile), ("with the spread", drift)):
            got = [design_percentiles(p, rate, shape, seed=s) for s in range(SEEDS)]
            err = {q: np.median([x[q] for x in got]) / meas[q] - 1 for q in meas}
            cells.append(f"{name} {err['p50']:+.1%}, {err['p99']:+.1%}")
        say(" | ".join(cells))


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["calibrate/profiles/cpu-resnet64-epyc"]:
        main(Path(arg))
