"""What the MGET ranker's loop pays for what it holds (calibrate/README, "The loop pays for
what it holds"): a closed loop of N requests in flight, each sent when the last came back,
against a fresh server and redis-server on the front end's core, this load generator on the
model instance's core (off the loop's), ``--secs`` per N after 2 s at 8
(:func:`calibrate.held.in_flight_cost`). Per N: throughput, the CPU of the server's process
(its /metrics) and the redis-server's (/proc) per request, the cores they used and the
latency. Where the loop is saturated (N from 32), the CPU per request against N by least
squares: its slope over its value at N = 32 is the share each further request held adds
to the loop's work (``preprocess.event_loop.cost_per_in_flight``).

    python calibrate/experiments/ranker_in_flight_cost.py   # ~2 minutes
    python calibrate/experiments/ranker_in_flight_cost.py --in-flight 16,24,32,40,48,64,96,128,256 \
        --secs 6 --redis-connections 256   # the pool past every count: no fetch waits for a connection
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from calibrate.held import in_flight_cost, share_per_request
from calibrate.payloads import ranker_payloads
from calibrate.run import redis_pids
from calibrate.servers import get_json, redis_server, server

SERVER = ["--model", "ranker", "--max-batch-size", "32", "--max-queue-delay-ms", "2", "--feature-batch-size", "26"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--in-flight", default="2,8,32,64,128,256", help="Requests in flight, comma-separated.")
    ap.add_argument("--secs", type=float, default=12.0)
    ap.add_argument("--redis-connections", type=int, default=32, help="The server's Redis pool (its default: 32).")
    a = ap.parse_args()
    counts = tuple(int(n) for n in a.in_flight.split(","))
    before = os.sched_getaffinity(0)
    with (
        redis_server({0}) as redis,
        server([*SERVER, "--redis-connections", str(a.redis_connections), "--redis-url", redis]) as url,
    ):
        cfg = get_json(url + "/v2/models/ranker/config")["parameters"]["servesim"]
        os.sched_setaffinity(0, {i["core"] for i in cfg["instances"]})
        try:
            payloads = ranker_payloads(32, cfg["model"]["dense"], 10_000, np.random.default_rng(0))
            held = in_flight_cost(url, "ranker", payloads, sidecars=redis_pids(redis), in_flight=counts, secs=a.secs)
        finally:
            os.sched_setaffinity(0, before)
    for r in held["by_in_flight"]:
        print(  # noqa: T201
            f"{r['in_flight']:4d} in flight: {r['rps']:6.0f} req/s, CPU {r['cpu_ms_per_request']:.3f} ms a request, "
            f"{r['cores']:.2f} cores, latency p50 {r['p50_ms']:.1f} p99 {r['p99_ms']:.1f} ms"
        )
    share = share_per_request([r for r in held["by_in_flight"] if r["in_flight"] >= 32])
    shown = f"{share:.5f}" if share is not None else "none"
    print(f"from 32 in flight: {shown} of the CPU a request per request held")  # noqa: T201


if __name__ == "__main__":
    main()
