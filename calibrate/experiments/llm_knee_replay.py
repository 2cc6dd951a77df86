"""The knee's first slice replayed (calibrate/README, "The knee's batches are its
requests'"): is the simulator's scheduler what keeps more sequences running at the knee
than the engine did? A calibration's first knee slice is drawn from its ``--seed``
(``llm_load.plan_from_scenario`` at the knee's offer, 25 s), so its requests can be drawn
again, request for request. Per calibration folder: the engine's sequences running in its
first knee slice (10-25 s, as counted), the same requests through the simulator's replica
(the folder's fitted step time, no noise, no speed process), and the spread of that
figure over the same design's fresh draws (seeds 1-39). Then the speed process's part:
the knee's steps in the simulator (fresh draws, the folder's speed process, 12 seeds) and
in the engine, each summed over the sum of their nominal times (the fit of every phase):
a time change whose factors average one over time does more work a second where it never
idles (a slow spell holds fewer steps), in the engine as in the simulator; and in the
simulator again without the speed process's fastest component.

    python calibrate/experiments/llm_knee_replay.py FOLDER [FOLDER ...] [--seed N]   # seconds
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from calibrate import llm_load, llm_profile
from calibrate.llm_sim import KNEE_SKIP_S
from simulator.scenario.config import Scenario
from simulator.serving.continuous import LLMService
from simulator.serving.llm_replica import Replica
from simulator.stages.speed import SpeedProcess

KNEE_S = 25.0


class _Nominal:
    """A step model that keeps each step's nominal time (the replica asks it once a step
    for the step's work, then once more for a step with prompt tokens, for their share)."""

    def __init__(self, inner):
        self.inner, self.calls, self.steps = inner, [], []

    def ms(self, work) -> float:
        v = self.inner.ms(work)
        self.calls.append(v)
        return v

    def noise(self) -> float:  # called once a step, after its ms: the first call was its work
        self.steps.append(self.calls[0])
        self.calls.clear()
        return 1.0


def replayed(scenario, offered_rps: float, seed: int, speed: bool = False) -> tuple[float, float]:
    """The knee slice drawn from ``seed`` through one replica (with ``speed``, on a path of
    the scenario's speed process): its mean sequences a step, and its steps' times summed
    over their nominal times, both from ``KNEE_SKIP_S`` to ``KNEE_S``."""
    plan = llm_load.plan_from_scenario(scenario, offered_rps, KNEE_S, np.random.default_rng(seed))
    service = LLMService.of(scenario.batching, scenario.workers.instance_type, np.random.default_rng(seed))
    nominal = _Nominal(service.step)
    path = None
    if speed:
        path = SpeedProcess(scenario.platform.speed, KNEE_S * 3000.0, np.random.default_rng(seed)).worker(0)
    rep = Replica(service.policy, nominal, service.limits, noise=nominal.noise, speed=path)
    rep.wake = ()  # no idle in an overload slice after its first steps
    for i in range(len(plan)):
        rep.push(i, plan.at_s[i] * 1000.0, int(plan.prompt[i]), int(plan.output[i]))
    rep.advance()
    steps = rep.step_log()
    start = steps.start / 1000.0
    counted = (start >= KNEE_SKIP_S) & (start < KNEE_S)
    took = (steps.end - steps.start)[counted].sum() / np.asarray(nominal.steps)[counted].sum()
    return float(np.mean(steps.seqs[counted])), float(took)


def main(folders: list[Path], seed: int) -> None:
    for folder in folders:
        measured = json.loads((folder / "measured.json").read_text())
        s = Scenario.model_validate(yaml.safe_load((folder / "scenario.yaml").read_text()))
        offered = measured["knee"]["offered_rps"]
        steps = pd.read_csv(folder / "steps.csv.gz")
        first = steps[(steps["phase"] == "knee") & (steps["slice"] == 1)]
        t = (first["begin_ns"] - first["begin_ns"].min()) / 1e9
        engine = float(first["running"][(t >= KNEE_SKIP_S) & (t < KNEE_S)].mean())
        same, _ = replayed(s, offered, seed)
        fresh = np.array([replayed(s, offered, k)[0] for k in range(1, 40) if k != seed])
        print(  # noqa: T201
            f"{folder}: first knee slice (offered {offered:.2f} req/s): the engine ran {engine:.2f} sequences a step; "
            f"its requests through the replica {same:.2f}; fresh draws {fresh.mean():.2f} (sd {fresh.std(ddof=1):.2f}, "
            f"{len(fresh)} draws)"
        )
        if s.platform is None or s.platform.speed is None:
            continue
        sim = np.array([replayed(s, offered, k, speed=True)[1] for k in range(1, 13)])
        doc = yaml.safe_load((folder / "scenario.yaml").read_text())
        comps = doc["platform"]["speed"]["components"]
        fastest = min(comps, key=lambda c: c["correlation_time_s"])
        doc["platform"]["speed"]["components"] = [c for c in comps if c is not fastest]
        slow = np.array([replayed(Scenario.model_validate(doc), offered, k, speed=True)[1] for k in range(1, 13)])
        fit = llm_profile.fit(steps)
        knee = steps[steps["phase"] == "knee"]
        took = llm_profile.step_ms(knee).sum() / llm_profile.predict_ms(fit, knee).sum()
        print(  # noqa: T201
            f"  the knee's steps over their nominal times: the simulator's {sim.mean():.3f} (sd {sim.std(ddof=1):.3f}, "
            f"12 seeds, its speed process), {slow.mean():.3f} (sd {slow.std(ddof=1):.3f}) without its fastest "
            f"component (sigma {fastest['sigma']}, {fastest['correlation_time_s']} s); the engine's {took:.3f} "
            "(the fit of every phase)"
        )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path)
    p.add_argument("--seed", type=int, default=0, help="the calibrations' --seed (default 0)")
    a = p.parse_args()
    main(a.folders, a.seed)
