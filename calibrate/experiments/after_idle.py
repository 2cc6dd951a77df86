"""A batch after its instance sat idle runs slower: by how much, and what fitting it moves
(calibrate/README, "A batch after an idle instance").

For a run folder of ``servesim calibrate run``: each batch's time over the fitted table by
how long its instance sat idle before it (from the slice's batch before, by the server's
dispatch clock), by level and by band of idle time; then the run refitted twice, copies
of the folder, with the same seed, without and with ``service_time.after_idle``
(:data:`calibrate.fit.AFTER_IDLE`), and the held-out p50/p99 errors of each.

    python calibrate/experiments/after_idle.py RUN [RUN ...]    # ~1 min a run on 2 cores
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
from calibrate.run import refit_run

say = print


def bands(run: Path) -> pd.DataFrame:
    """Mean ratio of batch time to the run's fitted mean, by band of idle time, all levels."""
    profile = json.loads((run / "profile.json").read_text())
    requests = pd.read_csv(run / "measurements.csv.gz")
    b = fit.batches_from_requests(requests[~requests["warmup"]])
    b["ratio"] = b["service_ms"] / fit.predicted_ms(profile["service_time"], b["batch_size"].to_numpy())
    b["idle band, ms"] = pd.cut(b["idle_ms"].clip(lower=0), fit.IDLE_EDGES_MS, right=False)
    return b.groupby("idle band, ms", observed=True)["ratio"].agg(["count", "median", "mean"]).round(3)


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
        say(f"== {run}\n{bands(run).to_string()}")
        with tempfile.TemporaryDirectory() as tmp:
            for on in (False, True):
                copy = Path(tmp) / ("with" if on else "without")
                shutil.copytree(run, copy)
                fit.AFTER_IDLE = on
                refit_run(copy, draws=200, rng=np.random.default_rng(0))
                st = json.loads((copy / "profile.json").read_text())["service_time"]
                say(f"{'with   ' if on else 'without'} {errors(copy)}")
                if on:
                    say(f"        after_idle {st.get('after_idle')}")
        fit.AFTER_IDLE = True


if __name__ == "__main__":
    main(sys.argv[1:] or ["calibrate/profiles/cpu-resnet64"])
