"""The LLM replica's cost in instructions, not seconds: what a small change of the step
buys, told apart on a host whose speed moves by 40% between hours.

Wall time on these shared 2-core machines moves by ±30% between runs and by 40–50% between
days (benchmarks/README), so a change worth 10% cannot be told apart in seconds without many
rounds. The instructions a run executes do not move with the host: valgrind's callgrind
counts them (``I refs``), to within a few million in a few thousand (the hash seed of the
interpreter moves them a little). Each case runs twice, at its duration and at 1 s, and
the difference is the simulation's own (the imports and the interpreter cancel).

Cases: the bar's replica in process (``bench_llm.in_process``: ShareGPT-like requests at
10 req/s on one H100 replica, vLLM V1's policy), and ``servesim run scenarios/llm_chat.yaml``
in the command's process (four replicas, about 50 running on each).

    python benchmarks/bench_llm_instructions.py [--duration-s 300] [--before DIR]

Needs ``valgrind`` (``apt-get install valgrind``); a run under it is ~50x slower, so the
defaults take about four minutes, eight with ``--before``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BAR = "import benchmarks.bench_llm as b; b.DURATION = {d}; b.in_process(True)"
CHAT = (
    "from servesim.cli import main; "
    "sys.argv = ['servesim', 'run', 'scenarios/llm_chat.yaml', '--duration-s', '{d}', '--set', 'warmup_s=0']; "
    "main()"
)


def instructions(root: Path, case: str, duration: float) -> int:
    """Instructions of one run of ``case`` in checkout ``root`` (callgrind's I refs)."""
    code = f"import sys; sys.path.insert(0, {str(root)!r}); " + case.format(d=duration)
    got = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
    )
    m = re.search(r"I\s+refs:\s+([\d,]+)", got.stderr)
    if got.returncode != 0 or m is None:
        raise SystemExit(f"{root}: the run under valgrind failed:\n{got.stderr[-2000:]}")
    return int(m.group(1).replace(",", ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration-s", type=float, default=300.0, help="the bar's simulated seconds (llm_chat: a tenth)")
    ap.add_argument("--before", type=Path, help="another checkout, counted the same way")
    a = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    roots = [("this checkout", ROOT)] + ([("before", a.before.resolve())] if a.before else [])
    cases = [("bar, in process", BAR, a.duration_s), ("llm_chat, the command", CHAT, a.duration_s / 10)]
    got: dict[tuple[str, str], int] = {}
    for case, code, d in cases:
        for name, root in roots:
            n = instructions(root, code, d) - instructions(root, code, 1.0)
            got[name, case] = n
            print(f"  {case:24s} {d:6g} s  {name:14s} {n / 1e6:8,.0f} M instructions", flush=True)
    if a.before:
        for case, _, _ in cases:
            now, then = got["this checkout", case], got["before", case]
            print(f"{case}: {now / then - 1:+.1%} against before")


if __name__ == "__main__":
    main()
