"""What the LLM calibration's target can tell apart (calibrate/llm_target.py): virtual runs of
a calibrated profile's own model, on a design small enough for the default suite."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from calibrate import llm_target

PROFILE = Path(__file__).resolve().parents[1] / "calibrate" / "profiles" / "cpu-tiny-llm" / "profile.json"


def small(profile: dict) -> dict:
    """The committed profile on a design of one 6-s slice a level, 9 replications, 12-s
    overload slices."""
    knee = {**profile["knee"], "slice_s": 12.0}
    return {**profile, "rounds": 1, "replications": 9, "slice_s": 6.0, "warmup_s": 1.0, "knee": knee}


def test_a_correct_model_meets_its_cells_as_often_as_its_interval_says_and_no_speed_less():
    profile = small(json.loads(PROFILE.read_text()))
    report = llm_target.target_report(profile, runs=40, pool_size=40, triples=200, knee_pool=8, seed=3)
    by = {(p["truth"], p["predictor"]): p for p in report["pairs"]}
    correct, blind = by[("fitted", "fitted")], by[("fitted", "no speed")]
    # 9 replications: the range holds a new draw 8 times in 10; the 10% and 20% bounds add a little
    rates = np.array([c["pass_rate"] for c in correct["cells"]])
    assert 0.7 < rates.mean() < 0.95, rates.mean()
    assert abs(np.median([c["median_error"] for c in correct["cells"]])) < 0.05
    assert blind["mean_judged_met"] < correct["mean_judged_met"]
    rule = report["passable_rule"]
    assert 0 < rule["every_run_at_least"] <= correct["judged_met_in_90pct"] <= 18
    assert correct["passes_total_rule"] >= 0.9
    for p in report["pairs"]:
        assert 0.0 <= p["knee_within_5pct"] <= 1.0
        assert np.isfinite(p["knee_bound_three_runs_90pct"])


def test_the_pool_does_not_depend_on_the_processes():
    profile = small(json.loads(PROFILE.read_text()))
    docs = llm_target.models(profile)
    rates = {0.3: 5.0}
    a = llm_target.pools({"fitted": docs["fitted"]}, rates, size=30, slice_s=4.0, warmup_s=1.0, seed=1)
    b = llm_target._pool(docs["fitted"], 5.0, list(range(10_000_000, 10_000_030)), 4.0, 1.0)
    assert len(a[("fitted", 0.3)]) == 30
    for (x1, y1), (x2, y2) in zip(a[("fitted", 0.3)], b, strict=True):
        assert np.array_equal(x1, x2)
        assert np.array_equal(y1, y2)


def test_a_profile_without_a_speed_process_is_refused_with_exit_2(tmp_path):
    from servesim.cli import app

    profile = json.loads(PROFILE.read_text())
    profile["step_time"] = {k: v for k, v in profile["step_time"].items() if k != "speed"}
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    got = CliRunner().invoke(app, ["calibrate", "target", str(tmp_path), "--runs", "6"])
    assert got.exit_code == 2
    assert "speed process" in got.output
    assert "Traceback" not in got.output


def test_too_small_a_pool_is_refused():
    profile = json.loads(PROFILE.read_text())
    with pytest.raises(ValueError, match="pool_size"):
        llm_target.target_report(profile, runs=3, pool_size=10)
    with pytest.raises(ValueError, match="knee_pool"):
        llm_target.target_report(profile, runs=3, knee_pool=5)


def test_another_number_of_rounds_is_judged_with_a_pool_as_large_as_it_draws():
    profile = small(json.loads(PROFILE.read_text()))
    # 2 rounds of 9 replications and the measured slices: 20 distinct draws a level
    report = llm_target.target_report(profile, runs=6, pool_size=20, triples=10, knee_pool=0, seed=1, rounds=2)
    assert report["rounds"] == 2
    assert report["pairs"][0]["cells_judged"] == 18
    with pytest.raises(ValueError, match="pool_size"):
        llm_target.target_report(profile, runs=6, pool_size=19, rounds=2)
    with pytest.raises(ValueError, match="rounds"):
        llm_target.target_report(profile, runs=6, rounds=0)
    assert llm_target.pool_for(3, 20) == 200
    assert llm_target.pool_for(12, 20) == 252


def test_rounds_are_refused_for_an_image_profile_with_exit_2(tmp_path):
    from servesim.cli import app

    (tmp_path / "profile.json").write_text(json.dumps({"design": {"rounds": 3}}))
    got = CliRunner().invoke(app, ["calibrate", "target", str(tmp_path), "--rounds", "4"])
    assert got.exit_code == 2
    assert "LLM profile" in got.output
    assert "Traceback" not in got.output
