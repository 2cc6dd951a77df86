"""README's commands work: the main run command as written, and every other servesim line."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from simulator.scenario.loader import load_scenario

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def servesim(args: list[str], **env: str) -> subprocess.CompletedProcess:
    """The installed console script of this interpreter's environment (else ``python -m servesim``)."""
    exe = Path(sys.executable).with_name("servesim")
    cmd = [str(exe), *args] if exe.exists() else [sys.executable, "-m", "servesim", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, **env})


def without_wall_times(text: str) -> list[str]:
    """A run's printout without its ``simulated`` entry (wall times, this machine's), each
    line's trailing blanks stripped: what README says comes back exactly."""
    lines, skipping = [], False
    for line in text.splitlines():
        if line.startswith(" simulated"):
            skipping = True
            continue
        if skipping and line.startswith("          "):
            continue
        skipping = False
        lines.append(line.rstrip())
    return [line for line in lines if line]


def bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README, flags=re.S)


def test_two_commands_come_first():
    first, second = bash_blocks()[:2]
    assert "pip install" in first
    assert "servesim run scenarios/inference_platform.yaml" in first
    assert "pip install" in second
    assert "pytest" in second


def test_main_command_runs_as_written():
    """The run command as written prints README's "What you get" (80 columns wide, as a
    terminal of that width shows it), every figure but the wall times exactly."""
    cmd = bash_blocks()[0].strip().split("&&")[-1].strip()
    args = shlex.split(cmd)
    assert args[0] == "servesim"
    proc = servesim(args[1:], COLUMNS="80")
    assert proc.returncode == 0, proc.stderr
    shown = re.search(r"## What you get\n\n```\n(.*?)```", README, flags=re.S).group(1)
    assert without_wall_times(proc.stdout) == without_wall_times(shown)


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
