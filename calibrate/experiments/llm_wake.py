"""The first steps after the engine idles (calibrate/README, "The wake cost and an honest
interval"): a calibration's steps against the speed-aware fit on all its phases *without*
the wake cost (the step model before it), each step's quarter-second speed factor divided
out, by kind (decode-only, prefill-only, mixed) and by whether the engine was idle just
before (more than 1 ms since the last step), the prefill-only steps by prompt size, and
each kind's excess (ms, median) by its place after the idle gap. At low load nearly every
prefill-only step is the first after an idle engine; the second and third steps after a
gap, decode-only ones among them, sit above the line too: the wake cost that the step
model now fits (``wake_ms``, printed last as fitted on the same steps).

    python calibrate/experiments/llm_wake.py [FOLDER]   # a few seconds; the committed profile by default
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate import llm_profile as lp


def residuals(steps: pd.DataFrame) -> pd.DataFrame:
    s = steps.sort_values("begin_ns").reset_index(drop=True)
    y = lp.step_ms(s)
    fit = lp.fit(s, wake_steps=0)
    x = lp.design(s, fit["decode_threshold"])
    _, factor = lp.nnls_at_speed(x, y, lp.speed_bins(s))
    gap_ms = (s["begin_ns"] - s["done_ns"].shift()).fillna(np.inf).to_numpy() / 1e6
    kind = np.where(s["chunks"] == 0, "decode", np.where(s["decodes"] == 0, "prefill", "mixed"))
    line = lp.predict_ms(fit, s) * factor
    return pd.DataFrame(
        {
            "phase": s["phase"],
            "kind": kind,
            "after_idle": gap_ms > 1.0,
            "place": np.minimum(lp.wake_position(s), 5),
            "prompt": s["prefill_tokens"],
            "log_residual": np.log(y / line),
            "excess_ms": y - line,
        }
    )


def main(folder: Path) -> None:
    t = residuals(pd.read_csv(folder / "steps.csv.gz"))
    t = t[t["phase"] != "profile"]  # the loads' steps (the profile's grid runs one workload at a time)
    by = t.pivot_table(index="kind", columns="after_idle", values="log_residual", aggfunc=["mean", "count"])
    print(by.round(3).to_string())  # noqa: T201
    p = t[t["kind"] == "prefill"].assign(size=lambda d: pd.cut(d["prompt"], [0, 64, 128, 256, 512, 1024]))
    print(p.groupby("size", observed=True)["log_residual"].agg(["mean", "count"]).round(3).to_string())  # noqa: T201
    print(t.pivot_table(index="phase", columns="kind", values="log_residual", aggfunc="mean").round(3).to_string())  # noqa: T201
    place = t.pivot_table(index="place", columns="kind", values="excess_ms", aggfunc=["median", "count"])
    print(place.round(3).to_string())  # noqa: T201  (place 5: the sixth step after a gap and later)
    print("wake_ms fitted:", [round(w, 3) for w in lp.fit(pd.read_csv(folder / "steps.csv.gz"))["wake_ms"]])  # noqa: T201


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("calibrate/profiles/cpu-tiny-llm"))
