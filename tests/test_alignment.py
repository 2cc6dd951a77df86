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


def test_a_slice_at_constant_speed_reads_constant_whatever_its_batch_sizes():
    """No noise, no speed process: every batch runs at the instance's own table (the fitted
    one less the hand-back the event loop takes) times the factors, so the trace reads 0 in
    every window, at a light load and a busy one alike. Divided by the fitted table, bigger
    batches read slower by the hand-back's share, and a backlog, which makes them, as a
    slowdown: the pressure experiment's control read +0.1% a request from that alone."""
    profile = json.loads(EPYC.read_text())
    profile["service_time"].pop("noise_ratios", None)
    profile["service_time"]["noise_cv"] = 0.0
    profile.pop("speed_process", None)
    less = profile["frontend"]["event_loop"]["instance_less_ms"]
    assert less > 0.1
    table = alignment.instance_table(profile)
    fitted = {int(k): v for k, v in profile["service_time"]["batch_ms"].items()}
    assert table[1] == fitted[1] - less
    duration = 4.0
    for load in (0.2, 0.85):
        doc = scenario_dict(profile, load * profile["capacity_rps"], duration_s=duration, warmup_s=0.25, seed=5)
        got = simulate(Scenario.model_validate(doc))
        assert len(np.unique(got.batches.size)) > (1 if load < 0.5 else 3)
        np.testing.assert_allclose(alignment.own_trace(profile, got.batches, duration), 0.0, atol=1e-9)
