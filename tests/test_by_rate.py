"""A busy instance runs its batches faster (``service_time.by_rate``): the factor by the
instance's recent throughput, by formula on each scheduler, the same whole or in chunks,
its fit recovered, bad tables refused."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate.idle import LEVEL_POINTS, LEVEL_REACH, fit_by_level, fit_by_rate, rate_factor_at, recent_rate
from simulator.engine import simulate
from simulator.scenario.config import Scenario, Workers
from simulator.scenario.loader import ScenarioError, load_scenario
from simulator.serving.workers import ServiceModel
from tests.helpers import BAD_FACTOR_TABLES, chunked_against_plain, factor_table_refusal
from tests.test_after_idle import _doc as idle_doc

SLOPE = {"0": 1.5, "20": 1.0}  # factor 1.5 - rate / 40 (requests/s), 1 from 20 req/s on
TAU = 100.0
MMC = Path(__file__).resolve().parent.parent / "scenarios/validation/mmc.yaml"


def _doc(tmp_path, loop: bool, by_rate: dict | None, batching: dict | None = None) -> dict:
    """test_after_idle's scenario (requests 100 ms apart, batches of one), with ``by_rate``."""
    d = idle_doc(tmp_path, loop, None, batching)
    if by_rate is not None:
        d["workers"]["service_time"] |= {"by_rate": by_rate, "rate_window_ms": TAU}
    return d


def _expected(n: int, gap_ms: float) -> np.ndarray:
    """Batches of one ``gap_ms`` apart: before the k-th, the average of the k before it,
    each 1 / TAU a ms when it went, decayed since; the factor at that rate (req/s)."""
    rate = np.array([sum(math.exp(-(k - i) * gap_ms / TAU) for i in range(k)) / TAU * 1000 for k in range(n)])
    return np.interp(rate, [0.0, 20.0], [1.5, 1.0])


@pytest.mark.parametrize(
    ("loop", "batching"),
    [
        (True, None),  # the event loop's dispatch
        (False, {"max_batch_size": 8, "max_queue_delay_ms": 2}),  # the compiled batcher
        (False, {"max_batch_size": 1, "max_queue_delay_ms": 2}),  # batching off: not the FCFS recursion
        (False, {"max_batch_size": 8, "max_queue_delay_ms": 2, "deadline_ms": 500}),  # the SimPy scheduler
    ],
)
def test_a_batch_is_faster_by_its_instances_recent_throughput(tmp_path, loop, batching):
    """Requests 100 ms apart, each a batch of one dispatched 100 ms after the one before:
    the first at factor 1.5 (nothing before it), then 1.5 - rate / 40 at the decayed
    average (3.68 req/s before the second, 5.82 in the steady state)."""
    rec = simulate(Scenario.model_validate(_doc(tmp_path, loop, SLOPE, batching))).records
    assert (rec.batch_size == 1).all()
    got = rec.t_inferred - rec.t_dispatch - (0.15 if loop else 0.0)
    np.testing.assert_allclose(got, 6 * _expected(len(got), 100.0), atol=1e-9)
    assert got[-1] == pytest.approx(6 * (1.5 - 1000 * math.exp(-1) / (1 - math.exp(-1)) / TAU / 40), abs=1e-9)
    plain = simulate(Scenario.model_validate(_doc(tmp_path, loop, None, batching))).records
    np.testing.assert_allclose(plain.t_inferred - plain.t_dispatch, 6.0 + (0.15 if loop else 0.0), atol=1e-9)


def test_simpy_workers_keep_each_instances_throughput():
    """The SimPy schedulers' batch: each instance's own average, flat beyond the table."""
    doc = {"count": 1, "service_time": {"kind": "table", "batch_ms": {"1": 6}, "by_rate": SLOPE, "rate_window_ms": 100}}
    model = ServiceModel(Workers.model_validate(doc), 8, np.random.default_rng(0))
    assert model.finish(10.0, 1, 0.0, inst=0) == pytest.approx(10.0 + 6 * 1.5)  # nothing before it
    assert model.finish(10.0, 1, 0.0, inst=1) == pytest.approx(10.0 + 6 * 1.5)  # another instance
    # instance 0: one request 100 ms before, 10 req/s then, decayed by e
    assert model.finish(110.0, 1, 0.0, inst=0) == pytest.approx(110.0 + 6 * (1.5 - 10 / math.e / 40))
    model.finish(111.0, 8, 0.0, inst=0)
    assert model.finish(112.0, 1, 0.0, inst=0) == pytest.approx(112.0 + 6 * 1.0)  # past 20 req/s: flat


def test_a_run_cut_in_chunks_is_the_whole_run(tmp_path):
    """A busy scenario on the event loop, random gaps: the instances' averages carry
    across chunks, so every response is the whole run's; and the table moves the batches
    against the same run without it: about 125 req/s an instance, past the 1.0 at 50, so
    the table's batches are shorter (the first, from none, are longer)."""
    took, plain = chunked_against_plain(tmp_path, _doc(tmp_path, True, {"0": 1.3, "50": 1.0, "300": 0.9}), "by_rate")
    assert np.nanmean(took) < np.nanmean(plain)


def test_the_fit_recovers_the_factor():
    """Batches timed with a known factor by throughput and a log-normal noise: the fit gives
    each band's mean factor back within 2%, relative to all batches' mean."""
    rng = np.random.default_rng(11)
    starts = np.cumsum(np.concatenate([rng.exponential(40.0, 3000), rng.exponential(4.0, 6000)]))
    sizes = rng.integers(1, 4, len(starts))
    rate = recent_rate(starts, sizes, 500.0)
    true = {0.0: 1.12, 150.0: 1.0, 600.0: 0.95}
    r = rate_factor_at(rate, true) * rng.lognormal(-0.005, 0.1, len(starts))
    fitted = fit_by_rate(rate, r)
    assert fitted is not None
    assert len(fitted) >= 4
    factor = rate_factor_at(rate, true)
    edges = np.quantile(rate, np.linspace(0, 1, 9))  # eight bands of equal counts
    band = np.clip(np.searchsorted(edges, rate, side="right") - 1, 0, 7)
    expected = {round(float(np.median(rate[band == k])), 3): factor[band == k].mean() / factor.mean() for k in range(8)}
    assert set(fitted) == set(expected)
    for x, f in fitted.items():
        assert f == pytest.approx(expected[x], rel=0.02), (x, f, expected[x])
    assert fitted[min(fitted)] > 1.05  # slow when quiet
    assert fitted[max(fitted)] < 0.97  # fast when busy
    assert fit_by_rate(np.full(100, 5.0), np.ones(100)) is None  # one band: nothing to tell apart


def test_the_level_line_reads_the_levels_speed_not_the_spread_within_them():
    """Three levels whose speed is a line in their rate, and within each a throughput that
    a fast spell raises (the host's speed moves it, not the other way): the line through
    the levels gives each level's factor back within 1% and carries it past them, where
    the bands read the within-level spread into a steeper slope."""
    rng = np.random.default_rng(5)
    levels, rates = np.repeat([0, 1, 2], 4000), np.repeat([100.0, 200.0, 300.0], 4000)
    line = 1.1 - rates / 2000  # 1.05, 1.0, 0.95
    spell = rng.normal(0.0, 0.05, len(rates))  # the host's speed, in log
    seen = rates * np.exp(-spell)  # a fast spell takes more requests into batches
    r = line * np.exp(spell - 0.05**2 / 2) * rng.lognormal(-0.005, 0.1, len(rates))
    fitted = fit_by_level(seen, r, levels)
    assert fitted is not None
    assert len(fitted) == LEVEL_POINTS
    mean_seen = np.array([seen[levels == k].mean() for k in range(3)])
    got = rate_factor_at(mean_seen, fitted)
    want = np.array([1.05, 1.0, 0.95]) / line.mean()
    np.testing.assert_allclose(got, want, rtol=0.01)
    knots = sorted(fitted)
    assert knots[0] == pytest.approx(LEVEL_REACH[0] * mean_seen.min(), rel=1e-3)
    assert knots[-1] == pytest.approx(LEVEL_REACH[1] * mean_seen.max(), rel=1e-3)
    assert fitted[knots[0]] > fitted[knots[-1]]
    bands = fit_by_rate(seen, r)  # the bands, for contrast: steeper than the line
    assert bands is not None
    band_slope = np.polyfit(list(bands), list(bands.values()), 1)[0]
    assert band_slope < 1.05 * np.polyfit(mean_seen, got, 1)[0]
    assert fit_by_level(seen, r, np.zeros(len(r))) is None  # one level: nothing to draw a line through


@pytest.mark.parametrize(("value", "needle"), BAD_FACTOR_TABLES)
def test_bad_tables_are_refused_naming_the_field(value, needle):
    msg = factor_table_refusal("by_rate", value)
    assert "by_rate" in msg
    assert needle in msg


def test_a_window_that_cannot_average_is_refused():
    with pytest.raises(ScenarioError, match="rate_window_ms"):
        load_scenario(
            MMC, ["workers.service_time={kind: table, batch_ms: {1: 5}, by_rate: {0: 1.1, 9: 1}, rate_window_ms: 0}"]
        )


@pytest.mark.parametrize("factor", ["by_rate", "after_idle"])
def test_the_replays_speed_trace_divides_out_the_factors_the_model_applies_on_top(factor):
    """`calibrate replay --modes windowed` runs a slice at its batches' speed per window; the
    simulation multiplies the fitted factors on top, so the trace holds the speed without
    them: a flat table of 1.25 gives every window 1 / 1.25 of the trace without it (each
    batch placed in its window by the time it took, not the time less the factor)."""
    import json

    import pandas as pd

    from calibrate.replay import window_trace

    run = Path(__file__).resolve().parent.parent / "calibrate/profiles/cpu-resnet64-epyc"
    profile = json.loads((run / "profile.json").read_text())
    requests = pd.read_csv(run / "measurements.csv.gz")
    g = requests[requests["slice"] == requests["slice"].iloc[0]]
    bare = copy.deepcopy(profile)
    for k in ("by_rate", "after_idle"):
        bare["service_time"].pop(k)
    flat = copy.deepcopy(bare)
    flat["service_time"][factor] = {"1": 1.25, "500": 1.25}
    without = np.array(window_trace(bare, g, 4.0, 0.25)["factors"])
    with_factor = np.array(window_trace(flat, g, 4.0, 0.25)["factors"])
    assert len(without) == 16
    # a slice's first batch has no idle time before it on the server's clock (no factor)
    first = 1 if factor == "after_idle" else 0
    np.testing.assert_allclose(with_factor[first:], without[first:] / 1.25, rtol=1e-4)


@pytest.mark.parametrize(
    ("loop", "batching"),
    [
        (True, None),  # the event loop's dispatch
        (False, {"max_batch_size": 8, "max_queue_delay_ms": 2}),  # the compiled batcher
        (False, {"max_batch_size": 8, "max_queue_delay_ms": 2, "deadline_ms": 500}),  # the SimPy scheduler
    ],
)
def test_a_run_can_start_where_a_busy_spell_left_the_instance(tmp_path, loop, batching):
    """``rate_initial_rps``: the instance's average as of time 0, as if it had run at that
    rate before. The batches of test_a_batch_is_faster_by_its_instances_recent_throughput
    from 30 req/s: the first at the factor of 30 req/s decayed over the 101 ms to its
    dispatch (1.5 - 11 / 40), the rest at the average that carries it on; 0 is the run
    that starts idle, its first batch at 1.5."""
    doc = _doc(tmp_path, loop, SLOPE, batching)
    doc["workers"]["service_time"]["rate_initial_rps"] = 30.0
    rec = simulate(Scenario.model_validate(doc)).records
    got = rec.t_inferred - rec.t_dispatch - (0.15 if loop else 0.0)
    rate = 30.0 * np.exp(-rec.t_dispatch / TAU)  # what is left of it at each batch, and the batches before it
    rate += np.array(
        [sum(math.exp(-(t - u) / TAU) for u in rec.t_dispatch[:k]) / TAU * 1000 for k, t in enumerate(rec.t_dispatch)]
    )
    np.testing.assert_allclose(got, 6 * np.interp(rate, [0.0, 20.0], [1.5, 1.0]), atol=1e-9)
    assert got[0] == pytest.approx(6 * (1.5 - 30.0 * math.exp(-rec.t_dispatch[0] / TAU) / 40))
    idle = _doc(tmp_path, loop, SLOPE, batching)
    idle["workers"]["service_time"]["rate_initial_rps"] = 0.0
    first = simulate(Scenario.model_validate(idle)).records
    assert first.t_inferred[0] - first.t_dispatch[0] - (0.15 if loop else 0.0) == pytest.approx(6 * 1.5)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (", rate_initial_rps: 10", "give by_rate with it"),
        (", by_rate: {0: 1.1, 9: 1}, rate_initial_rps: -1", "greater than or equal to 0"),
    ],
)
def test_a_bad_initial_throughput_is_refused_naming_the_field(extra, needle):
    with pytest.raises(ScenarioError) as err:
        load_scenario(MMC, [f"workers.service_time={{kind: table, batch_ms: {{1: 5}}{extra}}}"])
    assert "rate_initial_rps" in str(err.value)
    assert needle in str(err.value)


def test_the_schedules_rate_is_averaged_as_the_throughput_is_on_the_servers_clock():
    """``scheduled_rate``: the slice's scheduled sends put on the server's clock by the
    median offset of receipt (here 40 ms, with jitter), each 1 / tau a ms, decayed to each
    batch's dispatch; the same average :func:`recent_rate` keeps of the batches."""
    from calibrate.idle import scheduled_rate

    rng = np.random.default_rng(4)
    sent_s = np.sort(rng.uniform(0.0, 2.0, 300))
    got_ns = (sent_s + 0.040 + rng.uniform(-1e-4, 1e-4, 300)) * 1e9
    went_ns = got_ns + 3e6  # each dispatched 3 ms after it arrived, alone
    df = pd.DataFrame({"slice": 0, "scheduled_s": sent_s, "received_at_ns": got_ns, "dispatched_at_ns": went_ns})
    got = scheduled_rate(df, TAU)
    on_server_ms = sent_s * 1e3 + np.median(got_ns / 1e6 - sent_s * 1e3)
    expected = [
        sum(math.exp(-(t - u) / TAU) for u in on_server_ms[on_server_ms < t]) / TAU * 1000 for t in went_ns / 1e6
    ]
    np.testing.assert_allclose(got, expected, rtol=1e-9)
    assert scheduled_rate(df.drop(columns="received_at_ns")) is None


def test_bands_of_the_schedule_keep_what_the_load_does_not_what_a_fast_spell_does():
    """A true factor of 1.2 − rate / 1000 (rate in req/s); a fast spell (its own log speed)
    also raises the throughput the instance shows. Banded by the throughput, the table
    falls steeper than the truth (the spells read as load); banded by the schedule's rate,
    which the spell cannot move, it follows the truth."""
    rng = np.random.default_rng(8)
    n = 40_000
    sched = rng.choice([100.0, 200.0, 300.0], n) + rng.normal(0, 15, n)  # the schedule's recent rate
    spell = rng.normal(0, 0.05, n)  # the host's own log speed: negative is fast
    rate = sched - 600 * spell + rng.normal(0, 5, n)  # a fast spell clears a backlog: more throughput
    ratio = (1.2 - rate / 1000.0) * np.exp(spell)
    truth = lambda x: (1.2 - np.asarray(x) / 1000.0) / np.mean(1.2 - rate / 1000.0)  # noqa: E731
    plain = fit_by_rate(rate, ratio)
    banded = fit_by_rate(rate, ratio, instrument=sched)
    err = lambda t: np.mean([abs(f - truth(x)) for x, f in t.items()])  # noqa: E731
    assert err(banded) < 0.01
    assert err(plain) > 2 * err(banded)
    lo, hi = min(plain), max(plain)
    assert plain[lo] - plain[hi] > 1.3 * (truth(lo) - truth(hi))  # steeper than the truth
