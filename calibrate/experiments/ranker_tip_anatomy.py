"""What core 0 does while a busy slice tips (calibrate/README, "The ranker on a slower host").
The MGET ranker served as a calibration serves it (its instance on core 1; the front end, its
redis-server and this load generator on core 0), through pairs of slices, a light one and
then a busy one, each on fresh connections as a calibration sends them. A sampler on core 1
reads every 2 ms the scheduler's clocks (``/proc/PID/task/TID/schedstat``) of every thread of
the front end, of the redis-server and of this load generator, and core 0's idle and stolen
time (``/proc/stat``).

Per busy slice and per ``--bin-ms`` of its first second: the requests scheduled and answered,
the requests in the system at the bin's end, the median latency of those scheduled in it, and
the milliseconds of core 0 each process ran, the idle and the stolen. Then the bins averaged
over the slices that tipped (p99 past 100 ms) and over those that did not: whether a slice
that tips has its core full (a cost per request that grew) or idle while requests wait (a
wait that is not the core's).

    python calibrate/experiments/ranker_tip_anatomy.py --light 140 --busy 400 --pairs 8   # ~2 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.experiments.ranker_in_flight_cost import SERVER
from calibrate.experiments.ranker_tipping import TIPPED_MS
from calibrate.loadgen import CONNECTIONS, TIMING_KEYS, schedule
from calibrate.payloads import ranker_payloads
from calibrate.run import redis_pids
from calibrate.sender import parse, request_bytes, send_on_schedule
from calibrate.servers import get_json, redis_server, server

PROCS = ("loop", "frontend_other", "redis", "generator")
TICK_MS = 1e3 / os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> list[int]:
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))


def cpu0() -> tuple[float, float]:
    """Core 0's idle (with I/O wait) and stolen time so far, ms."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu0 "):
                v = [int(x) for x in line.split()[1:]]
                return (v[3] + v[4]) * TICK_MS, v[7] * TICK_MS
    raise RuntimeError("no cpu0 in /proc/stat")


def sample(groups: list[list[str]], core: int, period_s: float, stop, out) -> None:
    """Every ``period_s`` on ``core``: perf_counter ms, each group's run ms summed over its
    threads' schedstat, then core 0's idle and stolen ms."""
    os.sched_setaffinity(0, {core})
    files = [[open(p) for p in g] for g in groups]  # noqa: SIM115 -- kept open for the run
    rows = []
    try:
        while not stop.is_set():
            row = [time.perf_counter_ns() / 1e6]
            for fs in files:
                run = 0
                for f in fs:
                    f.seek(0)
                    run += int(f.read().split()[0])
                row.append(run / 1e6)
            row.extend(cpu0())
            rows.append(row)
            time.sleep(period_s)
    finally:
        for fs in files:
            for f in fs:
                f.close()
    out.put(np.array(rows))


async def run(url: str, dense: int, light: float, busy: float, pairs: int, slice_s: float) -> list[pd.DataFrame]:
    payloads = ranker_payloads(32, dense, 10_000, np.random.default_rng(0))
    requests = [request_bytes(url, "/v2/models/ranker/infer", p.body, p.headers) for p in payloads]
    slices = []
    for k in range(pairs):
        for rate in (light, busy):
            rng = np.random.default_rng([k, int(rate)])
            times = schedule(rate, slice_s, 1, rng)
            pick = rng.integers(0, len(payloads), len(times))
            rows = await send_on_schedule(url, requests, times, pick, connections=CONNECTIONS)
            for r in rows:
                r["at_ms"] = r.get("_scheduled", np.nan) * 1e3
            rows = pd.DataFrame(parse(rows, TIMING_KEYS))
            await asyncio.sleep(0.2)  # the calibration's gap between slices
        slices.append(rows)
    return slices


def bins(rows: pd.DataFrame, samples: np.ndarray, bin_ms: float, first_ms: float) -> pd.DataFrame:
    """One busy slice's first ``first_ms``, bin by bin."""
    start = rows["at_ms"].min()
    edges = start + np.arange(0.0, first_ms + bin_ms / 2, bin_ms)
    done = rows["at_ms"] + rows["latency_ms"]
    out = pd.DataFrame({"bin_ms": edges[:-1] - start})
    out["scheduled"] = np.histogram(rows["at_ms"], edges)[0]
    out["answered"] = np.histogram(done.dropna(), edges)[0]
    out["in_system"] = [int(((rows["at_ms"] <= e) & ~(done <= e)).sum()) for e in edges[1:]]
    which = np.searchsorted(edges, rows["at_ms"], side="right") - 1
    med = rows["latency_ms"].groupby(which).median()
    out["median_ms"] = med.reindex(range(len(out))).to_numpy()
    t = samples[:, 0]
    for k, name in enumerate([*PROCS, "idle", "stolen"]):
        out[f"{name}_ms"] = np.diff(np.interp(edges, t, samples[:, 1 + k]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--light", type=float, default=140.0, help="The light slice's rate, req/s.")
    ap.add_argument("--busy", type=float, default=400.0, help="The busy slice's rate, req/s (85%% of capacity).")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--slice-s", type=float, default=4.0)
    ap.add_argument("--bin-ms", type=float, default=100.0)
    ap.add_argument("--first-ms", type=float, default=1000.0)
    ap.add_argument("--out", type=Path, help="Write every busy slice's bins here (CSV).")
    ap.add_argument("--rows", type=Path, help="Write every busy slice's requests here (CSV).")
    a = ap.parse_args()
    before = os.sched_getaffinity(0)
    sampler = None
    with redis_server({0}) as redis, server([*SERVER, "--redis-url", redis]) as url:
        cfg = get_json(url + "/v2/models/ranker/config")["parameters"]["servesim"]
        fe = cfg["frontend_pid"]
        task = "/proc/{}/task/{}/schedstat"
        groups = [
            [task.format(fe, fe)],
            [task.format(fe, t) for t in threads(fe) if t != fe],
            [task.format(p, t) for p in redis_pids(redis) for t in threads(p)],
            [task.format(os.getpid(), t) for t in threads(os.getpid())],
        ]
        stop, out = mp.Event(), mp.Queue()
        sampler = mp.Process(target=sample, args=(groups, cfg["instances"][0]["core"], 0.002, stop, out), daemon=True)
        os.sched_setaffinity(0, set(cfg["frontend_cores"]))
        try:
            sampler.start()
            slices = asyncio.run(run(url, cfg["model"]["dense"], a.light, a.busy, a.pairs, a.slice_s))
            stop.set()
            samples = out.get(timeout=30)
            sampler.join(timeout=10)
        finally:
            if sampler.is_alive():
                sampler.kill()
            os.sched_setaffinity(0, before)
    frames = []
    for k, rows in enumerate(slices):
        ok = rows[rows["status"] == 200]
        b = bins(rows, samples, a.bin_ms, a.first_ms)
        b["slice"] = k
        b["tipped"] = bool(np.percentile(ok["latency_ms"], 99) > TIPPED_MS[-1])
        frames.append(b)
    allb = pd.concat(frames, ignore_index=True)
    if a.rows:
        pd.concat([r.assign(slice=k) for k, r in enumerate(slices)], ignore_index=True).to_csv(a.rows, index=False)
    if a.out:
        allb.to_csv(a.out, index=False)
    cols = ["scheduled", "answered", "in_system", "median_ms", *[f"{n}_ms" for n in [*PROCS, "idle", "stolen"]]]
    for tipped, g in allb.groupby("tipped"):
        n = g["slice"].nunique()
        print(f"\n{'tipped' if tipped else 'did not tip'}: {n} of {len(slices)} busy slices, means by bin")  # noqa: T201
        print(g.groupby("bin_ms")[cols].mean().round(1).to_markdown())  # noqa: T201


if __name__ == "__main__":
    main()
