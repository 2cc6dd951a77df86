"""What is left at light load once the host's minutes are known (calibrate/README, "The
host's minutes or the model")? Per calibration folder refitted with the host's speeds
(``servesim calibrate refit``, 2026-11-27 afternoon or later; the folder keeps
``requests.csv.gz``), each level at 30, 50 and 70% of the knee:

* the *same requests* (each slice's own arrivals, prompt and output lengths, arriving the
  measured overhead after their scheduled time) through the simulator's replica on each
  slice's own host speed, without noise or speed process: their TTFT and TPOT p50 against
  the measured (the scheduler and the step time alone);
* at 30 and 50% (``--variants``), fresh draws on each slice's own speed as the report's
  last column predicts them (the speed process's variation within a slice) and the same
  without the speed process (white noise only), 20 replications: p50 and p90 against the
  measured.

Then over the folders: each figure's mean and how many came out low.

    python calibrate/experiments/llm_same_requests.py FOLDER [FOLDER ...] [--variants]
    # about 7 s a folder; with --variants about a minute a folder
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate import llm_run, llm_server, llm_sim
from calibrate.experiments.llm_ttft_apart import replayed
from simulator.scenario.config import Scenario


def held_out(folder: Path, level: float) -> tuple[dict, dict, list[float]]:
    """The level's held-out fit (its overhead in it), the engine's batching fields and its
    slices' host speeds."""
    steps = pd.read_csv(folder / "steps.csv.gz")
    measured = json.loads((folder / "measured.json").read_text())
    profile = json.loads((folder / "profile.json").read_text())
    phase = f"level {level:g}"
    fit = {**llm_run.fitted(steps[steps["phase"] != phase]), "overhead_ms": measured["overhead_ms"]}
    engine = {k: v for k, v in measured["engine"].items() if k in llm_server.ENGINE}
    return fit, engine, profile["host_by_slice"][phase]


def same_requests(folder: Path, level: float) -> dict:
    """The level's requests through the replica on each slice's own speed: TTFT and TPOT p50
    against the measured (relative errors)."""
    fit, engine, speeds = held_out(folder, level)
    measured = json.loads((folder / "measured.json").read_text())
    requests = pd.read_csv(folder / "requests.csv.gz")
    parts = []
    for rnd, g in requests[(requests["level"] == level) & requests["error"].isna()].groupby("round"):
        doc = llm_sim.scenario_dict(
            llm_sim.at_speed(fit, speeds[int(rnd)]), engine, rate_rps=1.0, duration_s=20.0, warmup_s=0.0
        )
        at = g["scheduled_s"].to_numpy() * 1000.0
        arrive = at + measured["overhead_ms"]
        _, first, last = replayed(Scenario.model_validate(doc), arrive, g["prompt_tokens"], g["output_tokens"])
        n = g["output_tokens"].to_numpy()
        parts.append(
            pd.DataFrame(
                {
                    "ttft": g["ttft_s"].to_numpy() * 1e3,
                    "sim_ttft": first - at,
                    "tpot": g["tpot_s"].to_numpy() * 1e3,
                    "sim_tpot": np.where(n > 1, (last - first) / np.maximum(n - 1, 1), np.nan),
                    "kept": g["scheduled_s"].to_numpy() >= measured["warmup_s"],
                }
            )
        )
    d = pd.concat(parts)
    d = d[d["kept"]]
    return {
        "ttft50 same": d["sim_ttft"].median() / d["ttft"].median() - 1.0,
        "tpot50 same": d["sim_tpot"].median() / d["tpot"].median() - 1.0,
    }


def variants(folder: Path, level: float, replications: int = 20) -> dict:
    """Fresh draws on each slice's own speed, with the speed process's variation within a
    slice and without it: TTFT and TPOT p50 and p90 against the measured."""
    fit, engine, speeds = held_out(folder, level)
    measured = json.loads((folder / "measured.json").read_text())
    slice_s, warmup_s = measured["slice_s"], measured["warmup_s"]
    rates = llm_run.level_rates(measured, level)
    got = measured["percentiles"][f"{level:g}"]
    out = {}
    for name, keep_speed in (("own", True), ("own, no speed", False)):
        docs = []
        for v in speeds:
            doc = llm_sim.scenario_dict(
                llm_sim.at_speed(fit, v, slice_s), engine, rate_rps=1.0, duration_s=slice_s, warmup_s=warmup_s
            )
            if not keep_speed:
                doc.pop("platform", None)
            docs.append(doc)
        sim = llm_sim.simulated(docs, rates, slice_s, warmup_s, range(1, 1 + replications))
        for metric in ("ttft", "tpot"):
            for q in (50, 90):
                col = f"{metric}_p{q}_ms"
                out[f"{metric}{q} {name}"] = sim[col].median() / got[col] - 1.0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--variants", action="store_true", help="also fresh draws with and without the speed process")
    args = ap.parse_args()
    rows = []
    for folder in args.folders:
        for level in (0.3, 0.5, 0.7):
            row = {"run": folder.name, "level": level, **same_requests(folder, level)}
            if args.variants and level < 0.7:
                row |= variants(folder, level)
            rows.append(row)
            print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}, flush=True)  # noqa: T201
    t = pd.DataFrame(rows)
    cols = [c for c in t.columns if c not in ("run", "level")]
    summary = t.groupby("level")[cols].agg(["mean", lambda x: (x < 0).sum() if x.notna().any() else np.nan])
    summary.columns = [f"{c} {'mean' if k == 'mean' else 'low'}" for c, k in summary.columns]
    pd.set_option("display.width", 250)
    print(summary.T.round(3).to_string())  # noqa: T201


if __name__ == "__main__":
    main()
