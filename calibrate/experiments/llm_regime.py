"""Light load slow, or heavy load fast (calibrate/README, "Heavy load runs fast on some
hosts")? In runs 22, 28, 30 and 31 the 30% level's steps ran 0.11-0.15 slower in log than
the fit of the other phases, while the knee's ran 0.07-0.13 faster; the decode-only steps
of one sequence took 1.27-1.44 ms at 30% in every run, but 0.86-1.10 ms at 70% and the
knee in those four against 1.37-1.61 ms in runs 25-27: the same light-load speed
everywhere, and a host that speeds up under sustained load on some days. Change one thing:
the engine's idle. Asleep on its pipe (``--idle sleep``, as in every calibration), its
core halts between bursts; polling (``--idle spin``), the core is busy whatever the load,
so a host that clocks a busy vCPU up sees a busy one at 30% too. Per round, each idle
mode a fresh server (in a random order), on it 30% and 80% of 20 req/s (the knee of runs
before 22; in a random order), 20 s a slice. Per slice: the host's speed over its time
(:func:`calibrate.experiments.llm_halt.host_over_time`: every step against one fit of
all the experiment's steps, each quarter-second's mean log ratio averaged over the
slice's; > 0 slower) and the median forward pass (ms) of
decode-only steps of 1, 2 and 4 sequences.

    python calibrate/experiments/llm_regime.py [ROUNDS [SEED]]   # 3 rounds: about 5 minutes
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from calibrate import llm_load
from calibrate.experiments.llm_halt import host_over_time
from calibrate.llm_server import ENGINE, server_args, step_records
from calibrate.servers import beside_llm_front_end, server
from simulator.scenario.config import Scenario

PROFILE = Path("calibrate/profiles/cpu-tiny-llm")
KNEE_RPS = 20.0


def main(rounds: int = 3, seed: int = 23) -> None:
    s = Scenario.model_validate(yaml.safe_load((PROFILE / "scenario.yaml").read_text()))
    rng = np.random.default_rng(seed)
    parts = []
    for rnd in range(rounds):
        for idle in rng.permutation(["sleep", "spin"]):
            with (
                server([*server_args(ENGINE), "--idle", str(idle)], command="serve-llm", health="/health") as url,
                beside_llm_front_end(url),
            ):
                step_records(url)
                for share in rng.permutation([0.3, 0.8]):
                    plan = llm_load.plan_from_scenario(s, float(share) * KNEE_RPS, 20.0, rng)
                    llm_load.run(url, plan, seed=int(rng.integers(1 << 31)))
                    st = step_records(url)
                    parts.append(st.assign(round=rnd, idle=str(idle), share=float(share)))
                    print(f"round {rnd} {idle} {share:.0%}: {len(st)} steps", flush=True)  # noqa: T201
    every = pd.concat(parts, ignore_index=True)
    every = every[every.groupby(["round", "idle", "share"])["begin_ns"].transform(lambda b: b - b.min()) >= 3e9]
    host = host_over_time(every, ["round", "idle", "share"])
    d = every[(every["chunks"] == 0) & every["decodes"].isin([1, 2, 4])].copy()
    d["fwd"] = (d["end_ns"] - d["start_ns"]) / 1e6
    t = d.pivot_table(index=["idle", "share"], columns="decodes", values="fwd", aggfunc="median").round(3)
    t["host"] = host.groupby(["idle", "share"]).mean().round(3)
    print(t.to_string())  # noqa: T201
    each = host.unstack("share")
    each["30% less 80%"] = each[0.3] - each[0.8]
    print(each.round(3).to_string())  # noqa: T201


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
