"""The tiny LLM engine as a calibration drives it (``servesim serve-llm``): the engine it
serves (:data:`ENGINE`, :data:`IDLE`) and the server's arguments for it, the engine's
step records, and the measurements that are one call each: a request's own overhead,
the knee's completions, and the aging before both. :mod:`calibrate.llm_run` puts them
together into a calibration; the experiments use them alone.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from calibrate import llm_load, llm_profile
from calibrate.servers import get_json
from simulator.scenario.config import Scenario

AGE_S = 90.0  # overload that ages the engine before the knee and the levels are measured (then drained)
# the engine's idle while calibrated: polling its pipe, its core stays busy at every load. Asleep,
# its core halts between bursts, and some hosts then run its steps 18-33% faster under
# sustained load than at light load (calibrate/README, "Light load runs slow on some hosts"): a host's power
# management the model does not hold, which polling takes out (and costs nothing elsewhere)
IDLE = "spin"
ENGINE = {"num_blocks": 512, "block_size": 16, "max_num_batched_tokens": 512, "max_num_seqs": 64}


def server_args(engine: dict) -> list[str]:
    return [arg for k, v in engine.items() for arg in (f"--{k.replace('_', '-')}", str(v))]


def profile_server_args(profile: dict) -> list[str]:
    """``serve-llm``'s arguments for the engine a calibration measured: its engine, on its
    device, idling as it did (a profile from before the idle was recorded: asleep)."""
    return [
        *server_args(profile["engine"]),
        *("--device", profile.get("device", "cpu")),
        *("--idle", profile.get("idle", "sleep")),
    ]


OVERHEAD_TIMES = 3  # the overhead is measured this many times, the median kept: one of ten runs' single
# measurement came out 6.28 ms where the others gave 3.14-4.13 (and 20 more on five servers
# 3.24-4.29, sd 0.2-0.3: calibrate/experiments/llm_overhead_spread.py); a median of three
# keeps such a stray one out


def measured_overhead(url: str, seed: int, n: int = 40) -> float:
    """What a request's first token costs beyond the engine's step (ms): HTTP and the
    front end, the hand-offs to the engine and back, the stream to the client. Requests
    one at a time (a 64-token prompt, 2 tokens): the median TTFT less the median cycle of
    the steps that prefilled them."""
    plan = llm_load.Plan(np.arange(1, n + 1) * 0.1, np.full(n, 64), np.full(n, 2))
    step_records(url)  # what came before
    df = llm_load.run(url, plan, seed=seed)
    steps = step_records(url)
    prefill = llm_profile.step_ms(steps[steps["chunks"] > 0])
    return max(float(np.median(df["ttft_s"].dropna()) * 1000.0 - np.median(prefill)), 0.0)


def measured_knee(url: str, doc: dict, rate_rps: float, duration_s: float, skip_s: float, seed: int) -> dict:
    """Offer ``rate_rps`` (more than the engine takes) for ``duration_s``; completions a
    second from ``skip_s`` to ``duration_s``."""
    s = Scenario.model_validate(doc)
    plan = llm_load.plan_from_scenario(s, rate_rps, duration_s, np.random.default_rng(seed))
    df = llm_load.run(url, plan, seed=seed)
    done = (df["scheduled_s"] + df["e2e_s"]).to_numpy()
    n = np.count_nonzero((done >= skip_s) & (done < duration_s))
    return {
        "offered_rps": rate_rps,
        "completed_rps": n / (duration_s - skip_s),
        "requests": len(df),
        "errors": int(df["error"].notna().sum()),
    }


AGE_WINDOW_S = 20.0  # the aging's completions are counted in windows this long


def age_engine(url: str, doc: dict, offered_rps: float, age_s: float, seed: int) -> dict:
    """Overload the engine for ``age_s`` (offered ``offered_rps``, then its backlog drained)
    and forget its steps: an engine process runs its forward 7-12% slower after minutes of
    overload than fresh (calibrate/experiments/llm_aging.py, the same forward in turns on
    one core), so a calibration that starts on a fresh engine measures its first minutes
    fast (the first knee slice above its run's mean in 11 of 12 runs). Returns the design
    and the completions a second of each :data:`AGE_WINDOW_S` of it (the record); its
    ``errors`` are mostly the server's 503s once more than its 512 connections are open
    (a backlog of 90 s of overload: the engine stays full all the same)."""
    if age_s <= 0:
        return {"seconds": 0.0}
    plan = llm_load.plan_from_scenario(Scenario.model_validate(doc), offered_rps, age_s, np.random.default_rng(seed))
    df = llm_load.run(url, plan, seed=seed)
    step_records(url)  # the aging's steps: not a phase of the fit
    done = (df["scheduled_s"] + df["e2e_s"]).dropna().to_numpy()
    edges = np.arange(0.0, done.max(initial=0.0) + AGE_WINDOW_S, AGE_WINDOW_S)
    counts = np.histogram(done, edges)[0] if len(edges) > 1 else np.zeros(0)
    return {
        "seconds": float(age_s),
        "offered_rps": float(offered_rps),
        "took_s": float(done.max(initial=0.0)),
        "window_s": AGE_WINDOW_S,
        "completed_rps": [round(float(c) / AGE_WINDOW_S, 3) for c in counts],
        "errors": int(df["error"].notna().sum()),
    }


def step_records(url: str) -> pd.DataFrame:
    """The engine's step records since the last fetch (its whole cycles only)."""
    steps = pd.DataFrame(get_json(url + "/servesim/steps"))
    return steps[steps["done_ns"] > 0].reset_index(drop=True)
