"""The 200k RPS inference platform: wall time and peak memory for a minute of traffic.

Target (issue 2): 60 s of simulated traffic in under 120 s wall on a 2-core machine,
with peak memory under 4 GB. For a ratio, the same scenario also runs for a short slice
through the event-per-request reference model (tests/reference_model.py), the
idiomatic SimPy way, in the same process.

    python benchmarks/bench_platform.py [--duration-s 60] [--peer-duration-s 0.25]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.engine import simulate  # noqa: E402
from simulator.results.reduce import summarize  # noqa: E402
from simulator.scenario.loader import load_scenario  # noqa: E402
from tests.reference_model import simulate_reference  # noqa: E402

SCENARIO = ROOT / "scenarios/inference_platform.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--peer-duration-s", type=float, default=0.25)
    args = ap.parse_args()

    # the peer first, so that the peak-memory reading below belongs to servesim's run
    peer = load_scenario(SCENARIO, [f"duration_s={args.peer_duration_s}", "warmup_s=0", "network.bandwidth_gbps=null"])
    t = time.perf_counter()
    ref = simulate_reference(peer)
    peer_wall = time.perf_counter() - t
    peer_rate = len(ref["arrival"]) / peer_wall

    s = load_scenario(SCENARIO, [f"duration_s={args.duration_s}"])
    t = time.perf_counter()
    run = simulate(s)
    sim_wall = time.perf_counter() - t
    out = summarize(run)
    total_wall = time.perf_counter() - t
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    n = len(run.records)
    rate = n / sim_wall
    print(
        f"inference_platform: {s.traffic.rate_rps:,.0f} RPS, {s.workers.count} workers, "
        f"{args.duration_s:g} s of traffic"
    )
    print(
        f"  servesim         {n:12,d} requests  simulate {sim_wall:7.2f} s  (+ metrics: {total_wall:7.2f} s)  "
        f"{rate:11,.0f} req/s"
    )
    print(
        f"  reference model  {len(ref['arrival']):12,d} requests  simulate {peer_wall:7.2f} s"
        f"{'':22s}{peer_rate:11,.0f} req/s   (event per request, {args.peer_duration_s:g} s slice)"
    )
    print(f"  ratio servesim / reference: {rate / peer_rate:.1f}x")
    print(f"  peak memory (max RSS): {peak_gb:.2f} GB")
    print(
        f"  p99 {out['latency_ms']['e2e']['p99']:.2f} ms, mean batch {out['batch_size']['mean']:.2f}, "
        f"target: < 120 s wall and < 4 GB -> {'OK' if total_wall < 120 and peak_gb < 4 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
