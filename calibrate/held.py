"""What a front end's event loop pays for the requests it holds (calibrate/README, "The loop
pays for what it holds"): a closed loop of N requests in flight, each sent when the last
came back, and the CPU per request of the server's process and its sidecars (a
redis-server) at each N. Up to the loop's saturation its CPU per request falls (fixed costs
spread over more requests); past it, on the MGET ranker, it rose 13-19% from 32 to 128 in
flight (the collector's passes, more sockets to poll; a Redis pool of 256 connections rose
the same, so not the waits for a pooled connection).
``preprocess.event_loop.cost_by_held`` is that rise as measured, a factor at each count over
the first (:func:`factors_by_held`); ``cost_per_in_flight``, a straight line's share per
request held, is kept beside it. The rise is not straight: on the 2-core VM the ranker's
CPU per request was flat to 40 in flight, rose 0.0025 a request held from 40 to 96 and
0.0003 past 128 (two rounds, with its Redis pool of 32 connections or of 256), and a
line through 32, 128 and 256 (0.0009) gives half the rise where a level tips, 50-100 held.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from calibrate.loadgen import _frontend, _session, process_cpu_s

IN_FLIGHT = (32, 48, 64, 96, 128, 256)  # past the ranker's saturation (between 8 and 32 on the 2-core VM)
SECS = 6.0
MAX_COST = 0.01  # a share per request held above this is a measurement gone wrong: not used
MAX_FACTOR = 3.0  # and a loop three times as costly at the most held


async def _closed(url: str, model: str, payloads: list, n: int, secs: float, sidecars: tuple[int, ...]) -> dict:
    """``n`` requests in flight for ``secs``: answered (200) per second, those that were not,
    the server's and the sidecars' CPU per answered request (ms), the cores they used and
    the latency's p50/p99."""
    import aiohttp

    done, failed, lat = 0, 0, []
    path = f"{url}/v2/models/{model}/infer"
    async with _session(n + 8) as session:
        front0, side0, t0 = await _frontend(session, url), process_cpu_s(sidecars), time.perf_counter()
        stop = t0 + secs

        async def worker(k: int) -> None:
            nonlocal done, failed
            while time.perf_counter() < stop:
                p = payloads[k % len(payloads)]
                k += n
                sent = time.perf_counter()
                try:
                    async with session.post(path, data=p.body, headers=p.headers) as resp:
                        await resp.read()
                        ok = resp.status == 200
                except (aiohttp.ClientError, TimeoutError):  # reset or timed out: not answered either
                    ok = False
                if ok:
                    done += 1
                    lat.append(time.perf_counter() - sent)
                else:  # a 503 past the server's queue bound, say: not answered, its CPU counted
                    failed += 1

        await asyncio.gather(*(worker(k) for k in range(n)))
        front1, side1, t1 = await _frontend(session, url), process_cpu_s(sidecars), time.perf_counter()
    cpu = (front1["cpu_s"] - front0["cpu_s"]) + (side1 - side0)
    ms = np.array(lat) * 1e3 if lat else np.array([np.nan])
    return {
        "in_flight": n,
        "rps": done / (t1 - t0),
        "failed": failed,
        "cpu_ms_per_request": cpu / max(done, 1) * 1e3,
        "cores": cpu / (t1 - t0),
        "p50_ms": float(np.median(ms)),
        "p99_ms": float(np.quantile(ms, 0.99)),
    }


def in_flight_cost(
    url: str,
    model: str,
    payloads: list,
    *,
    sidecars: tuple[int, ...] = (),
    in_flight: tuple[int, ...] = IN_FLIGHT,
    secs: float = SECS,
) -> dict:
    """The server at each count of ``in_flight`` (after 2 s at 8); the share of the CPU per
    request at the first count that each further request held adds (:func:`share_per_request`);
    and the factor at each count (:func:`factors_by_held`)."""

    async def go() -> list[dict]:
        await _closed(url, model, payloads, 8, 2.0, sidecars)  # warm
        return [await _closed(url, model, payloads, n, secs, sidecars) for n in in_flight]

    rows = asyncio.run(go())
    return {"by_in_flight": rows, "cost_per_in_flight": share_per_request(rows), "cost_by_held": factors_by_held(rows)}


def factors_by_held(rows: list[dict]) -> dict[int, float] | None:
    """The CPU per request at each count in flight over its value at the fewest, as
    ``event_loop.cost_by_held``: never below 1 nor below the factor at a smaller count (the
    loop does not get cheaper for holding more; what dips is the measurement's noise). None
    with fewer than two counts with the CPU, or a factor past :data:`MAX_FACTOR`."""
    ok = sorted(
        (int(r["in_flight"]), float(r["cpu_ms_per_request"]))
        for r in rows
        if np.isfinite(r["cpu_ms_per_request"]) and r["cpu_ms_per_request"] > 0
    )
    if len(ok) < 2 or len({n for n, _ in ok}) < len(ok):
        return None
    factors = np.maximum.accumulate(np.maximum(np.array([c for _, c in ok]) / ok[0][1], 1.0))
    if factors[-1] > MAX_FACTOR:
        return None
    return {n: round(float(f), 4) for (n, _), f in zip(ok, factors, strict=True)}


def share_per_request(rows: list[dict]) -> float | None:
    """The least-squares slope of the CPU per request against the requests in flight, over
    its fitted value at the fewest; clipped at 0, None past :data:`MAX_COST`, with fewer
    than two counts or without the CPU."""
    n = np.array([r["in_flight"] for r in rows], dtype=float)
    cpu = np.array([r["cpu_ms_per_request"] for r in rows], dtype=float)
    ok = np.isfinite(cpu) & (cpu > 0)
    if ok.sum() < 2 or np.ptp(n[ok]) == 0:
        return None
    slope, icpt = np.polyfit(n[ok], cpu[ok], 1)
    share = max(float(slope / (icpt + slope * n[ok].min())), 0.0)
    return share if share <= MAX_COST else None
