"""calibrate/experiments/ranker_runaway.py: each variant takes out its one mechanism and
leaves the rest of the profile as it was."""

from __future__ import annotations

import json

from calibrate.experiments import ranker_runaway


def test_each_variant_takes_out_one_mechanism():
    profile = json.loads((ranker_runaway.RUN / "profile.json").read_text())
    loop = profile["frontend"]["event_loop"]
    assert loop["cost_per_in_flight"] > 0
    assert profile["speed_process"]["speed"]["episodes"]
    same = ranker_runaway.variant(profile, "as fitted")
    assert same == profile
    assert same is not profile
    cost = ranker_runaway.variant(profile, "no cost per in flight")
    assert cost["frontend"]["event_loop"]["cost_per_in_flight"] == 0.0
    assert cost["speed_process"] == profile["speed_process"]
    calm = ranker_runaway.variant(profile, "no episodes")
    assert "episodes" not in calm["speed_process"]["speed"]
    assert calm["frontend"] == profile["frontend"]
    neither = ranker_runaway.variant(profile, "neither")
    assert neither["frontend"]["event_loop"]["cost_per_in_flight"] == 0.0
    assert "episodes" not in neither["speed_process"]["speed"]
    assert profile["speed_process"]["speed"]["episodes"]  # the profile itself untouched
    assert set(ranker_runaway.VARIANTS) == {"as fitted", "no cost per in flight", "no episodes", "neither"}
