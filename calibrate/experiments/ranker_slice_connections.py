"""Does a busy slice tip at its start because its connections are new? (calibrate/README, "The
ranker on a slower host"). A calibration's load generator opens 64 fresh connections before
each slice and closes them all after it, so the server's loop accepts and tears down a slice's
worth of connections just as the slice begins. This runs the MGET ranker, on a redis-server and
a load generator sharing the front end's core as a calibration places them, through pairs of
slices, a light one and then a busy one, in two arms that alternate pair by pair:

* ``fresh``: as a calibration sends them, a new set of connections for each slice;
* ``kept``: one set of connections for the whole run, grown as needed and never closed (they
  stay open, idle, through the other arm's slices too).

For the busy slices of each arm it prints how many tipped (p99 past 100 ms) and how many were
past 30 ms at the median of their first second, and the medians over the slices of the p99
and of the first 100 ms's median.

    python calibrate/experiments/ranker_slice_connections.py --light 140 --busy 400 --pairs 8  # ~3 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import os

import numpy as np

from calibrate.experiments.ranker_in_flight_cost import SERVER
from calibrate.experiments.ranker_tipping import FIRST_S, TIPPED_MS, shares
from calibrate.loadgen import CONNECTIONS, TIMING_KEYS, schedule
from calibrate.payloads import ranker_payloads
from calibrate.sender import Sender, parse, request_bytes, send_on_schedule
from calibrate.servers import get_json, redis_server, server

WARMUP_S = 0.25
ARMS = ("fresh", "kept")


def busy_slice(rows: list[dict]) -> dict[str, float]:
    """A busy slice's p99, the median of its first second (:data:`FIRST_S`) and of its first
    100 ms after the warm-up, of its answered requests (ms)."""
    at = np.array([r["scheduled_s"] for r in rows if r.get("status") == 200])
    lat = np.array([r["latency_ms"] for r in rows if r.get("status") == 200])
    kept = at >= WARMUP_S
    at, lat = at[kept], lat[kept]
    return {
        "p99": float(np.percentile(lat, 99)),
        "first_s": float(np.median(lat[at < WARMUP_S + FIRST_S])),
        "first_100ms": float(np.median(lat[at < WARMUP_S + 0.1])),
    }


async def run(url: str, dense: int, light: float, busy: float, pairs: int, slice_s: float) -> dict[str, list[dict]]:
    payloads = ranker_payloads(32, dense, 10_000, np.random.default_rng(0))
    requests = [request_bytes(url, "/v2/models/ranker/infer", p.body, p.headers) for p in payloads]
    kept = Sender(url, CONNECTIONS)
    await kept.start(64)
    out: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    try:
        for k in range(pairs):
            for arm in ARMS if k % 2 == 0 else ARMS[::-1]:  # ABBA: neither arm always first
                for rate in (light, busy):
                    rng = np.random.default_rng([k, int(rate), ARMS.index(arm)])
                    times = schedule(rate, slice_s, 1, rng)
                    pick = rng.integers(0, len(payloads), len(times))
                    sender = kept if arm == "kept" else None
                    rows = await send_on_schedule(url, requests, times, pick, connections=CONNECTIONS, sender=sender)
                    rows = parse(rows, TIMING_KEYS)
                    await asyncio.sleep(0.2)  # the calibration's gap between slices
                out[arm].append(busy_slice(rows))
    finally:
        kept.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--light", type=float, default=140.0, help="The light slice's rate, req/s.")
    ap.add_argument("--busy", type=float, default=400.0, help="The busy slice's rate, req/s (85%% of capacity).")
    ap.add_argument("--pairs", type=int, default=8, help="Pairs of slices per arm.")
    ap.add_argument("--slice-s", type=float, default=4.0)
    a = ap.parse_args()
    before = os.sched_getaffinity(0)
    with redis_server({0}) as redis, server([*SERVER, "--redis-url", redis]) as url:
        cfg = get_json(url + "/v2/models/ranker/config")["parameters"]["servesim"]
        os.sched_setaffinity(0, set(cfg["frontend_cores"]))  # as a calibration places its load generator
        try:
            out = asyncio.run(run(url, cfg["model"]["dense"], a.light, a.busy, a.pairs, a.slice_s))
        finally:
            os.sched_setaffinity(0, before)
    head = f"| connections | busy slices tipped (p99 > {TIPPED_MS[-1]:g} ms) |"
    head += f" first second's median > {TIPPED_MS[0]:g} ms | median p99 | median of the first 100 ms |"
    print(head)  # noqa: T201
    print("|---|---|---|---|---|")  # noqa: T201
    for arm, got in out.items():
        p99 = np.array([g["p99"] for g in got])
        first = np.array([g["first_s"] for g in got])
        early = np.array([g["first_100ms"] for g in got])
        _, tipped, started = (round(s * len(got)) for s in shares(p99, first))
        print(  # noqa: T201
            f"| {arm} | {tipped}/{len(got)} | {started}/{len(got)} | "
            f"{np.median(p99):.1f} ms | {np.median(early):.1f} ms |"
        )


if __name__ == "__main__":
    main()
