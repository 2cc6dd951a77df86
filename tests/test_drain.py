"""calibrate.drain: the loop's work by the requests held, fitted to how fast the server drains
a backlog in the calibration's own slices."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate import drain

PROFILES = Path(__file__).resolve().parent.parent / "calibrate" / "profiles"


def test_the_bins_count_what_is_held_at_their_start_and_what_they_answer():
    """Three requests: at 0.00 s (answered at 0.25), 0.05 s (at 0.12) and 0.15 s (never):
    from 0.1 s, the first bin starts with two held and answers one (0.12); the second starts
    with two held (three arrived, one answered) and answers one (0.25)."""
    at = np.array([0.0, 0.05, 0.15])
    done = np.array([0.25, 0.12, np.inf])
    held, rate = drain.rates_by_held(at, done, 0.1, 0.3)
    assert held.tolist() == [2, 2]
    assert rate.tolist() == pytest.approx([1 / drain.BIN_S, 1 / drain.BIN_S])


def test_the_factor_is_at_least_one_and_never_falls_with_the_count():
    assert drain.monotone({2: 0.97, 6: 1.1, 12: 1.05, 24: 1.3}) == {2: 1.0, 6: 1.1, 12: 1.1, 24: 1.3}


def test_the_ratio_pools_levels_by_their_bins_and_leaves_out_thin_ones():
    """At 6 held the model answers 10% faster than the server at one level (20 bins a side)
    and 30% at another (10 and 40 bins: weighted by the fewer, 10), the bins alike, so the
    step is the ratio; at 12 held there are too few measured bins to say; at 24, the model
    is 2% faster but the bins spread too widely to tell (step 1)."""

    def bins(level, held, rates):
        return pd.DataFrame({"level": level, "held": held, "rate": rates})

    spread = np.tile([50.0, 150.0], 10)
    server = pd.concat([bins(0, 5, [100.0] * 20), bins(1, 7, [100.0] * 10), bins(1, 12, [100.0] * 3)])
    server = pd.concat([server, bins(0, 30, spread)])
    model = pd.concat([bins(0, 4, [110.0] * 20), bins(1, 6, [130.0] * 40), bins(1, 13, [200.0] * 30)])
    model = pd.concat([model, bins(0, 20, spread * 1.02)])
    t = drain.ratios(model, server)
    assert t.index.tolist() == [6, 24]
    pooled = np.exp((20 * np.log(1.1) + 10 * np.log(1.3)) / 30)
    assert t.loc[6, "ratio"] == pytest.approx(pooled)
    assert t.loc[6, "step"] == pytest.approx(pooled)
    assert t.loc[6, "bins"] == 30
    assert t.loc[24, "ratio"] == pytest.approx(1.02)
    assert t.loc[24, "step"] == 1.0


def test_a_profile_whose_loop_is_not_the_stores_is_left_as_it_was():
    """The ResNet's front end (no feature store on its loop): nothing fitted, nothing changed."""
    profile = json.loads((PROFILES / "cpu-resnet64" / "profile.json").read_text())
    before = copy.deepcopy(profile)
    assert drain.fit(profile, pd.DataFrame(), [f["level"] for f in profile["fit_levels"]]) is None
    assert profile == before


def test_a_model_that_drains_slower_than_the_server_leaves_the_loop_as_fitted(monkeypatch):
    """The factor never goes below 1: where the model answers a backlog at half the server's
    rate, the fit moves nothing, stops after one round and keeps the loop as fitted (the
    closed loop's share per request held with it)."""
    profile = json.loads((PROFILES / "cpu-ranker-mget" / "profile.json").read_text())
    before = copy.deepcopy(profile["frontend"]["event_loop"])

    def bins(rate):
        return pd.DataFrame({"level": 3, "held": np.repeat([2, 50], 20), "rate": np.repeat([300.0, rate], 20)})

    monkeypatch.setattr(drain, "measured", lambda *args: bins(400.0))
    monkeypatch.setattr(drain, "simulated", lambda *args, **kwargs: bins(200.0))
    assert drain.fit(profile, pd.DataFrame(), [3]) is None
    loop = profile["frontend"]["event_loop"]
    record = loop.pop("drain_fit")
    assert loop == before
    assert record["cost_by_held"] is None
    assert len(record["ratios_by_round"]) == 1
    assert record["ratios_by_round"][0]["48"][0] == pytest.approx(0.5)


def _made(profile: dict, levels: list[int], slices: int) -> pd.DataFrame:
    """Requests of ``slices`` slices of each level simulated from ``profile``, as a
    calibration's measurements record them (other seeds than the fit's)."""
    from calibrate.validate import design

    slice_s, warmup_s = design(pd.DataFrame(), profile)
    rows = []
    for level in levels:
        rate = float(profile["levels_rps"][level])
        for k in range(slices):
            at, done = drain.simulated_slice(profile, rate, slice_s=slice_s, warmup_s=warmup_s, seed=500 + k)
            answered = np.isfinite(done)
            rows.append(
                pd.DataFrame(
                    {
                        "level": level,
                        "slice": level * 1000 + k,
                        "scheduled_s": at,
                        "latency_ms": np.where(answered, (done - at) * 1e3, np.nan),
                        "status": np.where(answered, 200, -1),
                    }
                )
            )
    return pd.concat(rows, ignore_index=True)


@pytest.mark.slow
def test_a_factor_the_model_was_made_with_is_fitted_back(monkeypatch):
    """The committed MGET ranker (its fitted levels at 60% and 80%): requests its model
    makes with the loop 25% slower from 12 held are fitted back to a factor within 0.08 of
    that at 24 held and of none at 2; the model's own requests leave the loop as fitted."""
    monkeypatch.setattr(drain, "SLICES", 30)
    profile = json.loads((PROFILES / "cpu-ranker-mget" / "profile.json").read_text())
    levels = [f["level"] for f in profile["fit_levels"] if f["load"] >= 0.6]
    made = copy.deepcopy(profile)
    loop = made["frontend"]["event_loop"]
    loop.pop("cost_per_in_flight", None)
    loop["cost_by_held"] = {2: 1.0, 6: 1.0, 12: 1.25, 24: 1.25}
    got = copy.deepcopy(profile)
    assert drain.fit(got, _made(made, levels, 30), levels) is not None
    factor = got["frontend"]["event_loop"]["cost_by_held"]
    assert factor[2] == pytest.approx(1.0, abs=0.06)
    assert factor[24] == pytest.approx(1.25, abs=0.08)
    assert "cost_per_in_flight" not in got["frontend"]["event_loop"]
    same = copy.deepcopy(profile)
    same["frontend"]["event_loop"].pop("cost_per_in_flight", None)
    plain = _made(same, levels, 30)
    share = profile["frontend"]["event_loop"]["cost_per_in_flight"]
    assert drain.fit(profile, plain, levels) is None  # nothing told apart: the loop as fitted
    assert profile["frontend"]["event_loop"]["cost_per_in_flight"] == share
    assert "cost_by_held" not in profile["frontend"]["event_loop"]
    assert profile["frontend"]["event_loop"]["drain_fit"]["cost_by_held"] is None
