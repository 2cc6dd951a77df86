"""Work after a rest runs slower: by how much, and what fitting it moves (calibrate/README,
"A batch after an idle instance").

For a run folder of ``servesim calibrate run``: each batch's time over the fitted table by
how long its instance sat idle before it (from the slice's batch before, by the server's
dispatch clock), by band of idle time; a read on an idle loop (read to queued) by how long
the loop had slept; then the run refitted four times, copies of the folder, with the same
seed: without either factor, with the instance's (``workers.service_time.after_idle``,
:data:`calibrate.idle.AFTER_IDLE`), with the loop's too (``preprocess.event_loop.after_idle``,
:data:`calibrate.idle.LOOP_AFTER_IDLE`), and with the batch's factor by its instance's recent
throughput as well (``workers.service_time.by_rate``, :data:`calibrate.idle.BY_RATE`, the
first three without it), and the held-out p50/p99 errors of each.

    python calibrate/experiments/after_idle.py RUN [RUN ...]    # ~1.5 min a run on 2 cores
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

import calibrate.fit as fit
from calibrate import idle
from calibrate.refit import refit_run

say = print


def bands(run: Path) -> pd.DataFrame:
    """Mean ratio of batch time to the run's fitted mean, by band of idle time, all levels."""
    profile = json.loads((run / "profile.json").read_text())
    requests = pd.read_csv(run / "measurements.csv.gz")
    b = fit.batches_from_requests(requests[~requests["warmup"]])
    b["ratio"] = b["service_ms"] / fit.predicted_ms(profile["service_time"], b["batch_size"].to_numpy())
    b["idle band, ms"] = pd.cut(b["idle_ms"].clip(lower=0), idle.IDLE_EDGES_MS, right=False)
    return b.groupby("idle band, ms", observed=True)["ratio"].agg(["count", "median", "mean"]).round(3)


def loop_bands(run: Path) -> pd.DataFrame:
    """A read on an idle loop (read to queued, ms) by band of the loop's idle time before it."""
    r = pd.read_csv(run / "measurements.csv.gz")
    r = r[r["status"] == 200].dropna(subset=["received_at_ns", "enqueued_at_ns", "dispatched_at_ns"])
    gap = idle.loop_gaps_ms(r, fit.batch_time_us(r).to_numpy() / 1e3)
    read = pd.Series((r["enqueued_at_ns"] - r["received_at_ns"]).to_numpy() / 1e6)
    keep = ~r["warmup"].to_numpy() & (gap > idle.LOOP_EDGES_MS[0])
    band = pd.cut(gap[keep], idle.LOOP_EDGES_MS, right=False)
    return read[keep].groupby(band, observed=True).agg(["count", "median", "mean"]).round(3)


def errors(folder: Path) -> str:
    cells = []
    for x in json.loads((folder / "validation.json").read_text())["validation"]:
        if x["percentile"] in ("p50", "p99"):
            miss = "!" if x["verdict"] == "miss" else ""
            cells.append(f"{x['load']:.0%} {x['percentile']} {x['error_pct']:+.1f}{miss}")
    met = sum(1 for c in cells if not c.endswith("!"))
    return f"met {met} of {len(cells)} | " + " | ".join(cells)


def main(runs: list[str]) -> None:
    for run in map(Path, runs):
        say(f"== {run}\nbatch over the table by the instance's idle\n{bands(run).to_string()}")
        say(f"read on an idle loop by the loop's idle\n{loop_bands(run).to_string()}")
        with tempfile.TemporaryDirectory() as tmp:
            ladder = (("neither", False, False, False), ("instance", True, False, False), ("both", True, True, False),
                      ("by_rate", True, True, True))  # fmt: skip
            for name, batch, loop, rate in ladder:
                copy = Path(tmp) / name
                shutil.copytree(run, copy)
                idle.AFTER_IDLE, idle.LOOP_AFTER_IDLE, idle.BY_RATE = batch, loop, rate
                refit_run(copy, draws=200, rng=np.random.default_rng(0))
                profile = json.loads((copy / "profile.json").read_text())
                say(f"{name:8s} {errors(copy)}")
                loop_fit = profile["frontend"].get("event_loop")
                for where, d in (("instance", profile["service_time"]), ("loop", loop_fit)):
                    if (d or {}).get("after_idle"):
                        say(f"         {where}'s after_idle {d['after_idle']}")
                if profile["service_time"].get("by_rate"):
                    say(f"         by_rate {profile['service_time']['by_rate']}")
        idle.AFTER_IDLE = idle.LOOP_AFTER_IDLE = idle.BY_RATE = True


if __name__ == "__main__":
    main(sys.argv[1:] or ["calibrate/profiles/cpu-resnet64"])
