"""LLM serving's speed on the user's path: issue 29's bar, 10,000 ShareGPT-like requests
through one replica in under 5 s on one core.

The command, a whole process as a user runs it: ``servesim run scenarios/llm_chat.yaml``
on one H100 replica with the ``sharegpt`` preset at 10 req/s for 1,000 s (about 10,000
requests). Peers, interleaved round by round: the bare interpreter, and in process the same
requests through one replica with the closed-form skip of decode-only stretches and
without it (``Replica(skip=False)``, one step at a time: the ratio is what the skip buys).
Prints the median and range over the rounds, and the simulated time over the wall time.

``--before DIR`` runs a second checkout (an older commit, in a git worktree) in the same
rounds, interleaved: its command, and its replica in process (in a process of its own).

    python benchmarks/bench_llm.py [--rounds 3] [--before /tmp/old]
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

RATE, DURATION = 10.0, 1000.0
SETS = [
    "workers.count=1",
    f"traffic.rate_rps={RATE}",
    "traffic.tokens.preset=sharegpt",
    "traffic.tokens.prompt=null",
    "traffic.tokens.output=null",
    "warmup_s=0",
]
COMMAND = [sys.executable, "-m", "servesim", "run", "scenarios/llm_chat.yaml", "--duration-s", str(DURATION)]
for _s in SETS:
    COMMAND += ["--set", _s]


def in_process(skip: bool) -> tuple[float, int, int]:
    """One replica over the scenario's requests (their arrivals and tokens as the engine
    draws them): wall seconds, requests, steps."""
    from simulator import load_scenario
    from simulator.rng import streams
    from simulator.serving.continuous import LLMService
    from simulator.serving.llm_serve import serve
    from simulator.stages.arrivals import Arrivals
    from simulator.stages.tokens import TokenDraws

    s = load_scenario(ROOT / "scenarios/llm_chat.yaml", [*SETS, f"duration_s={DURATION}"])
    rng = streams(s.seed)
    t0, _ = Arrivals(s.traffic, DURATION * 1000.0, rng=rng.arrivals).take(DURATION * 1000.0)
    work = TokenDraws(s, rng).draw(len(t0))
    svc = LLMService.of(s.batching, s.workers.instance_type, rng.steps)
    t = time.perf_counter()
    got = serve(t0, work.prompt, work.output, svc.step, svc.limits, noise=svc.replica(0).noise, skip=skip)
    return time.perf_counter() - t, len(t0), got.steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", type=Path, help="another checkout to run in the same rounds")
    a = ap.parse_args()
    cases = {
        "python -c pass (peer)": [],
        "servesim run (the bar)": [],
        "in process, skip": [],
        "in process, no skip": [],
    }
    n = steps = 0
    for _ in range(a.rounds):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], cwd=ROOT, check=True, capture_output=True)
        cases["python -c pass (peer)"].append(time.perf_counter() - t)
        t = time.perf_counter()
        subprocess.run(COMMAND, cwd=ROOT, check=True, capture_output=True)
        cases["servesim run (the bar)"].append(time.perf_counter() - t)
        for skip, name in ((True, "in process, skip"), (False, "in process, no skip")):
            wall, n, steps = in_process(skip)
            cases[name].append(wall)
        if a.before is not None:
            root = a.before.resolve()
            t = time.perf_counter()
            subprocess.run(COMMAND, cwd=root, check=True, capture_output=True)
            cases.setdefault("before: servesim run", []).append(time.perf_counter() - t)
            code = f"import sys; sys.path.insert(0, {str(root)!r}); from benchmarks.bench_llm import in_process; "
            code += "print(in_process(True)[0])"
            got = subprocess.run([sys.executable, "-c", code], cwd=root, check=True, capture_output=True, text=True)
            cases.setdefault("before: in process, skip", []).append(float(got.stdout.split()[-1]))
    print(f"{cpu_model()}, Python {platform.python_version()}, {a.rounds} rounds")
    print(f"{n:,} requests, {steps:,} steps, {DURATION:g} simulated s at {RATE:g} req/s on one replica")
    print(f"command: {' '.join(COMMAND[1:])}")
    for name, ts in cases.items():
        med = statistics.median(ts)
        print(
            f"  {name:28s} median {med:6.2f} s  range {min(ts):.2f}-{max(ts):.2f} s  {DURATION / med:7.0f}x real time"
        )
    skip, no = statistics.median(cases["in process, skip"]), statistics.median(cases["in process, no skip"])
    print(f"the skip: {no / skip:.2f}x fewer seconds than one step at a time (median over rounds)")


if __name__ == "__main__":
    main()
