"""Sweeps: cells and seeds, the same rows on every executor (a real Dask LocalCluster), the CLI."""

from __future__ import annotations

import os
import signal
import subprocess

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from servesim.cli import app
from simulator.engine import simulate
from simulator.planning.sweep import cells, execute, parse_grid, tasks, tidy
from simulator.scenario.loader import ScenarioError, load_scenario

runner = CliRunner()

SMALL = """\
name: small
seed: 5
duration_s: 4
warmup_s: 0.5
sla: {percentile: 99, target_ms: 40}
traffic: {rate_rps: 3000}
router: {balancing: random}
batching: {max_batch_size: 8, max_queue_delay_ms: 2}
workers:
  count: 4
  service_time: {kind: affine, base_ms: 2.0, per_item_ms: 0.5, noise_cv: 0.1}
cost: {price_per_hour_usd: 1.0}
"""


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    return path


def _rows(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns="wall_s")


def test_cells_and_seeds_do_not_depend_on_the_option_order(small):
    a = tasks(small, [], parse_grid(["workers.count=3,4", "batching.max_queue_delay_ms=1,2"]), 2)
    b = tasks(small, [], parse_grid(["batching.max_queue_delay_ms=1,2", "workers.count=3,4"]), 2)
    assert [(t.cell_key, t.replication) for t in a] == [(t.cell_key, t.replication) for t in b]
    assert len(cells({"x": [1, 2, 3], "y": ["a", "b"]})) == 6
    pd.testing.assert_frame_equal(_rows(execute(a[:2])), _rows(execute(b[:2])))


def test_every_executor_gives_the_same_rows_bit_for_bit(small):
    distributed = pytest.importorskip("distributed", reason="the cluster extra (dask) is not installed")
    work = tasks(small, [], parse_grid(["workers.count=3,4", "batching.max_queue_delay_ms=1,4"]), 2)
    here = _rows(execute(work))
    assert len(here) == 8
    assert here["p99_ms"].nunique() == 8  # every run differs: seeds differ by cell and replication
    pd.testing.assert_frame_equal(here, _rows(execute(work, jobs=2)))
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    ) as cluster:
        remote = _rows(execute(work, cluster=cluster.scheduler_address))
    pd.testing.assert_frame_equal(here, remote)


def test_tidy_table_has_replications_and_summaries(small):
    work = tasks(small, [], parse_grid(["workers.count=3,4"]), 3)
    table = tidy(execute(work), ["workers.count"])
    reps, summary = table[table["kind"] == "replication"], table[table["kind"] == "summary"]
    assert len(reps) == 6
    assert summary["workers.count"].tolist() == [3, 4]
    for _, row in summary.iterrows():
        g = reps[reps["cell"] == row["cell"]]
        assert row["p99_ms"] == pytest.approx(g["p99_ms"].mean())
        assert row["p99_ms_ci_lo"] <= row["p99_ms"] <= row["p99_ms_ci_hi"]
        # pooled over every request of the cell's replications, from merged sketches
        assert g["p99_ms"].min() * 0.99 <= row["pooled_p99_ms"] <= g["p99_ms"].max() * 1.01
    assert "e2e_sketch" not in table.columns


def test_pooled_percentiles_merge_the_replications_sketches(small):
    """The cell's pooled p99 is the p99 of all its replications' requests together: from
    the merged sketches, within the sketch's error of the exact pooled value."""
    from simulator.planning.replicate import derive_seed
    from simulator.results.metrics import window

    work = tasks(small, [], parse_grid(["workers.count=3"]), 3)
    table = tidy(execute(work), ["workers.count"])
    pooled = table[table["kind"] == "summary"].iloc[0]["pooled_p99_ms"]
    s = load_scenario(small, ["workers.count=3"])
    lat = []
    for r in range(3):
        run = simulate(s.model_copy(update={"seed": derive_seed(s.seed, work[0].cell_key, r)}))
        done = window(run.records, s) & run.records.completed
        lat.append((run.records.t_response - run.records.arrival)[done])
    exact = np.percentile(np.concatenate(lat), 99, method="lower")
    assert abs(pooled - exact) <= 0.005 * exact


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ("workers.count", "expected dotted.path=v1,v2"),
        ("workers.count=", "no values"),
        ("workers.count=2,0", "line 10: workers.count"),
        ("workers.colour=2", "workers.colour: unknown key"),
        ("=1,2", "--grid '=1,2': empty path component"),  # was said of "--set '=0'"
        ("workers..count=1", "--grid 'workers..count=1': empty path component"),
    ],
)
def test_a_bad_grid_is_refused_before_anything_runs(small, grid, message):
    with pytest.raises(ScenarioError, match=message):
        tasks(small, [], parse_grid([grid]), 2)
    result = runner.invoke(app, ["sweep", str(small), "--grid", grid, "--out", str(small.parent / "x.csv")])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert not (small.parent / "x.csv").exists()


def test_sweep_cli_writes_the_tidy_table(small, tmp_path):
    out = tmp_path / "sweep.csv"
    args = ["sweep", str(small), "--grid", "workers.count=3,4", "--replications", "2", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    df = pd.read_csv(out)
    assert sorted(df["kind"].unique()) == ["replication", "summary"]
    assert len(df) == 2 * 2 + 2
    assert "per cell" in result.output


def test_cluster_start_serves_a_sweep(small, tmp_path):
    """A sweep on `servesim cluster start` gives the local sweep's numbers; SIGINT then stops
    the cluster and its worker processes, even when SIGINT came to it ignored (as it does
    to a command a non-interactive shell starts in the background)."""
    pytest.importorskip("distributed", reason="the cluster extra (dask) is not installed")
    from tests.servers import descendants, free_port, servesim_cmd, wait_gone

    port = free_port()
    proc = subprocess.Popen(
        [*servesim_cmd(), "cluster", "start", "--workers", "1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    kids: list[int] = []
    try:
        first = proc.stdout.readline()
        assert f"Dask scheduler at tcp://127.0.0.1:{port}" in first, first
        out = tmp_path / "remote.csv"
        args = ["sweep", str(small), "--grid", "workers.count=3", "--replications", "2", "--out", str(out)]
        result = runner.invoke(app, [*args, "--cluster", f"tcp://127.0.0.1:{port}"])
        assert result.exit_code == 0, result.output
        remote = pd.read_csv(out)
        assert runner.invoke(app, [*args[:-1], str(tmp_path / "here.csv")]).exit_code == 0
        here = pd.read_csv(tmp_path / "here.csv")
        pd.testing.assert_frame_equal(remote.drop(columns="wall_s"), here.drop(columns="wall_s"))
        kids = descendants(proc.pid)
        assert kids, "the cluster's worker processes"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert wait_gone(kids) == []
    finally:
        if proc.poll() is None:  # a failure above: leave nothing running
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.mark.parametrize("taken", [True, False])
def test_cluster_start_on_a_port_it_cannot_have_is_one_line(taken):
    """A port in use was Dask's RuntimeError as a traceback, after its log; --port 99999 was
    ignored for a random port. Each is one line, exit 2, nothing started."""
    pytest.importorskip("distributed", reason="the cluster extra (dask) is not installed")
    import socket

    from tests.servers import servesim_cmd

    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1] if taken else 99999
        done = subprocess.run(
            [*servesim_cmd(), "cluster", "start", "--port", str(port)], capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert "Dask scheduler at" not in done.stdout
    assert (f"cannot start the scheduler on port {port}" if taken else "--port") in done.stderr
