"""The ranker's fetch with a first-come first-served wait for a Redis connection
(calibrate/README, "A fair wait for a connection"): the server as it is against the server
at ``--before`` (by default the last commit on redis-py's BlockingConnectionPool, whose
waiters a newcomer could overtake), the same load generator, rates and seeds. Each
condition is a fresh redis-server and server (the earlier one from a temporary git
worktree on PYTHONPATH), in a random order per round, the load generator on the front
end's core as `servesim calibrate run` keeps it; ``--secs`` a rate after a 5 s warm-up.
Per condition and rate: latency p50/p99/p99.9 and the fetch's p50/p90/p99 and maximum, ms,
and the fetches over 20 ms; each round's and the rounds' mean.

    python calibrate/experiments/ranker_fair_pool.py   # ~8 minutes, from the repository root
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from ranker_client_core import show
from ranker_fetch_task import compare

BEFORE = "6f4315e"  # the last commit whose fetches waited on redis-py's BlockingConnectionPool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="1050,1280,1400", help="Open-loop rates, req/s, comma-separated.")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--secs", type=float, default=30.0)
    ap.add_argument("--before", default=BEFORE, help="The commit to compare with.")
    a = ap.parse_args()
    rates = [float(r) for r in a.rates.split(",")]
    conditions = {"blocking pool (before)": a.before, "fair wait": None}
    show(compare(conditions, rates, a.secs, a.rounds, "pool", tails=True), "pool")


if __name__ == "__main__":
    main()
