"""The dashboard's run of every shipped scenario at its default duration.

Target (issue 6): each returns in under 5 s on a 2-core machine. A dashboard run is
``dashboards.data.run`` (fleet-sampled where exact, then reduced to the chart tables);
the peer, in the same process, is the plain CLI path on the whole fleet
(``simulate`` + ``summarize``), so the ratio shows what sampling and the reduction cost
or save.

    python benchmarks/bench_dashboard.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dashboards.data import run, scenario_files  # noqa: E402
from simulator.engine import simulate  # noqa: E402
from simulator.results.reduce import summarize  # noqa: E402
from simulator.scenario.loader import load_scenario  # noqa: E402


def main() -> None:
    print(f"{'scenario':34s} {'dashboard s':>11s} {'sampled':>8s} {'CLI path s':>10s} {'ratio':>6s}")
    worst = 0.0
    for path in scenario_files():
        s = load_scenario(path)
        t = time.perf_counter()
        r = run(s)
        dash = time.perf_counter() - t
        t = time.perf_counter()
        summarize(simulate(s))
        cli = time.perf_counter() - t
        worst = max(worst, dash)
        sampled = f"{r.sampled}/{s.workers.count}" if r.sampled else "-"
        name = str(path.relative_to(ROOT / "scenarios"))
        print(f"{name:34s} {dash:11.2f} {sampled:>8s} {cli:10.2f} {cli / dash:5.1f}x")
    print(f"slowest dashboard run: {worst:.2f} s -> target under 5 s {'met' if worst < 5 else 'NOT met'}")


if __name__ == "__main__":
    main()
