"""The engine's counters (calibrate/README, "What the misses are made of"): same-shape steps
run 8-15% faster at 85% of the knee than at 30%. This VM exposes no hardware counters
(``perf`` lists no ``cpu`` event source), but the kernel's own are there: each step's CPU
time on the engine's thread (``StepRecord.cpu_ns``) against its wall time tells a thread
that lost its core (preempted, stolen, interrupted) from one that ran slower; the engine
process's page faults, context switches and run-queue wait (``/proc/<pid>``) tell more
work from slower work. One server, 30% and 80% of the knee the runs measured (20 req/s)
alternated, 20 s each, four pairs. Per slice: decode-only steps of 1, 2 and 4 sequences,
their median forward pass in wall and in CPU time (ms); over all steps, wall over CPU;
and a step's minor faults, involuntary switches and run-queue wait (µs).

    python calibrate/experiments/llm_counters.py   # about 3 minutes, from the repository root
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from calibrate import llm_load
from calibrate.llm_server import ENGINE, server_args, step_records
from calibrate.servers import beside_llm_front_end, get_json, server
from simulator.scenario.config import Scenario

PROFILE = Path("calibrate/profiles/cpu-tiny-llm")
KNEE_RPS = 20.0  # the knee the calibrations measured, 18.5-20.3 req/s (run 6's 24.9 was a fast minute)


def counters(pid: int) -> dict:
    """The process's minor faults, involuntary switches and run-queue wait (ns), summed over its threads."""
    out = {"minflt": 0.0, "nvcsw": 0.0, "run_delay_ns": 0.0}
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        out["minflt"] += float(stat.rsplit(")", 1)[1].split()[7])
        for line in (task / "status").read_text().splitlines():
            if line.startswith("nonvoluntary_ctxt_switches"):
                out["nvcsw"] += float(line.split()[1])
        out["run_delay_ns"] += float((task / "schedstat").read_text().split()[1])
    return out


def slice_row(steps: pd.DataFrame, spent: dict) -> dict:
    wall = (steps["end_ns"] - steps["start_ns"]) / 1e6
    cpu = steps["cpu_ns"] / 1e6
    dec = steps["chunks"] == 0
    row = {"steps": len(steps)}
    for d in (1, 2, 4):
        m = dec & (steps["decodes"] == d)
        row[f"wall_D{d}"] = float(wall[m].median()) if m.sum() > 20 else np.nan
        row[f"cpu_D{d}"] = float(cpu[m].median()) if m.sum() > 20 else np.nan
        row[f"ctx_D{d}"] = float((steps["decode_context"][m] / d).median()) if m.sum() > 20 else np.nan
    row["wall_over_cpu"] = float(wall.sum() / cpu.sum())
    n = max(len(steps), 1)
    row["minflt_a_step"] = spent["minflt"] / n
    row["nvcsw_a_step"] = spent["nvcsw"] / n
    row["run_delay_us_a_step"] = spent["run_delay_ns"] / n / 1e3
    return row


def main() -> None:
    s = Scenario.model_validate(yaml.safe_load((PROFILE / "scenario.yaml").read_text()))
    rng = np.random.default_rng(17)
    rows = []
    with server(server_args(ENGINE), command="serve-llm", health="/health") as url, beside_llm_front_end(url):
        pid = get_json(url + "/v1/models")["data"][0]["servesim"]["engine_pid"]
        step_records(url)
        for pair in range(4):
            for share in (0.3, 0.8) if pair % 2 == 0 else (0.8, 0.3):
                plan = llm_load.plan_from_scenario(s, share * KNEE_RPS, 20.0, rng)
                before = counters(pid)
                llm_load.run(url, plan, seed=int(rng.integers(1 << 31)))
                after = counters(pid)
                spent = {k: after[k] - before[k] for k in before}
                st = step_records(url)
                row = {"pair": pair, "share": share, **slice_row(st, spent)}
                if len(sys.argv) > 1:  # a folder to keep each slice's step records in
                    st.assign(pair=pair, share=share).to_csv(Path(sys.argv[1]) / f"steps_{pair}_{share}.csv.gz")
                rows.append(row)
                print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)  # noqa: T201
    t = pd.DataFrame(rows)
    print(t.groupby("share").mean(numeric_only=True).round(3).to_string())  # noqa: T201


if __name__ == "__main__":
    main()
