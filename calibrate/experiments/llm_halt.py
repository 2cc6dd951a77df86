"""The guest's idle (calibrate/README, "What the misses are made of"): at 30% of the knee the
engine's steps, its forward passes and its pure-Python scheduling alike, run slower than at
80%, and an 80% slice's steps slow down as it drains (``llm_counters.py``); the thread keeps
its core the while (CPU time equals wall time). This VM is a KVM guest whose idle vCPUs
poll briefly and then halt (the ``haltpoll`` cpuidle driver), handing the physical core back
to the host. Keeping the engine's own core busy (``llm_idle.py``: ``--idle spin``) changed
nothing. Change one thing: forbid halting on both vCPUs, as a latency profile does, by
holding ``/dev/cpu_dma_latency`` at 0 (the idle loop then only polls). One server; 30% and
80% of the knee the runs measured (20 req/s), each with halting allowed and forbidden, in a
random order in each of three rounds, 20 s a slice. Per slice: decode-only steps of 1 to 4
sequences, their median forward pass (ms), and the mean log of their forward pass against
the experiment's median for their size (``speed``: > 0 slower); and every step against one
fit of all the experiment's steps (:func:`calibrate.llm_profile.fit`), the mean log ratio
of each quarter-second averaged over the slice's quarter-seconds (``host``: the host's
speed over the slice's time, which the batches' make-up does not select as it selects the
steps of one size).

    python calibrate/experiments/llm_halt.py [ROUNDS]   # 3 rounds: about 5 minutes, as root
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from calibrate import llm_load, llm_profile
from calibrate.llm_server import ENGINE, server_args, step_records
from calibrate.servers import beside_llm_front_end, server
from simulator.scenario.config import Scenario

PROFILE = Path("calibrate/profiles/cpu-tiny-llm")
KNEE_RPS = 20.0  # the knee the calibrations measured, 18.5-20.3 req/s


@contextlib.contextmanager
def no_halt(on: bool):
    """While open, the kernel keeps every CPU out of idle states slower than 0 µs to leave
    (PM QoS): its idle loop polls instead of halting the vCPU."""
    if not on:
        yield
        return
    fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
    try:
        os.write(fd, struct.pack("i", 0))
        yield
    finally:
        os.close(fd)


def host_over_time(steps: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Each slice's host speed (a slice: one value of ``keys``): every step against one fit
    of all ``steps`` (:func:`calibrate.llm_profile.fit`), the mean log ratio of each
    quarter-second, averaged over the slice's quarter-seconds (> 0: slower)."""
    coef = llm_profile.fit(steps)
    r = np.log(llm_profile.step_ms(steps) / llm_profile.predict_ms(coef, steps))
    t = steps[keys].assign(r=r, bin=steps["begin_ns"] // int(llm_profile.SPEED_BIN_S * 1e9))
    return t.groupby([*keys, "bin"])["r"].mean().groupby(keys).mean()


def main(rounds: int = 3) -> None:
    s = Scenario.model_validate(yaml.safe_load((PROFILE / "scenario.yaml").read_text()))
    rng = np.random.default_rng(19)
    conditions = [(share, poll) for share in (0.3, 0.8) for poll in (False, True)]
    parts = []
    rows = []
    with server(server_args(ENGINE), command="serve-llm", health="/health") as url, beside_llm_front_end(url):
        step_records(url)
        for rnd in range(rounds):
            for k in rng.permutation(len(conditions)):
                share, poll = conditions[k]
                plan = llm_load.plan_from_scenario(s, share * KNEE_RPS, 20.0, rng)
                with no_halt(poll):
                    df = llm_load.run(url, plan, seed=int(rng.integers(1 << 31)))
                st = step_records(url)
                parts.append(st.assign(round=rnd, share=share, poll=poll))
                ok = df[df["error"].isna() & (df["scheduled_s"] >= 3)]
                rows.append({"round": rnd, "share": share, "poll": poll, "tpot_p50": ok["tpot_s"].median() * 1e3})
                print(rows[-1], flush=True)  # noqa: T201
    every = pd.concat(parts, ignore_index=True)
    host = host_over_time(every, ["round", "share", "poll"])
    d = every[(every["chunks"] == 0) & every["decodes"].between(1, 4)].copy()
    d["fwd"] = (d["end_ns"] - d["start_ns"]) / 1e6
    d["speed"] = np.log(d["fwd"] / d["decodes"].map(d.groupby("decodes")["fwd"].median()))
    t = d.pivot_table(index=["share", "poll"], columns="decodes", values="fwd", aggfunc="median").round(3)
    t["speed"] = d.groupby(["share", "poll"])["speed"].mean().round(3)
    t["tpot_p50"] = pd.DataFrame(rows).groupby(["share", "poll"])["tpot_p50"].mean().round(3)
    t["host"] = host.groupby(["share", "poll"]).mean().round(3)
    print(t.to_string())  # noqa: T201
    print(host.unstack("poll").round(3))  # noqa: T201
    print(d.pivot_table(index=["round", "share"], columns="poll", values="speed", aggfunc="mean").round(3))  # noqa: T201


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
