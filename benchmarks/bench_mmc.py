"""M/M/8 at rho = 0.8: servesim against Ciw and an idiomatic SimPy model, in one run.

Each simulator runs the same system (Poisson arrivals, 8 exponential servers, mean
service 10 ms, one FCFS queue) and reports simulated requests per wall-second and its
p99 sojourn against the exact Erlang C value. Ratios are against peers measured in this
same process, so machine load affects all of them alike.

    python benchmarks/bench_mmc.py [--requests 400000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import simpy

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.engine import simulate  # noqa: E402
from simulator.scenario.loader import load_scenario  # noqa: E402
from tests.theory import mmc_sojourn_quantile  # noqa: E402

C, MEAN_MS, RHO = 8, 10.0, 0.8
LAM = RHO * C / MEAN_MS  # per ms


def servesim(n: int, seed: int, extra=()) -> tuple[float, np.ndarray]:
    duration_s = n / (LAM * 1000)
    s = load_scenario(
        ROOT / "scenarios/validation/mmc.yaml",
        [
            f"workers.count={C}",
            f"workers.service_time.mean_ms={MEAN_MS}",
            f"traffic.rate_rps={LAM * 1000}",
            f"duration_s={duration_s}",
            "warmup_s=0",
            f"seed={seed}",
            *extra,
        ],
    )
    t = time.perf_counter()
    run = simulate(s)
    wall = time.perf_counter() - t
    return wall, run.records.t_response - run.records.arrival


def simpy_idiomatic(n: int, seed: int) -> tuple[float, np.ndarray]:
    """The textbook SimPy model: a process per request, servers as a Resource."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1 / LAM, n).tolist()
    services = rng.exponential(MEAN_MS, n).tolist()
    sojourn = []
    env = simpy.Environment()
    servers = simpy.Resource(env, capacity=C)

    def customer(i):
        arrive = env.now
        with servers.request() as req:
            yield req
            yield env.timeout(services[i])
        sojourn.append(env.now - arrive)

    def source():
        for i in range(n):
            yield env.timeout(gaps[i])
            env.process(customer(i))

    t = time.perf_counter()
    env.process(source())
    env.run()
    return time.perf_counter() - t, np.asarray(sojourn)


def ciw_model(n: int, seed: int) -> tuple[float, np.ndarray]:
    import ciw

    network = ciw.create_network(
        arrival_distributions=[ciw.dists.Exponential(rate=LAM)],
        service_distributions=[ciw.dists.Exponential(rate=1 / MEAN_MS)],
        number_of_servers=[C],
    )
    ciw.seed(seed)  # Ciw's own API: it seeds its module-level generators
    t = time.perf_counter()
    sim = ciw.Simulation(network)
    sim.simulate_until_max_time(n / LAM)
    wall = time.perf_counter() - t
    recs = sim.get_all_records()
    return wall, np.asarray([r.exit_date - r.arrival_date for r in recs])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=400_000, help="requests per servesim run")
    ap.add_argument("--peer-requests", type=int, default=100_000, help="requests per Ciw / SimPy run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per model; the best wall time is kept")
    args = ap.parse_args()
    theory = mmc_sojourn_quantile(0.99, C, LAM, 1 / MEAN_MS)
    models = {
        "servesim (FCFS recursion)": (servesim, args.requests),
        "servesim (batch queue, compiled)": (
            lambda n, s: servesim(n, s, ["batching.max_queue_size=100000000"]),
            args.requests // 4,
        ),
        "SimPy, process per request": (simpy_idiomatic, args.peer_requests),
        "Ciw": (ciw_model, args.peer_requests),
    }
    rates = {}
    print(f"M/M/{C}, rho={RHO}, mean service {MEAN_MS} ms; Erlang C p99 sojourn = {theory:.2f} ms")
    print(f"{'model':32s} {'requests':>9s} {'best wall s':>11s} {'req/s':>12s} {'p99 ms':>8s} {'vs theory':>9s}")
    print(f"{'':32s} {'':9s} {'':11s} {'(best run)':>12s} {'(mean)':>8s}")
    for name, (fn, n) in models.items():
        best, p99s = np.inf, []
        for rep in range(args.repeat):
            wall, sojourn = fn(n, rep)
            best = min(best, wall)
            p99s.append(np.percentile(sojourn[len(sojourn) // 10 :], 99))  # first 10% as warm-up
        p99 = float(np.mean(p99s))
        rates[name] = n / best
        print(f"{name:32s} {n:9,d} {best:11.3f} {rates[name]:12,.0f} {p99:8.2f} {p99 / theory - 1:+9.1%}")
    base = rates["servesim (FCFS recursion)"]
    print()
    for name in ("Ciw", "SimPy, process per request"):
        print(
            f"servesim / {name}: {base / rates[name]:.1f}x   "
            f"(batch-queue path: {rates['servesim (batch queue, compiled)'] / rates[name]:.1f}x)"
        )


if __name__ == "__main__":
    main()
