"""The knee's first slice replayed (calibrate/README, "The knee's batches are its
requests'"): is the simulator's scheduler what keeps more sequences running at the knee
than the engine did? A calibration's first knee slice is drawn from its ``--seed``
(``llm_load.plan_from_scenario`` at the knee's offer, 25 s), so its requests can be drawn
again, request for request. Per calibration folder: the engine's sequences running in its
first knee slice (10-25 s, as counted), the same requests through the simulator's replica
(the folder's fitted step time, no noise, no speed process), and the spread of that
figure over the same design's fresh draws (seeds 1-39).

    python calibrate/experiments/llm_knee_replay.py FOLDER [FOLDER ...] [--seed N]   # seconds
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from calibrate import llm_load
from calibrate.llm_run import KNEE_SKIP_S, _load
from simulator.serving.llm_replica import Limits, Replica, step_model

KNEE_S = 25.0


def replayed(scenario, offered_rps: float, seed: int) -> tuple[float, float]:
    """The knee slice drawn from ``seed`` through one replica: its mean sequences a step
    and its completions a second, both from ``KNEE_SKIP_S`` to ``KNEE_S``."""
    plan = llm_load.plan_from_scenario(scenario, offered_rps, KNEE_S, np.random.default_rng(seed))
    b, kind = scenario.batching, scenario.workers.instance_type
    limits = Limits(b.blocks(kind), b.block_size, b.max_num_batched_tokens, b.max_num_seqs, prefix_caching=True)
    rep = Replica(b.policy, step_model(b, kind), limits)
    for i in range(len(plan)):
        rep.push(i, plan.at_s[i] * 1000.0, int(plan.prompt[i]), int(plan.output[i]))
    rep.advance()
    steps, done = rep.step_log(), rep.finished().done / 1000.0
    start = steps.start / 1000.0
    counted = (start >= KNEE_SKIP_S) & (start < KNEE_S)
    rate = np.count_nonzero((done >= KNEE_SKIP_S) & (done < KNEE_S)) / (KNEE_S - KNEE_SKIP_S)
    return float(np.mean(steps.seqs[counted])), rate


def main(folders: list[Path], seed: int) -> None:
    for folder in folders:
        measured = json.loads((folder / "measured.json").read_text())
        s = _load(yaml.safe_load((folder / "scenario.yaml").read_text()))
        offered = measured["knee"]["offered_rps"]
        steps = pd.read_csv(folder / "steps.csv.gz")
        first = steps[(steps["phase"] == "knee") & (steps["slice"] == 1)]
        t = (first["begin_ns"] - first["begin_ns"].min()) / 1e9
        engine = float(first["running"][(t >= KNEE_SKIP_S) & (t < KNEE_S)].mean())
        same, _ = replayed(s, offered, seed)
        fresh = np.array([replayed(s, offered, k)[0] for k in range(1, 40) if k != seed])
        print(  # noqa: T201
            f"{folder}: first knee slice (offered {offered} req/s): the engine ran {engine:.2f} sequences a step; "
            f"its requests through the replica {same:.2f}; fresh draws {fresh.mean():.2f} (sd {fresh.std(ddof=1):.2f}, "
            f"{len(fresh)} draws)"
        )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path)
    p.add_argument("--seed", type=int, default=0, help="the calibrations' --seed (default 0)")
    a = p.parse_args()
    main(a.folders, a.seed)
