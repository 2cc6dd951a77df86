"""The batch's hand-back on the loop, measured and simulated (calibrate/README, "The
hand-back's tail").

A batch's hand-back is its instance's answer read and its outputs copied on the front
end's loop (the server's ``handoff`` less ``handoff_in``): the instance is free when it is
done. For every level of each run, measured and simulated:

* ``hb``: the hand-back's mean (ms); simulated, from the instance's end to the loop's
  (:attr:`simulator.ledger.BatchLog.computed` to ``end``);
* ``inst``: the instance's own part (dispatch to its answer written) over the profile's
  batch table, mean;
* ``tot``: the two together over the table, mean;
* ``size``: the request-weighted mean batch size;

simulated twice: the hand-back a constant (``return_ms``, its light-level median) and drawn
from the light level's hand-backs (``return_time``). Then ``reads``: the requests the loop
read inside the hand-backs over 1 ms against the level's rate: a loop kept from its core
reads none, a loop busy with reads more.

    python calibrate/experiments/hand_back.py RUN [RUN ...]
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate import scenario as cal_scenario
from calibrate.experiments.two_speeds import read_run
from calibrate.samples import fit_distribution
from calibrate.scenario import scenario_dict
from calibrate.validate import design
from simulator.engine import simulate
from simulator.scenario.config import Scenario

REPS = 6
COLUMNS = ("hb", "inst", "tot", "size")
VARIANTS = {"constant": False, "drawn": True}
say = print


def table_ms(profile: dict) -> np.ndarray:
    """The batch table by size (interpolated between its sizes)."""
    tab = profile["service_time"]["batch_ms"]
    sizes = np.array(sorted(int(k) for k in tab))
    return np.interp(np.arange(int(profile["server"]["max_batch_size"]) + 1), sizes, [tab[str(k)] for k in sizes])


def with_drawn(profile: dict, ok: pd.DataFrame) -> dict:
    """``profile`` with the light level's hand-backs to draw from (as :func:`calibrate.loop_fit.fit_event_loop`
    fits them), for profiles fitted before them."""
    loop = profile["frontend"]["event_loop"]
    if "return_time" not in loop:
        light = min(f["level"] for f in profile["fit_levels"])
        b = ok[ok["level"] == light].drop_duplicates(["slice", "dispatched_at_ns"])
        back = ((b["handoff_us"] - b["handoff_in_us"]) / 1e3).to_numpy()
        profile = copy.deepcopy(profile)
        profile["frontend"]["event_loop"]["return_time"] = fit_distribution(back, rng=np.random.default_rng(0))
    return profile


def measured(b: pd.DataFrame, table: np.ndarray) -> dict:
    """The columns for one level's batches (a row per batch, the server's timings in us)."""
    back = (b["handoff_us"] - b["handoff_in_us"]) / 1e3
    own = (b["handoff_in_us"] + b["compute_input_us"] + b["compute_infer_us"] + b["compute_output_us"]) / 1e3
    size = b["batch_size"].to_numpy().astype(int)
    return {
        "hb": back.mean(),
        "inst": (own / table[size]).mean(),
        "tot": ((own + back) / table[size]).mean(),
        "size": (size**2).sum() / size.sum(),
    }


def simulated(profile: dict, rate: float, slices: int, slice_s: float, warmup_s: float, level: int, table) -> dict:
    """The columns over ``REPS`` x ``slices`` simulated slices at ``rate`` (batches after warm-up)."""
    parts = []
    for j in range(slices * REPS):
        seed = int(np.random.SeedSequence([level, j]).generate_state(1)[0])
        doc = scenario_dict(profile, rate, duration_s=slice_s, warmup_s=warmup_s, seed=seed)
        log = simulate(Scenario.model_validate(doc)).batches
        keep = log.start > warmup_s * 1000
        parts.append(
            pd.DataFrame({"start": log.start, "computed": log.computed, "end": log.end, "size": log.size})[keep]
        )
    b = pd.concat(parts, ignore_index=True)
    size = b["size"].to_numpy()
    return {
        "hb": (b["end"] - b["computed"]).mean(),
        "inst": ((b["computed"] - b["start"]) / table[size]).mean(),
        "tot": ((b["end"] - b["start"]) / table[size]).mean(),
        "size": (size**2).sum() / size.sum(),
    }


def reads_inside(ok: pd.DataFrame, over_ms: float = 1.0) -> tuple[int, float]:
    """Requests read (``received_at_ns``) inside the hand-backs longer than ``over_ms`` (from
    0.3 ms after the instance's answer to 0.05 ms before the loop's end), and how many the
    level's rate would put there."""
    got, span, reads, seconds = 0, 0.0, 0, 0.0
    for _, g in ok.groupby("slice"):
        read = np.sort(g["received_at_ns"].to_numpy() / 1e6)
        b = g.drop_duplicates("dispatched_at_ns")
        compute = (b["compute_input_us"] + b["compute_infer_us"] + b["compute_output_us"]) / 1e3
        answered = (b["dispatched_at_ns"] / 1e6 + b["handoff_in_us"] / 1e3 + compute).to_numpy()
        taken = answered + ((b["handoff_us"] - b["handoff_in_us"]) / 1e3).to_numpy()
        lo, hi = answered + 0.3, taken - 0.05
        long = taken - answered > over_ms
        got += int((np.searchsorted(read, hi[long]) - np.searchsorted(read, lo[long])).sum())
        span += float((hi - lo)[long].sum())
        reads, seconds = reads + len(read), seconds + float(np.ptp(read))
    return got, reads / seconds * span if seconds > 0 else float("nan")


def main(runs: list[Path]) -> None:
    rows = []
    for run in runs:
        profile, requests, summary = read_run(run)
        ok = requests[~requests["warmup"] & (requests["status"] == 200)]
        profile = with_drawn(profile, ok)
        table = table_ms(profile)
        slice_s, warmup_s = design(requests, profile)
        for _, lv in summary.iterrows():
            level = int(lv["level"])
            g = ok[ok["level"] == level]
            row = {
                "run": run.name,
                "load": float(lv["load"]),
                **measured(g.drop_duplicates(["slice", "dispatched_at_ns"]), table),
            }
            for name, drawn in VARIANTS.items():
                cal_scenario.HAND_BACK_DRAWN = drawn
                try:
                    sim = simulated(
                        profile, float(lv["offered_rps"]), int(g["slice"].nunique()), slice_s, warmup_s, level, table
                    )
                finally:
                    cal_scenario.HAND_BACK_DRAWN = True
                row |= {f"{name}_{c}": v for c, v in sim.items()}
            row["reads"], row["reads_expected"] = reads_inside(g)
            rows.append(row)
            say(
                f"{run.name} {row['load']:.0%}: hand-back {row['hb']:.3f} ms measured, "
                + ", ".join(f"{n} {row[f'{n}_hb']:.3f}" for n in VARIANTS)
                + f"; reads inside the long ones {row['reads']} (the rate's {row['reads_expected']:.0f})",
                flush=True,
            )
    t = pd.DataFrame(rows)
    say(f"simulated against measured, %, median over {len(runs)} runs (runs where the simulation is under):")
    for load, g in t.groupby("load"):
        cells = []
        for c in COLUMNS:
            for n in VARIANTS:
                d = 100 * (g[f"{n}_{c}"] / g[c] - 1)
                cells.append(f"{c} {n} {d.median():+.1f} ({(d < 0).sum()})")
        ratio = g["reads"].sum() / g["reads_expected"].sum()
        say(f"  {load:.0%}: " + "; ".join(cells) + f"; reads inside long hand-backs {ratio:.1f}x the rate's")


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]] or [Path("calibrate/profiles/cpu-resnet64-epyc")])
