"""Is the knee's miss the engine's own, or the server's around it? The calibration's design
(a profile, a knee slice, then rounds of held-out levels and knee slices) run on the engine
alone, in this process, pinned to one core with nothing on the other: no HTTP, no front end,
no hand-off, no load generator beside it. The steps are fitted and the knee predicted as
``servesim calibrate llm`` does (the fit of every other phase), and each knee slice's steps
compared with that fit.

    python calibrate/experiments/llm_inprocess.py [OUT] [ROUNDS]   # about 5 minutes for 2 rounds
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate import llm_load, llm_profile, llm_run, llm_server, llm_sim
from simulator.scenario.config import Scenario

SLICE_S, KNEE_S = 20.0, 25.0


def run_plan(engine, plan: llm_load.Plan, stop_s: float | None, rng) -> tuple[list[float], pd.DataFrame]:
    """Feed ``plan`` to ``engine`` in real time; step while it has work (until ``stop_s``,
    then drop what is left). Returns each request's completion time (s from the start)
    and the steps."""
    engine.steps.clear()
    t0 = time.perf_counter()
    done, i, n = [], 0, len(plan)
    while i < n or engine.busy:
        now = time.perf_counter() - t0
        if stop_s is not None and now >= stop_s:
            break
        begin = time.perf_counter_ns()
        while i < n and plan.at_s[i] <= now:
            prompt = rng.integers(1, 256, int(plan.prompt[i])).tolist()
            engine.add(f"r{i}", prompt, int(plan.output[i]))
            i += 1
        if not engine.busy:
            time.sleep(max(plan.at_s[i] - (time.perf_counter() - t0), 0.0))
            continue
        recorded = len(engine.steps)
        tokens = engine.step(begin)
        if len(engine.steps) > recorded:
            engine.steps[-1].done_ns = time.perf_counter_ns()
        done += [time.perf_counter() - t0 for t in tokens if t.finished]
    for rid in list(engine.requests):
        engine.abort(rid)
    steps = pd.DataFrame([dataclasses.asdict(s) for s in engine.steps])
    engine.steps.clear()
    return done, steps


def main(out: Path, rounds: int) -> None:
    from reference_server.llm.engine import Engine, EngineConfig

    os.sched_setaffinity(0, {1})
    import torch

    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    engine = Engine(EngineConfig(**llm_server.ENGINE))
    engine.add("warmup", [1] * 32, 2)
    engine.run_all()
    phases: dict[str, list[pd.DataFrame]] = {}
    # the profile's grid, one workload at a time
    shapes = llm_profile.grid(64, 512 * 16, engine.cfg.max_model_len)
    engine.steps.clear()
    for d, length in [shapes[k] for _ in range(2) for k in rng.permutation(len(shapes))]:
        for j in range(d):
            engine.add(f"p{j}", rng.integers(1, 256, length).tolist(), llm_profile.OUTPUT_TOKENS)
        while engine.busy:
            begin = time.perf_counter_ns()
            engine.step(begin)
            engine.steps[-1].done_ns = time.perf_counter_ns()
    phases["profile"] = [pd.DataFrame([dataclasses.asdict(s) for s in engine.steps])]
    engine.steps.clear()
    first = llm_profile.fit(phases["profile"][0])
    doc = llm_sim.scenario_dict({**first, "noise_cv": 0.1}, llm_server.ENGINE, rate_rps=1.0, duration_s=SLICE_S,
                                warmup_s=3.0)  # fmt: skip
    s = Scenario.model_validate(doc)
    offered = 1.5 * llm_sim.saturated_rate(doc, KNEE_S)
    knees = []

    def knee_slice():
        plan = llm_load.plan_from_scenario(s, offered, KNEE_S, rng)
        done, steps = run_plan(engine, plan, KNEE_S, rng)
        d = np.asarray(done)
        knees.append(np.count_nonzero((d >= llm_sim.KNEE_SKIP_S) & (d < KNEE_S)) / (KNEE_S - llm_sim.KNEE_SKIP_S))
        phases.setdefault("knee", []).append(steps.assign(slice=len(knees)))
        print(f"knee slice {len(knees)}: {knees[-1]:.2f} req/s", flush=True)  # noqa: T201

    knee_slice()
    for _ in range(rounds):
        so_far = float(np.mean(knees))
        for item in rng.permutation(len(llm_run.LEVELS) + 1):
            if item == len(llm_run.LEVELS):
                knee_slice()
                continue
            share = llm_run.LEVELS[item]
            plan = llm_load.plan_from_scenario(s, share * so_far, SLICE_S, rng)
            _, steps = run_plan(engine, plan, None, rng)
            level = phases.setdefault(f"level {share:g}", [])
            level.append(steps.assign(slice=len(level)))
    steps = pd.concat([pd.concat(v, ignore_index=True).assign(phase=k) for k, v in phases.items()], ignore_index=True)
    steps.to_csv(out / "steps.csv.gz", index=False)
    held = llm_run.fitted(steps[steps["phase"] != "knee"])
    knee_doc = llm_sim.scenario_dict(held, llm_server.ENGINE, rate_rps=1.0, duration_s=SLICE_S, warmup_s=3.0)
    simulated = llm_sim.simulated_knee(knee_doc, offered, KNEE_S, llm_sim.KNEE_SKIP_S, range(1, 11))
    coef = llm_profile.fit(steps[steps["phase"] != "knee"])
    kn = steps[steps["phase"] == "knee"]
    ratios = [
        float(llm_profile.step_ms(g).sum() / llm_profile.predict_ms(coef, g).sum()) for _, g in kn.groupby("slice")
    ]
    got = {"offered_rps": offered, "slices_rps": knees, "measured_rps": float(np.mean(knees)),
           "simulated_rps": simulated, "error": simulated / float(np.mean(knees)) - 1.0,
           "knee_steps_over_heldout_fit": ratios}  # fmt: skip
    (out / "knee.json").write_text(json.dumps(got, indent=1) + "\n")
    print(json.dumps(got, indent=1))  # noqa: T201


if __name__ == "__main__":
    args = sys.argv[1:]
    main(Path(args[0]) if args else Path("/tmp/llm-inprocess"), int(args[1]) if len(args) > 1 else 2)
