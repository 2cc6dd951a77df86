"""The compiled loops' cache is keyed by the simulator's sources as a whole: numba checks
only the file that holds a function, so a changed loop in one module (``compiled.rate_factor``)
would leave a kernel in another (``loop_kernel``) running its cached old copy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulator import jit

ROOT = Path(__file__).resolve().parent.parent


def test_the_hash_follows_every_source_file_and_nothing_else(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    first = jit.source_hash(pkg)
    assert len(first) == 16
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "a.nbi").write_bytes(b"cache")  # what numba writes does not count
    (pkg / "notes.txt").write_text("not a source")
    assert jit.source_hash(pkg) == first
    (pkg / "sub" / "b.py").write_text("y = 3\n")  # a module the loops call, changed
    assert jit.source_hash(pkg) != first
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    assert jit.source_hash(pkg) == first
    (pkg / "sub" / "b.py").rename(pkg / "b.py")  # the same text elsewhere is another package
    assert jit.source_hash(pkg) != first


@pytest.mark.skipif(not jit.AVAILABLE, reason="numba is not installed")
def test_a_run_caches_its_loops_in_the_folder_of_the_sources_hash(tmp_path):
    """A fresh process runs a compiled loop: numba's cache folder is the hash's, under the
    package's __pycache__ (or the user's NUMBA_CACHE_DIR where set), and the loop's cache
    files are written there."""
    code = (
        "import numba, numpy as np\n"
        "from simulator import jit\n"
        "from simulator.serving.compiled import finish_on_path\n"
        "finish_on_path(0.0, 1.0, np.zeros(0), np.zeros(0), np.zeros(0))\n"
        "print(numba.config.CACHE_DIR)\n"
        "print(jit.cache_dir())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    numba_dir, ours = out.stdout.split()
    assert numba_dir == ours
    assert Path(ours).parent == ROOT / "simulator" / "__pycache__"
    assert Path(ours).name == f"numba-{jit.source_hash(ROOT / 'simulator')}"
    assert any(Path(ours).rglob("*compiled*finish_on_path*.nbi"))
    chosen = tmp_path / "numba-cache"
    env["NUMBA_CACHE_DIR"] = str(chosen)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(chosen), str(chosen)]
    assert any(chosen.rglob("*.nbi"))
