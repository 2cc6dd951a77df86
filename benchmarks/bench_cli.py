"""The command line's fixed costs: ``servesim --help`` and ``servesim check``, whole processes.

Each command runs as a user runs it (a fresh ``python -m servesim`` process, imports and
all), interleaved round by round with the peer: the bare interpreter (``python -c pass``)
and the interpreter with the libraries every command needs (typer and rich). Prints the
median and the range over the rounds, and each command's time over the bare interpreter's.
Issue 27's target: ``--help`` and ``check`` under 0.5 s.

    python benchmarks/bench_cli.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_stream import cpu_model  # noqa: E402

CASES = {
    "python -c pass (peer)": [sys.executable, "-c", "pass"],
    "python -c 'import typer, rich.console' (peer)": [sys.executable, "-c", "import typer, rich.console"],
    "servesim --help": [sys.executable, "-m", "servesim", "--help"],
    "servesim check scenarios/inference_platform.yaml": [
        sys.executable,
        "-m",
        "servesim",
        "check",
        "scenarios/inference_platform.yaml",
    ],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    times: dict[str, list[float]] = {k: [] for k in CASES}
    for _ in range(a.rounds):
        for name, cmd in CASES.items():
            t = time.perf_counter()
            subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
            times[name].append(time.perf_counter() - t)
    bare = statistics.median(times["python -c pass (peer)"])
    print(f"{cpu_model()}, {a.rounds} rounds, Python {platform.python_version()}")
    print("| command | median | range | over the bare interpreter |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| `{name}` | {med:.3f} s | {min(ts):.3f}–{max(ts):.3f} s | {med / bare:.1f}× |")


if __name__ == "__main__":
    main()
