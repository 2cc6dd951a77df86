"""Where a level's p50 error lives, stage by stage (calibrate/README, "The 70% p50's miss,
stage by stage").

For each level of a run (fitted and held out), the median of four parts of a request's
latency, measured and simulated:

* ``admit``: received to enqueued in the batch queue (the server's clocks; the
  simulator's ``t_preprocessed - t_api``);
* ``queue``: enqueued to dispatched (``queue_us``; ``t_dispatch - t_preprocessed``);
* ``after``: dispatched to the response written (the server's ``request_us`` less the
  two above; ``t_postprocessed - t_dispatch``): the batch, the hand-backs, the loop's writes;
* ``outside``: the client's latency less the server's ``request_us`` (``t_api - arrival``
  plus ``t_response - t_postprocessed``).

The server's clocks and the simulator's stages need not cut a request at the same
instants, so each part is also given as its growth from the lightest fitted level,
where a fixed offset between the two cancels. The simulation is the run's scenario
(:func:`calibrate.scenario.scenario_dict`) at the level's offered rate, over as many
slices as the level ran, ``REPS`` times on the same seeds, pooled.

    python calibrate/experiments/stage_split.py RUN [RUN ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.experiments.two_speeds import read_run
from calibrate.scenario import scenario_dict
from calibrate.validate import design
from simulator.engine import simulate
from simulator.results.metrics import window
from simulator.scenario.config import Scenario

REPS = 6
say = print


def simulated(profile: dict, rate: float, slices: int, slice_s: float, warmup_s: float, seed: int) -> pd.DataFrame:
    """Each completed request's queue wait and latency (ms) over ``REPS`` x ``slices``
    simulated slices of the run's design at ``rate``."""
    out = []
    for r in range(REPS):
        for j in range(slices):
            sub = int(np.random.SeedSequence([seed, r, j]).generate_state(1)[0])
            doc = scenario_dict(profile, rate, duration_s=slice_s, warmup_s=warmup_s, seed=sub)
            s = Scenario.model_validate(doc)
            rec = simulate(s).records
            done = window(rec, s) & rec.completed
            out.append(
                pd.DataFrame(
                    {
                        "admit": (rec.t_preprocessed - rec.t_api)[done],
                        "queue": (rec.t_dispatch - rec.t_preprocessed)[done],
                        "after": (rec.t_postprocessed - rec.t_dispatch)[done],
                        "outside": ((rec.t_api - rec.arrival) + (rec.t_response - rec.t_postprocessed))[done],
                        "latency": (rec.t_response - rec.arrival)[done],
                    }
                )
            )
    return pd.concat(out, ignore_index=True)


PARTS = ("admit", "queue", "after", "outside")


def measured(g: pd.DataFrame) -> pd.DataFrame:
    """The four parts of each measured request (ms)."""
    admit = (g["enqueued_at_ns"] - g["received_at_ns"]).to_numpy() / 1e6
    queue = g["queue_us"].to_numpy() / 1e3
    inside = g["request_us"].to_numpy() / 1e3
    latency = g["latency_ms"].to_numpy()
    return pd.DataFrame(
        {
            "admit": admit,
            "queue": queue,
            "after": inside - queue - admit,
            "outside": latency - inside,
            "latency": latency,
        }
    )


def main(runs: list[Path]) -> None:
    rows = []
    for run in runs:
        profile, requests, summary = read_run(run)
        slice_s, warmup_s = design(requests, profile)
        for _, lv in summary.iterrows():
            level = int(lv["level"])
            g = requests[(requests["level"] == level) & ~requests["warmup"] & (requests["status"] == 200)]
            m = measured(g)
            sim = simulated(profile, float(lv["offered_rps"]), int(g["slice"].nunique()), slice_s, warmup_s, level)
            row = {"run": run.name, "load": float(lv["load"]), "held_out": bool(lv["held_out"])}
            row["p50"] = 100 * (np.median(sim["latency"]) / np.median(m["latency"]) - 1)
            for part in PARTS:
                row[part], row[part + "_sim"] = float(np.median(m[part])), float(np.median(sim[part]))
            rows.append(row)
            say(
                f"{run.name} {row['load']:.0%}{' (held out)' if row['held_out'] else ''}: p50 {row['p50']:+.1f}% | "
                + ", ".join(f"{p} {row[p]:.2f} / {row[p + '_sim']:.2f}" for p in PARTS)
                + " ms (measured / simulated medians)",
                flush=True,
            )
    t = pd.DataFrame(rows)
    base = t[~t["held_out"]].sort_values("load").groupby("run").first()  # the lightest fitted level
    say(f"simulated less measured, median over {len(runs)} runs, ms (runs where the simulation is under):")
    for load, g in t.groupby("load"):
        parts = []
        for p in PARTS:
            d = g[p + "_sim"] - g[p]
            grow = (g[p + "_sim"] - g["run"].map(base[p + "_sim"])) - (g[p] - g["run"].map(base[p]))
            parts.append(
                f"{p} {d.median():+.2f} ({(d < 0).sum()}), its growth {grow.median():+.2f} ({(grow < 0).sum()})"
            )
        say(f"  {load:.0%}: p50 {g['p50'].median():+.1f}% ({(g['p50'] < 0).sum()}) | " + "; ".join(parts))


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]] or [Path("calibrate/profiles/cpu-resnet64-epyc")])
