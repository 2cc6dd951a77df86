"""Fetches waiting for a pooled Redis connection (calibrate/README, "A fair wait for a
connection"): N fetches back to back through the server's own client
(:class:`reference_server.features.FeatureStore`, the ranker's one MGET of 26 keys) on 32
pooled connections against a fresh redis-server, for ``--secs`` each, on uvloop, this
process and the redis-server on one core. Per N: fetches/s, the fetches that waited out
the pool's 1 s timeout (a 503 each in the server), and the wall time of those that
succeeded (p50/p99/max, ms). With ``--before REV`` the same again with the client at that
commit (a temporary git worktree on PYTHONPATH, in a process of its own).

    python calibrate/experiments/fetch_pool_fairness.py --before 6f4315e   # ~1 minute
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from ranker_fetch_task import server_at


def level(url: str, n: int, secs: float) -> str:
    from reference_server.features import FeatureStore, FeatureStoreConfig, StoreUnavailable

    cfg = FeatureStoreConfig(url=url, keys=26, batch_size=26, entities=2000, max_connections=32)
    rng = np.random.default_rng(0)

    async def go() -> tuple[np.ndarray, int]:
        store = FeatureStore(cfg)
        await store.populate(1000)
        walls, failed, stop = [], 0, time.perf_counter() + secs

        async def worker() -> None:
            nonlocal failed
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                try:
                    await store.fetch(rng.integers(0, cfg.entities, 1))
                    walls.append(time.perf_counter() - t0)
                except StoreUnavailable:
                    failed += 1

        try:
            await asyncio.gather(*(worker() for _ in range(n)))
        finally:
            await store.close()
        return np.array(walls) * 1e3, failed

    import uvloop

    w, failed = uvloop.run(go())
    return (
        f"{n:4d} in flight: {len(w) / secs:6.0f} fetches/s, {failed:3d} timed out, "
        f"wall p50 {np.median(w):6.2f} p99 {np.quantile(w, 0.99):6.2f} max {w.max():7.1f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--in-flight", default="16,40,64,128", help="Fetches in flight, comma-separated.")
    ap.add_argument("--secs", type=float, default=3.0)
    ap.add_argument("--before", help="Also the client at this commit.")
    ap.add_argument("--url", help=argparse.SUPPRESS)  # a redis-server already running (the --before child)
    a = ap.parse_args()
    counts = [int(n) for n in a.in_flight.split(",")]
    if a.url is not None:
        for n in counts:
            print(level(a.url, n, a.secs), flush=True)  # noqa: T201
        return
    from calibrate.servers import redis_server

    os.sched_setaffinity(0, {0})
    with redis_server({0}) as url:
        runs = [("as it is", None)] + ([(f"at {a.before}", a.before)] if a.before else [])
        for name, rev in runs:
            print(f"client {name}:", flush=True)  # noqa: T201
            with server_at(rev):
                args = [sys.executable, __file__, "--url", url, "--in-flight", a.in_flight, "--secs", str(a.secs)]
                subprocess.run(args, check=True)


if __name__ == "__main__":
    main()
