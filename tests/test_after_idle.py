"""A batch after its instance sat idle runs slower (``service_time.after_idle``): the
simulator's factor by formula on each scheduler, its fit recovered, bad tables refused."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from calibrate.fit import batches_from_requests, fit_table, predicted_ms
from calibrate.idle import fit_after_idle, fit_loop_after_idle, idle_factor, loop_gaps_ms
from simulator.engine import simulate
from simulator.scenario.config import Scenario, Workers
from simulator.serving.workers import ServiceModel
from tests.helpers import BAD_FACTOR_TABLES, factor_table_refusal

# 100 ms apart, never meeting: each batch of one starts after its instance idled ~100 ms
SLOPE = {"0": 1.0, "200": 1.5}  # factor 1 + idle / 400


def _doc(tmp_path, loop: bool, after_idle: dict | None, batching: dict | None = None) -> dict:
    path = tmp_path / "arrivals.txt"
    np.savetxt(path, np.arange(1, 40) * 0.1, fmt="%.6f")
    st = {"kind": "table", "batch_ms": {"1": 6, "8": 11}}
    if after_idle is not None:
        st["after_idle"] = after_idle
    d = {
        "name": "idle",
        "seed": 3,
        "duration_s": 40,
        "warmup_s": 0,
        "sla": {"percentile": 99, "target_ms": 100},
        "traffic": {"arrivals_file": str(path)},
        "router": {"overhead": {"kind": "deterministic", "value_ms": 1.0}},
        "preprocess": {"service": {"kind": "deterministic", "value_ms": 0.4}, "cpu_workers": 1},
        "batching": batching or {"max_batch_size": 8, "max_queue_delay_ms": 2},
        "workers": {"count": 1, "instances": 1, "service_time": st},
        "cost": {"price_per_hour_usd": 1},
    }
    if loop:
        d["preprocess"]["event_loop"] = {"return_ms": 0.15, "respond_per_batch_ms": 0.2, "respond_per_request_ms": 0.1}
    return d


def _batch_ms(doc) -> np.ndarray:
    rec = simulate(Scenario.model_validate(doc)).records
    assert (rec.batch_size == 1).all()
    return rec.t_inferred - rec.t_dispatch


def test_the_event_loops_batch_is_slower_by_its_instances_idle_time(tmp_path):
    """On the loop the instance is idle from its hand-back (0.15 ms after its batch): the
    first batch after 103.4 ms idle (1.4 ms front, 2 ms window), every later one after
    100 - 0.15 - the batch before's time (factor 1 + idle / 400)."""
    got = _batch_ms(_doc(tmp_path, True, SLOPE)) - 0.15
    np.testing.assert_allclose(got[0], 6 * (1 + 103.4 / 400), atol=1e-9)
    np.testing.assert_allclose(got[1:], 6 * (1 + (99.85 - got[:-1]) / 400), atol=1e-9)
    np.testing.assert_allclose(_batch_ms(_doc(tmp_path, True, None)), 6.15, atol=1e-9)  # none: every batch alike


@pytest.mark.parametrize(
    "batching",
    [
        {"max_batch_size": 8, "max_queue_delay_ms": 2},  # the compiled batcher
        {"max_batch_size": 1, "max_queue_delay_ms": 2},  # batching off: not the FCFS recursion
    ],
)
def test_the_batchers_batch_is_slower_by_its_instances_idle_time(tmp_path, batching):
    """Without the loop the instance is idle from its batch's end: 100 ms less the batch
    before's time (with the window; batching off, dispatched 2 ms sooner, the same idle
    after the first)."""
    got = _batch_ms(_doc(tmp_path, False, SLOPE, batching))
    np.testing.assert_allclose(got[1:], 6 * (1 + (100 - got[:-1]) / 400), atol=1e-9)
    first = 101.4 + batching["max_queue_delay_ms"] * (batching["max_batch_size"] > 1)
    np.testing.assert_allclose(got[0], 6 * (1 + first / 400), atol=1e-9)


def test_simpy_workers_take_the_same_factor():
    """The SimPy schedulers' batch (workers and traffic classes): the factor at the idle
    time they pass, interpolated and flat beyond the table's ends."""
    doc = {"count": 1, "service_time": {"kind": "table", "batch_ms": {"1": 6}, "after_idle": SLOPE}}
    model = ServiceModel(Workers.model_validate(doc), 1, np.random.default_rng(0))
    assert model.finish(10.0, 1, 0.0) == pytest.approx(16.0)
    assert model.finish(10.0, 1, 100.0) == pytest.approx(10.0 + 6 * 1.25)
    assert model.finish(10.0, 1, 1e6) == pytest.approx(10.0 + 6 * 1.5)


def test_the_fit_recovers_the_factor_and_the_table():
    """Batches made with a known factor by idle time, a table and a log-normal noise: the
    fit gives the factor back within 2% in every band, and the table taken out of it."""
    rng = np.random.default_rng(7)
    n = 20000
    size = rng.integers(1, 9, n)
    idle = np.concatenate([rng.exponential(0.3, n // 2), rng.exponential(30.0, n - n // 2)])
    true = {0.0: 0.97, 5.0: 1.0, 20.0: 1.08, 60.0: 1.15}
    table = {b: 9.0 + 2.0 * b for b in range(1, 9)}
    y = np.array([table[b] for b in size]) * idle_factor(idle, true) * rng.lognormal(-0.005, 0.1, n)
    pooled = fit_table(size, y)
    fitted = fit_after_idle(idle, y / predicted_ms(pooled, size))
    assert fitted is not None
    assert len(fitted) >= 5
    base = np.mean(idle_factor(idle, true))  # the factor is relative to all batches' mean
    for x, f in fitted.items():
        inside = (idle >= x * 0.5) & (idle <= x * 1.5 + 0.2)
        expected = np.mean(idle_factor(idle[inside], true)) / base
        assert f == pytest.approx(expected, rel=0.02), (x, f, expected)
    again = fit_table(size, y / idle_factor(idle, fitted))
    for b in range(1, 9):
        assert again["batch_ms"][b] / base == pytest.approx(table[b], rel=0.02)


def test_idle_time_from_the_servers_clocks_and_overlapping_batches_refused():
    """A batch's idle time is its dispatch after the end of its slice's batch before it;
    batches that overlap (several instances) give no factor."""
    rows = pd.DataFrame(
        {
            "status": 200,
            "batch_size": [1, 1, 2, 2, 1],
            "compute_infer_us": [5000.0, 5100.0, 6000.0, 6000.0, 5000.0],
            "dispatched_at_ns": [0, 20_000_000, 30_000_000, 30_000_000, 37_000_000],
            "slice": [0, 0, 0, 0, 1],
        }
    )
    b = batches_from_requests(rows)  # one row a batch
    np.testing.assert_allclose(b["idle_ms"].to_numpy(), [np.nan, 15.0, 4.9, np.nan])  # the last: a new slice
    assert fit_after_idle(np.full(100, -3.0), np.ones(100)) is None
    assert fit_after_idle(np.full(100, 4.0), np.ones(100)) is None  # one band: nothing to tell apart


@pytest.mark.parametrize(("value", "needle"), BAD_FACTOR_TABLES)
def test_bad_tables_are_refused_naming_the_field(value, needle):
    msg = factor_table_refusal("after_idle", value)
    assert "after_idle" in msg
    assert needle in msg


def test_a_loop_job_after_the_loop_slept_is_slower(tmp_path):
    """``preprocess.event_loop.after_idle``: each job's time × the factor at the loop's idle
    time with work before it. An admission waits for nothing (1 ms of network first) and
    finds the loop idle since the last response; the hand-back comes 8 ms after the
    admission (the window's timer in between does no work), and the responses right after
    it (idle 0: factor 1). The loop has slept since ever before its first job (the
    table's last factor)."""
    doc = _doc(tmp_path, True, None)
    doc["preprocess"]["event_loop"]["after_idle"] = SLOPE
    rec = simulate(Scenario.model_validate(doc)).records
    slept = rec.arrival[1:] + 1.0 - rec.t_response[:-1]
    np.testing.assert_allclose(rec.t_preprocessed[1:] - rec.arrival[1:], 1.0 + 0.4 * (1 + slept / 400), atol=1e-9)
    assert rec.t_preprocessed[0] - rec.arrival[0] == pytest.approx(1.0 + 0.4 * 1.5)
    np.testing.assert_allclose(rec.t_dispatch - rec.t_preprocessed, 2.0, atol=1e-9)
    np.testing.assert_allclose(rec.t_inferred - rec.t_dispatch, 6.0 + 0.15 * (1 + 8 / 400), atol=1e-9)
    np.testing.assert_allclose(rec.t_response - rec.t_inferred, 0.3, atol=1e-9)


def _isolated_requests(rng, n: int, slept: np.ndarray, read_ms: np.ndarray) -> pd.DataFrame:
    """Server clocks of requests each alone on the loop: read, queued 0.1 ms later,
    computed 2 ms, answered 0.2 ms after, the next read ``slept`` ms after that answer."""
    recv = np.cumsum(slept + np.r_[0.0, read_ms[:-1] + 2.3])
    enq = recv + read_ms
    return pd.DataFrame(
        {
            "status": 200,
            "level": 1,
            "slice": 0,
            "batch_size": 1,
            "compute_infer_us": 2000.0 + rng.uniform(0, 1e-3, n),  # no two batches alike
            "received_at_ns": (recv * 1e6).astype(np.int64),
            "enqueued_at_ns": (enq * 1e6).astype(np.int64),
            "dispatched_at_ns": ((enq + 0.1) * 1e6).astype(np.int64),
            "request_us": (read_ms + 2.3) * 1e3,
        }
    )


def test_the_loops_factor_is_recovered_and_keeps_the_light_level_as_fitted():
    """Reads made 0.5 ms × g(slept) × noise: the loop's idle times come back from the
    clocks, the fitted factors follow g from band to band within 3%, and their mean over
    the (light) level is 1."""
    rng = np.random.default_rng(11)
    n = 6000
    slept = np.concatenate([rng.exponential(0.8, n // 2), rng.exponential(12.0, n - n // 2)]) + 0.06
    rng.shuffle(slept)
    g = 1.0 + slept / 20.0
    df = _isolated_requests(rng, n, slept, 0.5 * g * rng.lognormal(0.0, 0.03, n))
    np.testing.assert_allclose(loop_gaps_ms(df, np.full(n, 2.0))[1:], slept[1:], atol=1e-5)
    fitted = fit_loop_after_idle(df, df, np.full(n, 2.0))
    assert fitted is not None
    knots = np.array(sorted(fitted))
    got = np.array([fitted[k] for k in knots])
    np.testing.assert_allclose(got / got[0], (1 + knots / 20) / (1 + knots[0] / 20), rtol=0.03)
    assert np.mean(np.interp(slept, knots, got)) == pytest.approx(1.0, abs=1e-3)  # the first: slept since ever


def test_a_table_read_back_from_json_interpolates_as_written():
    """A profile.json gives its tables back with string keys; sorted as strings ('16.34'
    before '4.839') the interpolation read them out of order (calibrate replay's trace and
    the experiments divided the wrong factors out: up to 5% a batch on the epyc profile)."""
    table = {0.047: 0.9963, 1.962: 0.9886, 4.839: 1.006, 8.509: 1.0298, 16.34: 1.034, 32.827: 1.0602}
    back = json.loads(json.dumps(table))
    assert list(back) != sorted(back)  # the strings' order is not the numbers'
    idle = np.array([0.0, 0.5, 3.0, 6.0, 12.0, 20.0, 40.0, np.nan])
    assert np.array_equal(idle_factor(idle, back), idle_factor(idle, table))
    expected = np.interp(idle[:-1], sorted(table), [table[k] for k in sorted(table)])
    assert np.allclose(idle_factor(idle, table)[:-1], expected)
    assert idle_factor(idle, back)[-1] == 1.0
