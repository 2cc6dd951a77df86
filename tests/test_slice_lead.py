"""A calibration's slice follows another level's (the rounds interleave the levels), and
the validation simulates it so: the instance comes to the slice busy, its recent
throughput (``by_rate``) where the slice before left it, not idle since the level's own
last slice (calibrate/README, "A slice comes after another")."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate import idle
from calibrate.interval import LEAD_IN_S, SliceDesign, design_run, lead_in
from calibrate.validate import follows

EPYC = Path(__file__).resolve().parent.parent / "calibrate/profiles/cpu-resnet64-epyc/profile.json"


def test_each_slice_is_led_in_by_another_level_then_the_gap():
    """Three slices of 4 s, 24 s apart: each after 1.5 s at one of the other levels' rates
    and 0.17 s without arrivals; without other levels, the slices alone from 0."""
    d = SliceDesign(3, 4.0, 0.25, 24.0, lead_rates=(100.0, 200.0), lead_gap_s=0.17)
    t0, steps = lead_in(d, 300.0, seed=5)
    assert t0 == pytest.approx(LEAD_IN_S + 0.17)
    for j in range(3):
        lead, quiet, on, off = steps[4 * j : 4 * j + 4]
        start = t0 + j * 28.0
        assert lead["at_s"] == pytest.approx(start - t0)
        assert lead["rate_rps"] in (100.0, 200.0)
        assert quiet == {"at_s": pytest.approx(start - 0.17), "rate_rps": 0.0}
        assert on == {"at_s": pytest.approx(start), "rate_rps": 300.0}
        assert off == {"at_s": pytest.approx(start + 4.0), "rate_rps": 0.0}
    assert lead_in(d, 300.0, seed=5) == (t0, steps)  # the draws follow the seed
    bare = lead_in(d._replace(lead_rates=()), 300.0, seed=5)
    assert bare == (
        0.0,
        [
            s
            for j in range(3)
            for s in ({"at_s": j * 28.0, "rate_rps": 300.0}, {"at_s": j * 28.0 + 4.0, "rate_rps": 0.0})
        ],
    )


def test_follows_reads_the_other_levels_and_the_measured_gap():
    profile = {"levels_rps": [72.0, 108.0, 180.0], "design": {"slice_gap_ms": 170.0}}
    got = follows(profile, SliceDesign(10, 4.0, 0.25, 24.0), 108.0)
    assert got.lead_rates == (72.0, 180.0)
    assert got.lead_gap_s == pytest.approx(0.17)
    older = follows({"levels_rps": [72.0, 108.0]}, SliceDesign(10, 4.0, 0.25, 24.0), 108.0)
    assert older.lead_rates == ()
    assert older.lead_gap_s == 0.0


def test_a_slice_after_a_busy_one_starts_at_the_busy_speed():
    """The committed EPYC profile, its ``by_rate`` made strong (1.3 at no throughput, 1.0
    past 200 req/s), at 300 req/s: after 1.5 s at 300 req/s the slice's batches start at
    the busy factor; led in by nothing they start at 1.3, and its first second's requests
    wait longer. The lead-in's own requests are not measured."""
    profile = json.loads(EPYC.read_text())
    profile["service_time"] |= {"by_rate": {"0": 1.3, "200": 1.0}, "rate_window_ms": 500.0}
    d = SliceDesign(1, 4.0, 0.0, 24.0, lead_rates=(300.0,), lead_gap_s=0.17)
    rec, kept = design_run(profile, 300.0, d, seed=1)
    bare, kept_bare = design_run(profile, 300.0, d._replace(lead_rates=()), seed=1)
    t0 = LEAD_IN_S + 0.17
    early = kept & (rec.arrival / 1000.0 < t0 + 1.0) & rec.completed
    early_bare = kept_bare & (bare.arrival / 1000.0 < 1.0) & bare.completed
    assert early.sum() > 200
    assert early_bare.sum() > 200
    assert np.median((rec.t_response - rec.arrival)[early]) < 0.8 * np.median(
        (bare.t_response - bare.arrival)[early_bare]
    )
    assert not kept[rec.arrival / 1000.0 < t0].any()
    assert kept.sum() == pytest.approx(kept_bare.sum(), rel=0.1)  # the same slice measured


def test_the_slices_start_where_the_run_left_the_instance():
    """Two slices, the second 170 ms after the first ended: its first batch's recent
    throughput is the average carried over the first slice and the gap, as one run;
    the gap between slices is read off the dispatch clock."""
    rng = np.random.default_rng(2)
    a = np.cumsum(rng.exponential(5.0, 400))
    b = a[-1] + 170.0 + np.r_[0.0, np.cumsum(rng.exponential(5.0, 399))]
    start = np.r_[a, b]
    size = rng.integers(1, 4, len(start)).astype(float)
    df = pd.DataFrame(
        {
            "slice": np.r_[np.zeros(len(a), int), np.ones(len(b), int)],
            "dispatched_at_ns": start * 1e6,
            "batch_size": size,
        }
    )
    whole = idle.recent_rate(start, size, 500.0)
    got = idle.slice_start_rates(df, 500.0)
    assert got[0] == 0.0
    assert got[1] == pytest.approx(whole[len(a)])
    assert got[1] > 0.5 * whole[len(a) - 1]
    assert idle.slice_gap_ms(df) == pytest.approx(170.0)
    # the fit's rates from a slice's own start rate carry on as the whole run's
    rate, _ = idle.rate_before(df, 500.0, initial=got)
    np.testing.assert_allclose(rate, whole)


def test_the_fit_can_carry_the_throughput_over_the_held_out_slices(monkeypatch):
    """``calibrate.fit.start_rates`` reads every level's batches (the held-out ones' sizes
    as the instance served them), so a fitted level's later slice starts where the slice
    before, held out, left the instance; with the default (from none) it gives nothing."""
    from calibrate.fit import start_rates, with_rates

    rng = np.random.default_rng(5)
    starts, t = [], 0.0
    for n, mean_ms in ((300, 8.0), (300, 3.0), (300, 8.0)):
        s = t + np.r_[0.0, np.cumsum(rng.exponential(mean_ms, n - 1))]
        starts.append(s)
        t = s[-1] + 150.0
    start = np.concatenate(starts)
    size = rng.integers(1, 4, len(start)).astype(float)
    df = pd.DataFrame(
        {
            "slice": np.repeat([0, 1, 2], 300),
            "level": np.repeat([1, 2, 1], 300),
            "status": 200,
            "dispatched_at_ns": start * 1e6,
            "batch_size": size,
        }
    )
    fitted = df[df["level"] == 1]
    assert start_rates(df) is None
    monkeypatch.setattr(idle, "RATE_START", "carried")
    got = with_rates(fitted, start_rates(df))
    whole = idle.recent_rate(start, size, idle.RATE_WINDOW_MS)
    np.testing.assert_allclose(got["rate_rps"].to_numpy(), whole[df["level"].to_numpy() == 1])
    # the busy held-out slice is in the third slice's first rate; from none it would be 0
    assert got["rate_rps"].to_numpy()[300] > 300.0
