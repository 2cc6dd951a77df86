"""The knee's error against the knee's own steps (calibrate/README, "The knee's error is the
host's minutes"): per calibration folder, the sum of the knee's step times over the sum
that the fit of every other phase predicts (above 1: the knee's steps ran slower than the
rest of the run says), beside the knee's prediction error (``profile.json``); then the
correlation and slope of the two in log over the folders. And whether a context cost that
bends (a column added to the step model, fitted on the other phases as the calibration
fits) would move the knee's prediction: the same ratio with each candidate column.

    python calibrate/experiments/llm_knee_speed.py FOLDER [FOLDER ...]   # ~25 s a folder
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate import llm_profile as lp


def _context(d: pd.DataFrame) -> np.ndarray:
    return d["decode_context"].to_numpy(float) + d["prefill_tokens"].to_numpy(float)


BENDS = {
    "none": None,
    "ctx²": lambda d: _context(d) ** 2 / 1e3,
    "ctx past 4,000": lambda d: np.maximum(_context(d) - 4000.0, 0.0),
    "ctx past 6,000": lambda d: np.maximum(_context(d) - 6000.0, 0.0),
}


def knee_ratio(rest: pd.DataFrame, knee: pd.DataFrame, bend) -> tuple[float, float]:
    """The knee's steps over the prediction of a fit of ``rest`` (the calibration's: the
    threshold that fits best, the host's speed taken out), with the column ``bend`` added;
    and the fitted coefficient of that column (0: none, or the fit gave it none)."""
    y = lp.step_ms(rest)
    best = None
    for th in lp.THRESHOLDS:
        x, xk = lp.design(rest, th, lp.WAKE_STEPS), lp.design(knee, th, lp.WAKE_STEPS)
        if bend is not None:
            x, xk = np.column_stack([x, bend(rest)]), np.column_stack([xk, bend(knee)])
        coef, factor = lp.nnls_at_speed(x, y, lp.speed_bins(rest))
        score = float(np.sum(((y / factor - x @ coef) / (x @ coef)) ** 2))
        if best is None or score < best[0]:
            best = (score, coef, xk)
    _, coef, xk = best
    return float(lp.step_ms(knee).sum() / (xk @ coef).sum()), float(coef[-1]) if bend is not None else 0.0


def main(folders: list[Path]) -> None:
    speed, error = [], []
    for folder in folders:
        steps = pd.read_csv(folder / "steps.csv.gz")
        knee_rec = json.loads((folder / "profile.json").read_text())["knee"]
        rest = steps[steps["phase"] != "knee"].reset_index(drop=True)
        knee = steps[steps["phase"] == "knee"].reset_index(drop=True)
        ratios = {name: knee_ratio(rest, knee, bend) for name, bend in BENDS.items()}
        speed.append(np.log(ratios["none"][0]))
        error.append(np.log1p(knee_rec["error"]))
        bends = ", ".join(f"{n} {r:.3f} (coefficient {c:.2g})" for n, (r, c) in list(ratios.items())[1:])
        print(  # noqa: T201
            f"{folder}: knee error {knee_rec['error']:+.1%}, its steps over the other phases' fit "
            f"{ratios['none'][0]:.3f}; with a bend: {bends}",
            flush=True,
        )
    if len(folders) > 2:
        slope, intercept = np.polyfit(speed, error, 1)
        r = np.corrcoef(speed, error)[0, 1]
        print(  # noqa: T201
            f"over {len(folders)} folders, log knee error on log step ratio: r {r:.2f}, slope {slope:.2f}, "
            f"at a ratio of 1 the knee errs {np.expm1(intercept):+.1%}"
        )


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
