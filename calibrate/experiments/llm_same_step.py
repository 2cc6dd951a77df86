"""The same step at every load (calibrate/README, "Light load runs slow on some hosts"): per
calibration folder, the median forward pass (µs) of decode-only steps of one sequence at
each level and in the knee, the engine's own record of each; and, over the decode-only
steps of one sequence at the levels and the knee, the correlation of each step's log
forward pass with the engine's busy share of the 10, 100 and 1,000 ms before it (a host
that clocks a busy core up within that time would show it).

    python calibrate/experiments/llm_same_step.py FOLDER [FOLDER ...]   # seconds
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

PHASES = {"level 0.3": "30%", "level 0.5": "50%", "level 0.7": "70%", "knee": "knee"}


def busy_share(begin: np.ndarray, done: np.ndarray, at: np.ndarray, window_ns: float) -> np.ndarray:
    """The share of the ``window_ns`` before each of ``at`` the engine spent in a step
    (steps in time order, none overlapping)."""
    spent = np.concatenate([[0], np.cumsum(done - begin)])

    def before(t: np.ndarray) -> np.ndarray:  # the engine's busy time up to t
        k = np.searchsorted(begin, t, side="right")
        j = np.maximum(k - 1, 0)
        return np.where(k > 0, spent[j] + np.clip(np.minimum(t, done[j]) - begin[j], 0, None), 0)

    return (before(at) - before(at - window_ns)) / window_ns


def summary(folder: Path) -> dict:
    s = pd.read_csv(folder / "steps.csv.gz").sort_values("begin_ns", kind="stable").reset_index(drop=True)
    one = ((s["chunks"] == 0) & (s["decodes"] == 1) & s["phase"].isin(list(PHASES))).to_numpy()
    fwd = ((s["end_ns"] - s["start_ns"]) / 1e3).to_numpy()
    row = {"run": folder.name}
    row.update({label: float(np.median(fwd[one & (s["phase"] == p).to_numpy()])) for p, label in PHASES.items()})
    begin, done = s["begin_ns"].to_numpy(np.int64), s["done_ns"].to_numpy(np.int64)
    for ms in (10, 100, 1000):
        u = busy_share(begin, done, begin[one], ms * 1e6)
        row[f"r busy {ms} ms"] = float(np.corrcoef(u, np.log(fwd[one]))[0, 1])
    return row


def main(folders: list[str]) -> None:
    t = pd.DataFrame([summary(Path(f)) for f in folders]).set_index("run")
    digits = {label: 0 for label in PHASES.values()} | {c: 2 for c in t.columns if c.startswith("r ")}
    print(t.round(digits).to_string())  # noqa: T201


if __name__ == "__main__":
    main(sys.argv[1:])
