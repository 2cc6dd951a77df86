"""Would the held-out p50s come right if the host's speed varied at each level as much as
it did there? A diagnostic, not a model (it reads the held-out level's own batches), as
``level_only`` was for the levels' mean speed (calibrate/README, "The 70% p50's miss,
stage by stage").

For each run and held-out level: the standard deviation of its slices' mean batch speed
(the log ratio to the profile's table, ``after_idle`` and ``by_rate``), over the same of
the fitted levels (their root mean square) is ``r``. Then :func:`calibrate.validate.predict`
over the level's slices, ``REPS`` replications on the same seeds, with the speed
process's components as fitted (``fitted``), with every component's σ times ``r``
(``all``), and with only the slowest one's (``slow``).

    python calibrate/experiments/level_spread.py RUN [RUN ...]
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate import idle
from calibrate.experiments.two_speeds import batch_ratios, read_run
from calibrate.validate import design, predict

REPS = 6
VARIANTS = ("fitted", "all", "slow")
say = print


def slice_speeds(run: Path, profile: dict) -> pd.DataFrame:
    """Each slice's level and its settled batches' mean log speed against the profile's
    model (:func:`calibrate.experiments.two_speeds.batch_ratios`, over ``by_rate`` too)."""
    b = batch_ratios(run, profile)
    by_rate = profile["service_time"].get("by_rate")
    b["speed"] = np.log(b["ratio"] / (idle.rate_factor_at(b["rate"].to_numpy(), by_rate) if by_rate else 1.0))
    return b.groupby(["level", "slice"], as_index=False)["speed"].mean()


def scaled(profile: dict, r: float, which: str) -> dict:
    """``profile`` with its speed process's components' σ times ``r``: all, or the slowest."""
    p = copy.deepcopy(profile)
    comps = p["speed_process"]["speed"]["components"]
    slowest = max(range(len(comps)), key=lambda k: comps[k]["correlation_time_s"])
    for k, c in enumerate(comps):
        if which == "all" or k == slowest:
            c["sigma"] = c["sigma"] * r
    return p


def main(runs: list[Path]) -> None:
    rows = []
    for run in runs:
        profile, requests, summary = read_run(run)
        fit_levels = [f["level"] for f in profile["fit_levels"]]
        spread = slice_speeds(run, profile).groupby("level")["speed"].std()
        pooled = float(np.sqrt((spread[fit_levels] ** 2).mean()))
        slice_s, warmup_s = design(requests, profile)
        for _, lv in summary[summary["held_out"]].iterrows():
            level, rate = int(lv["level"]), float(lv["offered_rps"])
            g = requests[(requests["level"] == level) & ~requests["warmup"] & (requests["status"] == 200)]
            meas = float(np.percentile(g["latency_ms"], 50))
            r = float(spread[level] / pooled)
            row = {"run": run.name, "load": float(lv["load"]), "r": r}
            for name in VARIANTS:
                p = profile if name == "fitted" else scaled(profile, r, name)
                got = predict(
                    p, rate, slices=int(g["slice"].nunique()), slice_s=slice_s, warmup_s=warmup_s, reps=REPS, seed=level
                )
                row[name] = 100 * (got["p50"][0] / meas - 1)
            rows.append(row)
            say(
                f"{run.name} {row['load']:.0%}: r {r:.2f}; p50 " + ", ".join(f"{n} {row[n]:+.1f}%" for n in VARIANTS),
                flush=True,
            )
    t = pd.DataFrame(rows)
    say(f"p50, median error by load (runs over), {len(runs)} runs:")
    for load, g in t.groupby("load"):
        say(
            f"  {load:.0%}: r {g['r'].median():.2f}; "
            + ", ".join(
                f"{n} {g[n].median():+.1f}% ({(g[n] > 0).sum()}, |err| {g[n].abs().median():.1f})" for n in VARIANTS
            )
        )


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]] or [Path("calibrate/profiles/cpu-resnet64-epyc")])
