"""Replay (calibrate/README, "Nine runs, one sign"): is the low-load miss in the step model
or in the scheduling? Three 30 s slices at 30% of the profile's knee; each slice's own
arrivals and lengths replayed through the simulator (``traffic.from_trace``, so the workload
is the same request for request) with the profile's step time, and again with that step
time scaled by the slice's own steps against the fit (decode-weighted). Per slice: the
client's TPOT p50 and p90 (vLLM's TPOT; the first 3 s left out), the two replays' medians
over 10 seeds, the steps' ratio, and the mean sequences a step (decodes and prompt chunks) in the
engine and in the replay.

    python calibrate/experiments/llm_replay.py   # about 3 minutes, from the repository root
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from calibrate import llm_load, llm_profile
from calibrate.llm_server import ENGINE, server_args, step_records
from calibrate.llm_sim import scaled_step_time
from calibrate.servers import beside_llm_front_end, server
from simulator.scenario.config import Scenario

PROFILE = Path("calibrate/profiles/cpu-tiny-llm")
SKIP_S = 3.0


def trace_doc(doc: dict, trace: Path, duration_s: float, scale: float = 1.0) -> dict:
    """``doc`` replaying ``trace`` (arrival_s, prompt_tokens, output_tokens) for
    ``duration_s``, its step time's coefficients times ``scale``."""
    st = scaled_step_time(doc["batching"]["step_time"], scale)
    traffic = {"arrivals_file": str(trace), "tokens": {"from_trace": True}}
    d = {**doc, "traffic": traffic, "duration_s": duration_s, "warmup_s": SKIP_S}
    d["batching"] = {**doc["batching"], "step_time": st}
    return d


def replay_once(doc: dict, seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    """One replay: the TTFT and TPOT (ms) of the requests scheduled from ``SKIP_S`` on, as
    the client sees them, and the mean sequences a step."""
    from simulator import simulate
    from simulator.results.tokens import tpot_ms, ttft_ms

    run = simulate(Scenario.model_validate(doc), seed=seed)
    r = run.records
    keep = (r.arrival >= SKIP_S * 1000.0) & np.isfinite(r.t_response)
    tpot = tpot_ms(r)[keep]
    return ttft_ms(r)[keep], tpot[np.isfinite(tpot)], float(np.mean(run.batches.size))


def replayed(doc: dict, trace: Path, duration_s: float, scale: float, seeds: range) -> dict:
    """The simulator's TPOT p50/p90 (medians over ``seeds``) and mean sequences a step, on
    the trace, with the step time's coefficients times ``scale``."""
    d = trace_doc(doc, trace, duration_s, scale)
    p50, p90, seqs = [], [], []
    for seed in seeds:
        _, v, n = replay_once(d, seed)
        p50.append(np.percentile(v, 50))
        p90.append(np.percentile(v, 90))
        seqs.append(n)
    return {"p50": float(np.median(p50)), "p90": float(np.median(p90)), "seqs": float(np.mean(seqs))}


def main() -> None:
    profile = json.loads((PROFILE / "profile.json").read_text())
    knee = profile["knee"]["completed_rps"]
    doc = yaml.safe_load((PROFILE / "scenario.yaml").read_text())
    fit = profile["step_time"]
    s = Scenario.model_validate(doc)
    rng = np.random.default_rng(5)
    duration = 30.0
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        server(server_args(ENGINE), command="serve-llm", health="/health") as url,
        beside_llm_front_end(url),
    ):
        step_records(url)
        for k in range(3):
            plan = llm_load.plan_from_scenario(s, 0.3 * knee, duration, rng)
            df = llm_load.run(url, plan, seed=int(rng.integers(1 << 31)))
            steps = step_records(url)
            trace = Path(tmp) / f"slice{k}.csv"
            pd.DataFrame({"arrival_s": plan.at_s, "prompt_tokens": plan.prompt, "output_tokens": plan.output}).to_csv(
                trace, index=False
            )
            ok = df[df["error"].isna() & (df["scheduled_s"] >= SKIP_S)]
            y, p = llm_profile.step_ms(steps), llm_profile.predict_ms(fit, steps)
            dec = steps["decodes"].to_numpy()
            ratio = float(np.sum(dec * y) / np.sum(dec * p))
            as_fit = replayed(doc, trace, duration, 1.0, range(1, 11))
            as_ran = replayed(doc, trace, duration, ratio, range(1, 11))
            row = {
                "slice": k,
                "tpot_p50": ok["tpot_s"].median() * 1e3,
                "tpot_p90": ok["tpot_s"].quantile(0.9) * 1e3,
                "steps_vs_fit": ratio,
                "replay_p50": as_fit["p50"],
                "replay_p90": as_fit["p90"],
                "scaled_p50": as_ran["p50"],
                "scaled_p90": as_ran["p90"],
                "engine_seqs_a_step": float((dec + steps["chunks"].to_numpy()).mean()),
                "replay_seqs_a_step": as_ran["seqs"],
            }
            rows.append(row)
            print({k: round(v, 3) for k, v in row.items()}, flush=True)  # noqa: T201
    print(pd.DataFrame(rows).round(3).to_string())  # noqa: T201


if __name__ == "__main__":
    main()
