"""calibrate/cycle.py with the simulator as its own truth: requests lined up against their
batches by the clocks a run's server reports. A batcher fed arrivals that ignore its batches
keeps its rule, sees them uniform over the batch, and its replay gives back its own waits."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from scipy import stats

from calibrate.cycle import PHASE_BINS, batches, clocked, cycle, phase_counts, rule_check
from calibrate.scenario import scenario_dict
from simulator.engine import simulate
from simulator.scenario.config import Scenario

PROFILE = Path(__file__).parents[1] / "calibrate" / "profiles" / "cpu-resnet64" / "profile.json"


def _measured(profile: dict, rate: float, slices: int, slice_s: float, seed: int) -> pd.DataFrame:
    """A run of the profile's model (its batch time per size exact, no platform speed) as a
    calibration's measurements: one level, ``slices`` slices, the server's clocks in ns."""
    rows = []
    for k in range(slices):
        doc = scenario_dict(profile, rate, duration_s=slice_s, warmup_s=0.0, seed=seed + k)
        doc.pop("platform", None)
        doc["workers"]["service_time"].pop("noise_ratios", None)
        rec = simulate(Scenario.model_validate(doc)).records
        done = rec.completed
        t0 = 1e6 * 1000.0 * (k + 1)  # each slice far from the others on the host's clock
        rows.append(
            pd.DataFrame(
                {
                    "status": 200,
                    "level": 0,
                    "slice": k,
                    "offered_rps": rate,
                    "warmup": rec.arrival[done] < 250.0,
                    "batch_size": rec.batch_size[done],
                    "compute_infer_us": (rec.t_inferred - rec.t_dispatch)[done] * 1e3,
                    "received_at_ns": t0 + rec.arrival[done] * 1e6,
                    "enqueued_at_ns": t0 + rec.t_preprocessed[done] * 1e6,
                    "dispatched_at_ns": t0 + rec.t_dispatch[done] * 1e6,
                }
            )
        )
    return pd.concat(rows, ignore_index=True)


@pytest.fixture(scope="module")
def profile() -> dict:
    return json.loads(PROFILE.read_text())


def test_the_replay_gives_back_the_models_own_waits(profile):
    measured = _measured(profile, 0.3 * profile["capacity_rps"], slices=4, slice_s=4.0, seed=1)
    row = cycle(measured, profile).iloc[0]
    # the same arrivals, the same batch time per size, the same batcher: the same dispatches
    assert row.replayed_wait_mean_ms == pytest.approx(row.measured_wait_mean_ms, rel=1e-6)
    assert row.replayed_wait_median_ms == pytest.approx(row.measured_wait_median_ms, rel=1e-6)
    assert row.early_share == 0.0
    assert abs(row.window_late_median_ms) < 1e-6
    shares = [row[c] for c in row.index if c.startswith("share: ")]
    assert sum(shares) == pytest.approx(1.0)


def test_arrivals_that_ignore_the_batches_are_uniform_over_them(profile):
    measured = _measured(profile, 0.5 * profile["capacity_rps"], slices=3, slice_s=6.0, seed=7)
    counts = sum(phase_counts(s, batches(s)) for _, s in clocked(measured).groupby("slice"))
    assert stats.chisquare(counts).pvalue > 1e-3, counts
    assert len(counts) == PHASE_BINS


def test_a_batch_before_its_window_is_counted():
    b = pd.DataFrame(
        {"disp_ms": [10.0, 30.0], "end_ms": [20.0, 40.0], "size": [1, 1], "oldest_ms": [8.0, 28.5]}
    ).assign(prev_end_ms=lambda d: d["end_ms"].shift(1))
    out = rule_check(b, window_ms=2.0, max_batch_size=8)
    assert out["early_share"] == 0.5  # the second went 0.5 ms before its window
    assert out["window_late_median_ms"] == pytest.approx(-0.25)


def test_a_run_without_the_clocks_is_refused(profile):
    with pytest.raises(ValueError, match="enqueued_at_ns"):
        cycle(pd.DataFrame({"status": [200], "batch_size": [1]}), profile)


def test_the_command_refuses_a_run_without_clocks_in_one_line():
    from typer.testing import CliRunner

    from servesim.cli import app

    result = CliRunner().invoke(app, ["calibrate", "cycle", str(PROFILE.parent)])
    assert result.exit_code == 2
    assert "enqueued_at_ns" in result.output
    assert "Traceback" not in result.output


def test_a_window_the_server_closes_late_is_fitted_and_kept_by_the_scenario(profile):
    """A server whose 2 ms window closes 0.4 ms late (its timers): the fit reads the
    lateness off the window-bound batches of the lightest fitted level, and the scenario
    it writes waits that long; on time, the fit finds none."""
    from calibrate.cycle import fit_window

    window = profile["server"]["max_queue_delay_ms"]
    late = dict(profile, server={**profile["server"], "max_queue_delay_ms": window + 0.4})
    measured = _measured(late, 0.2 * profile["capacity_rps"], slices=3, slice_s=4.0, seed=3)
    fit = fit_window(measured, [0], window, profile["server"]["max_batch_size"])
    assert fit["late_ms"] == pytest.approx(0.4, abs=1e-6)
    assert fit["batches"] > 100
    doc = scenario_dict({**profile, "window": fit}, 100.0, duration_s=1.0, warmup_s=0.0)
    assert doc["batching"]["max_queue_delay_ms"] == pytest.approx(window + 0.4)
    on_time = _measured(profile, 0.2 * profile["capacity_rps"], slices=3, slice_s=4.0, seed=3)
    assert fit_window(on_time, [0], window, profile["server"]["max_batch_size"])["late_ms"] == pytest.approx(0.0)
    assert fit_window(on_time.drop(columns=["dispatched_at_ns"]), [0], window, 8) is None


def test_the_resumption_is_read_off_back_to_back_queue_arrivals():
    """Replies that come back together queue their requests 0.018 ms apart (the loop's
    time to resume each handler); clumps of one to four, 3 ms apart: the fit reads 0.018
    ms off the gaps under 0.1 ms; without clocks, or without clumps, there is none."""
    import numpy as np

    from calibrate.cycle import fit_resume

    rng = np.random.default_rng(2)
    rows, t = [], 1e9
    for _ in range(2000):
        for j in range(int(rng.integers(1, 5))):
            enq = t + j * 18_000 + rng.normal(0, 300)
            clocks = {"received_at_ns": enq - 1e6, "enqueued_at_ns": enq, "dispatched_at_ns": enq + 2e6}
            rows.append({"status": 200, "level": 1, "slice": 0, "warmup": False, "batch_size": 1, **clocks})
        t += 3e6
    df = pd.DataFrame(rows)
    assert fit_resume(df, [1, 3]) == pytest.approx(0.018, abs=0.001)
    assert fit_resume(df.drop(columns=["dispatched_at_ns"]), [1, 3]) is None
    assert fit_resume(df.iloc[::4], [1, 3]) is None  # no clumps left: fewer than 20 gaps that close


def test_the_timers_own_lateness_is_read_off_the_batches_no_arrival_closed():
    """A loop whose window timer fires an exponential 0.4 ms late (the simulator as the
    server): the batches that no request queued after their due time closed show the
    timer's draws, which the fit gives back (KS against the exponential); the windows that
    an arrival closed earlier are left out, so the mean of all lateness is lower. A loop
    profile's scenario draws the timer per window and keeps the window as configured."""
    import numpy as np

    from calibrate.cycle import fit_window

    doc = {
        "name": "late-timer", "seed": 5, "duration_s": 30, "warmup_s": 0.5,
        "sla": {"percentile": 99, "target_ms": 100}, "traffic": {"rate_rps": 400.0},
        "preprocess": {"service": {"kind": "exponential", "mean_ms": 0.05}, "cpu_workers": 1,
                       "event_loop": {"return_ms": 0.02, "timer_late": {"kind": "exponential", "mean_ms": 0.4}}},
        "batching": {"max_batch_size": 32, "max_queue_delay_ms": 2.0},
        "workers": {"count": 1, "instances": 1, "service_time": {"kind": "deterministic", "value_ms": 0.5}},
        "cost": {"price_per_hour_usd": 1},
    }  # fmt: skip
    rec = simulate(Scenario.model_validate(doc)).records
    done = rec.completed
    measured = pd.DataFrame(
        {
            "status": 200, "level": 0, "slice": 0, "offered_rps": 400.0, "warmup": rec.arrival[done] < 500.0,
            "batch_size": rec.batch_size[done], "compute_infer_us": (rec.t_inferred - rec.t_dispatch)[done] * 1e3,
            "received_at_ns": 1e12 + rec.arrival[done] * 1e6, "enqueued_at_ns": 1e12 + rec.t_preprocessed[done] * 1e6,
            "dispatched_at_ns": 1e12 + rec.t_dispatch[done] * 1e6,
        }
    )  # fmt: skip
    fit = fit_window(measured, [0], 2.0, 32)
    timer = np.asarray(fit["timer_ms"])
    assert stats.kstest(timer, "expon", args=(0, 0.4)).statistic < 0.05
    assert fit["late_ms"] < timer.mean() - 0.05  # arrivals closed some windows before their timer
    profile = {"window": fit}
    loop_doc = {"preprocess": {"event_loop": {}}}
    from calibrate.scenario import timer_late

    assert timer_late(profile, loop_doc["preprocess"]) == {"kind": "empirical", "samples_ms": fit["timer_ms"]}
    assert timer_late(profile, {"service": {}}) is None  # no loop: the window lengthened by the mean, as before
    assert timer_late({"window": {"late_ms": 0.2}}, loop_doc["preprocess"]) is None  # a profile before the timer's own


def test_the_timers_draws_stop_where_few_windows_are_left_open():
    """Windows the timer closed within 0.5 ms, a fifth closed by a request at 0.5-1.2 ms
    before the timer fired, and one timer 5 ms late (a loop stall): the Kaplan-Meier
    estimate leaves a fifth of the windows open past 1.2 ms, which the data cannot place.
    The draws give them the lateness at which 20 windows were still open (at most 1.2 ms),
    not the stall's 5 ms (the estimate's last step, which put a fifth of the draws there)."""
    import numpy as np

    from calibrate.cycle import KM_MIN_AT_RISK, _timer_quantiles

    rng = np.random.default_rng(3)
    fired = np.append(rng.uniform(0.0, 0.5, 800), 5.0)
    closed = rng.uniform(0.5, 1.2, 200)
    q = np.asarray(_timer_quantiles(fired, closed))
    assert q.max() <= np.sort(np.concatenate([fired, closed]))[-KM_MIN_AT_RISK] + 1e-4  # draws are rounded to 0.1 µs
    assert (q > 1.0).mean() == pytest.approx(0.2, abs=0.03)  # the open share, at the last well-held lateness
    km = stats.ecdf(stats.CensoredData(uncensored=fired, right=closed))
    body = np.quantile(q, [0.1, 0.3, 0.5, 0.7])
    assert km.cdf.evaluate(body) == pytest.approx([0.1, 0.3, 0.5, 0.7], abs=0.01)  # below, the estimate's own


def test_the_report_says_how_the_scenario_keeps_the_window():
    """A loop profile with the timer's draws: the scenario draws them per window and the
    report says so; without them (a profile fitted before), the window is lengthened by the
    mean lateness and the report gives its length."""
    from calibrate.report import _header

    profile = json.loads((PROFILE.parents[1] / "gpu-h200" / "profile.json").read_text())
    profile["frontend"]["servers"] = 1  # its eight front ends as one loop
    window = {"late_ms": 0.2, "late_quantiles_ms": {"5": 0.0, "50": 0.1, "95": 0.6}, "batches": 500}
    drawn = {**profile, "window": {**window, "timer_ms": [0.05, 0.1, 0.2, 0.9]}}
    doc = scenario_dict(drawn, 100.0, duration_s=1.0, warmup_s=0.0)
    assert doc["preprocess"]["event_loop"]["timer_late"]["samples_ms"] == [0.05, 0.1, 0.2, 0.9]
    assert doc["batching"]["max_queue_delay_ms"] == profile["server"]["max_queue_delay_ms"]
    assert "draws its timer's lateness per window" in " ".join(_header(drawn))
    mean_only = {**profile, "window": window}
    doc = scenario_dict(mean_only, 100.0, duration_s=1.0, warmup_s=0.0)
    assert "timer_late" not in doc["preprocess"]["event_loop"]
    assert doc["batching"]["max_queue_delay_ms"] == pytest.approx(profile["server"]["max_queue_delay_ms"] + 0.2)
    assert f"window is {profile['server']['max_queue_delay_ms'] + 0.2:.2f} ms" in " ".join(_header(mean_only))
