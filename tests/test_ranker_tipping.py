"""calibrate/experiments/ranker_tipping.py and the simulated slice it reads
(calibrate.validate.slice_requests)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate.experiments import ranker_tipping
from calibrate.validate import slice_requests

RUN = Path(__file__).resolve().parent.parent / "calibrate" / "profiles" / "cpu-ranker-mget"


def test_a_simulated_slice_keeps_its_requests_after_the_warm_up_and_within_the_slice():
    profile = json.loads((RUN / "profile.json").read_text())
    at, lat = slice_requests(profile, 600.0, slice_s=2.0, warmup_s=0.25, seed=3)
    assert at.size == lat.size > 600  # ~1,050 requests in 1.75 s at 600 req/s
    assert at.min() >= 0.25
    assert at.max() < 2.0
    assert np.all(lat > 0)
    # a slower front end (its CPU times doubled) answers the same arrivals later
    _at2, lat2 = slice_requests(profile, 600.0, slice_s=2.0, warmup_s=0.25, seed=3, speed=2.0)
    assert np.median(lat2) > np.median(lat)


def test_measured_slices_read_each_slice_p99_and_its_first_second():
    rows = []
    for sl, first_ms, rest_ms in ((0, 10.0, 10.0), (1, 50.0, 400.0)):
        for k in range(400):
            t = 0.25 + k * 0.01  # 0.25 to 4.24 s
            rows.append((2, sl, t, 200, first_ms if t < 1.25 else rest_ms, False))
        rows.append((2, sl, 0.1, 200, 999.0, True))  # warm-up: left out
        rows.append((2, sl, 0.5, 503, 999.0, False))  # failed: left out
    req = pd.DataFrame(rows, columns=["level", "slice", "scheduled_s", "status", "latency_ms", "warmup"])
    m = ranker_tipping.measured_slices(req, 0.25).set_index("slice")
    assert m.loc[0, "first"] == 10.0
    assert m.loc[0, "p99"] == 10.0
    assert m.loc[1, "first"] == 50.0
    assert m.loc[1, "p99"] == 400.0
    assert ranker_tipping.shares(m["p99"].to_numpy(), m["first"].to_numpy()) == [0.5, 0.5, 0.5]


def test_parts_split_the_requests_by_whether_their_slice_tipped():
    rows = []
    for sl, lat in ((0, 10.0), (1, 300.0)):
        for k in range(50):
            rows.append((4, sl, 0.3 + k * 0.05, 200, lat, False, 1000 * lat / 2, 1000.0, 2000.0, 1000 * (lat - 1), 3))
    cols = ["level", "slice", "scheduled_s", "status", "latency_ms", "warmup"]
    cols += ["feature_us", "queue_us", "handoff_us", "request_us", "batch_size"]
    req = pd.DataFrame(rows, columns=cols)
    slices = pd.DataFrame(
        {"slice": [0, 1, 1], "kept": [True, False, True], "requests": [50, 50, 50], "frontend_gc_s": [0.005, 9.0, 0.01]}
    )
    out = ranker_tipping.parts(req, slices, 4)
    calm, tipped = out.loc[(4, False)], out.loc[(4, True)]
    assert calm["fetch"] == 5.0
    assert tipped["fetch"] == 150.0
    assert calm["batch queue"] == 1.0
    assert calm["hand-off"] == 2.0
    assert calm["outside the server"] == 1.0
    assert tipped["outside the server"] == 1.0
    assert calm["gc a request"] == pytest.approx(0.1)
    assert tipped["gc a request"] == pytest.approx(0.2)
    assert calm["slices"] == 1
    assert tipped["slices"] == 1
