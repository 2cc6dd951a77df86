"""The server's dynamic batcher in-process, on the real clock: window from the oldest
request, a full batch at once, the queue cap, and errors reaching every request."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

pytest.importorskip("torch", reason="the reference server needs the server extra")

from reference_server.batcher import DynamicBatcher, Overloaded


def _echo(items):
    return [dict(it) for it in items], {"compute_infer": 0}


async def _run(batcher: DynamicBatcher, plan: list[tuple[float, int]]):
    """Submit (delay s, items) in order; returns each request's (dispatch - first submit, batch size)."""
    batcher.start()
    t0 = time.perf_counter_ns()

    async def one(delay, n):
        await asyncio.sleep(delay)
        p = await batcher.submit({"x": n}, n)
        return (p.t_dispatch_ns - t0) / 1e9, p.batch_size

    try:
        return await asyncio.gather(*(one(d, n) for d, n in plan))
    finally:
        await batcher.stop()


def test_window_counts_from_the_oldest_request():
    b = DynamicBatcher(_echo, max_batch_size=8, max_queue_delay_ms=200)
    out = asyncio.run(_run(b, [(0.0, 1), (0.05, 1), (0.1, 2)]))
    assert [size for _, size in out] == [4, 4, 4]
    assert all(0.19 <= t < 0.35 for t, _ in out)  # ~200 ms after the first, not after the last


def test_a_full_batch_goes_at_once_and_the_rest_waits_its_window():
    b = DynamicBatcher(_echo, max_batch_size=4, max_queue_delay_ms=300)
    out = asyncio.run(_run(b, [(0.0, 2), (0.0, 2), (0.0, 1)]))
    assert out[0][1] == out[1][1] == 4
    assert out[0][0] < 0.1  # no waiting for the window
    assert out[2][1] == 1
    assert out[2][0] >= 0.29


def test_queue_cap_and_request_size():
    async def scenario():
        b = DynamicBatcher(_echo, max_batch_size=4, max_queue_delay_ms=200, max_queue_size=1)
        b.start()
        first = asyncio.create_task(b.submit({}, 1))
        await asyncio.sleep(0.02)
        assert b.full()
        with pytest.raises(Overloaded):
            await b.submit({}, 1)
        with pytest.raises(ValueError, match=r"1\.\.4 items"):
            await b.submit({}, 5)
        await first
        await b.stop()

    asyncio.run(scenario())


def test_a_failing_model_fails_each_request_of_the_batch():
    def boom(items):
        raise RuntimeError("CUDA out of memory")

    async def scenario():
        b = DynamicBatcher(boom, max_batch_size=4, max_queue_delay_ms=20)
        b.start()
        results = await asyncio.gather(b.submit({}, 1), b.submit({}, 1), return_exceptions=True)
        await b.stop()
        return results

    results = asyncio.run(scenario())
    assert [str(r) for r in results] == ["CUDA out of memory"] * 2


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_the_window_never_closes_early_on_uvloop():
    """uvloop's timers are whole milliseconds on a loop clock cached at the last iteration:
    a 2 ms window's timeout fired up to ~0.4 ms early. No batch may go before its window."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario():
        b = DynamicBatcher(_echo, max_batch_size=8, max_queue_delay_ms=2)
        b.start()
        rng = np.random.default_rng(0)
        waits = []
        try:
            for _ in range(150):
                await asyncio.sleep(rng.uniform(0, 0.002))  # a random phase against the loop's clock
                # other work in the iteration that wakes the batcher: the loop's clock goes stale
                asyncio.get_running_loop().call_soon(_busy, rng.uniform(0, 0.001))
                p = await b.submit({"x": 1}, 1)
                waits.append((p.t_dispatch_ns - p.t_enqueue_ns) / 1e6)
        finally:
            await b.stop()
        return np.array(waits)

    waits = uvloop.run(scenario())
    early = waits < 2.0
    assert not early.any(), f"{early.sum()} of {len(waits)} batches went early (shortest {waits.min():.3f} ms)"
