"""The instance's forward pass by load level, size for size (calibrate/README, "The light
load's batches run slower at the level").

For each run folder (a ``servesim calibrate run`` output: its measurements and profile,
no server started), per level:

- ``fwd``: the batches' forward pass (``compute_infer``) over the median forward of their
  size at the levels of 50% and up, the mean of the slices' means (1.00: as fast as busy);
- ``resid``: the whole batch time over the run's fitted table and its ``after_idle``
  factor, as the model has it (1.00: the model's batch time);
- ``held``: ``resid`` as the instance's recent throughput predicts it (requests a second,
  an exponential average over ``TAU_MS`` of its batches), its table fitted on the run's
  fitted levels only, in eight bands of that throughput, flat beyond the ends, the way a
  fitted ``{rate: factor}`` table would give it to the held-out levels;
- ``chunk0``, ``chunk1``: the speed meter's fixed chunk of pure-Python work on each core
  (``speed.csv``, its median) over its median at 50% and up: the cores' clocks.

And, over all levels, how much of ``resid``'s variance (in log) the level alone explains
(R², a mean per level) and the recent throughput does (R², a mean per band).

    python calibrate/experiments/level_speed.py RUN [RUN ...]   # seconds a run
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.fit import batch_time_us
from calibrate.idle import idle_factor, recent_rate

TAU_MS = 500.0
BANDS = 8
say = print


def batches(run: Path) -> pd.DataFrame:
    """One row per batch of the run, in the server's dispatch order, with its idle time
    before, its forward, and its time over the model's."""
    profile = json.loads((run / "profile.json").read_text())
    m = pd.read_csv(run / "measurements.csv.gz")
    m = m[m["status"] == 200].dropna(subset=["batch_size", "dispatched_at_ns"])
    m = m.assign(bt=batch_time_us(m) / 1e3)
    b = m.drop_duplicates(["slice", "dispatched_at_ns"]).sort_values("dispatched_at_ns", kind="stable")
    start = b["dispatched_at_ns"].to_numpy() / 1e6
    end = start + b["bt"].to_numpy()
    st = profile["service_time"]
    table = {int(k): v for k, v in st["batch_ms"].items()}
    after = {float(k): v for k, v in (st.get("after_idle") or {0.0: 1.0, 1.0: 1.0}).items()}
    idle = np.r_[np.nan, start[1:] - end[:-1]]
    out = pd.DataFrame(
        {
            "level": b["level"].to_numpy(),
            "slice": b["slice"].to_numpy(),
            "warmup": b["warmup"].to_numpy(),
            "size": b["batch_size"].astype(int).to_numpy(),
            "fwd_ms": b["compute_infer_us"].to_numpy() / 1e3,
            "resid": b["bt"].to_numpy() / b["batch_size"].map(table).to_numpy() / idle_factor(idle, after),
            "rate": recent_rate(start, b["batch_size"].to_numpy(), TAU_MS),
            "idle": idle,
        }
    )
    fit_levels = [f["level"] for f in profile["fit_levels"]]
    return out[~out["warmup"] & (out["idle"] > -0.5)].assign(fitted=lambda d: d["level"].isin(fit_levels))


def by_bands(x: np.ndarray, y: np.ndarray, fitted: np.ndarray) -> np.ndarray:
    """``y``'s mean in ``BANDS`` quantile bands of ``x`` over the ``fitted`` rows,
    interpolated at every row's ``x`` between the bands' medians (flat beyond)."""
    edges = np.quantile(x[fitted], np.linspace(0, 1, BANDS + 1))
    band = np.clip(np.digitize(x, edges[1:-1]), 0, BANDS - 1)
    knots = [np.median(x[fitted & (band == k)]) for k in range(BANDS)]
    values = [y[fitted & (band == k)].mean() for k in range(BANDS)]
    return np.interp(x, knots, values)


def r2(y: np.ndarray, fitted: np.ndarray) -> float:
    y, fitted = y - y.mean(), fitted - fitted.mean()
    return float(1 - ((y - fitted) ** 2).sum() / (y**2).sum())


def main(runs: list[Path]) -> None:
    for run in runs:
        d = batches(run)
        busy = d[d["level"] >= 2].groupby("size")["fwd_ms"].median()
        d["fwd"] = d["fwd_ms"] / d["size"].map(busy)
        y = np.log(d["resid"].to_numpy())
        y = y - y[d["fitted"].to_numpy()].mean()
        held = by_bands(d["rate"].to_numpy(), y, d["fitted"].to_numpy())
        every = np.ones(len(d), dtype=bool)
        levels = d["level"].to_numpy()
        level_mean = pd.Series(y).groupby(levels).transform("mean").to_numpy()
        in_sample = by_bands(d["rate"].to_numpy(), y, every)
        per = pd.DataFrame(
            {
                "fwd": d.groupby(["level", "slice"])["fwd"].mean().groupby("level").mean(),
                "resid": pd.Series(np.exp(y)).groupby(levels).mean(),
                "held": pd.Series(np.exp(held)).groupby(levels).mean(),
            }
        )
        meter = pd.read_csv(run / "speed.csv")
        for core, g in meter.groupby("core"):
            chunk = g.groupby("level")["chunk_us"].median()
            per[f"chunk{core}"] = chunk / g.loc[g["level"] >= 2, "chunk_us"].median()
        say(f"{run}: R² of log resid: level {r2(y, level_mean):.4f}, recent throughput {r2(y, in_sample):.4f}")
        say(per.T.round(3).to_string())


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
