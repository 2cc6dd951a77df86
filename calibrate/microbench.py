"""Forward time per batch size, in-process, after warm-up: the model alone, no server.

On a GPU each forward is timed with CUDA events (the GPU's own clock, so host jitter does
not leak in); on the CPU with ``perf_counter_ns``.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd


def batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, … up to and including ``max_batch``."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return [*out, max_batch]


def microbench(
    model_cfg, precisions: list[str], max_batch: int, *, repeats: int = 30, warmup: int = 5, seed: int = 0
) -> pd.DataFrame:
    """p50/p95/p99/mean forward time (ms) per precision and batch size."""
    import torch

    from reference_server.models import ServedModel

    rng = np.random.default_rng(seed)
    rows = []
    for precision in precisions:
        model_cfg.precision = precision
        model = ServedModel(model_cfg)
        cuda = model.device.type == "cuda"
        for b in batch_sizes(max_batch):
            batch = model.collate(model.example(b, rng))
            for _ in range(warmup):
                model.forward(batch)
            times = []
            for _ in range(repeats):
                if cuda:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    model.forward(batch)
                    end.record()
                    torch.cuda.synchronize()
                    times.append(start.elapsed_time(end))
                else:
                    t0 = time.perf_counter_ns()
                    model.forward(batch)
                    times.append((time.perf_counter_ns() - t0) / 1e6)
            t = np.asarray(times)
            rows.append(
                {
                    "precision": precision,
                    "batch_size": b,
                    "device": str(model.device),
                    "p50_ms": float(np.percentile(t, 50)),
                    "p95_ms": float(np.percentile(t, 95)),
                    "p99_ms": float(np.percentile(t, 99)),
                    "mean_ms": float(t.mean()),
                    "per_item_ms": float(t.mean() / b),
                }
            )
    return pd.DataFrame(rows)


def feature_fetch_cost(url: str, features: dict, *, fetches: int = 1000, warmup: int = 50, seed: int = 0) -> dict:
    """One request's feature fetch alone: ``fetches`` sequential fetches of one entity each
    through the server's own client (:class:`reference_server.features.FeatureStore`, the
    server's settings, on uvloop as the server runs), against a populated Redis at ``url``.

    Returns the CPU and wall time per fetch and per round trip (ms). With nothing else on
    the event loop, CPU per fetch is what the fetch costs the server's loop; the rest of
    the wall time is Redis's answer and the kernel, which the loop waits through.
    """
    import asyncio

    from reference_server.features import FeatureStore, FeatureStoreConfig

    fields = ("keys", "batch_size", "parallelism", "entities", "max_connections")
    cfg = FeatureStoreConfig(url=url, **{k: features[k] for k in fields if k in features})
    entities = np.random.default_rng(seed).integers(0, cfg.entities, warmup + fetches)

    async def go() -> tuple[float, float, int]:
        store = FeatureStore(cfg)
        try:
            for e in entities[:warmup]:
                await store.fetch(np.array([e]))
            trips0 = store.round_trips
            c0, w0 = time.process_time(), time.perf_counter()
            for e in entities[warmup:]:
                await store.fetch(np.array([e]))
            return time.process_time() - c0, time.perf_counter() - w0, store.round_trips - trips0
        finally:
            await store.close()

    try:
        import uvloop

        cpu, wall, trips = uvloop.run(go())
    except ImportError:
        cpu, wall, trips = asyncio.run(go())
    return {
        "fetches": fetches,
        "round_trips_per_fetch": trips / fetches,
        "cpu_ms_per_fetch": cpu / fetches * 1e3,
        "wall_ms_per_fetch": wall / fetches * 1e3,
        "cpu_ms_per_trip": cpu / trips * 1e3,
        "wall_ms_per_trip": wall / trips * 1e3,
    }


IN_FLIGHT = (1, 8, 32, 64, 128)


def feature_fetch_in_flight(
    url: str,
    features: dict,
    *,
    in_flight: tuple[int, ...] = IN_FLIGHT,
    seconds: float = 1.5,
    sidecars: tuple[int, ...] = (),
    seed: int = 0,
) -> pd.DataFrame:
    """The feature fetch's cost against the fetches in flight: for each count, that many
    fetches run back to back in a closed loop for ``seconds`` through the server's own
    client and settings (its pooled connections included), on uvloop.

    Returns one row per count: fetches/s, the client's CPU per fetch, the ``sidecars``' (a
    redis-server's) CPU per fetch, and the fetches that failed (the pool's wait for a
    connection timed out: the server's 503). The simulator holds the loop for a fixed time
    per round trip; on the 2-core VM 26 GETs per fetch cost 1.83 ms of CPU (client and
    redis) at 32 in flight and 2.48 and 3.01 ms at 64 and 128. Where this rises, a level
    with that many fetches in flight is slower than predicted. (With redis-py's blocking
    pool, fetches past the connections timed out here: a waiter lost its turn to newcomers;
    the server's wait is first come, first served since, calibrate/README "A fair wait for
    a connection".)"""
    import asyncio

    from calibrate.loadgen import process_cpu_s
    from reference_server.features import FeatureStore, FeatureStoreConfig, StoreUnavailable

    fields = ("keys", "batch_size", "parallelism", "entities", "max_connections")
    cfg = FeatureStoreConfig(url=url, **{k: features[k] for k in fields if k in features})
    rng = np.random.default_rng(seed)

    async def level(store, n: int) -> dict:
        done = failed = 0
        stop = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done, failed
            while time.perf_counter() < stop:
                try:
                    await store.fetch(rng.integers(0, cfg.entities, 1))
                    done += 1
                except StoreUnavailable:
                    failed += 1

        c0, s0, w0 = time.process_time(), process_cpu_s(sidecars), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(n)))
        c1, s1, w1 = time.process_time(), process_cpu_s(sidecars), time.perf_counter()
        per = max(done, 1)
        return {
            "in_flight": n,
            "fetches_per_s": done / (w1 - w0),
            "client_cpu_ms_per_fetch": (c1 - c0) / per * 1e3,
            "sidecar_cpu_ms_per_fetch": (s1 - s0) / per * 1e3 if sidecars else float("nan"),
            "failed": failed,
        }

    async def go() -> list[dict]:
        store = FeatureStore(cfg)
        try:
            await level(store, 1)  # warm the connections
            return [await level(store, n) for n in in_flight]
        finally:
            await store.close()

    try:
        import uvloop

        rows = uvloop.run(go())
    except ImportError:
        rows = asyncio.run(go())
    out = pd.DataFrame(rows)
    out["cpu_ms_per_fetch"] = out["client_cpu_ms_per_fetch"] + out["sidecar_cpu_ms_per_fetch"].fillna(0.0)
    return out
