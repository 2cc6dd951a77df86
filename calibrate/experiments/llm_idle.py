"""The engine's idle (calibrate/README, "What the misses are made of"): same-shape steps run
8-15% faster at 85% of the knee than at 30%, in every calibration, and neither the front
end, the other core, the time since the engine last idled nor stalls explain it. This VM
has no hardware counters (``perf`` lists no ``cpu`` event source), so a slower clock and
more work cannot be told apart by counting cycles. Change one thing instead: the engine's
idle. Asleep on its pipe (``--idle sleep``, as in every calibration), its core halts
between bursts, and the hypervisor may hand the physical core to another guest or let it
clock down; polling (``--idle spin``), the core stays busy whatever the load. Two
conditions, each a fresh server, in a random order in each of eight rounds; in each, 30% of
the profile's knee for 15 s (where the engine idles a third of the time). Per slice: the
median forward pass (ms) of decode-only steps of 1, 2 and 4 sequences, the client's TPOT
p50, and the shares of the engine's core idle and stolen by the hypervisor (``/proc/stat``).
The host's speed drifts by 15-25% from minute to minute, so the conditions are compared
within each round (the ratio spin/sleep), not pooled.

    python calibrate/experiments/llm_idle.py   # about 6 minutes, from the repository root
"""

from __future__ import annotations

import json
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


def cpu_times(core: int) -> np.ndarray:
    """``/proc/stat``'s line for ``core``: user, nice, system, idle, iowait, irq, softirq, steal."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{core} "):
            return np.array(line.split()[1:9], dtype=float)
    raise LookupError(f"no cpu{core} in /proc/stat")


def main() -> None:
    knee = json.loads((PROFILE / "profile.json").read_text())["knee"]["completed_rps"]
    s = Scenario.model_validate(yaml.safe_load((PROFILE / "scenario.yaml").read_text()))
    rng = np.random.default_rng(13)
    rows = []
    for rnd in range(8):
        for idle in rng.permutation(["sleep", "spin"]):
            args = [*server_args(ENGINE), "--idle", str(idle)]
            with server(args, command="serve-llm", health="/health") as url, beside_llm_front_end(url):
                core = get_json(url + "/v1/models")["data"][0]["servesim"]["engine_core"]
                step_records(url)
                for share in (0.3,):
                    plan = llm_load.plan_from_scenario(s, share * knee, 15.0, rng)
                    before = cpu_times(core)
                    df = llm_load.run(url, plan, seed=int(rng.integers(1 << 31)))
                    spent = cpu_times(core) - before
                    row = {"round": rnd, "idle": str(idle), "share": share}
                    row.update(slice_figures(df, step_records(url), (1, 2, 4)))
                    row["steal_pct"] = 100 * spent[7] / max(spent.sum(), 1.0)
                    row["idle_pct"] = 100 * spent[3] / max(spent.sum(), 1.0)
                    rows.append(row)
                    print(row, flush=True)  # noqa: T201
    t = pd.DataFrame(rows)
    print(t.groupby("idle").mean(numeric_only=True).round(3).to_string())  # noqa: T201
    cols = ["fwd_D1", "fwd_D2", "fwd_D4", "tpot_p50"]
    by = t.pivot_table(index="round", columns="idle", values=cols)
    ratio = pd.DataFrame({c: by[(c, "spin")] / by[(c, "sleep")] for c in cols})
    print("spin / sleep, each round:")  # noqa: T201
    print(ratio.round(3).to_string())  # noqa: T201
    print("median", ratio.median().round(3).to_dict(), "rounds spin faster", (ratio < 1).sum().to_dict())  # noqa: T201


if __name__ == "__main__":
    main()
