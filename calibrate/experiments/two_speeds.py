"""A level's speed and the moment's, apart: does a batch's speed read as the level's (a
line in the level's rate through the fitted levels) times the moment's (a slope in the
instance's recent throughput about the level's mean, as steep as within the fitted
levels) predict the held-out p50s better than ``by_rate``'s bands? (calibrate/README, "Two
speeds, a level's and the moment's".)

The simulator keeps one throughput average, so each held-out level is simulated with a
``by_rate`` table of its own: the line's factor at the level's offered rate, and the
within-level slope about the level's mean throughput (the fitted levels' mean
throughput over their offered rate, times its offered rate). Within a level the slow
average is the level's, so this is what a model with both averages would simulate, less
each slice's first second (left out of the measurements too).

Five variants for each held-out level, on the run's profile as fitted (its table,
``after_idle`` and speed process the same in all but the last): ``bands``, the profile's
``by_rate``; ``line``, the level's factor alone (no slope within it); ``two``, the line
and the within-level slope; ``ext``, the bands carried past their ends along the line
through their knots (:func:`extended`); ``line+``, the level's factor with the host's speed
process fitted again on what a line through the fitted levels leaves of their batches
(the bands take some of the host's slow spells for the throughput's doing). Each:
:func:`calibrate.validate.predict` over the level's slices, ``REPS`` replications, the same seeds in every variant.

    python calibrate/experiments/two_speeds.py RUN [RUN ...]
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate import idle
from calibrate.experiments.by_level import level_batches
from calibrate.speed import fit_run_speed
from calibrate.validate import design, predict

REPS = 6
say = print


def batch_ratios(run: Path, profile: dict) -> pd.DataFrame:
    """Every settled batch of every level (:func:`calibrate.experiments.by_level.level_batches`
    whose slice's first second is past): its level and slice, its instance's recent
    throughput and its time over the profile's table and ``after_idle``."""
    b = level_batches(run, profile)
    return b[b["since"] >= 2 * idle.RATE_WINDOW_MS].reset_index(drop=True)


def level_tables(b: pd.DataFrame, fit_levels: list[int], held: dict[int, float]) -> tuple[dict, dict, dict]:
    """For each held-out level (``held``: level -> offered rate), the ``line`` and ``two``
    tables, and what they were read from."""
    fitted = b[b["level"].isin(fit_levels)]
    r = fitted["ratio"] / fitted["ratio"].mean()
    per = fitted.assign(r=r).groupby("level").agg(offered=("offered", "first"), rate=("rate", "mean"), r=("r", "mean"))
    slope_l, icpt = np.polyfit(per["offered"], per["r"], 1)
    dev_x = fitted["rate"] - fitted.groupby("level")["rate"].transform("mean")
    dev_y = r - r.groupby(fitted["level"]).transform("mean")
    slope_w = float(np.sum(dev_x * dev_y) / np.sum(dev_x**2))
    k = float((per["rate"] / per["offered"]).mean())
    line, two = {}, {}
    for level, offered in held.items():
        f, mid = icpt + slope_l * offered, k * offered
        at = np.linspace(0.25 * mid, 2.0 * mid, 15)
        line[level] = {round(float(a), 3): round(float(np.clip(f, 0.5, 2.0)), 4) for a in at}
        two[level] = {round(float(a), 3): round(float(np.clip(f + slope_w * (a - mid), 0.5, 2.0)), 4) for a in at}
    info = {"between_per_100": 100 * slope_l, "within_per_100": 100 * slope_w, "rate_over_offered": k}
    return line, two, info


def extended(table: dict) -> dict:
    """``table`` (the bands) carried past its ends along the least-squares line through its
    knots, to half its lowest rate and 1.3 times its highest, where the simulator holds it
    flat."""
    x = np.array([float(k) for k in table])
    f = np.array(list(table.values()))
    slope = np.polyfit(x, f, 1)[0]
    lo, hi = 0.5 * x[0], 1.3 * x[-1]
    out = {round(lo, 3): round(float(np.clip(f[0] + slope * (lo - x[0]), 0.5, 2.0)), 4)}
    out.update({float(k): v for k, v in table.items()})
    out[round(hi, 3)] = round(float(np.clip(f[-1] + slope * (hi - x[-1]), 0.5, 2.0)), 4)
    return out


VARIANTS = ("bands", "line", "two", "ext", "line+")


def read_run(run: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """A ``calibrate run`` folder's profile, its requests and its levels' summary."""
    profile = json.loads((run / "profile.json").read_text())
    requests = pd.read_csv(run / "measurements.csv.gz")
    return profile, requests, pd.DataFrame(json.loads((run / "validation.json").read_text())["levels"])


def main(runs: list[Path]) -> None:
    rows = []
    for run in runs:
        profile, requests, summary = read_run(run)
        fit_levels = [f["level"] for f in profile["fit_levels"]]
        held_rows = summary[summary["held_out"]]
        held = {int(lv["level"]): float(lv["offered_rps"]) for _, lv in held_rows.iterrows()}
        b = batch_ratios(run, profile)
        line, two, info = level_tables(b, fit_levels, held)
        say(
            f"{run.name}: slope between levels {info['between_per_100']:+.2f}, within {info['within_per_100']:+.2f} "
            f"(ratio per 100 req/s); throughput / offered {info['rate_over_offered']:.3f}",
            flush=True,
        )
        # line+: the host's speed process fitted again on what the line leaves of the fitted
        # batches (the bands take some of the host's slow spells for the throughput's doing)
        fitted = b[b["level"].isin(fit_levels)]
        level_line = idle.fit_by_level(
            fitted["rate"].to_numpy(), fitted["ratio"].to_numpy(), fitted["level"].to_numpy()
        )
        shares = bool((profile.get("frontend") or {}).get("client_shares_cores"))
        refit = copy.deepcopy(profile)
        refit["speed_process"] = fit_run_speed(
            requests,
            pd.read_csv(run / "slices.csv"),
            {**profile["service_time"], "by_rate": level_line},
            fit_levels,
            client_shares_cores=shares,
        )
        ext = extended(profile["service_time"]["by_rate"])
        slice_s, warmup_s = design(requests, profile)
        for level, offered in held.items():
            g = requests[(requests["level"] == level) & ~requests["warmup"] & (requests["status"] == 200)]
            n_slices = int(g["slice"].nunique())
            measured = {q: float(np.percentile(g["latency_ms"], p)) for q, p in (("p50", 50), ("p99", 99))}
            row = {"run": run.name, "level": level, "load": offered / profile["capacity_rps"], **measured}
            variants = (
                ("bands", None),
                ("line", line[level]),
                ("two", two[level]),
                ("ext", ext),
                ("line+", line[level]),
            )
            for name, table in variants:
                p = copy.deepcopy(refit if name == "line+" else profile)
                if table is not None:
                    p["service_time"]["by_rate"] = table
                got = predict(p, offered, slices=n_slices, slice_s=slice_s, warmup_s=warmup_s, reps=REPS, seed=level)
                for q in ("p50", "p99"):
                    row[f"{name}_{q}"] = 100 * (got[q][0] / measured[q] - 1)
            rows.append(row)
            say(
                f"  {row['load']:.0%}: p50 {measured['p50']:.1f} ms, "
                + ", ".join(f"{n} {row[f'{n}_p50']:+.1f}%" for n in VARIANTS)
                + f" | p99 {measured['p99']:.1f} ms, "
                + ", ".join(f"{n} {row[f'{n}_p99']:+.1f}%" for n in VARIANTS),
                flush=True,
            )
    t = pd.DataFrame(rows)
    t["share"] = (t["load"] * 20).round() / 20
    for q in ("p50", "p99"):
        say(f"{q}: median error by load (and runs over), {len(runs)} runs")
        for share, g in t.groupby("share"):
            say(
                f"  {share:.0%}: "
                + ", ".join(
                    f"{n} {g[f'{n}_{q}'].median():+.1f}% ({(g[f'{n}_{q}'] > 0).sum()}/{len(g)} over, "
                    f"|err| {g[f'{n}_{q}'].abs().median():.1f})"
                    for n in VARIANTS
                )
            )


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]] or [Path("calibrate/profiles/cpu-resnet64-epyc")])
