"""A calibration's own held-out slices replayed (calibrate/README, "Nine runs, one sign"):
each level predicted again with the calibration's held-out step time (fitted on the other
phases' steps, as ``servesim calibrate llm`` does), but on the slices' own arrivals and
lengths (``requests.csv.gz``) instead of fresh draws. Per level and percentile: measured,
the calibration's prediction, and the replay's (median over seeds, the slices pooled as
measured). Where the replay matches the calibration's prediction, the miss is the step
time; where it matches the measurement, the draws.

    python calibrate/experiments/llm_replay_calibration.py calibrate/profiles/cpu-tiny-llm
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.experiments.llm_replay import SKIP_S, replay_once, trace_doc
from calibrate.llm_run import fitted
from calibrate.llm_server import ENGINE
from calibrate.llm_sim import QUANTILES, scenario_dict


def main(folder: Path, seeds: range = range(1, 11)) -> pd.DataFrame:
    profile = json.loads((folder / "profile.json").read_text())
    steps = pd.read_csv(folder / "steps.csv.gz")
    asked = pd.read_csv(folder / "requests.csv.gz")
    table = pd.read_csv(folder / "validation.csv")
    slice_s, overhead = profile["slice_s"], profile["step_time"].get("overhead_ms", 0.0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for share in sorted(asked["level"].unique()):
            fit = {**fitted(steps[steps["phase"] != f"level {share:g}"]), "overhead_ms": overhead}
            doc = scenario_dict(fit, ENGINE, rate_rps=1.0, duration_s=slice_s, warmup_s=SKIP_S)
            docs = []
            for rnd, sl in asked[asked["level"] == share].groupby("round"):
                trace = Path(tmp) / f"{share}-{rnd}.csv"
                cols = {"arrival_s": sl["scheduled_s"], "prompt_tokens": sl["prompt_tokens"]}
                pd.DataFrame({**cols, "output_tokens": sl["output_tokens"]}).to_csv(trace, index=False)
                docs.append(trace_doc(doc, trace, slice_s))
            got = {f"{m}_p{q}": [] for m in ("ttft", "tpot") for q in QUANTILES}
            for seed in seeds:
                ttft, tpot = [], []
                for d in docs:
                    a, b, _ = replay_once(d, seed)
                    ttft.append(a)
                    tpot.append(b)
                for name, v in (("ttft", np.concatenate(ttft)), ("tpot", np.concatenate(tpot))):
                    for q in QUANTILES:
                        got[f"{name}_p{q}"].append(np.percentile(v, q))
            for r in table[table["level"] == share].itertuples():
                replay = float(np.median(got[f"{r.metric}_p{r.q}"]))
                rows.append(
                    {
                        "level": share,
                        "metric": f"{r.metric.upper()} p{r.q}",
                        "measured_ms": r.measured_ms,
                        "calibration_ms": r.predicted_ms,
                        "replay_ms": replay,
                        "calibration_error": r.predicted_ms / r.measured_ms - 1,
                        "replay_error": replay / r.measured_ms - 1,
                    }
                )
    return pd.DataFrame(rows)


if __name__ == "__main__":
    out = main(Path(sys.argv[1] if len(sys.argv) > 1 else "calibrate/profiles/cpu-tiny-llm"))
    print(out.round(3).to_string())  # noqa: T201
