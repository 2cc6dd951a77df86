"""The first step after the engine idles (calibrate/README, "The host's speed shapes the
batches"): a calibration's steps against the speed-aware fit on all its phases, each
step's quarter-second speed factor divided out, by kind (decode-only, prefill-only, mixed)
and by whether the engine was idle just before (more than 1 ms since the last step), and
the prefill-only steps by prompt size. At low load nearly every prefill-only step is the
first after an idle engine: where they sit above the line by a fixed cost, the model lacks
a wake cost that lands on the TTFT of requests arriving to an idle engine.

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
    fit = lp.fit(s)
    x = lp.design(s, fit["decode_threshold"])
    _, factor = lp.nnls_at_speed(x, y, lp.speed_bins(s))
    gap_ms = (s["begin_ns"] - s["done_ns"].shift()).fillna(np.inf).to_numpy() / 1e6
    kind = np.where(s["chunks"] == 0, "decode", np.where(s["decodes"] == 0, "prefill", "mixed"))
    return pd.DataFrame(
        {
            "phase": s["phase"],
            "kind": kind,
            "after_idle": gap_ms > 1.0,
            "prompt": s["prefill_tokens"],
            "log_residual": np.log(y / factor / lp.predict_ms(fit, s)),
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


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("calibrate/profiles/cpu-tiny-llm"))
