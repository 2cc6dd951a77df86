"""Does the engine's step time follow what the other core does? ``servesim serve-llm`` (the
engine pinned to a core, the front end and this load generator on the other), driven at
30% and 85% of its knee and overloaded, 20 s each, twice, in a random order, while a thread
samples the other core's busy share from /proc/stat every quarter-second. Per
quarter-second: the engine's steps against one fit on all of them (the mean log ratio),
beside the other core's busy share, the requests sent and the tokens streamed.

    python calibrate/experiments/llm_neighbour.py [OUT]   # about 3 minutes
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate import llm_load, llm_profile, llm_server, llm_sim
from calibrate.servers import beside_llm_front_end, get_json, server
from simulator.scenario.config import Scenario

BIN_S = 0.25


def cpu_times() -> dict[int, tuple[int, int]]:
    """Each core's (busy, total) jiffies."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                name, *v = line.split()
                v = [int(x) for x in v]
                idle = v[3] + v[4]
                out[int(name[3:])] = (sum(v[:8]) - idle, sum(v[:8]))
    return out


def sampler(rows: list, stop: threading.Event) -> None:
    last = cpu_times()
    while not stop.wait(BIN_S):
        now, t = cpu_times(), time.perf_counter_ns()
        rows.append({"t_ns": t, **{f"busy{c}": (now[c][0] - last[c][0]) / max(now[c][1] - last[c][1], 1) for c in now}})
        last = now


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    rows, stop = [], threading.Event()
    with server(llm_server.server_args(llm_server.ENGINE), command="serve-llm", health="/health") as url, \
            beside_llm_front_end(url):  # fmt: skip
        info = get_json(url + "/v1/models")["data"][0].get("servesim", {})
        engine_core = info.get("engine_core")
        fit = llm_profile.fit(pd.read_csv("calibrate/profiles/cpu-tiny-llm/steps.csv.gz"))
        doc = llm_sim.scenario_dict(
            {**fit, "noise_cv": 0.1}, llm_server.ENGINE, rate_rps=1.0, duration_s=20.0, warmup_s=3.0
        )
        s = Scenario.model_validate(doc)
        llm_server.step_records(url)
        th = threading.Thread(target=sampler, args=(rows, stop), daemon=True)
        th.start()
        phases, answers = [], []
        design = [("0.3", 7.0), ("0.85", 20.0), ("knee", 36.0)]
        for name, rate in [x for _ in range(2) for x in rng.permutation(design)]:
            rate = float(rate)
            plan = llm_load.plan_from_scenario(s, rate, 20.0, rng)
            df = llm_load.run(url, plan, seed=int(rng.integers(1 << 31)))
            answers.append(df.assign(phase=name))
            phases.append(llm_server.step_records(url).assign(phase=name))
            print(name, rate, len(df), flush=True)  # noqa: T201
        stop.set()
        th.join()
    steps = pd.concat(phases, ignore_index=True)
    cpu = pd.DataFrame(rows)
    steps.to_csv(out / "steps.csv.gz", index=False)
    cpu.to_csv(out / "cpu.csv", index=False)
    coef = llm_profile.fit(steps)
    steps["r"] = np.log(llm_profile.step_ms(steps) / llm_profile.predict_ms(coef, steps))
    steps["bin"] = np.searchsorted(cpu["t_ns"].to_numpy(), steps["begin_ns"].to_numpy())
    other = [c for c in cpu.columns if c.startswith("busy") and c != f"busy{engine_core}"]
    cpu["other"] = cpu[other].mean(axis=1)
    cpu["engine"] = cpu[f"busy{engine_core}"] if engine_core is not None else np.nan
    b = steps.groupby("bin").agg(r=("r", "mean"), phase=("phase", "first"), n=("r", "size"))
    b = b.join(cpu[["other", "engine"]], how="inner")
    print(b.groupby("phase")[["r", "other", "engine", "n"]].mean().round(3).to_string())  # noqa: T201
    centred = b.assign(
        r=b.r - b.groupby("phase").r.transform("mean"), o=b.other - b.groupby("phase").other.transform("mean")
    )
    print("corr(r, other) within phases:", round(float(np.corrcoef(centred.r, centred.o)[0, 1]), 3))  # noqa: T201


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/llm-neighbour"))
