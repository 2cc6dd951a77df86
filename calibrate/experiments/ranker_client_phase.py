"""Whether the load generator makes the server's quiet time after a dispatch (calibrate/README,
"The queue's share of the light loads' p50"): the MGET ranker at one open-loop rate, this
load generator on the loop's core (as `calibrate run` has it) or on the instance's core,
and the share of the requests per ms the server receives and queues in each bin after its
latest batch dispatch (:func:`ranker_batch_phase.density`), the batch size, the p50 and the
send lag; the generator waking at each request's time (``precise``, a timerfd) or on its
loop's millisecond timers (``ms``, as every run before fp9 did), in turn.

    python calibrate/experiments/ranker_client_phase.py --rate 350 --secs 10   # ~2 minutes
    python calibrate/experiments/ranker_client_phase.py --rate 800 --places loop --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import os

import numpy as np
import pandas as pd
from ranker_batch_phase import EDGES, density

from calibrate.loadgen import run_level
from calibrate.payloads import ranker_payloads
from calibrate.servers import get_json, redis_server, server

SERVER = ["--model", "ranker", "--max-batch-size", "32", "--max-queue-delay-ms", "2", "--feature-batch-size", "26"]


def phases(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, float, float, float]:
    ok = df[(df["status"] == 200) & df["dispatched_at_ns"].notna()]
    d = np.unique(ok["dispatched_at_ns"].to_numpy() / 1e6)
    recv = density(ok["received_at_ns"].to_numpy() / 1e6, d)
    enq = density(ok["enqueued_at_ns"].to_numpy() / 1e6, d)
    per_batch = ok.groupby("dispatched_at_ns")["batch_size"].first()
    queue = (ok["dispatched_at_ns"] - ok["enqueued_at_ns"]).median() / 1e6
    return recv, enq, float(per_batch.mean()), float(ok["latency_ms"].median()), float(queue)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=350.0)
    ap.add_argument("--secs", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--places", default="loop,instance", help="where the generator runs: loop, instance or both")
    ap.add_argument("--wakes", default="precise,ms", help="how the generator wakes: precise, ms or both")
    a = ap.parse_args()
    wakes = a.wakes.split(",")
    if not set(wakes) <= {"precise", "ms"} or not set(a.places.split(",")) <= {"loop", "instance"}:
        ap.error("--wakes takes precise and/or ms; --places loop and/or instance")
    before = os.sched_getaffinity(0)
    with redis_server({0}) as redis, server([*SERVER, "--redis-url", redis]) as url:
        cfg = get_json(url + "/v2/models/ranker/config")["parameters"]["servesim"]
        places = {"loop": set(cfg["frontend_cores"]), "instance": {i["core"] for i in cfg["instances"]}}
        places = {k: v for k, v in places.items() if k in a.places.split(",")}
        payloads = ranker_payloads(32, cfg["model"]["dense"], 10_000, np.random.default_rng(0))
        print(f"{a.rate:g} req/s, bins after a dispatch (ms): {EDGES.tolist()}")  # noqa: T201
        try:
            for r in range(a.rounds):
                for name, cores in places.items():
                    os.sched_setaffinity(0, cores)
                    for wake in wakes:
                        df = asyncio.run(
                            run_level(
                                url,
                                "ranker",
                                a.rate,
                                payloads,
                                duration_s=a.secs,
                                min_queries=1,
                                seed=r,
                                precise=wake == "precise",
                            )
                        )
                        recv, enq, size, p50, queue = phases(df)
                        lag = np.percentile(df["send_lag_ms"], [50, 99])
                        print(  # noqa: T201
                            f"round {r}, the load generator on the {name}'s core, waking {wake}: "
                            f"receipts {np.round(recv, 3).tolist()}, queue arrivals {np.round(enq, 3).tolist()}; "
                            f"a batch {size:.2f}, queue p50 {queue:.2f} ms, p50 {p50:.2f} ms, "
                            f"send lag p50 {lag[0]:.3f}, p99 {lag[1]:.3f} ms"
                        )
        finally:
            os.sched_setaffinity(0, before)


if __name__ == "__main__":
    main()
