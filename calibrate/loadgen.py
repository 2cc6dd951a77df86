"""An open-loop Poisson load generator for Open Inference Protocol servers.

Send times are drawn in advance from a Poisson process; each request is sent at its
scheduled time whether or not earlier ones have returned, and its latency is measured
from the *scheduled* time, so a stalled server or client shows up as latency instead of
silently lowering the offered load (no coordinated omission). A level runs for at least
``duration_s`` and ``min_queries`` requests, as MLPerf LoadGen's server scenario does.
Each record keeps the client latency and the server's stage timings from the response.

:func:`run_level` (``servesim calibrate load``) and :func:`run_slices` (``calibrate run``)
send with the lean HTTP/1.1 sender of :mod:`calibrate.sender`, which keeps its schedule at
twice the reference server's capacity and costs a fraction of aiohttp's CPU per request
(aiohttp, which ``calibrate run`` used until --frontends, took 0.28 ms a request on an
H100 host: one process could not offer the 4,000 req/s a GPU instance takes). The
front end's ``/metrics`` is still read through aiohttp between slices.

:func:`run_slices` runs a randomized block design: rounds of short slices, one per level in
a random order, back to back in one event loop over one connection pool, so a slow minute
of the machine hits every level alike. Around each slice it reads the server's front-end
CPU (``process_cpu_seconds_total`` in ``/metrics``), this client's own CPU, and the
platform's hiccups.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from calibrate.payloads import Payload, bytes_payload, image_payloads, ranker_payloads
from calibrate.prometheus import NotMetrics, frontend_counters
from calibrate.sender import parse, read_answer, request_bytes, send_on_schedule

# the payloads live in payloads.py; the load generator has always offered them
__all__ = [
    "LEAD_S",
    "Payload",
    "Slice",
    "SliceRuns",
    "bytes_payload",
    "image_payloads",
    "paced",
    "process_cpu_s",
    "ranker_payloads",
    "run_level",
    "run_slices",
    "schedule",
    "sweep",
]

TIMING_KEYS = (
    "handoff_us",
    "handoff_in_us",
    "feature_us",
    "preprocess_us",
    "queue_us",
    "compute_input_us",
    "compute_infer_us",
    "compute_output_us",
    "request_us",
    "batch_size",
    "feature_round_trips",
    "received_at_ns",
    "enqueued_at_ns",
    "dispatched_at_ns",
    "relay_us",  # servesim serve --frontends N: the hops between a front end and the batcher
    "frontend",  # and which front end answered
)


def schedule(rate_rps: float, duration_s: float, min_queries: int, rng: np.random.Generator) -> np.ndarray:
    """Poisson send times (s from the start): at least ``duration_s`` and ``min_queries``."""
    n = max(min_queries, int(rate_rps * duration_s * 1.2) + 16)
    t = np.cumsum(rng.exponential(1.0 / rate_rps, n))
    stop = max(np.searchsorted(t, duration_s), min_queries)
    return t[:stop]


async def _post(session, endpoint: str, p: Payload, scheduled: float, row: dict) -> None:
    """Send one request at ``scheduled`` (perf_counter s) and fill its row."""
    delay = scheduled - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    sent = time.perf_counter()
    row["send_lag_ms"] = (sent - scheduled) * 1e3
    import aiohttp

    try:
        async with session.post(endpoint, data=p.body, headers=p.headers) as resp:
            raw = await resp.read()
            done = time.perf_counter()
            row["status"] = resp.status
            hl = resp.headers.get("Inference-Header-Content-Length")
            read_answer(row, resp.status, raw, int(hl) if hl else None, TIMING_KEYS)
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError, ValueError) as err:
        done = time.perf_counter()
        row["status"] = -1
        row["error"] = type(err).__name__
    row["latency_ms"] = (done - scheduled) * 1e3  # from the scheduled time: no coordinated omission


LEAD_S = 0.01  # a send's task is created this long before its scheduled time


async def paced(times: np.ndarray, start: Callable[[int, float], Awaitable[None]], *, lead_s: float = LEAD_S) -> None:
    """Run ``start(i, at)`` for every scheduled time ``at = t0 + times[i]`` (perf_counter s),
    each task created ``lead_s`` before its time, and wait for them all.

    Creating every task up front (a gather over the whole level) costs the loop tens of
    microseconds per task before the first send: 28,000 tasks made the first requests of a
    40 s level 476 ms late, in one burst the server took 5.5 s to drain. Paced, the tasks
    alive are those due within ``lead_s`` plus those in flight."""
    t0 = time.perf_counter() + 0.05
    tasks = []
    for i, t in enumerate(times):
        at = t0 + float(t)
        ahead = at - lead_s - time.perf_counter()
        if ahead > 0:
            await asyncio.sleep(ahead)
        tasks.append(asyncio.ensure_future(start(i, at)))
    await asyncio.gather(*tasks)


async def _level(session, endpoint: str, times: np.ndarray, pick: np.ndarray, payloads: list[Payload]) -> list[dict]:
    rows: list[dict] = [{"scheduled_s": float(t)} for t in times]
    await paced(times, lambda i, at: _post(session, endpoint, payloads[pick[i]], at, rows[i]))
    return rows


CONNECTIONS = 256


def _session(connections: int = CONNECTIONS):
    import aiohttp

    # beyond ``connections`` in flight, requests wait in this client (their latency counts
    # it): to see a server shed load, give it more than the server's queue holds
    connector = aiohttp.TCPConnector(limit=connections)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30))


async def run_level(
    url: str,
    model: str,
    rate_rps: float,
    payloads: list[Payload],
    *,
    duration_s: float,
    min_queries: int,
    seed: int,
    connections: int = CONNECTIONS,
    precise: bool = True,
) -> pd.DataFrame:
    """One open-loop level; one row per request (``precise``: :func:`send_on_schedule`'s)."""
    rng = np.random.default_rng(seed)
    times = schedule(rate_rps, duration_s, min_queries, rng)
    pick = rng.integers(0, len(payloads), len(times))
    path = f"/v2/models/{model}/infer"
    requests = [request_bytes(url, path, p.body, p.headers) for p in payloads]
    rows = await send_on_schedule(url, requests, times, pick, connections=connections, precise=precise)
    df = pd.DataFrame(parse(rows, TIMING_KEYS))
    df["offered_rps"] = rate_rps
    return df


def process_cpu_s(pids: tuple[int, ...]) -> float:
    """CPU seconds (user + system) the processes ``pids`` have used so far, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def _frontend(session, url: str) -> dict[str, float]:
    """From the server's /metrics: its process's CPU seconds, and its garbage collections
    (seconds in all, and how many took over 10 ms) so far; nan when it has none."""
    out = {"cpu_s": float("nan"), "gc_s": float("nan"), "gc_over_10ms": float("nan"), "hub_cpu_s": float("nan")}
    try:
        async with session.get(f"{url}/metrics") as resp:
            text = await resp.text()
    except Exception:  # a scrape that fails loses this slice's figures, nothing else
        return out
    try:
        return frontend_counters(text)
    except NotMetrics:  # nor does a page that is not metrics
        return out


@dataclass(frozen=True)
class Slice:
    """One slice of a randomized block design."""

    round: int
    level: int
    rate_rps: float
    seed: int


async def _run_slices(
    url: str,
    model: str,
    plan: list[Slice],
    payloads: list[Payload],
    *,
    slice_s: float,
    meter,
    stall_ms: float,
    retries: int,
    log,
    sidecars: tuple[int, ...] = (),
) -> tuple[list[pd.DataFrame], list[dict], list[pd.DataFrame], list[pd.DataFrame]]:
    path = f"/v2/models/{model}/infer"
    requests = [request_bytes(url, path, p.body, p.headers) for p in payloads]
    frames, slices, hiccups, speed = [], [], [], []
    async with _session() as session:  # for the scrapes around each slice
        for k, sl in enumerate(plan):
            for attempt in range(retries + 1):
                rng = np.random.default_rng([sl.seed, attempt])
                times = schedule(sl.rate_rps, slice_s, 1, rng)
                pick = rng.integers(0, len(payloads), len(times))
                fe0, client0, side0 = await _frontend(session, url), time.process_time(), process_cpu_s(sidecars)
                if meter is not None:
                    meter.collect()  # drop what came before the slice
                t_start, t_start_ns = time.perf_counter(), time.perf_counter_ns()
                rows = parse(await send_on_schedule(url, requests, times, pick, connections=CONNECTIONS), TIMING_KEYS)
                seconds = time.perf_counter() - t_start
                client1, side1, fe1 = time.process_time(), process_cpu_s(sidecars), await _frontend(session, url)
                h = meter.collect() if meter is not None else None
                stalled = h is not None and h.max_ms > stall_ms
                info = {
                    "slice": k,
                    "round": sl.round,
                    "level": sl.level,
                    "rate_rps": sl.rate_rps,
                    "attempt": attempt,
                    "requests": len(rows),
                    "seconds": seconds,
                    "frontend_cpu_s": fe1["cpu_s"] - fe0["cpu_s"],
                    "hub_cpu_s": fe1["hub_cpu_s"] - fe0["hub_cpu_s"],
                    "client_cpu_s": client1 - client0,
                    "sidecar_cpu_s": side1 - side0 if sidecars else float("nan"),
                    "frontend_gc_s": fe1["gc_s"] - fe0["gc_s"],
                    "frontend_gc_over_10ms": fe1["gc_over_10ms"] - fe0["gc_over_10ms"],
                    "hiccup_max_ms": h.max_ms if h is not None else float("nan"),
                    "hiccups_over_1ms": h.above(1.0) if h is not None else 0,
                    "kept": not stalled or attempt == retries,
                }
                slices.append(info)
                if h is not None and len(h.overshoot_ms):
                    hiccups.append(
                        pd.DataFrame({"slice": k, "attempt": attempt, "core": h.core, "overshoot_ms": h.overshoot_ms})
                    )
                if h is not None and len(h.chunk_us):
                    w = h.speed_windows(t_start_ns, SPEED_WINDOW_S)
                    speed.append(w.assign(slice=k, attempt=attempt, level=sl.level)[SPEED_COLUMNS])
                if info["kept"]:
                    df = pd.DataFrame(rows)
                    df["offered_rps"] = sl.rate_rps
                    df["level"], df["round"], df["slice"] = sl.level, sl.round, k
                    frames.append(df)
                    break
                log(f"slice {k} (level {sl.level}): a {h.max_ms:.1f} ms platform stall; repeated")
    return frames, slices, hiccups, speed


SPEED_WINDOW_S = 0.25  # the platform-speed meter's chunk times are summarised per window of this
SPEED_COLUMNS = ["slice", "attempt", "level", "core", "window", "chunk_us", "chunk_wall_us", "chunks"]


class SliceRuns(NamedTuple):
    """What :func:`run_slices` measured."""

    requests: pd.DataFrame  # one row per request; the first ``warmup_s`` of each slice marked ``warmup``
    slices: pd.DataFrame  # one row per slice run (repeats included)
    hiccups: pd.DataFrame  # the sleep meter's recorded overshoots
    speed: pd.DataFrame  # the speed meter's median chunk time per slice, core and window


def run_slices(
    url: str,
    model: str,
    plan: list[Slice],
    payloads: list[Payload],
    *,
    slice_s: float,
    warmup_s: float,
    meter=None,
    stall_ms: float = float("inf"),
    retries: int = 0,
    log=lambda _msg: None,
    sidecars: tuple[int, ...] = (),
) -> SliceRuns:
    """Run ``plan`` slice after slice (each starting from an idle server, since a slice waits
    for its last answer); a slice in which ``meter`` saw a stall longer than ``stall_ms`` is
    run again, up to ``retries`` times. The CPU of the ``sidecars`` (a redis-server on the
    front end's cores) is read around each slice too."""
    # this process has imported torch and pandas: a full collection would take ~80 ms, in which
    # no request is sent or answered; freezing what exists keeps collections to the new objects
    gc.collect()
    gc.freeze()
    try:
        frames, slices, hiccups, speed = asyncio.run(
            _run_slices(
                url,
                model,
                plan,
                payloads,
                slice_s=slice_s,
                meter=meter,
                stall_ms=stall_ms,
                retries=retries,
                log=log,
                sidecars=sidecars,
            )
        )
    finally:
        gc.unfreeze()
    requests = pd.concat(frames, ignore_index=True)
    requests["warmup"] = requests["scheduled_s"] < warmup_s
    columns = ["slice", "attempt", "core", "overshoot_ms"]
    recorded = pd.concat(hiccups, ignore_index=True) if hiccups else pd.DataFrame(columns=columns)
    chunks = pd.concat(speed, ignore_index=True) if speed else pd.DataFrame(columns=SPEED_COLUMNS)
    return SliceRuns(requests, pd.DataFrame(slices), recorded, chunks)


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
    connections: int = CONNECTIONS,
) -> pd.DataFrame:
    """Run each rate as a level; the first ``warmup_s`` of each level is marked, not dropped."""
    frames = []
    for k, rate in enumerate(rates):
        df = _run(
            run_level(
                url,
                model,
                rate,
                payloads,
                duration_s=duration_s,
                min_queries=min_queries,
                seed=seed + k,
                connections=connections,
            )
        )
        df["level"] = k
        df["warmup"] = df["scheduled_s"] < warmup_s
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def _run(coro):
    """Run a level on uvloop where it is installed (the client's own cost per request is
    what keeps it on schedule), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)
