"""The loop's core, whole: what the kernel counts busy on the MGET ranker's front-end core
against what the calibration counts there (the server's process, its redis-server and
this load generator), at open-loop rates as a calibration's levels run them, with the
hiccup meter on every core (as `calibrate run` has it) and without. The difference is CPU
on the loop's core that the fitted front end does not see: the meter, the kernel's
interrupts and softirqs for loopback, other processes.

    python calibrate/experiments/ranker_core_unaccounted.py   # ~2 minutes
    python calibrate/experiments/ranker_core_unaccounted.py --window-ms 0 --meter off
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time

import numpy as np

from calibrate.hiccups import HiccupMeter
from calibrate.loadgen import _frontend, _session, process_cpu_s, run_level
from calibrate.payloads import ranker_payloads
from calibrate.run import redis_pids
from calibrate.servers import get_json, redis_server, server

SERVER = ["--model", "ranker", "--max-batch-size", "32", "--feature-batch-size", "26"]


def core_busy_s(core: int) -> float:
    """Seconds core ``core`` has been busy (all but idle and iowait), from /proc/stat."""
    tick = os.sysconf("SC_CLK_TCK")
    for line in open("/proc/stat").read().splitlines():  # noqa: SIM115 - one read
        if line.startswith(f"cpu{core} "):
            v = [int(x) for x in line.split()[1:]]
            return (sum(v[:8]) - v[3] - v[4]) / tick
    raise ValueError(f"no cpu{core} in /proc/stat")


async def _level(url: str, payloads: list, rate: float, secs: float, core: int, redis: tuple[int, ...]) -> dict:
    async with _session() as session:
        fe0 = await _frontend(session, url)
    c0, r0, b0, t0 = time.process_time(), process_cpu_s(redis), core_busy_s(core), time.perf_counter()
    df = await run_level(url, "ranker", rate, payloads, duration_s=secs, min_queries=1, seed=int(rate))
    c1, r1, b1, t1 = time.process_time(), process_cpu_s(redis), core_busy_s(core), time.perf_counter()
    async with _session() as session:
        fe1 = await _frontend(session, url)
    wall = t1 - t0
    parts = {
        "server": (fe1["cpu_s"] - fe0["cpu_s"]) / wall,
        "client": (c1 - c0) / wall,
        "redis": (r1 - r0) / wall,
    }
    busy = (b1 - b0) / wall
    ok = df["status"] == 200
    return {
        "rate": rate,
        "answered": float(ok.sum() / wall),
        "p99_ms": float(np.quantile(df.loc[ok, "latency_ms"], 0.99)) if ok.any() else float("nan"),
        "busy": busy,
        **parts,
        "unaccounted": busy - sum(parts.values()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="300,700,1100,1350", help="Open-loop rates, req/s, comma-separated.")
    ap.add_argument("--secs", type=float, default=8.0)
    ap.add_argument("--window-ms", type=float, default=2.0, help="The server's batching window (2 as calibrated).")
    ap.add_argument("--meter", choices=("both", "off", "on"), default="both", help="Runs without and with the meter.")
    a = ap.parse_args()
    rates = [float(r) for r in a.rates.split(",")]
    before = os.sched_getaffinity(0)
    with (
        redis_server({0}) as redis,
        server([*SERVER, "--max-queue-delay-ms", str(a.window_ms), "--redis-url", redis]) as url,
    ):
        cfg = get_json(url + "/v2/models/ranker/config")["parameters"]["servesim"]
        front = cfg["frontend_cores"]
        inst = {i["core"] for i in cfg["instances"]}
        os.sched_setaffinity(0, front)  # this load generator on the loop's core, as a calibration runs
        try:
            payloads = ranker_payloads(32, cfg["model"]["dense"], 10_000, np.random.default_rng(0))
            pids = redis_pids(redis)
            for meter in {"both": (False, True), "off": (False,), "on": (True,)}[a.meter]:
                with HiccupMeter(list(range(os.cpu_count() or 1)), coarse=inst) if meter else contextlib.nullcontext():
                    for rate in rates:
                        r = asyncio.run(_level(url, payloads, rate, a.secs, front[0], pids))
                        print(  # noqa: T201
                            f"meter {'on ' if meter else 'off'} {r['rate']:6.0f} req/s (answered {r['answered']:6.0f}, "
                            f"p99 {r['p99_ms']:6.1f} ms): core {front[0]} busy {r['busy']:.3f}; server "
                            f"{r['server']:.3f}, client {r['client']:.3f}, redis {r['redis']:.3f}; "
                            f"unaccounted {r['unaccounted']:+.3f} cores"
                        )
        finally:
            os.sched_setaffinity(0, before)


if __name__ == "__main__":
    main()
