"""The open-loop generator's pacing: tasks are made as their send times come, not all at once."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from calibrate.loadgen import LEAD_S, paced


def test_paced_sends_keep_few_tasks_alive_and_run_every_one():
    """5,000 sends in 1 s. Made all at once (as before), 5,000 tasks were alive before the
    first send, and the first requests of a long level left hundreds of ms late in one
    burst. Paced, the tasks alive are those due within the lead (about 50 here) and those
    waiting for their time; the bound leaves room for a ~150 ms hiccup of this machine."""
    rng = np.random.default_rng(0)
    times = np.sort(rng.uniform(0.0, 1.0, 5000))
    state = {"alive": 0, "peak": 0}
    ran = np.zeros(len(times), dtype=bool)

    async def start(i: int, at: float) -> None:
        state["alive"] += 1
        state["peak"] = max(state["peak"], state["alive"])
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        ran[i] = True
        state["alive"] -= 1

    asyncio.run(paced(times, start))
    assert ran.all()
    assert state["peak"] <= 5000 * (LEAD_S + 0.15), state["peak"]
