"""How often a slice tips, measured and simulated (calibrate/README, "The loop's cost is not
a straight line"): at each level from 70% of a `calibrate run` folder, the share of its
measured slices whose p99 passed 30 ms and 100 ms (a slice that tips climbs to 300-400 ms
and stays), against the same shares over ``--slices`` slices simulated from the folder's
profile at the level's rate (each slice of the run's length and warm-up, starting empty, the
fitted parameters at their point values; the speed process drawn afresh in each).

    python calibrate/experiments/ranker_tipping.py RUN --slices 100   # ~2 minutes
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.validate import _latencies

TIPPED_MS = (30.0, 100.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="A `calibrate run` folder (refitted or not).")
    ap.add_argument("--slices", type=int, default=100, help="Simulated slices a level.")
    ap.add_argument("--from-load", type=float, default=0.7)
    a = ap.parse_args()
    profile = json.loads((a.run / "profile.json").read_text())
    levels = pd.DataFrame(json.loads((a.run / "validation.json").read_text())["levels"])
    req = pd.read_csv(a.run / "measurements.csv.gz")
    slice_s = round(float(req["scheduled_s"].max()), 1)  # the schedule's length (the slices' 4 s)
    warm = float(req.loc[req["warmup"], "scheduled_s"].max()) if req["warmup"].any() else 0.0
    ok = req[~req["warmup"] & (req["status"] == 200)]
    measured = ok.groupby(["level", "slice"])["latency_ms"].quantile(0.99)
    for _, lv in levels[levels["load"] >= a.from_load].iterrows():
        m = measured.loc[int(lv["level"])].to_numpy()
        sim = np.array(
            [
                np.percentile(
                    _latencies(profile, float(lv["offered_rps"]), slice_s=slice_s, warmup_s=warm, seed=1000 + s), 99
                )
                for s in range(a.slices)
            ]
        )
        shares = " ".join(
            f">{t:g} ms {int((m > t).sum())}/{len(m)} measured, {(sim > t).mean():.0%} simulated;" for t in TIPPED_MS
        )
        print(  # noqa: T201
            f"load {lv['load']:.0%} ({lv['offered_rps']:.0f} req/s, {'held out' if lv['held_out'] else 'fitted'}): "
            f"{shares} median slice p99 {np.median(m):.1f} measured, {np.median(sim):.1f} simulated"
        )


if __name__ == "__main__":
    main()
