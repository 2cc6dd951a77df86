"""What the MGET ranker's loop pays per request it holds (calibrate/README, "The loop pays for
what it holds"): a closed loop of N requests in flight, each sent when the last came back,
against a fresh server and redis-server on the front end's core, this load generator on the
model instance's core (off the loop's), ``--secs`` per N after a 3 s warm-up. Per N:
throughput, the CPU of the server's processes and the redis-server per request (from
/proc), the cores they used and the latency. Where the loop is saturated (N from 32), the
CPU per request against N by least squares: its slope over its value at N = 32 is the
share each further request held adds to the loop's work
(``preprocess.event_loop.cost_per_in_flight``).

    python calibrate/experiments/ranker_in_flight_cost.py   # ~2 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import time

import numpy as np

from calibrate.payloads import ranker_payloads
from calibrate.servers import get_json, redis_server, server

SERVER = ["--model", "ranker", "--max-batch-size", "32", "--max-queue-delay-ms", "2", "--feature-batch-size", "26"]


def cpu_s(pids: list[int]) -> float:
    """User and system CPU of ``pids`` so far, s."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


async def closed(url: str, payloads, n: int, secs: float) -> tuple[int, np.ndarray]:
    """``n`` requests in flight for ``secs``: how many came back 200, and their latencies (ms)."""
    import aiohttp

    done, lat = 0, []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=n + 8)) as session:
        stop = time.perf_counter() + secs

        async def worker(k: int) -> None:
            nonlocal done
            while time.perf_counter() < stop:
                p = payloads[k % len(payloads)]
                k += n
                t0 = time.perf_counter()
                async with session.post(url + "/v2/models/ranker/infer", data=p.body, headers=p.headers) as r:
                    await r.read()
                    if r.status == 200:
                        done += 1
                        lat.append(time.perf_counter() - t0)

        await asyncio.gather(*(worker(k) for k in range(n)))
    return done, np.array(lat) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--in-flight", default="2,8,32,64,128,256", help="Requests in flight, comma-separated.")
    ap.add_argument("--secs", type=float, default=12.0)
    a = ap.parse_args()
    counts = [int(n) for n in a.in_flight.split(",")]
    before = os.sched_getaffinity(0)
    rows = []
    with redis_server({0}) as redis, server([*SERVER, "--redis-url", redis]) as url:
        cfg = get_json(url + "/v2/models/ranker/config")["parameters"]["servesim"]
        os.sched_setaffinity(0, {i["core"] for i in cfg["instances"]})
        try:
            found = subprocess.run(["pgrep", "-f", "servesim serve|redis-server"], capture_output=True, text=True)
            pids = [int(p) for p in found.stdout.split()]
            payloads = ranker_payloads(32, cfg["model"]["dense"], 10_000, np.random.default_rng(0))
            asyncio.run(closed(url, payloads, 8, 3.0))  # warm
            for n in counts:
                c0, t0 = cpu_s(pids), time.perf_counter()
                done, lat = asyncio.run(closed(url, payloads, n, a.secs))
                c1, t1 = cpu_s(pids), time.perf_counter()
                rows.append((n, done / (t1 - t0), (c1 - c0) / done * 1e3, (c1 - c0) / (t1 - t0)))
                print(  # noqa: T201
                    f"{n:4d} in flight: {rows[-1][1]:6.0f} req/s, CPU {rows[-1][2]:.3f} ms a request, "
                    f"{rows[-1][3]:.2f} cores, latency p50 {np.median(lat):.1f} p99 {np.quantile(lat, 0.99):.1f} ms",
                    flush=True,
                )
        finally:
            os.sched_setaffinity(0, before)
    sat = [(n, c) for n, _, c, _ in rows if n >= 32]
    if len(sat) >= 2:
        slope, icpt = np.polyfit([n for n, _ in sat], [c for _, c in sat], 1)
        at32 = icpt + 32 * slope
        print(f"from 32 in flight: {slope * 1e3:.3f} µs more CPU a request per request held, {slope / at32:.5f} of it")  # noqa: T201


if __name__ == "__main__":
    main()
