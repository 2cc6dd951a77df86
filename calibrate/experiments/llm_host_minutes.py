"""The host's minutes or the model? Each calibration judges a held-out phase predicted from
the other phases' fit, on the host's mean speed over the run; its report also predicts
each phase again on its own slices' host speed (``at_speed_ms``, the knee's
``at_speed_rps``: :func:`calibrate.llm_run.predict_llm`). Per calibration folder
(``servesim calibrate llm`` or ``calibrate refit``'s, the code of 2026-11-27 afternoon or
later): each phase's host speed (the mean of its slices', log against the other phases);
the knee's error both ways; the cells within their bound (10% at p50 and p90, 20% at p99;
no interval, which only the held-out prediction has) at 30-70% and in all, both ways; and
the errors of TTFT and TPOT p50 at 30% of the knee, both ways. Then each cell over the
folders: its mean error both ways, in how many it came out low, and in how many within
its bound.

    python calibrate/experiments/llm_host_minutes.py FOLDER [FOLDER ...]   # seconds
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

JUDGED = (0.3, 0.5, 0.7)


def summary(folder: Path) -> dict:
    profile = json.loads((folder / "profile.json").read_text())
    table = pd.read_csv(folder / "validation.csv")
    if "at_speed_ms" not in table or "host_by_slice" not in profile:
        raise SystemExit(f"{folder}: no prediction on the host's speed (run `servesim calibrate refit {folder}`)")
    knee = profile["knee"]
    bound = np.where(table["q"] == 99, 0.20, 0.10)
    own = table["at_speed_ms"] / table["measured_ms"] - 1.0
    judged = table["level"].isin(JUDGED)
    light = table[(table["level"] == 0.3) & (table["q"] == 50)].set_index("metric")
    light_own = own[(table["level"] == 0.3) & (table["q"] == 50)].set_axis(light.index)
    return {
        "run": folder.name,
        **{f"host {k.replace('level ', '')}": np.mean(v) for k, v in profile["host_by_slice"].items()},
        "knee": knee["error"],
        "knee own": knee["at_speed_rps"] / knee["completed_rps"] - 1.0,
        "18 bound": int((table["error"].abs() <= bound)[judged].sum()),
        "18 own": int((own.abs() <= bound)[judged].sum()),
        "24 bound": int((table["error"].abs() <= bound).sum()),
        "24 own": int((own.abs() <= bound).sum()),
        "ttft50 30%": light.loc["ttft", "error"],
        "own": light_own["ttft"],
        "tpot50 30%": light.loc["tpot", "error"],
        "own ": light_own["tpot"],
    }


def by_cell(folders: list[Path]) -> pd.DataFrame:
    """Each cell over the folders: the mean error held out and on the host's speed, how
    many came out low, how many within the cell's bound."""
    t = pd.concat([pd.read_csv(f / "validation.csv").assign(run=f.name) for f in folders], ignore_index=True)
    t["own"] = t["at_speed_ms"] / t["measured_ms"] - 1.0
    bound = np.where(t["q"] == 99, 0.20, 0.10)
    t = t.assign(held_low=t["error"] < 0, own_low=t["own"] < 0)
    t = t.assign(held_in=t["error"].abs() <= bound, own_in=t["own"].abs() <= bound)
    cols = {"held": ("error", "mean"), "own": ("own", "mean"), "held low": ("held_low", "sum")}
    cols |= {"own low": ("own_low", "sum"), "held in": ("held_in", "sum"), "own in": ("own_in", "sum")}
    return t.groupby(["level", "metric", "q"]).agg(**cols)


def main(folders: list[Path]) -> None:
    t = pd.DataFrame([summary(f) for f in folders]).set_index("run")
    pd.set_option("display.width", 250)
    print(t.round(3).to_string())  # noqa: T201
    print("mean: " + ", ".join(f"{k} {v:+.3f}" for k, v in t.select_dtypes("number").mean().items()))  # noqa: T201
    print(by_cell(folders).round(3).to_string())  # noqa: T201


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
