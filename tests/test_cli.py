"""The command line: runs, JSON keys, overrides, determinism, and clear errors for bad input."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pandas as pd
import pytest
from typer.testing import CliRunner

from servesim.cli import app
from tests.helpers import ROOT

runner = CliRunner()

GOOD = """\
name: tiny
seed: 3
duration_s: 5
warmup_s: 1
sla: {percentile: 99, target_ms: 50}
traffic: {rate_rps: 400, payload_kb: 8, response_kb: 1}
network:
  client_to_api: {kind: lognormal, p50_ms: 1.0, p99_ms: 4.0}
  bandwidth_gbps: 1
features:
  lookups_per_request: 10
  batch_size: 5
  parallelism: 2
  round_trip: {kind: exponential, mean_ms: 1.0}
batching: {max_batch_size: 8, max_queue_delay_ms: 2}
workers:
  count: 2
  instance_type: t4
  service_time: {kind: affine, base_ms: 2.0, per_item_ms: 0.5}
"""


def write(tmp_path, text, name="s.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def test_run_writes_json_with_documented_keys(tmp_path):
    path = write(tmp_path, GOOD)
    out = tmp_path / "out.json"
    res = invoke("run", path, "--json", out)
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert d["requests"]["completed"] > 0
    assert d["requests"]["rejected"] == 0
    for k in ("p50", "p95", "p99", "p999", "mean"):
        assert d["latency_ms"]["e2e"][k] > 0
    for stage in ("network_in", "features", "queue", "inference", "network_out"):
        assert set(d["latency_ms"]["stages"][stage]) >= {"p50", "p95", "p99", "mean"}
    assert set(d["sla"]) >= {"percentile", "target_ms", "attained_ms", "met"}
    assert 0 < d["utilization"]["workers"] <= 1
    assert 1 <= d["batch_size"]["mean"] <= 8
    assert d["cost"]["per_hour_usd"] == pytest.approx(2 * 0.526)
    assert d["cost"]["per_million_requests_usd"] > 0
    assert set(d["sim"]) >= {"wall_s", "requests_per_wall_s", "seed"}
    assert "end to end" in res.output
    assert "SLA" in res.output


def test_same_seed_same_json_and_different_seed_differs(tmp_path):
    path = write(tmp_path, GOOD)

    def summary(seed):
        out = tmp_path / f"{seed}.json"
        assert invoke("run", path, "--seed", seed, "--json", out).exit_code == 0
        d = json.loads(out.read_text())
        for timing in ("wall_s", "requests_per_wall_s", "simulate_s", "start_s"):  # wall-clock, not a result
            d["sim"].pop(timing, None)
        return d

    assert summary(5) == summary(5)
    assert summary(5) != summary(6)


def test_set_overrides_and_duration(tmp_path):
    path = write(tmp_path, GOOD)
    out = tmp_path / "o.json"
    res = invoke(
        "run", path, "--set", "workers.count=3", "--set", "traffic.rate_rps=100", "--duration-s", "3", "--json", out
    )
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert d["workers"]["count"] == 3
    assert d["requests"]["throughput_rps"] == pytest.approx(100, rel=0.25)


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_records_file(tmp_path, suffix):
    path = write(tmp_path, GOOD)
    rec = tmp_path / f"records{suffix}"
    assert invoke("run", path, "--records", rec).exit_code == 0
    df = pd.read_parquet(rec) if suffix == ".parquet" else pd.read_csv(rec)
    assert {"arrival_ms", "t_response_ms", "outcome", "batch_size", "warmup", "version"} <= set(df.columns)
    assert len(df) > 1000
    assert df["warmup"].any()
    assert not df["warmup"].all()  # warmup_s 1 of 5 s
    assert set(df["version"].astype(str)) == {"primary"}
    assert set(df["traffic_class"].astype(str)) == {"default"}


def test_schema_and_check(tmp_path):
    res = invoke("schema")
    schema = json.loads(res.output)
    assert "workers" in schema["properties"]
    assert invoke("check", write(tmp_path, GOOD)).exit_code == 0


BAD = [
    ("workers:\n  count: 2", "workers:\n  count: many", "line 17: workers.count", "integer"),
    ("  count: 2\n", "  count: 2\n  cuont: 3\n", "line 18: workers.cuont: unknown key", None),
    ("rate_rps: 400", "rate_rps: -400", "line 6: traffic.rate_rps", "greater than 0"),
    (
        "{kind: exponential, mean_ms: 1.0}",
        "{kind: weibull, mean_ms: 1.0}",
        "line 14: features.round_trip",
        "unknown kind 'weibull'",
    ),
    (
        "{kind: exponential, mean_ms: 1.0}",
        "{kind: empirical, file: nope.txt}",
        "line 14: features.round_trip.file",
        "file not found",
    ),
    (
        "traffic: {rate_rps: 400,",
        "traffic: {arrivals_file: gone.csv,",
        "line 6: traffic.arrivals_file",
        "file not found",
    ),
    ("sla: {percentile: 99, target_ms: 50}", "sla: {percentile: 99, target_ms: 50", "not valid YAML", None),
    (
        "  service_time: {kind: affine, base_ms: 2.0, per_item_ms: 0.5}",
        "",
        "line 16: workers.service_time",
        "is required",
    ),
]


@pytest.mark.parametrize(
    ("old", "new", "where", "what"),
    BAD,
    ids=[
        "wrong-type",
        "unknown-key",
        "negative-rate",
        "unknown-dist",
        "missing-file",
        "missing-arrivals",
        "bad-yaml",
        "missing-field",
    ],
)
def test_bad_scenarios_name_field_and_line(tmp_path, old, new, where, what):
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new))
    for cmd in ("check", "run"):
        res = invoke(cmd, path)
        assert res.exit_code == 2
        text = " ".join(res.output.split())
        assert where in text, res.output
        if what:
            assert what in text, res.output
        assert "Traceback" not in res.output


@pytest.mark.parametrize("args", [["--set", "workers.count"], ["--set", "workers.count=-1"], ["--records", "x.txt"]])
def test_bad_options(tmp_path, args):
    res = invoke("run", write(tmp_path, GOOD), *args)
    assert res.exit_code == 2
    assert "Traceback" not in res.output


def test_missing_scenario_file(tmp_path):
    res = invoke("run", tmp_path / "nope.yaml")
    assert res.exit_code == 2
    assert "file not found" in res.output


def test_console_script_prints_no_traceback(tmp_path):
    """Through the real entry point: the message on stderr, status 2, nothing else."""
    path = write(tmp_path, GOOD.replace("rate_rps: 400", "rate_rps: -400"))
    proc = subprocess.run([sys.executable, "-m", "servesim", "run", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "traffic.rate_rps" in proc.stderr
    assert "line 6" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_short_duration_shrinks_a_longer_warmup(tmp_path):
    path = write(tmp_path, GOOD)  # warmup_s: 1
    out = tmp_path / "o.json"
    res = invoke("run", path, "--duration-s", "0.5", "--json", out)
    assert res.exit_code == 0, res.output
    assert "using warmup_s 0.05" in " ".join(res.output.split())
    assert json.loads(out.read_text())["requests"]["window_s"] == pytest.approx(0.45)


@pytest.mark.parametrize("duration", ["-1", "0"])
def test_a_duration_below_zero_is_one_error_without_a_note_on_the_warmup(tmp_path, duration):
    """``--duration-s -1`` is refused for itself alone: no note shrinking the warm-up to
    -0.1 s, and no second error about that warm-up."""
    path = write(tmp_path, GOOD)  # warmup_s: 1
    res = invoke("run", path, "--duration-s", duration)
    assert res.exit_code == 2
    assert "duration_s: Input should be greater than 0" in res.output
    assert "note:" not in res.output
    assert "warmup_s" not in res.output


def test_a_top_level_cross_field_error_names_its_field_and_line(tmp_path):
    path = write(tmp_path, GOOD.replace("warmup_s: 1", "warmup_s: 9"))
    result = runner.invoke(app, ["check", str(path)])
    assert result.exit_code == 2
    assert "line 4: warmup_s: Value error, warmup_s (9) must be smaller than duration_s (5)" in result.output


HEAVY = ("numba", "simpy", "pandas", "scipy", "pyarrow", "simulator.engine", "simulator.streaming")


@pytest.mark.parametrize(
    "argv", [["--help"], ["check", "scenarios/inference_platform.yaml"], ["calibrate", "--help"], ["plan", "--help"]]
)
def test_help_and_check_load_no_engine(argv):
    """``servesim --help`` and ``check`` answer without loading the engine, numba, SimPy,
    pandas or scipy (issue 27: they took 2.3 s when everything loaded at start; the time
    itself is measured in benchmarks/bench_cli.py, not here)."""
    code = (
        "import sys\n"
        "from servesim.cli import app\n"
        "try:\n"
        f"    app({argv!r}, prog_name='servesim')\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        f"print('LOADED', sorted(m for m in sys.modules if m.startswith({HEAVY!r})))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.rsplit("LOADED", 1)[1].strip()
    assert loaded == "[]", f"servesim {' '.join(argv)} loaded {loaded}"


@pytest.mark.parametrize("argv", [["--help"], ["calibrate", "--help"]])
def test_a_command_list_gives_each_command_one_line_on_a_wide_terminal(argv):
    """A command's summary in a list is its docstring's first paragraph on one line: typer's
    rich mode kept the docstring's line breaks there, so at 80 columns 'practice' broke
    after 'step by step,' and 'calibrate run' after 'interleaved'."""
    import typer.main

    res = runner.invoke(app, argv, env={"COLUMNS": "1000"}, terminal_width=1000)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    top = lines.index(next(line for line in lines if "Commands" in line))
    panel = list(itertools.takewhile(lambda line: not line.startswith("╰"), lines[top + 1 :]))
    group = typer.main.get_command(app)
    for word in argv[:-1]:
        group = group.commands[word]
    assert len(panel) == len(group.commands), panel  # a line each
