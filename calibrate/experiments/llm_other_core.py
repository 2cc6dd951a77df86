"""The other core (calibrate/README, "What the misses are made of"): the engine's steps of
the same shape run 7-13% faster at 85% of the knee than at 30% (eight calibrations), from
the first second of a slice, whatever the time since the engine last idled. Is it the
other core's idleness (the front end's and the load generator's core, busy at 85%, mostly
idle at 30%)? 30% of the profile's knee for 20 s, alternately with a busy loop on the
front end's core and without, four pairs in one server. Per slice: the median forward pass
(ms) of decode-only steps of 1, 2 and 4 sequences, and the client's TPOT p50.

    python calibrate/experiments/llm_other_core.py   # about 3 minutes, from the repository root
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from calibrate import llm_load
from calibrate.experiments.llm_pinning import slice_figures
from calibrate.llm_server import ENGINE, server_args, step_records
from calibrate.servers import beside_llm_front_end, get_json, server
from simulator.scenario.config import Scenario

PROFILE = Path("calibrate/profiles/cpu-tiny-llm")


def burn(core: int) -> None:
    os.sched_setaffinity(0, {core})
    os.nice(19)  # the front end and the load generator come first on their core
    while True:
        pass


def main() -> None:
    knee = json.loads((PROFILE / "profile.json").read_text())["knee"]["completed_rps"]
    s = Scenario.model_validate(yaml.safe_load((PROFILE / "scenario.yaml").read_text()))
    rng = np.random.default_rng(11)
    rows = []
    with server(server_args(ENGINE), command="serve-llm", health="/health") as url, beside_llm_front_end(url):
        core = get_json(url + "/v1/models")["data"][0]["servesim"]["frontend_cores"][0]
        step_records(url)
        for pair in range(4):
            for busy in (False, True) if pair % 2 == 0 else (True, False):
                burner = mp.get_context("spawn").Process(target=burn, args=(core,), daemon=True) if busy else None
                if burner is not None:
                    burner.start()
                try:
                    plan = llm_load.plan_from_scenario(s, 0.3 * knee, 20.0, rng)
                    df = llm_load.run(url, plan, seed=int(rng.integers(1 << 31)))
                    st = step_records(url)
                finally:
                    if burner is not None:
                        burner.kill()
                        burner.join()
                row = {"pair": pair, "other_core_busy": busy, **slice_figures(df, st, (1, 2, 4))}
                rows.append(row)
                print(row, flush=True)  # noqa: T201
    t = pd.DataFrame(rows)
    print(t.groupby("other_core_busy").mean(numeric_only=True).round(3).to_string())  # noqa: T201


if __name__ == "__main__":
    main()
