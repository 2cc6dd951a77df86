"""How a closed loop's run starts (README, "Multi-turn conversations"): the turns a minute
sent in the first minutes of a long run against its steady rate, averaged over seeds.

A closed loop cannot start in its exact steady state (the answers before time 0 were never
computed): conversations under way at time 0 are placed as if those answers had taken no
time, and a population's users each start a first turn within a think time of 0. This
measures what that costs, so that the warm-up the run command asks for is sized from a
measurement. ``llm_multiturn.yaml`` closed (``--mode sessions``), or 1,000 users of its
conversations (``--mode users``), each 1,200 s with no warm-up; printed: each minute's
turns a second over the seeds and their mean prompt (how far the conversations have grown),
and each one's departure from the last ten minutes'.

    python calibrate/experiments/closed_loop_start.py --mode sessions --seeds 1-6   # about 2 minutes
    python calibrate/experiments/closed_loop_start.py --mode users --seeds 1-4
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from simulator import load_scenario
from simulator.engine import simulate

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "llm_multiturn.yaml"
MODES = {
    "sessions": ["traffic.tokens.sessions.turn_gap_from=answer"],
    "users": [
        "traffic.rate_rps=null",
        "traffic.tokens.sessions.users=1000",
        "traffic.tokens.sessions.turn_gap_from=answer",
    ],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=sorted(MODES), default="sessions")
    ap.add_argument("--seeds", default="1-6", help="a range lo-hi, or a comma list")
    ap.add_argument("--duration-s", type=float, default=1200.0)
    a = ap.parse_args()
    lo, _, hi = a.seeds.partition("-")
    seeds = range(int(lo), int(hi) + 1) if hi else [int(x) for x in a.seeds.split(",")]
    s = load_scenario(SCENARIO, [*MODES[a.mode], f"duration_s={a.duration_s:g}", "warmup_s=0"])
    edges = np.arange(0.0, a.duration_s + 1.0, 60.0)
    rate, tokens = np.zeros(len(edges) - 1), np.zeros(len(edges) - 1)
    for seed in seeds:
        r = simulate(s, seed=seed).records
        arrival_s = r.arrival / 1000.0
        rate += np.histogram(arrival_s, edges)[0] / 60.0 / len(seeds)
        tokens += np.histogram(arrival_s, edges, weights=r.prompt_tokens)[0] / 60.0 / len(seeds)
    prompt = tokens / rate  # the mean prompt of a minute's turns: how far the conversations have grown
    steady, steady_prompt = rate[-10:].mean(), tokens[-10:].sum() / rate[-10:].sum()
    print(  # noqa: T201
        f"{a.mode}, seeds {list(seeds)}: steady {steady:.2f} turns/s, mean prompt {steady_prompt:,.0f} tokens "
        "(the last ten minutes)"
    )
    for k, (r, p) in enumerate(zip(rate, prompt, strict=True)):
        print(  # noqa: T201
            f"  minute {k + 1:2d}: {r:6.2f} turns/s {r / steady - 1:+6.1%}, "
            f"prompt {p:6,.0f} {p / steady_prompt - 1:+6.1%}"
        )


if __name__ == "__main__":
    main()
