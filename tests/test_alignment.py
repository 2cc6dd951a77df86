"""The alignment experiment's control reads a simulated slice's speed back from its own
batches (calibrate/experiments/alignment.py): the trace it replays is the one the slice ran
at, once the factors the model applies on top are divided out."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np

from calibrate.experiments import alignment
from calibrate.scenario import scenario_dict
from simulator.engine import simulate
from simulator.scenario.config import Scenario

EPYC = Path(__file__).resolve().parent.parent / "calibrate/profiles/cpu-resnet64-epyc/profile.json"


def test_a_simulated_slices_own_batches_give_back_the_speed_it_ran_at():
    """The committed EPYC profile, the batches' own noise off and its ``after_idle`` and
    ``by_rate`` made strong (its own move a batch by a few percent, as much as the batches
    that straddle a window's edge), at 60% of its capacity, run at a known speed: 0.1 s
    windows alternating between three factors. Read back per window, about its mean, the
    speed is the one given within a few percent, and follows it."""
    profile = json.loads(EPYC.read_text())
    profile["service_time"].pop("noise_ratios", None)
    profile["service_time"] |= {"by_rate": {"100": 1.25, "300": 0.8}, "after_idle": {"0.05": 1.0, "10": 1.3}}
    duration = 4.0
    pattern = np.tile([0.85, 1.0, 1.2, 1.0, 0.9, 1.15], 7)[: int(duration / alignment.WINDOW_S)]
    doc = scenario_dict(profile, 0.6 * profile["capacity_rps"], duration_s=duration, warmup_s=0.25, seed=3)
    doc["platform"] = {"speed": {"kind": "trace", "step_ms": alignment.WINDOW_S * 1000.0, "factors": pattern.tolist()}}
    got = simulate(Scenario.model_validate(doc))
    read = alignment.own_trace(profile, got.batches, duration)
    given = np.log(pattern) - np.log(pattern).mean()
    inner = slice(3, len(given) - 1)  # the first windows run before the throughput's average settles
    assert np.corrcoef(read[inner], given[inner])[0, 1] > 0.95
    assert np.abs(read[inner] - given[inner]).mean() < 0.02
    # without the factors divided out, what they do would read as the host's speed
    plain = copy.deepcopy(profile)
    del plain["service_time"]["by_rate"], plain["service_time"]["after_idle"]
    assert np.abs(alignment.own_trace(plain, got.batches, duration)[inner] - given[inner]).mean() > 0.03
