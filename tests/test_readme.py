"""README's commands work: the main run command as written, and every other servesim line."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from simulator.scenario.loader import load_scenario

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def servesim(args: list[str]) -> subprocess.CompletedProcess:
    """The installed console script of this interpreter's environment (else ``python -m servesim``)."""
    exe = Path(sys.executable).with_name("servesim")
    cmd = [str(exe), *args] if exe.exists() else [sys.executable, "-m", "servesim", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README, flags=re.S)


def test_two_commands_come_first():
    first, second = bash_blocks()[:2]
    assert "pip install" in first
    assert "servesim run scenarios/inference_platform.yaml" in first
    assert "pip install" in second
    assert "pytest" in second


def test_main_command_runs_as_written():
    cmd = bash_blocks()[0].strip().split("&&")[-1].strip()
    args = shlex.split(cmd)
    assert args[0] == "servesim"
    proc = servesim(args[1:])
    assert proc.returncode == 0, proc.stderr
    assert "SLA p99" in proc.stdout


def test_set_examples_in_readme_are_valid():
    """Every `--set` example in the overrides table applies (to the platform, M/M/c for
    mean_ms, the noisy-neighbour scenario for traffic classes)."""
    table = "\n".join(line for line in README.splitlines() if line.startswith("| `"))
    sets = re.findall(r"`--set (.+?)`", table)
    assert len(sets) >= 7
    platform = ROOT / "scenarios/inference_platform.yaml"
    mmc = ROOT / "scenarios/validation/mmc.yaml"
    noisy = ROOT / "scenarios/noisy_neighbour.yaml"
    for s in sets:
        path = mmc if "mean_ms" in s else noisy if "traffic.classes" in s else platform
        load_scenario(path, [s.strip("'")])  # raises ScenarioError if invalid
