"""The timeline: exact levels, conservation of counts, and export."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from servesim.cli import app
from simulator.engine import simulate
from simulator.results.binning import binned_percentiles
from simulator.results.reduce import timeline
from simulator.results.timeline import COLUMNS, time_average_level
from tests.helpers import scenario


def test_time_average_level_matches_brute_force():
    rng = np.random.default_rng(5)
    a = rng.uniform(0, 10, 200)
    d = a + rng.exponential(1.5, 200)
    edges = np.linspace(0, 15, 16)
    fine = np.linspace(0, 15, 150_001)[:-1] + 0.5e-4  # midpoints of a 1e-4 grid
    level = ((a[:, None] <= fine) & (fine < d[:, None])).sum(axis=0)
    brute = level.reshape(15, -1).mean(axis=1)
    np.testing.assert_allclose(time_average_level(a, d, edges), brute, atol=0.02)


def test_timeline_conserves_counts_and_littles_law():
    s = scenario(
        duration_s=20.0,
        traffic={
            "rate_rps": 900,
            "shape": {"kind": "bursts", "bursts": [{"start_s": 5, "duration_s": 3, "multiplier": 3.0}]},
        },
        batching={"max_batch_size": 8, "max_queue_delay_ms": 2.0, "max_queue_size": 40},
        workers={"count": 1, "instances": 2, "service_time": {"kind": "affine", "base_ms": 3.0, "per_item_ms": 0.5}},
    )
    run = simulate(s)
    tl = timeline(run, interval_s=0.5)
    r = run.records
    dt = 0.5
    assert (tl.offered_rps * dt).sum() == pytest.approx(len(r))
    assert (tl.completed_rps * dt).sum() == pytest.approx(r.completed.sum())
    assert tl.rejected.sum() == (r.outcome == 1).sum()
    assert tl.rejected[(tl.t_s >= 5) & (tl.t_s < 9)].sum() > 0  # the burst overflows the queue
    # Little's law over the whole timeline: mean number in flight x span = total time in system
    span = len(tl) * dt * 1000
    done = r.completed
    assert tl.in_flight.mean() * span == pytest.approx((r.t_response - r.arrival)[done].sum(), rel=1e-9)
    # every column is declared, with its unit and whether a sampled run scales it to the fleet
    assert list(tl.columns) == list(COLUMNS)


def test_cli_writes_timeline(tmp_path, root_dir):
    out = tmp_path / "tl.parquet"
    js = tmp_path / "s.json"
    res = CliRunner().invoke(
        app,
        [
            "run",
            str(root_dir / "scenarios/validation/md1.yaml"),
            "--duration-s",
            "15",
            "--timeline",
            str(out),
            "--interval-s",
            "0.5",
            "--json",
            str(js),
        ],
    )
    assert res.exit_code == 0, res.output
    tl = pd.read_parquet(out)
    assert len(tl) >= 10
    assert {"t_s", "offered_rps", "completed_rps", "queue_depth", "p99_ms", "active_workers"} <= set(tl.columns)
    assert len(json.loads(js.read_text())["timeline"]) == len(tl)
    assert "timeline (" in res.output


def test_binned_percentiles_are_numpys_per_interval():
    """The timeline's p50 and p99 per interval, computed for all intervals at once, equal
    ``np.percentile`` of each interval's values to the bit (ties, one-value intervals and
    magnitudes from 1e-3 to 1e4 included)."""
    rng = np.random.default_rng(3)
    for trial in range(100):
        n = int(rng.integers(1, 3000))
        k = rng.integers(0, int(rng.integers(1, 50)), n)
        x = rng.exponential(5.0, n) * rng.choice([1e-3, 1.0, 1e3])
        if trial % 5 == 0:
            x = np.round(x)  # ties
        groups, got = binned_percentiles(k, x, (50.0, 99.0))
        assert list(groups) == sorted(set(k.tolist()))
        for g, row in zip(groups, got, strict=True):
            assert (row == np.percentile(x[k == g], [50.0, 99.0])).all()


@pytest.mark.parametrize("width_ms", [1.0, 7.3, 250.0, 1000.0, 60_000.0])
def test_interval_index_is_searchsorted_to_the_bit(width_ms):
    """The timeline's interval of a time, ⌊t/w⌋ corrected against the edges, is
    ``searchsorted(edges, t, "right") - 1`` for any time: on an edge, a float beside it on
    either side, at 0, before 0, and NaN."""
    from simulator.results.binning import Bins

    rng = np.random.default_rng(11)
    bins = Bins(width_ms)
    bins._grow(3_000 * width_ms)
    edges = bins.edges[:-2]
    t = np.concatenate(
        [
            rng.uniform(0, 3_000 * width_ms, 5_000),
            edges,
            np.nextafter(edges, np.inf),
            np.nextafter(edges[1:], -np.inf),
            [0.0, -1e-9, -width_ms * 2, np.nan],
        ]
    )
    got = bins.index(t)
    want = np.searchsorted(bins.edges, t, side="right") - 1
    assert (got == want).all()


def test_the_timeline_passes_compiled_python_and_numpy_agree(monkeypatch):
    """The timeline pass compiled, run as plain Python, and in numpy (the pass a run takes
    before numba has started) give the same sums, intervals and grouped latencies, to the
    bit (drops, degraded requests, unfinished ones and times on the edges included)."""
    from simulator import jit
    from simulator.results import binning

    rng = np.random.default_rng(4)
    n = 3_000
    arrival = np.sort(np.concatenate([rng.uniform(0, 20_000, n - 20), np.arange(20) * 1000.0]))
    outcome = rng.choice(np.array([0, 0, 0, 1, 2, 3], dtype=np.int8), n)
    done = outcome == 0
    t_queued = arrival + rng.exponential(2.0, n)
    t_dispatch = np.where(done, t_queued + rng.exponential(30.0, n), np.nan)
    t_response = np.where(done, t_dispatch + rng.exponential(10.0, n), np.nan)
    t_dropped = np.where(done, np.nan, t_queued + rng.exponential(5.0, n))
    degraded = rng.random(n) < 0.1
    b_start = np.sort(rng.uniform(0, 20_000, 500))
    b_size = rng.integers(1, 9, 500)
    edges = np.arange(0.0, 22_000.5, 1000.0)
    from types import SimpleNamespace

    r = SimpleNamespace(
        arrival=arrival, t_response=t_response, outcome=outcome, degraded=degraded,
        t_preprocessed=t_queued, t_dispatch=t_dispatch, t_dropped=t_dropped,
    )  # fmt: skip
    batches = SimpleNamespace(start=b_start, size=b_size)
    ways = {}
    for name, started, one_pass in (
        ("compiled", True, binning._timeline),
        ("python", True, binning._timeline_py),
        ("numpy", False, binning._timeline_np),
    ):
        monkeypatch.setattr(jit, "started", lambda started=started: started)
        monkeypatch.setattr(binning, "_timeline", one_pass)
        ways[name] = binning.timeline_sums(edges, 1000.0, r, done, batches)
    compiled = ways["compiled"]
    for name in ("python", "numpy"):
        for a, b in zip(compiled, ways[name], strict=True):
            assert a.dtype == b.dtype, name
            assert np.array_equal(a, b), name
    sums, ka, kr, e2e = compiled
    assert sums[binning.OFFERED].sum() == n
    assert sums[binning.COMPLETED].sum() == done.sum()
    assert (ka == np.searchsorted(edges, arrival, side="right") - 1).all()
    assert (kr == np.searchsorted(edges, t_response[done], side="right") - 1).all()
    assert np.array_equal(np.sort(e2e), np.sort((t_response - arrival)[done]))
