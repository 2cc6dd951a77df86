"""A calibration predicted again from its own step records (calibrate/README, "The host's
speed shapes the batches"): the knee and each held-out level, as ``servesim calibrate llm``
predicts them (the step time fitted on every other phase, the host's speed process, the
same slice design, 20 replications), with the fit as the calibration makes it (the host's
speed taken out, a factor a quarter-second; the first three steps after an idle engine
costing more; the drift between slices in the speed process), without the drift, without
the wake cost too, and without the speed taken out too (the fit before all three), each
judged against the calibration's measurements by the calibration's rule (p50/p90 within
10%, p99 within 20%, or inside the 90% interval). Give calibration folders (``steps.csv.gz``,
``validation.csv``, ``profile.json``); the committed profile by default.

    python calibrate/experiments/llm_refit.py [--mode=NAME ...] [FOLDER ...]   # about 1 minute a mode and folder
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from calibrate import llm_profile, llm_report, llm_run, llm_server, llm_sim
from calibrate.stats import replication_interval

MODES = {  # the fit's speed_bin_s, wake_steps and minute drift
    "as calibrated": (llm_profile.SPEED_BIN_S, llm_profile.WAKE_STEPS, True),
    "no minute drift": (llm_profile.SPEED_BIN_S, llm_profile.WAKE_STEPS, False),
    "no wake cost, no minute drift": (llm_profile.SPEED_BIN_S, 0, False),
    "speed-blind, no wake cost, no minute drift": (None, 0, False),
}


def predicted(
    folder: Path,
    speed_bin_s: float | None,
    wake_steps: int = llm_profile.WAKE_STEPS,
    minute: bool = True,
    seeds: range = range(1, 21),
) -> pd.DataFrame:
    steps = pd.read_csv(folder / "steps.csv.gz")
    measured = pd.read_csv(folder / "validation.csv")
    profile = json.loads((folder / "profile.json").read_text())
    knee, overhead = profile["knee"], profile["step_time"].get("overhead_ms", 0.0)
    slice_s, warmup_s = profile["slice_s"], profile["warmup_s"]

    def doc(phase: str) -> dict:
        fit = llm_run.fitted(steps[steps["phase"] != phase], speed_bin_s, wake_steps, minute)
        got = {**fit, "overhead_ms": overhead}
        return llm_sim.scenario_dict(got, llm_server.ENGINE, rate_rps=1.0, duration_s=slice_s, warmup_s=warmup_s)

    knee_s = knee.get("slice_s", 40.0)  # one 40-s overload before the knee was measured in every round
    knee_rps = llm_sim.simulated_knee(doc("knee"), knee["offered_rps"], knee_s, llm_sim.KNEE_SKIP_S, range(1, 11))
    rows = []
    for share in profile["levels"]:
        rates = llm_run.level_rates(profile, share)  # the rates each round's slice ran at
        sim = llm_sim.simulated(doc(f"level {share:g}"), rates, slice_s, warmup_s, seeds)
        for m in measured[measured["level"] == share].itertuples():
            lo, mid, hi = replication_interval(sim[f"{m.metric}_p{m.q}_ms"])
            rows.append(
                {"level": share, "metric": m.metric, "q": m.q, "measured_ms": m.measured_ms}
                | {"predicted_ms": mid, "lo_ms": lo, "hi_ms": hi}
            )
    return llm_report.verdicts(pd.DataFrame(rows)).assign(knee_error=knee_rps / knee["completed_rps"] - 1.0)


def main(folders: list[Path], modes: list[str]) -> None:
    for folder in folders:
        for mode in modes:
            t = predicted(folder, *MODES[mode])
            low = t[(t["level"] == 0.3) & (t["q"] < 99)]
            print(  # noqa: T201
                f"{folder}: {mode}: {int(t['ok'].sum())} of {len(t)} within bound or interval "
                f"({int(t[t['level'] <= 0.7]['ok'].sum())} of 18 at 30-70%), "
                f"knee {t['knee_error'].iloc[0]:+.1%}; at 30% p50/p90 "
                + ", ".join(f"{r.metric.upper()} p{r.q} {r.error:+.0%}" for r in low.itertuples()),
                flush=True,
            )


if __name__ == "__main__":
    args = sys.argv[1:]
    modes = [a.removeprefix("--mode=") for a in args if a.startswith("--mode=")]
    if any(m not in MODES for m in modes):
        sys.exit(f"--mode must be one of: {', '.join(MODES)}")
    folders = [Path(a) for a in args if not a.startswith("--mode=")]
    main(folders or [Path("calibrate/profiles/cpu-tiny-llm")], modes or list(MODES))
