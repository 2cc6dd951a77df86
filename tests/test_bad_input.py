"""Issue 12: every bad input gets one clear message (field and YAML line), exit 2, no
traceback, no hang and no runaway memory, decided before the run starts."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servesim.cli import app
from simulator.planning.plan import on_instance_type
from simulator.scenario.loader import ScenarioError, load_scenario

ROOT = Path(__file__).resolve().parent.parent
PLATFORM = ROOT / "scenarios/inference_platform.yaml"
runner = CliRunner()

TINY = """\
name: tiny
duration_s: 4
sla: {percentile: 99, target_ms: 50}
traffic: {rate_rps: 300}
batching: {max_batch_size: 8, max_queue_delay_ms: 2, max_queue_size: 64}
workers:
  count: 2
  service_time: {kind: affine, base_ms: 2.0, per_item_ms: 0.5}
"""


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception  # a traceback is a failure of the test
    return result


def cli(*args, timeout=60, limit_bytes=None) -> subprocess.CompletedProcess:
    """The real console script in a subprocess (optionally under an address-space limit)."""

    def limit():
        if limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return subprocess.run(
        [sys.executable, "-m", "servesim", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
        cwd=ROOT,
    )


def one_error(res, *needles):
    """Exit 2, no traceback, and every needle in the message."""
    text = res.output if hasattr(res, "output") else res.stdout + res.stderr
    code = res.exit_code if hasattr(res, "exit_code") else res.returncode
    assert code == 2, text
    assert "Traceback" not in text, text
    for n in needles:
        assert n in text, (n, text)
    return text


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--set", "traffic.rate_rps=.inf"], ["line 27", "traffic.rate_rps", "finite"]),
        (["--set", "traffic.rate_rps=.nan"], ["traffic.rate_rps", "got nan"]),
        (["--duration-s", "inf"], ["duration_s", "finite"]),
        (["--set", "workers.service_time.base_ms=.inf"], ["workers.service_time.base_ms", "finite"]),
        (["--set", "workers.count=true"], ["line 49", "workers.count", "got true"]),
        (
            ["--set", "workers.service_time.base_ms=0", "--set", "workers.service_time.per_item_ms=0"],
            ["workers.service_time", "must take some time"],
        ),
        (["--set", "batching.max_queue_delay_ms=1e12"], ["batching.max_queue_delay_ms", "not shorter than the run"]),
        (["--set", "traffic.rate_rps=1e308"], ["rate × duration is not a finite number"]),
        (
            ["--set", "batching.kind=paged"],
            ["batching.kind", "unknown kind 'paged'", "expected one of triton, continuous"],
        ),
    ],
)
def test_numbers_that_cannot_run_are_refused_with_field_and_line(args, needles):
    t0 = time.perf_counter()
    one_error(invoke("run", PLATFORM, *args), *needles)
    assert time.perf_counter() - t0 < 20  # refused before simulating (a 10 s platform run takes longer)


def test_check_agrees_with_run():
    one_error(invoke("check", PLATFORM, "--set", "traffic.rate_rps=.inf"), "finite")
    one_error(invoke("check", PLATFORM, "--set", "traffic.rate_rps=1e9"), "would need")
    ok = invoke("check", PLATFORM)
    assert ok.exit_code == 0
    assert "requests" in ok.output
    assert "memory" in ok.output


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--set", "traffic.rate_rps=1000000000"], ["would need", "GB of memory", "--duration-s", "--sample-workers"]),
        (["--chunk-s", "whole", "--duration-s", "3600"], ["would need", "--duration-s", "--chunk-s auto"]),
        (["--set", "workers.count=10000000"], ["would need", "workers.count"]),
        (["--set", "batching.max_batch_size=1000000000"], ["would need", "batching.max_batch_size"]),
        (["--duration-s", "86400", "--interval-s", "0.001"], ["would need", "--interval-s"]),
    ],
)
def test_runaway_runs_are_refused_before_any_large_allocation(args, needles):
    # under a 3 GB address-space limit: an allocation attempt would die with a MemoryError
    # traceback; the budget refuses first, with the remedies
    res = cli("run", PLATFORM, *args, limit_bytes=3 * 2**30)
    one_error(res, *needles)


def test_llm_replicas_by_the_hundred_million_are_refused_naming_their_kv_blocks():
    """An LLM fleet's KV blocks are the budget's own part ("kv"): refused with its remedy,
    not a KeyError (as it was for ``workers.count=100000000``)."""
    res = cli("run", ROOT / "scenarios/llm_chat.yaml", "--set", "workers.count=100000000", limit_bytes=3 * 2**30)
    one_error(res, "would need", "workers.count 100,000,000", "batching.num_blocks")


def test_every_part_of_the_budget_has_its_remedy():
    """Each part :func:`estimate` counts has a remedy in the refusal (a part without one
    raised a KeyError where its remedy was looked up)."""
    from simulator import load_scenario
    from simulator.planning.budget import estimate, remedies

    for name in ("inference_platform.yaml", "llm_chat.yaml", "recsys_feature_fetch.yaml"):
        s = load_scenario(ROOT / "scenarios" / name)
        parts = set(estimate(s).parts)
        assert parts <= set(remedies(s, streamed=False, records=False, interval_s=1.0)), (name, parts)
        assert name != "llm_chat.yaml" or "kv" in parts


def test_feature_lookups_in_the_billions_are_refused():
    res = cli(
        "run",
        ROOT / "scenarios/recsys_feature_fetch.yaml",
        "--set",
        "features.lookups_per_request=1000000000",
        limit_bytes=3 * 2**30,
    )
    one_error(res, "would need", "features.lookups_per_request")


def test_files_that_are_not_utf8_text(tmp_path):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: caf\xe9\n")
    one_error(invoke("check", latin), "line 1", "not UTF-8")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    one_error(invoke("check", binary), "binary file")


def test_an_alias_bomb_is_refused_at_once(tmp_path):
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{','.join(['*' + prev] * 9)}]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    t0 = time.perf_counter()
    one_error(cli("check", bomb, timeout=30, limit_bytes=2 * 2**30), "alias")
    assert time.perf_counter() - t0 < 15
    loop = tmp_path / "loop.yaml"
    loop.write_text("a: &a [1, *a]\n")
    with pytest.raises(ScenarioError, match="refers to itself"):
        load_scenario(loop)


def test_a_duplicate_key_names_both_lines(tmp_path):
    text = TINY.replace("  count: 2\n", "  count: 130\n  count: 13\n")
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    one_error(invoke("check", path), "line 8", "workers.count", "duplicate key", "first given at line 7")


def test_an_autoscaler_below_the_starting_fleet_is_refused():
    res = invoke("check", ROOT / "scenarios/autoscaling.yaml", "--set", "workers.count=5000")
    one_error(res, "workers.count", "max_replicas")


def test_warnings_for_configurations_that_rarely_mean_it(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(TINY)
    res = invoke("run", path, "--set", "batching.max_batch_size=128")
    assert res.exit_code == 0
    assert "warning: batching.max_batch_size (128) exceeds max_queue_size (64)" in res.output
    # a timeout inside the batching window drops light traffic: warned, and the report reads
    res = invoke("run", path, "--set", "batching.timeout_ms=1", "--set", "batching.max_queue_delay_ms=5")
    assert res.exit_code == 0
    assert "warning: batching.timeout_ms (1) is not above max_queue_delay_ms (5)" in res.output
    assert "nan" not in res.output
    assert "$inf" not in res.output
    assert "no request completed" in res.output


def test_output_paths_are_checked_before_the_run(tmp_path):
    for opt in ("--records", "--json", "--timeline"):
        t0 = time.perf_counter()
        res = invoke("run", PLATFORM, opt, tmp_path / "missing" / "x.csv")
        one_error(res, opt, "does not exist")
        assert time.perf_counter() - t0 < 5  # before the 10 s platform run
    one_error(invoke("run", PLATFORM, "--json", tmp_path), "is a folder")
    res = invoke("plan", PLATFORM, "--max-rate", "--vary", "workers.count=100,130", "--out", tmp_path / "x.yaml")
    one_error(res, "--out", "--max-rate", "--table")


def test_instance_type_means_the_same_in_run_and_plan():
    base = load_scenario(PLATFORM)
    t4 = load_scenario(PLATFORM, ["workers.instance_type=t4"])
    planned = on_instance_type(base, "t4")
    assert t4.workers.instance_type == planned.workers.instance_type == "t4"
    assert t4.workers.service_time == planned.workers.service_time
    assert t4.workers.service_time.base_ms > base.workers.service_time.base_ms  # a T4 is slower than an A100
    # a type measured on, named in the file, is not rescaled
    same = load_scenario(PLATFORM, ["workers.instance_type=t4", "workers.measured_on=t4"])
    assert same.workers.service_time == base.workers.service_time
    with pytest.raises(ScenarioError, match="not in the catalog"):
        load_scenario(PLATFORM, ["workers.instance_type=tpu"])


def test_a_traffic_class_may_name_a_profile(tmp_path):
    text = (ROOT / "scenarios/noisy_neighbour.yaml").read_text()
    old = "service_time: {kind: affine, base_ms: 8.0, per_item_ms: 1.0, noise_cv: 0.05}"
    assert old in text
    path = ROOT / "scenarios" / f"_test_profile_class_{os.getpid()}.yaml"  # relative paths resolve beside it
    try:
        path.write_text(
            text.replace(old, "service_time: {kind: profile, path: ../calibrate/profiles/cpu-resnet64/profile.json}")
        )
        s = load_scenario(path)
        assert s.traffic.classes["tagger"].service_time.kind == "table"
        path.write_text(text.replace(old, "service_time: {kind: profile, path: nope.json}"))
        with pytest.raises(ScenarioError, match=r"traffic\.classes\.tagger\.service_time\.path: file not found"):
            load_scenario(path)
    finally:
        path.unlink(missing_ok=True)


def test_version():
    res = invoke("--version")
    assert res.exit_code == 0
    assert res.output.startswith("servesim ")
