"""The code is linted and formatted as pyproject.toml says (ruff), so CI checks it too."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_ruff(args):
    if shutil.which("ruff") is None and subprocess.run([sys.executable, "-m", "ruff", "--version"]).returncode:
        pytest.skip("ruff is not installed (the test extra installs it)")
    done = subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
