"""An open-loop Poisson load generator for Open Inference Protocol servers.

Send times are drawn in advance from a Poisson process; each request is sent at its
scheduled time whether or not earlier ones have returned, and its latency is measured
from the *scheduled* time, so a stalled server or client shows up as latency instead of
silently lowering the offered load (no coordinated omission). A level runs for at least
``duration_s`` and ``min_queries`` requests, as MLPerf LoadGen's server scenario does.
Each record keeps the client latency and the server's stage timings from the response.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

TIMING_KEYS = (
    "feature_us",
    "preprocess_us",
    "queue_us",
    "compute_input_us",
    "compute_infer_us",
    "compute_output_us",
    "request_us",
    "batch_size",
    "feature_round_trips",
)


@dataclass(frozen=True)
class Payload:
    """A ready-to-send request body and its headers."""

    body: bytes
    headers: dict


def image_payloads(count: int, side: int, rng: np.random.Generator) -> list[Payload]:
    """Binary-tensor requests of one JPEG each, for the resnet model."""
    from reference_server.models import jpeg
    from reference_server.protocol import serialize_bytes

    out = []
    for _ in range(count):
        raw = serialize_bytes(np.array([jpeg(rng, side=side)], dtype=object))
        head = json.dumps(
            {
                "inputs": [
                    {
                        "name": "image",
                        "datatype": "BYTES",
                        "shape": [1, 1],
                        "parameters": {"binary_data_size": len(raw)},
                    }
                ]
            }
        ).encode()
        out.append(Payload(head + raw, {"Inference-Header-Content-Length": str(len(head))}))
    return out


def ranker_payloads(count: int, dense: int, entities: int, rng: np.random.Generator) -> list[Payload]:
    """JSON requests of one item each for the ranker fed from the feature store."""
    out = []
    for _ in range(count):
        doc = {
            "inputs": [
                {"name": "dense", "datatype": "FP32", "shape": [1, dense], "data": rng.standard_normal(dense).tolist()},
                {"name": "entity", "datatype": "INT64", "shape": [1, 1], "data": [int(rng.integers(0, entities))]},
            ]
        }
        out.append(Payload(json.dumps(doc).encode(), {"Content-Type": "application/json"}))
    return out


def schedule(rate_rps: float, duration_s: float, min_queries: int, rng: np.random.Generator) -> np.ndarray:
    """Poisson send times (s from the start): at least ``duration_s`` and ``min_queries``."""
    n = max(min_queries, int(rate_rps * duration_s * 1.2) + 16)
    t = np.cumsum(rng.exponential(1.0 / rate_rps, n))
    stop = max(np.searchsorted(t, duration_s), min_queries)
    return t[:stop]


async def run_level(
    url: str, model: str, rate_rps: float, payloads: list[Payload], *, duration_s: float, min_queries: int, seed: int
) -> pd.DataFrame:
    """One open-loop level; one row per request."""
    import aiohttp

    rng = np.random.default_rng(seed)
    times = schedule(rate_rps, duration_s, min_queries, rng)
    pick = rng.integers(0, len(payloads), len(times))
    endpoint = f"{url}/v2/models/{model}/infer"
    rows: list[dict] = [{} for _ in range(len(times))]
    connector = aiohttp.TCPConnector(limit=256)  # beyond this, requests wait (their latency counts it)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.perf_counter() + 0.05

        async def one(i: int) -> None:
            scheduled = t0 + times[i]
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = time.perf_counter()
            p = payloads[pick[i]]
            row = {"scheduled_s": times[i], "send_lag_ms": (sent - scheduled) * 1e3}
            try:
                async with session.post(endpoint, data=p.body, headers=p.headers) as resp:
                    raw = await resp.read()
                    done = time.perf_counter()
                    row["status"] = resp.status
                    hl = resp.headers.get("Inference-Header-Content-Length")
                    doc = json.loads(raw[: int(hl)] if hl else raw)
                    params = doc.get("parameters", {}) if resp.status == 200 else {}
                    for k in TIMING_KEYS:
                        row[k] = params.get(k, np.nan)
            except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as err:
                done = time.perf_counter()
                row["status"] = -1
                row["error"] = type(err).__name__
            row["latency_ms"] = (done - scheduled) * 1e3  # from the scheduled time: no coordinated omission
            rows[i] = row

        await asyncio.gather(*(one(i) for i in range(len(times))))
    df = pd.DataFrame(rows)
    df["offered_rps"] = rate_rps
    return df


def sweep(
    url: str,
    model: str,
    rates: list[float],
    payloads: list[Payload],
    *,
    duration_s: float = 10.0,
    min_queries: int = 200,
    seed: int = 0,
    warmup_s: float = 1.0,
) -> pd.DataFrame:
    """Run each rate as a level; the first ``warmup_s`` of each level is marked, not dropped."""
    frames = []
    for k, rate in enumerate(rates):
        df = asyncio.run(
            run_level(url, model, rate, payloads, duration_s=duration_s, min_queries=min_queries, seed=seed + k)
        )
        df["level"] = k
        df["warmup"] = df["scheduled_s"] < warmup_s
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def level_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per level: offered and achieved rate, errors, latency percentiles (after warm-up)."""
    rows = []
    for level, g in df[~df["warmup"]].groupby("level"):
        ok = g[g["status"] == 200]
        lat = ok["latency_ms"].to_numpy()
        # completions over the time from the first send to the last answer: a server that
        # falls behind finishes after the schedule ends, so the schedule's span overstates it
        done = (ok["scheduled_s"] + ok["latency_ms"] / 1e3).max() if len(ok) else g["scheduled_s"].max()
        span = max(done, g["scheduled_s"].max()) - g["scheduled_s"].min()
        rows.append(
            {
                "level": level,
                "offered_rps": float(g["offered_rps"].iloc[0]),
                "achieved_rps": len(ok) / span if span > 0 else float("nan"),
                "requests": len(g),
                "errors": int((g["status"] != 200).sum()),
                "p50_ms": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
                "p95_ms": float(np.percentile(lat, 95)) if len(lat) else float("nan"),
                "p99_ms": float(np.percentile(lat, 99)) if len(lat) else float("nan"),
                "mean_batch": float(ok["batch_size"].mean()) if len(ok) else float("nan"),
                "send_lag_p99_ms": float(np.percentile(g["send_lag_ms"], 99)),
            }
        )
    return pd.DataFrame(rows)
