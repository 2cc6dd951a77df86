"""Who waits for the loop's core when the MGET ranker's slowest requests are slow (calibrate/README,
"The batcher is a task on the loop", its last paragraph): the ranker served as `calibrate run`
serves it (its instance on core 1; the front end, its redis-server and this load generator on
core 0), one open-loop level, while a sampler on core 1 reads each process's scheduler
statistics (``/proc/PID/schedstat``: time on the CPU, time waiting on a run queue) every 2 ms.
Per 10 ms window: how long each of the three ran and waited for core 0, and the slowest latency
of the requests received in it; then the windows that hold the slowest 1% of requests against
the rest, and how much of them the loop was runnable (running or waiting for its core).

    python calibrate/experiments/ranker_runqueue.py --rate 800 --secs 20   # ~1 minute
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time

import numpy as np
import pandas as pd
from ranker_client_phase import SERVER

from calibrate.loadgen import _run, run_level
from calibrate.payloads import ranker_payloads
from calibrate.run import redis_pids
from calibrate.servers import get_json, redis_server, server

WINDOW_MS = 10.0


def schedstat(pid: int) -> tuple[int, int]:
    """Nanoseconds ``pid``'s main thread has run, and waited on a run queue."""
    with open(f"/proc/{pid}/schedstat") as f:
        run, wait, _ = f.read().split()
    return int(run), int(wait)


def sample(pids: list[int], core: int, period_s: float, stop, out) -> None:
    """Every ``period_s`` on ``core``: (perf_counter ns, then run and wait ns of each pid)."""
    os.sched_setaffinity(0, {core})
    rows = []
    while not stop.is_set():
        row = [time.perf_counter_ns()]
        for pid in pids:
            row += schedstat(pid)
        rows.append(row)
        time.sleep(period_s)
    out.put(np.array(rows, dtype=np.int64))


def windows(samples: np.ndarray, names: list[str], df: pd.DataFrame) -> pd.DataFrame:
    """Per window: each process's run-queue wait (ms), and the slowest request received in it."""
    t = samples[:, 0] / 1e6
    edges = np.arange(t[0], t[-1], WINDOW_MS)
    out = pd.DataFrame({"start_ms": edges[:-1]})
    for k, name in enumerate(names):
        run = np.interp(edges, t, samples[:, 1 + 2 * k] / 1e6)
        wait = np.interp(edges, t, samples[:, 2 + 2 * k] / 1e6)
        out[f"{name}_run_ms"] = np.diff(run)
        out[f"{name}_wait_ms"] = np.diff(wait)
    ok = df[(df["status"] == 200) & df["received_at_ns"].notna()]
    w = np.searchsorted(edges, ok["received_at_ns"].to_numpy() / 1e6, side="right") - 1
    keep = (w >= 0) & (w < len(out))
    lat = pd.Series(ok["latency_ms"].to_numpy()[keep]).groupby(w[keep])
    out["slowest_ms"] = lat.max().reindex(range(len(out))).to_numpy()
    out["received"] = lat.size().reindex(range(len(out))).fillna(0).to_numpy()
    return out.dropna()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=800.0)
    ap.add_argument("--secs", type=float, default=20.0)
    a = ap.parse_args()
    before = os.sched_getaffinity(0)
    sampler = None
    with redis_server({0}) as redis, server([*SERVER, "--redis-url", redis]) as url:
        cfg = get_json(url + "/v2/models/ranker/config")["parameters"]["servesim"]
        inst = [i["core"] for i in cfg["instances"]]
        names = ["loop", "redis", "generator"]
        pids = [cfg["frontend_pid"], redis_pids(redis)[0], os.getpid()]
        payloads = ranker_payloads(32, cfg["model"]["dense"], 10_000, np.random.default_rng(0))
        try:
            os.sched_setaffinity(0, set(cfg["frontend_cores"]))
            _run(run_level(url, "ranker", a.rate, payloads, duration_s=2.0, min_queries=1, seed=99))  # warm
            stop, out = mp.Event(), mp.Queue()
            sampler = mp.Process(target=sample, args=(pids, inst[0], 0.002, stop, out), daemon=True)
            sampler.start()
            df = _run(run_level(url, "ranker", a.rate, payloads, duration_s=a.secs, min_queries=1, seed=0))
            stop.set()
            samples = out.get(timeout=30)
            sampler.join(timeout=10)
        finally:
            if sampler is not None and sampler.is_alive():
                sampler.kill()
            os.sched_setaffinity(0, before)
    w = windows(samples, names, df)
    p99 = df.loc[df["status"] == 200, "latency_ms"].quantile(0.99)
    slow = w["slowest_ms"] >= p99
    print(f"{a.rate:g} req/s for {a.secs:g} s: p50 {df['latency_ms'].median():.2f}, p99 {p99:.2f} ms")  # noqa: T201
    print(f"{len(w)} windows of {WINDOW_MS:g} ms, {int(slow.sum())} holding a request at or past the p99")  # noqa: T201
    for name in names:
        col = w[f"{name}_wait_ms"]
        print(  # noqa: T201
            f"  {name:9s} waited for its core: {col[slow].mean():.3f} ms a window in those, {col[~slow].mean():.3f} "
            f"in the rest (90th percentile {col[slow].quantile(0.9):.3f} against {col[~slow].quantile(0.9):.3f}); "
            f"Spearman with the window's slowest latency {col.corr(w['slowest_ms'], method='spearman'):+.2f}"
        )
    busy = (w["loop_run_ms"] + w["loop_wait_ms"]) / WINDOW_MS  # runnable: running or waiting for the core
    print(  # noqa: T201
        f"  requests received a window {w['received'][slow].mean():.1f} in those, {w['received'][~slow].mean():.1f} "
        f"in the rest; the loop's CPU a request received {(w['loop_run_ms'] / w['received'])[slow].median():.3f} "
        f"against {(w['loop_run_ms'] / w['received'])[~slow].median():.3f} ms (medians)"
    )
    print(  # noqa: T201
        f"  the loop runnable {busy[slow].mean():.0%} of those windows ({busy[slow].quantile(0.9):.0%} at the 90th "
        f"percentile), {busy[~slow].mean():.0%} of the rest; core 0 used by the three "
        f"{(w[[f'{n}_run_ms' for n in names]].sum(axis=1)[slow] / WINDOW_MS).mean():.0%} against "
        f"{(w[[f'{n}_run_ms' for n in names]].sum(axis=1)[~slow] / WINDOW_MS).mean():.0%}"
    )


if __name__ == "__main__":
    main()
