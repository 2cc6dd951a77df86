"""ABAB (calibrate/README, "What the misses are made of"): 30% and 50% of the profile's knee
alternating in one server, 25 s each, four pairs. Per run: the client's TPOT and TTFT p50
and mean ITL, the engine's steps against the profile's fit (decode-weighted), and the
simulator's prediction of the same design (the profile's scenario, no refit).

    python calibrate/experiments/llm_abab.py   # about 5 minutes, from the repository root
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from calibrate import llm_load, llm_profile
from calibrate.llm_server import server_args, step_records
from calibrate.llm_sim import simulated
from calibrate.servers import server
from simulator.scenario.config import Scenario

PROFILE = Path("calibrate/profiles/cpu-tiny-llm")


def one_run(url: str, plan, seed: int, fit: dict, share: float, k: int) -> dict:
    df = llm_load.run(url, plan, seed=seed)
    steps = step_records(url)
    ok = df[df["error"].isna() & (df["scheduled_s"] >= 3)]
    itl = np.concatenate([v for v in ok["itl_s"] if isinstance(v, np.ndarray) and len(v)])
    y, p = llm_profile.step_ms(steps), llm_profile.predict_ms(fit, steps)
    d = steps["decodes"].to_numpy()
    w = d > 0
    return {
        "run": k,
        "share": share,
        "tpot_p50": ok["tpot_s"].median() * 1e3,
        "ttft_p50": ok["ttft_s"].median() * 1e3,
        "itl_mean": itl.mean() * 1e3,
        "steps_vs_fit": float(np.sum(d[w] * y[w]) / np.sum(d[w] * p[w])),
    }


def main() -> None:
    profile = json.loads((PROFILE / "profile.json").read_text())
    doc = yaml.safe_load((PROFILE / "scenario.yaml").read_text())
    scenario = Scenario.model_validate(doc)
    knee = profile["knee"]["completed_rps"]
    rng = np.random.default_rng(7)
    rows = []
    with server(server_args(profile["engine"]), command="serve-llm", health="/health") as url:
        step_records(url)
        for k in range(8):
            share = (0.3, 0.5)[k % 2]
            plan = llm_load.plan_from_scenario(scenario, share * knee, 25.0, rng)
            rows.append(one_run(url, plan, k, profile["step_time"], share, k))
            print(rows[-1], flush=True)  # noqa: T201
    t = pd.DataFrame(rows)
    for share in (0.3, 0.5):  # after the runs: the simulations do not share the cores with them
        sim = simulated(doc, share * knee, 25.0, 3.0, range(1, 21), 1)
        t.loc[t["share"] == share, "sim_tpot_p50"] = sim["tpot_p50_ms"].median()
        t.loc[t["share"] == share, "sim_ttft_p50"] = sim["ttft_p50_ms"].median()
    t["tpot_err"] = t["sim_tpot_p50"] / t["tpot_p50"] - 1
    t["ttft_err"] = t["sim_ttft_p50"] / t["ttft_p50"] - 1
    print(t.round(3).to_string())  # noqa: T201


if __name__ == "__main__":
    main()
