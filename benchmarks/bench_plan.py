"""`servesim plan` on the 200k RPS platform: 3 batching windows × 4 GPU types.

Target (issue 5): under 5 minutes on a 2-core machine. The plan runs as a user runs it
(the CLI, in a subprocess); its own last lines give the points and requests simulated.
For a ratio, the peer is one plain full-fleet run of the same scenario (130 workers,
every worker simulated, no sampling) in this process: the plan's requests per
wall-second against the peer's, and the plan's wall time in units of that one run.

    python benchmarks/bench_plan.py [--range 40..800] [--replications 3]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.engine import simulate  # noqa: E402
from simulator.scenario.loader import load_scenario  # noqa: E402

SCENARIO = ROOT / "scenarios/inference_platform.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--range", default="40..800", help="workers.count range bisected")
    ap.add_argument("--replications", type=int, default=3)
    args = ap.parse_args()

    s = load_scenario(SCENARIO)
    t = time.perf_counter()
    run = simulate(s)
    peer_wall = time.perf_counter() - t
    peer_rate = len(run.records) / peer_wall

    exe = Path(sys.executable).with_name("servesim")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            str(exe), "plan", str(SCENARIO),
            "--vary", f"workers.count={args.range}",
            "--vary", "batching.max_queue_delay_ms=1,2,5",
            "--vary", "workers.instance_type=t4,l4,a100,h100",
            "--replications", str(args.replications),
            "--out", f"{tmp}/chosen.yaml",
        ]  # fmt: skip
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env={"COLUMNS": "160", "PATH": ""}, check=True)
        wall = time.perf_counter() - t
    m = re.search(r"(\d+) points, ([\d,]+) requests simulated in ([\d.]+) s", proc.stdout)
    chosen = re.search(r"chosen: (.*)", proc.stdout)
    points, requests = int(m[1]), int(m[2].replace(",", ""))
    print(f"plan: {SCENARIO.name}, workers.count={args.range}, windows 1,2,5 ms x t4,l4,a100,h100")
    print(f"  wall {wall:.1f} s (command, start-up included); {points} points; {requests:,} requests")
    print(f"  {requests / wall:,.0f} simulated req/s; {chosen[1] if chosen else 'nothing chosen'}")
    print(f"peer: one full-fleet run, 130 workers, {s.duration_s:g} s: {len(run.records):,} requests")
    print(f"  wall {peer_wall:.2f} s; {peer_rate:,.0f} req/s")
    print(f"plan / peer req/s: {requests / wall / peer_rate:.2f}x; plan wall = {wall / peer_wall:.0f} peer runs")
    print(f"target: under 300 s -> {'met' if wall < 300 else 'NOT met'}")


if __name__ == "__main__":
    main()
