"""calibrate.specs.table_to: a batch table that stops short of the largest batch is carried
to it along the line fitted through every batch, not the table's last segment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.scenario import scenario_dict
from calibrate.specs import table_to

RANKER = Path(__file__).resolve().parent.parent / "calibrate" / "profiles" / "cpu-ranker-mget" / "profile.json"


def test_a_table_short_of_the_largest_batch_is_carried_to_it_along_the_line():
    """f6's table (calibrate/README): 4.92 ms at 9, 7.51 at 10; its last segment would give a
    batch of 32 64 ms, the line through every batch (0.39 ms a request) 16.1 ms."""
    st = {"kind": "table", "batch_ms": {"1": 2.0, "9": 4.92, "10": 7.51}, "noise_cv": 0.0}
    out = table_to(st, 32, 0.39)
    assert out["batch_ms"]["32"] == pytest.approx(7.51 + 0.39 * 22)
    assert {k: v for k, v in out["batch_ms"].items() if k != "32"} == st["batch_ms"]
    assert out["noise_cv"] == 0.0
    assert "32" not in st["batch_ms"]  # the profile's own table untouched
    assert table_to({"kind": "table", "batch_ms": {1: 2.0, 4: 3.0}}, 8, 0.5)["batch_ms"][8] == pytest.approx(5.0)


@pytest.mark.parametrize(
    ("st", "max_batch", "per_item"),
    [
        ({"kind": "table", "batch_ms": {"1": 2.0, "8": 9.0}}, 8, 1.0),  # it reaches the largest batch
        ({"kind": "table", "batch_ms": {"1": 2.0, "4": 5.0}}, 8, None),  # no line fitted
        ({"kind": "affine", "base_ms": 1.0, "per_item_ms": 0.5}, 8, 0.5),  # a line already
    ],
)
def test_anything_else_is_left_as_it_was(st, max_batch, per_item):
    assert table_to(st, max_batch, per_item) == st


def test_the_committed_rankers_scenario_runs_its_table_to_the_largest_batch():
    """The MGET ranker's table stops at 17 of 32; its scenario's reaches 32, by the line."""
    profile = json.loads(RANKER.read_text())
    doc = scenario_dict(profile, 500.0, duration_s=1.0, warmup_s=0.0)
    table = {int(k): v for k, v in doc["workers"]["service_time"]["batch_ms"].items()}
    assert max(table) == profile["server"]["max_batch_size"] == 32
    per_item = profile["service_time_fits"]["affine"]["per_item_ms"]
    assert table[32] - table[17] == pytest.approx(per_item * 15, rel=0.05)
