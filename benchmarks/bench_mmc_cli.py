"""M/M/8 on the user's path: ``servesim run`` as a fresh process against Ciw, round by round.

Each round runs the README's kind of command, ``python -m servesim run
scenarios/validation/mmc.yaml --duration-s 300 --json …`` (M/M/8 at ρ 0.8, about 240,000
requests), as a user runs it, and Ciw on the same system (8 exponential servers of mean
8 ms, Poisson arrivals at 800/s) in this process, 100,000 requests. It prints, per
round and as medians with their range:

- the command's own rate, ``sim.requests_per_wall_s`` of its JSON (the simulation and its
  summary; numba's start, once per process, is reported beside it as ``sim.start_s``);
- the simulation's rate, over ``sim.simulate_s``, its share of that wall time: the same
  scope as Ciw's figure, which times ``simulate_until_max_time`` and not the reading of
  its records;
- the whole process's rate: requests over the process's wall time (imports, numba's
  start, reading the scenario, printing and writing the JSON included);
- Ciw's rate (its simulation, in process), and the two ratios to it.

``--before DIR`` runs a second checkout (an older commit, in a git worktree) in the same
rounds, interleaved, so that before and after see the same machine.

Each checkout runs once before the rounds, uncounted, with Python allowed to write its
bytecode (``PYTHONDONTWRITEBYTECODE`` unset for the command): an installed package has
its ``.pyc`` files, and a module the run imports late would otherwise be compiled from
source inside the run's clock.

    python benchmarks/bench_mmc_cli.py [--rounds 5] [--before /tmp/old]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_stream import cpu_model  # noqa: E402

C, MEAN_MS, RATE_RPS = 8, 8.0, 800.0  # scenarios/validation/mmc.yaml
RATES = ("run", "simulation", "process")  # the command's, the simulation's, the whole process's
COMMAND = ["run", "scenarios/validation/mmc.yaml", "--duration-s", "300"]


def command(root: Path) -> tuple[float, dict]:
    """One ``servesim run`` in a fresh process from ``root``: its wall time and ``sim``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "summary.json"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "servesim", *COMMAND, "--json", str(out)],
            cwd=root,
            check=True,
            capture_output=True,
            env=env,
        )
        wall = time.perf_counter() - t
        return wall, json.loads(out.read_text())["sim"]


def ciw_rate(n: int, seed: int) -> float:
    """Ciw's simulated requests per wall second on the same M/M/8."""
    import ciw

    network = ciw.create_network(
        arrival_distributions=[ciw.dists.Exponential(rate=RATE_RPS / 1000.0)],
        service_distributions=[ciw.dists.Exponential(rate=1 / MEAN_MS)],
        number_of_servers=[C],
    )
    ciw.seed(seed)
    t = time.perf_counter()
    sim = ciw.Simulation(network)
    sim.simulate_until_max_time(n / (RATE_RPS / 1000.0))
    wall = time.perf_counter() - t
    return len(sim.get_all_records()) / wall


def _spread(xs: list[float], fmt: str) -> str:
    return f"{format(statistics.median(xs), fmt)} ({format(min(xs), fmt)}–{format(max(xs), fmt)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--before", type=Path, help="another checkout to run in the same rounds")
    ap.add_argument("--peer-requests", type=int, default=100_000)
    a = ap.parse_args()
    roots = {"after": ROOT} if a.before is None else {"before": a.before.resolve(), "after": ROOT}
    rows: dict[str, dict[str, list[float]]] = {
        k: {"run": [], "simulation": [], "process": [], "wall": [], "start": []} for k in roots
    }
    ciw: list[float] = []
    for root in roots.values():  # bytecode written, the page cache warm: not counted
        command(root)
    for r in range(a.rounds):
        for name, root in roots.items():
            wall, sim = command(root)
            rows[name]["run"].append(sim["requests_per_wall_s"])
            rows[name]["simulation"].append(sim["requests"] / sim.get("simulate_s", float("nan")))
            rows[name]["process"].append(sim["requests"] / wall)
            rows[name]["wall"].append(wall)
            rows[name]["start"].append(sim.get("start_s", float("nan")))
        ciw.append(ciw_rate(a.peer_requests, seed=r + 1))
    print(f"{cpu_model()}, {a.rounds} rounds, Python {platform.python_version()}; medians (range)")
    print(f"Ciw: {_spread(ciw, ',.0f')} req/s")
    print(
        "| checkout | the command's rate, req/s | / Ciw | the simulation's, req/s | / Ciw "
        "| process wall, s | process rate / Ciw | numba start, s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, m in rows.items():
        over, sim_over, proc = ([x / c for x, c in zip(m[k], ciw, strict=True)] for k in RATES)
        print(
            f"| {name} | {_spread(m['run'], ',.0f')} | {_spread(over, '.1f')}× | {_spread(m['simulation'], ',.0f')} "
            f"| {_spread(sim_over, '.1f')}× | {_spread(m['wall'], '.2f')} | {_spread(proc, '.1f')}× "
            f"| {_spread(m['start'], '.2f')} |"
        )


if __name__ == "__main__":
    main()
