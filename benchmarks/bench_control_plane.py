"""The control plane must not slow the data plane.

The 200k RPS platform scenario with a diurnal shape and a 5% shadow, with the HPA
autoscaler against a fixed fleet of 130, in one process. Target (issue 3): at least
70% of the fixed fleet's simulated requests per wall-second.

    python benchmarks/bench_control_plane.py [--duration-s 30] [--repeat 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.engine import simulate  # noqa: E402
from simulator.scenario.loader import load_scenario  # noqa: E402

SCENARIO = ROOT / "scenarios/inference_platform.yaml"
SHAPE = [
    "traffic.shape={kind: diurnal, peak_to_mean: 1.3, period_s: 30, peak_at_s: 15}",
    "traffic.rate_rps=170000",  # peaks at 221k req/s
]
HPA = [
    "workers.autoscaler={policy: hpa, metric: in_flight, target: 12, min_replicas: 100, max_replicas: 200}",
    "workers.cold_start={model_load: {kind: deterministic, value_ms: 5000}}",
]
SHADOW = {
    "own": "router.shadow={percent: 5, pool: own, workers: 8}",
    "shared": "router.shadow={percent: 5, pool: shared}",
    "shared, no impact pass": "router.shadow={percent: 5, pool: shared, measure_impact: false}",
}


def rate(overrides: list[str], repeat: int) -> tuple[float, int, object]:
    s = load_scenario(SCENARIO, overrides)
    best, n, run = float("inf"), 0, None
    for _ in range(repeat):
        t = time.perf_counter()
        run = simulate(s)
        best = min(best, time.perf_counter() - t)
        n = len(run.records)
    return n / best, n, run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration-s", type=float, default=30.0)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    d = [f"duration_s={args.duration_s}"]
    print(f"platform, diurnal, 5% shadow; {args.duration_s:g} s of traffic, best of {args.repeat}")
    for pool, extra in SHADOW.items():
        fixed, n, _ = rate(d + SHAPE + [extra], args.repeat)
        dyn, _, run = rate(d + SHAPE + HPA + [extra], args.repeat)
        print(
            f"  shadow on {pool + ' pool':28s} {n:11,d} requests: fixed fleet {fixed:9,.0f} req/s, "
            f"HPA {dyn:9,.0f} req/s -> {dyn / fixed:.0%}  ({len(run.fleet.workers)} workers over the run)"
        )
    print("target: HPA >= 70% of the fixed fleet's rate. The shared-pool shadow by default also simulates")
    print("the primary without the copies, to report the p99 they cost; that second pass is timed too.")


if __name__ == "__main__":
    main()
