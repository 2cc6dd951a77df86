"""The LLM twin on the path a user takes (calibrate/README, "The LLM twin"): ``servesim
serve-llm`` as the committed profile measured it, open-loop load at half its knee, and
``servesim calibrate watch --openai`` as its own process, every 10 s for ``DURATION_S``;
then when each row's scrape was taken, how long after it the row was printed, the twin's
speed factor and announcement, and how much older than the row its fit's window was (a
row waits for its own window's fit until 90% of the interval, then carries the newest
fit finished). All on this machine: the twin's simulations
share its cores with the engine and the load generator.

    python calibrate/experiments/llm_twin_live.py [DURATION_S]   # default 60; ~3 minutes
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml

from calibrate import llm_load
from calibrate.llm_server import profile_server_args
from calibrate.servers import server
from simulator.scenario.config import Scenario

FOLDER = Path(__file__).parents[1] / "profiles/cpu-tiny-llm"


def _seconds(t: time.struct_time) -> int:
    return t.tm_hour * 3600 + t.tm_min * 60 + t.tm_sec


def main() -> None:
    duration_s = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    profile = json.loads((FOLDER / "profile.json").read_text())
    knee = profile["knee"]["completed_rps"]
    scenario = Scenario.model_validate(yaml.safe_load((FOLDER / "scenario.yaml").read_text()))
    out = Path(tempfile.mkdtemp()) / "twin.jsonl"
    with server(profile_server_args(profile), command="serve-llm", health="/health") as url:
        plan = llm_load.plan_from_scenario(scenario, 0.5 * knee, duration_s, np.random.default_rng(1))
        load = threading.Thread(target=llm_load.run, args=(url, plan), kwargs={"seed": 1})
        load.start()
        t0 = time.time()
        cmd = [sys.executable, "-m", "servesim", "calibrate", "watch", "--openai", "--url", url]
        cmd += ["--interval-s", "10", "--duration-s", f"{duration_s:g}", "--json", str(out), "--sla", "p99<=250ms"]
        watch = subprocess.run(cmd, capture_output=True, text=True, timeout=3 * duration_s + 900)
        wall = time.time() - t0
        load.join()
    print(watch.stdout, watch.stderr[-2000:])  # noqa: T201
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    printed = [line.split()[0] for line in watch.stdout.splitlines()[2:] if line[:2].isdigit()]
    print(f"knee {knee:.2f} req/s, load {0.5 * knee:.2f} req/s for {duration_s:g} s; the watch ran {wall:.0f} s")  # noqa: T201
    for row, at in zip(rows, printed, strict=False):
        done, began = time.strptime(at, "%H:%M:%S"), time.localtime(row["time"])
        took = (_seconds(done) - _seconds(began)) % 86400  # the printed clock has whole seconds
        print(  # noqa: T201
            f"  scrape at +{row['time'] - t0:.0f} s, row printed {took:.0f} s later, "
            f"speed {row.get('speed_factor', math.nan):.2f}, breaks at {row.get('breaking_rate_rps') or math.nan:.2f}, "
            f"its fit's window {row.get('fit_age_s', math.nan):.0f} s older"
        )


if __name__ == "__main__":
    main()
