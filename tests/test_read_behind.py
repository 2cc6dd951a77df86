"""A client on the loop's core reads a batch's answers late (``event_loop.read_behind_ms``,
calibrate/behind.py): the simulator's lag by formula, in chunks as whole, its fit recovered,
a bad value refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate.behind import fit_read_behind, later_responses
from simulator.engine import simulate, stream
from simulator.scenario.config import Scenario
from tests.helpers import refusal
from tests.test_event_loop import _doc as loop_doc


def _doc(behind: float, rate: float = 300.0) -> dict:
    loop = {"return_ms": 0.2, "respond_per_batch_ms": 0.3, "respond_per_request_ms": 0.5, "read_behind_ms": behind}
    d = loop_doc(rate, loop)
    d["duration_s"] = 20
    d["workers"]["service_time"] = {"kind": "table", "batch_ms": {"1": 6, "8": 20}, "noise_cv": 0.1}
    return d


def test_each_response_is_read_later_by_the_responses_written_after_it():
    """The same run with and without the lag: every batch the same, every response later by
    read_behind_ms for each response of its batch written after it, exactly."""
    plain = simulate(Scenario.model_validate(_doc(0.0))).records
    late = simulate(Scenario.model_validate(_doc(0.3))).records
    np.testing.assert_array_equal(late.t_dispatch, plain.t_dispatch)
    np.testing.assert_array_equal(late.t_inferred, plain.t_inferred)
    ok = ~np.isnan(plain.t_response)
    d = pd.DataFrame({"batch": plain.t_dispatch[ok], "written": plain.t_response[ok]})
    later = d.groupby("batch")["written"].transform("size") - d.groupby("batch")["written"].rank(method="first")
    assert later.max() >= 5  # batches of several, at this load
    np.testing.assert_allclose(late.t_response[ok] - plain.t_response[ok], 0.3 * later.to_numpy(), atol=1e-9)


def test_a_run_in_chunks_reads_them_as_one_run():
    s = Scenario.model_validate(_doc(0.3))
    whole = simulate(s).records
    got = np.concatenate([p.records.t_response for p in stream(s, chunk_s=1.0)])
    np.testing.assert_array_equal(got, whole.t_response)


def test_a_negative_lag_is_refused_naming_its_line(tmp_path):
    text = refusal(tmp_path, _doc(-0.1))
    assert "preprocess.event_loop.read_behind_ms" in text
    assert "line " in text


def _requests(slope_ms: float, rng: np.random.Generator, levels=(1, 3, 5)) -> pd.DataFrame:
    """Synthetic server clocks: batches of 1-8, each request's handler resuming 0.5 ms
    after the one before it (stamped out of order in the rows), its time outside the server
    a level's own mean, plus ``slope_ms`` per response of its batch written after it, plus
    an exponential tail."""
    rows = []
    for lv in levels:
        for b in range(1500):
            size = int(rng.integers(1, 9))
            t0 = b * 30_000_000
            for j in rng.permutation(size):
                request_us = 20_000.0 + 500.0 * j
                later = size - 1 - j
                rows.append({
                    "level": lv, "slice": lv * 10 + b % 3, "batch_size": size, "received_at_ns": t0,
                    "dispatched_at_ns": t0 + 2_000_000, "request_us": request_us,
                    "latency_ms": request_us / 1e3 + 1.5 + 0.1 * lv + slope_ms * later + rng.exponential(0.6),
                })  # fmt: skip
    return pd.DataFrame(rows)


def test_later_responses_count_by_when_each_handler_resumed():
    df = _requests(0.0, np.random.default_rng(1), levels=(1,))
    later = later_responses(df)
    expected = df["batch_size"] - 1 - (df["request_us"] - 20_000.0) / 500.0
    np.testing.assert_array_equal(later.to_numpy(), expected.to_numpy())
    assert later_responses(df.drop(columns=["dispatched_at_ns"])).isna().all()


def test_the_fit_recovers_the_lag_within_levels():
    """The slope within each level, the levels' own means apart (a heavier level's longer
    time outside does not leak into it); at most the loop's time per response; none without
    the clocks or with batches of one."""
    rng = np.random.default_rng(2)
    for slope in (0.0, 0.28):
        fitted = fit_read_behind(_requests(slope, rng), cap_ms=0.5)
        # the slope's standard error: the tail's sd over the spread of the counts
        assert fitted == pytest.approx(slope, abs=0.02)
    assert fit_read_behind(_requests(0.28, rng), cap_ms=0.1) == 0.1
    df = _requests(0.28, rng)
    assert fit_read_behind(df.drop(columns=["received_at_ns"]), cap_ms=0.5) is None
    ones = df[df["batch_size"] == 1]
    assert fit_read_behind(ones, cap_ms=0.5) is None


def test_a_calibrated_scenario_carries_the_fitted_lag():
    from calibrate.scenario import scenario_dict

    profile = json.loads((Path(__file__).parents[1] / "calibrate/profiles/cpu-resnet64-epyc/profile.json").read_text())
    loop = profile["frontend"]["event_loop"]
    loop["read_behind_ms"] = 0.25
    doc = scenario_dict(profile, 100.0, duration_s=1.0, warmup_s=0.0, speed=1.2)
    assert doc["preprocess"]["event_loop"]["read_behind_ms"] == pytest.approx(0.3)
    Scenario.model_validate(doc)
    loop.pop("read_behind_ms")  # a profile fitted before it: none
    plain = scenario_dict(profile, 100.0, duration_s=1.0, warmup_s=0.0)
    assert "read_behind_ms" not in plain["preprocess"]["event_loop"]
