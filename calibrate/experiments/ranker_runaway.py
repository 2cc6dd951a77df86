"""Why the ranker's prediction interval at 85% reaches seconds (calibrate/README, "The
ranker's interval runs away at 85%").

The committed ranker report (``calibrate/profiles/cpu-ranker-mget``) predicts the 85% p99
at 58 ms inside [22, 5556] ms: some of the validation's parameter draws run away. Here
``DRAWS`` of those draws (:func:`calibrate.interval.parameter_draws`, seeded) simulate the
level's design (ten slices after a lead-in, as the validation does) as fitted and with one
thing taken out of each draw:

* ``no cost per in flight``: the event loop's jobs no longer slow with the requests in
  the server (``frontend.event_loop.cost_per_in_flight`` = 0);
* ``no episodes``: the speed process without its slow episodes;
* ``neither``: both taken out.

Per variant: the p99's median over the draws, its 5th and 95th percentiles, and the draws
whose p99 passes ``RUNAWAY_MS``.

    python calibrate/experiments/ranker_runaway.py [RUN] [--seed N]   # about 1 min a seed

``--seed`` draws another set of parameters (0 by default).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.interval import design_percentiles, parameter_draws
from calibrate.validate import follows, slice_design

RUN = Path(__file__).resolve().parents[1] / "profiles/cpu-ranker-mget"
DRAWS = 100
RUNAWAY_MS = 300.0
LOADS = (0.7, 0.85)
VARIANTS = ("as fitted", "no cost per in flight", "no episodes", "neither")
say = print


def variant(profile: dict, name: str) -> dict:
    """``profile`` with ``name``'s one thing taken out."""
    p = copy.deepcopy(profile)
    if name in ("no cost per in flight", "neither"):
        p["frontend"]["event_loop"]["cost_per_in_flight"] = 0.0
    if name in ("no episodes", "neither"):
        p["speed_process"]["speed"].pop("episodes", None)
    return p


def main(run: Path, seed: int = 0) -> None:
    profile = json.loads((run / "profile.json").read_text())
    requests = pd.read_csv(run / "measurements.csv.gz")
    slices = pd.read_csv(run / "slices.csv")
    draws = parameter_draws(profile, requests, slices, draws=DRAWS, rng=np.random.default_rng(seed))
    shape = slice_design(profile, requests, slices)
    kept = slices[slices["kept"]]
    capacity = float(profile["capacity_rps"])
    n_slices = int(kept.groupby("level").size().median())
    say(f"{run.name}: {DRAWS} parameter draws (seed {seed}), {n_slices} slices a design, capacity {capacity:.1f} req/s")
    for load in LOADS:
        rate = load * capacity
        for name in VARIANTS:
            p99 = []
            for k, (p, factor) in enumerate(draws):
                q = variant(p, name)
                level = follows(q, shape, rate)._replace(slices=n_slices)
                p99.append(design_percentiles(q, rate, level, seed=k, frontend_factor=factor)["p99"])
            v = np.asarray(p99)
            say(
                f"{load:.0%} {name}: p99 median {np.median(v):.1f} ms, 5-95% [{np.quantile(v, 0.05):.1f}, "
                f"{np.quantile(v, 0.95):.1f}], over {RUNAWAY_MS:.0f} ms in {(v > RUNAWAY_MS).sum()} of {len(v)}",
                flush=True,
            )


if __name__ == "__main__":
    args = sys.argv[1:]
    seed = 0
    if "--seed" in args:
        at = args.index("--seed")
        seed, args = int(args[at + 1]), args[:at] + args[at + 2 :]
    main(Path(args[0]) if args else RUN, seed)
