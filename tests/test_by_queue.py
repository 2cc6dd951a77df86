"""A host runs faster while a backlog waits (``service_time.by_queue``): the factor by the
requests queued as a batch is taken, on each scheduler, counted as the calibration counts
it from the server's clocks (``calibrate.backlog.waiting_at_dispatch``); bad tables
refused; the fit divides it out."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate import backlog, backlog_fit
from simulator.engine import simulate
from simulator.scenario.config import Scenario
from tests.helpers import BAD_FACTOR_TABLES, factor_table_refusal
from tests.test_after_idle import _doc as idle_doc

TABLE = {"1": 1.0, "5": 0.6}  # 10% faster a request waiting, from one (its own) to five
MMC = Path(__file__).resolve().parent.parent / "scenarios/validation/mmc.yaml"


def _bursts(tmp_path, loop: bool, batching: dict, by_queue: dict | None) -> dict:
    """test_after_idle's scenario with bursts of five requests 100 ms apart."""
    d = idle_doc(tmp_path, loop, None, batching)
    path = tmp_path / "bursts.txt"
    np.savetxt(path, np.repeat(np.arange(1, 30) * 0.1, 5) + np.tile(np.arange(5) * 1e-6, 29), fmt="%.6f")
    d["traffic"] = {"arrivals_file": str(path)}
    d["duration_s"] = 30
    if by_queue is not None:
        d["workers"]["service_time"]["by_queue"] = by_queue
    return d


def _waiting(rec) -> np.ndarray:
    """The requests queued as each request's batch was taken, its own included, counted as
    the calibration counts it (the server's enqueue and dispatch clocks, in ns)."""
    df = pd.DataFrame(
        {
            "slice": 0,
            "enqueued_at_ns": np.round(rec.t_preprocessed * 1e6),
            "dispatched_at_ns": np.round(rec.t_dispatch * 1e6),
        }
    )
    return backlog.waiting_at_dispatch(df)


@pytest.mark.parametrize(
    ("loop", "batching"),
    [
        (True, {"max_batch_size": 1, "max_queue_delay_ms": 2}),  # the event loop's dispatch
        (False, {"max_batch_size": 1, "max_queue_delay_ms": 2}),  # the compiled batcher
        (False, {"max_batch_size": 1, "max_queue_delay_ms": 2, "deadline_ms": 500}),  # the SimPy scheduler
    ],
)
def test_a_batch_is_faster_by_the_requests_waiting_as_it_is_taken(tmp_path, loop, batching):
    """Each burst's five requests reach the batch queue 0.4 ms apart (one preprocessing
    worker) and each batch of one takes 6 ms or less: the first goes alone, the second
    finds the other four waiting, then three, two, one. Each batch's time is 6 ms times the
    table at that count."""
    rec = simulate(Scenario.model_validate(_bursts(tmp_path, loop, batching, TABLE))).records
    assert (rec.batch_size == 1).all()
    waiting = _waiting(rec)
    assert sorted(set(waiting.astype(int))) == [1, 2, 3, 4]
    got = rec.t_inferred - rec.t_dispatch - (0.15 if loop else 0.0)
    np.testing.assert_allclose(got, 6.0 * np.interp(waiting, [1.0, 5.0], [1.0, 0.6]), atol=1e-6)
    plain = simulate(Scenario.model_validate(_bursts(tmp_path, loop, batching, None))).records
    np.testing.assert_allclose(plain.t_inferred - plain.t_dispatch, 6.0 + (0.15 if loop else 0.0), atol=1e-9)


def test_the_count_and_the_factor_read_the_servers_clocks():
    """Three requests enqueued before the first dispatch: the first batch (two) finds three
    waiting, the second (one) finds one; without the clocks there is no count."""
    df = pd.DataFrame(
        {
            "slice": [0, 0, 0, 1],
            "enqueued_at_ns": [0, 1, 2, 0],
            "dispatched_at_ns": [5, 5, 9, 3],
        }
    )
    np.testing.assert_array_equal(backlog.waiting_at_dispatch(df), [3, 3, 1, 1])
    assert backlog.waiting_at_dispatch(df.drop(columns="enqueued_at_ns")) is None
    np.testing.assert_allclose(backlog.queue_factor(np.array([1, 3, 9, np.nan]), TABLE), [1.0, 0.8, 0.6, 1.0])


def test_the_table_is_the_slope_from_one_waiting():
    waiting = np.r_[np.ones(50), np.arange(1, 51)]
    got = backlog.table(-0.01, waiting)
    assert min(got) == 1.0
    assert got[1.0] == 1.0
    top = max(got)
    assert top == pytest.approx(np.percentile(waiting, 99), abs=0.1)
    assert got[top] == pytest.approx(np.exp(-0.01 * (top - 1.0)), abs=1e-4)
    assert backlog.table(-0.01, np.ones(10)) is None  # never more than its own: nothing to fit


@pytest.mark.parametrize(("value", "needle"), BAD_FACTOR_TABLES)
def test_bad_tables_are_refused_naming_the_field(value, needle):
    msg = factor_table_refusal("by_queue", value)
    assert "by_queue" in msg
    assert needle in msg


EPYC = Path(__file__).resolve().parent.parent / "calibrate/profiles/cpu-resnet64-epyc"


def test_the_fit_measures_the_slope_on_a_committed_run_and_refits_with_it(monkeypatch):
    """On the committed EPYC run: the schedule moves the measured count (a first stage near
    one), the slope is finite and small, and switched on, the batch time is fitted again
    with its table (exp(slope × (count − 1))) divided out; off, the profile is untouched."""
    profile = json.loads((EPYC / "profile.json").read_text())
    requests = pd.read_csv(EPYC / "measurements.csv.gz")
    slices = pd.read_csv(EPYC / "slices.csv")
    fit_levels = [f["level"] for f in profile["fit_levels"]]
    before = copy.deepcopy(profile)
    assert backlog_fit.fit(profile, requests, slices, fit_levels) is None  # off by default
    assert profile == before
    monkeypatch.setattr(backlog, "BY_QUEUE", True)
    got = backlog_fit.fit(profile, requests, slices, fit_levels)
    assert got["first_stage"] > 0.5
    assert got["slices"] == len(slices[slices["kept"] & slices["level"].isin(fit_levels)])
    assert got["windows"] >= 10 * got["slices"]
    assert abs(got["slope"]) < 0.05
    table = profile["service_time"]["by_queue"]
    top = max(table)
    assert table[1.0] == 1.0
    assert table[top] == pytest.approx(np.exp(got["slope"] * (top - 1.0)), abs=1e-4)
    assert profile["by_queue_fit"]["slope"] == pytest.approx(got["slope"], abs=1e-6)
    assert set(profile["service_time"]) >= set(before["service_time"]) - {"by_queue"}
