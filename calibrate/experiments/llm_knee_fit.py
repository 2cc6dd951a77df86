"""The knee's steps against the fit of the other phases (calibrate/README, "The tiny engine on
an H100"): does another form or weighting of the step-time fit predict the knee's steps?
Per calibration folder: the sum of the knee's step times over the sum the held-out fit
predicts, for the fit's form at each decode threshold it chooses among, and with its steps
weighted so that each phase, or each band of decoding-batch sizes, weighs alike; each
phase's steps against the fit of the other phases (as the calibration predicts it); then
each phase's slices against the fit of every phase (mean log ratio), whose spread is the
host's minutes.

    python calibrate/experiments/llm_knee_fit.py FOLDER [FOLDER ...]   # a minute a folder
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate import llm_profile as lp


def fit(steps: pd.DataFrame, threshold: int | None, w: np.ndarray) -> np.ndarray:
    """The calibration's fit (:func:`llm_profile.nnls_at_speed`, the wake columns) at one
    threshold, each step weighted by ``w``."""
    x = lp.design(steps, threshold, lp.WAKE_STEPS)
    return lp.nnls_at_speed(x, lp.step_ms(steps), lp.speed_bins(steps), w)[0]


def main(folders: list[Path]) -> None:
    for folder in folders:
        steps = pd.read_csv(folder / "steps.csv.gz")
        rest = steps[steps["phase"] != "knee"].reset_index(drop=True)
        knee = steps[steps["phase"] == "knee"]
        bands = pd.cut(rest["decodes"], [-1, 0, 2, 4, 8, 16, 32, 10**6]).astype(str)
        weights = {
            "as fitted": np.ones(len(rest)),
            "phases alike": 1.0 / rest["phase"].map(rest["phase"].value_counts()).to_numpy(),
            "batch sizes alike": 1.0 / bands.map(bands.value_counts()).to_numpy(),
        }
        print(f"{folder}: the knee's steps over the held-out fit's prediction (sums)")  # noqa: T201
        for name, w in weights.items():
            ratios = []
            for th in lp.THRESHOLDS:
                coef = fit(rest, th, w)
                ratios.append(f"{th}: {lp.step_ms(knee).sum() / (lp.design(knee, th, lp.WAKE_STEPS) @ coef).sum():.3f}")
            print(f"  {name:18s} by threshold " + ", ".join(ratios))  # noqa: T201
        held_out = []
        for phase in sorted(steps["phase"].unique()):
            g = steps[steps["phase"] == phase]
            c = lp.fit(steps[steps["phase"] != phase])
            held_out.append(f"{phase} {lp.step_ms(g).sum() / lp.predict_ms(c, g).sum():.3f}")
        print("  each phase's steps over the fit of the other phases (sums): " + ", ".join(held_out))  # noqa: T201
        coef = lp.fit(steps)
        r = np.log(lp.step_ms(steps) / lp.predict_ms(coef, steps))
        by = pd.Series(r).groupby([steps["phase"], steps["slice"].fillna(0)]).mean()
        for phase, g in by.groupby(level=0):
            print(f"  {phase:11s} slices against the fit of every phase: " + ", ".join(f"{v:+.2f}" for v in g))  # noqa: T201


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
