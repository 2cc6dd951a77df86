"""Is a fresh engine faster? (calibrate/README, "The first knee slice"): overload slices
back to back in one server, the same in a second server started afresh, nothing else in
between. Per slice: completions a second (as the knee counts them) and the engine's steps
against one fit on all slices (the median log ratio), each server's slices in order.

    python calibrate/experiments/llm_fresh.py [SLICES] [SERVERS]   # about 4 minutes (4 x 2)
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from calibrate import llm_profile
from calibrate.llm_server import ENGINE, measured_knee, server_args, step_records
from calibrate.llm_sim import KNEE_SKIP_S, scenario_dict
from calibrate.servers import beside_llm_front_end, server

KNEE_S = 25.0


def main(slices: int, servers: int) -> None:
    fit = llm_profile.fit(pd.read_csv("calibrate/profiles/cpu-tiny-llm/steps.csv.gz"), wake_steps=0)
    doc = scenario_dict({**fit, "noise_cv": 0.1}, ENGINE, rate_rps=1.0, duration_s=20.0, warmup_s=3.0)
    rows, steps = [], []
    for srv in range(servers):
        with server(server_args(ENGINE), command="serve-llm", health="/health") as url, beside_llm_front_end(url):
            step_records(url)  # the warm-up's
            for k in range(slices):
                got = measured_knee(url, doc, 40.0, KNEE_S, KNEE_SKIP_S, seed=1000 * srv + k)
                steps.append(step_records(url).assign(server=srv, slice=k))
                rows.append({"server": srv, "slice": k, "completed_rps": got["completed_rps"]})
                print(rows[-1], flush=True)  # noqa: T201
    st = pd.concat(steps, ignore_index=True)
    common = llm_profile.fit(st, wake_steps=0)
    st["r"] = np.log(llm_profile.step_ms(st) / llm_profile.predict_ms(common, st))
    ratio = st.groupby(["server", "slice"])["r"].median().rename("log_step_vs_fit").reset_index()
    out = pd.DataFrame(rows).merge(ratio)
    print(out.to_string(index=False, float_format=lambda x: f"{x:+.3f}"))  # noqa: T201


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    main(*(args + [4, 2][len(args) :]))
