"""The napkin's prefix-cache estimate against the simulation (simulator/planning/prefix_cache.py):
Che's approximation of an LRU cache, given what the simulation ran (its completed rate and
its replicas' mean sequences a step), against the share of prompt tokens the simulated
replicas served from their caches, for the shipped scenarios with shared prefixes or
conversations and variants of their fleet and routing.

    python calibrate/experiments/prefix_cache_che.py     # about a minute
"""

from __future__ import annotations

from pathlib import Path

from simulator import load_scenario
from simulator.engine import simulate
from simulator.planning.llm_napkin import mean_tokens
from simulator.planning.prefix_cache import PrefixCache
from simulator.results.reduce import summarize

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
CASES = [
    ("llm_multiturn.yaml", []),
    ("llm_multiturn.yaml", ["workers.count=6"]),
    ("llm_multiturn.yaml", ["router.balancing=round_robin"]),
    ("llm_users.yaml", []),
    ("llm_users.yaml", ["workers.count=4"]),
    ("llm_rag_prefix.yaml", []),
    ("llm_rag_prefix.yaml", ["workers.count=8"]),
    ("llm_rag_prefix.yaml", ["router.balancing=prefix_affinity"]),
]


def main() -> None:
    print(f"{'scenario':<22} {'variant':<34} {'simulated':>9} {'Che':>6} {'T s':>6}")  # noqa: T201
    for name, sets in CASES:
        s = load_scenario(SCENARIOS / name, sets)
        out = summarize(simulate(s))
        rate = out["requests"]["throughput_rps"]
        running = out["batch_size"]["mean"]  # sequences a step, per replica
        e_s, e_o = mean_tokens(s)
        cache = PrefixCache(s)
        est = cache.at(s.workers.count, rate, running, e_s - cache.shared_mean + e_o / 2, e_o * 20.0)
        print(  # noqa: T201
            f"{name:<22} {' '.join(sets) or '(as shipped)':<34} {out['llm']['tokens']['prefix_hit_rate']:9.1%} "
            f"{est.reused / e_s:6.1%} {est.horizon_s:6.1f}"
        )


if __name__ == "__main__":
    main()
