"""Pinning (calibrate/README, "What the misses are made of"): does the engine's forward pass
run slower at low load because the front end and the load generator, free to move, run on
the engine's core while it idles and stay there when it wakes? Two conditions, each a fresh
server, in a random order per round: the front end and this process (the load generator)
left to the kernel's scheduler, or pinned to core 0 (the engine has core 1 either way).
In each, 30% and 85% of the profile's knee for 20 s. Per slice: the median forward pass
(ms) of decode-only steps of 1, 2, 4 and 8 sequences, and the client's TPOT p50.

    python calibrate/experiments/llm_pinning.py   # about 5 minutes, from the repository root
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate import llm_load
from calibrate.llm_server import ENGINE, server_args, step_records
from calibrate.servers import _free_port
from simulator.scenario.config import Scenario

PROFILE = Path("calibrate/profiles/cpu-tiny-llm")


@contextlib.contextmanager
def engine_server(pinned: bool):
    port = _free_port()
    exe = Path(sys.executable).with_name("servesim")
    pin = (lambda: os.sched_setaffinity(0, {0})) if pinned else None
    args = [str(exe), "serve-llm", "--port", str(port), *server_args(ENGINE)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=pin)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            with contextlib.suppress(OSError), urllib.request.urlopen(url + "/health", timeout=1):
                break
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def slice_figures(df: pd.DataFrame, steps: pd.DataFrame, sizes=(1, 2, 4, 8)) -> dict:
    """A slice's median forward pass (ms) of decode-only steps of each size, and its
    client's TPOT p50 (ms), the first 3 s left out."""
    fwd = (steps["end_ns"] - steps["start_ns"]) / 1e6
    dec = steps["chunks"] == 0
    row = {}
    for d in sizes:
        m = dec & (steps["decodes"] == d)
        row[f"fwd_D{d}"] = float(fwd[m].median()) if m.sum() > 20 else np.nan
    ok = df[df["error"].isna() & (df["scheduled_s"] >= 3)]
    row["tpot_p50"] = ok["tpot_s"].median() * 1e3
    return row


def main() -> None:
    profile = json.loads((PROFILE / "profile.json").read_text())
    knee = profile["knee"]["completed_rps"]
    import yaml

    s = Scenario.model_validate(yaml.safe_load((PROFILE / "scenario.yaml").read_text()))
    rng = np.random.default_rng(7)
    everywhere = os.sched_getaffinity(0)
    rows = []
    for rnd in range(2):
        for pinned in rng.permutation([False, True]):
            pinned = bool(pinned)
            os.sched_setaffinity(0, {0} if pinned else everywhere)
            with engine_server(pinned) as url:
                step_records(url)
                for share in (0.3, 0.85):
                    plan = llm_load.plan_from_scenario(s, share * knee, 20.0, rng)
                    df = llm_load.run(url, plan, seed=int(rng.integers(1 << 31)))
                    row = {"round": rnd, "pinned": pinned, "share": share, **slice_figures(df, step_records(url))}
                    rows.append(row)
                    print(row, flush=True)  # noqa: T201
    os.sched_setaffinity(0, everywhere)
    t = pd.DataFrame(rows)
    print(t.groupby(["pinned", "share"]).mean(numeric_only=True).round(3).to_string())  # noqa: T201


if __name__ == "__main__":
    main()
