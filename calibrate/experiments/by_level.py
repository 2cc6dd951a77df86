"""Does ``by_rate`` read as a line through the fitted levels predict the held-out levels
better than its throughput bands? (calibrate/README, "A level's speed, not the moment's:
tried, not adopted".)

``speeds`` (7-11 s for nine folders): each level's batches' mean log ratio to the fitted
table and ``after_idle`` (the level's speed before ``by_rate``), and what the fitted
levels predict for the held-out ones two ways: the bands' table at each batch's recent
throughput (its mean over the fitted levels taken out), and a line in the level's offered
rate through the fitted levels' speeds. Then, within each level, the slope of a batch's
log speed on the requests scheduled to arrive in the last 250 ms (an exponential
average over the run's whole schedule, which the host's speed cannot move) against the
slope between the levels' means, and the share of a fitted level's 0.1 s windows' speed
that rate explains.

``refit`` (24-25 s a folder and mode): each folder refitted on copies
(``calibrate.refit.refit_run``, 200 draws, seed 0) with ``calibrate.idle.BY_RATE_FIT``
``bands`` and ``levels``; the fitted table, the held-out p50/p99 errors, the cells meeting
the target and the measurements inside their intervals.

    python calibrate/experiments/by_level.py speeds RUN [RUN ...]
    python calibrate/experiments/by_level.py refit [--mode bands|levels] RUN [RUN ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate import idle
from calibrate.experiments.after_batch import refit_copy
from calibrate.fit import batches_from_requests, predicted_ms, with_rates

say = print
TAU_MS = 250.0


def scheduled_rate(at_ms: np.ndarray, arrivals_ms: np.ndarray, tau_ms: float = TAU_MS) -> np.ndarray:
    """Arrivals a second before each time of ``at_ms``: :func:`calibrate.idle.recent_rate`'s
    average over ``tau_ms`` of every arrival of ``arrivals_ms`` before it (the times read
    as events of no weight, each before an arrival at the same instant)."""
    times = np.concatenate([at_ms, arrivals_ms])
    weight = np.concatenate([np.zeros(len(at_ms)), np.ones(len(arrivals_ms))])
    order = np.lexsort((weight, times))
    rate = idle.recent_rate(times[order], weight[order], tau_ms)
    out = np.empty(len(times))
    out[order] = rate
    return out[: len(at_ms)]


def level_batches(run: Path, profile: dict) -> pd.DataFrame:
    """Every batch of ``run``'s levels after warm-up, slice by slice in dispatch order: its
    level, slice and offered rate, when it was dispatched (``at``, ms on the server's
    clock), its instance's recent throughput (``rate``, req/s) and how long into its slice
    (``since``, ms), and its time over the profile's table and ``after_idle`` (``ratio``)."""
    service = profile["service_time"]
    every = pd.read_csv(run / "measurements.csv.gz")
    ok = with_rates(every[every["status"] == 200])
    ok = ok[~ok["warmup"]].sort_values(["slice", "dispatched_at_ns"], kind="stable")
    out = []
    for (level, _), g in ok.groupby(["level", "slice"]):
        b = batches_from_requests(g)
        fitted = predicted_ms(service, b["batch_size"].to_numpy()) * idle.idle_factor(
            b["idle_ms"].to_numpy(), service.get("after_idle")
        )
        out.append(
            pd.DataFrame(
                {
                    "level": level,
                    "slice": g["slice"].iloc[0],
                    "offered": float(g["offered_rps"].iloc[0]),
                    "at": np.sort(g["dispatched_at_ns"].unique()) / 1e6,
                    "rate": b["rate_rps"].to_numpy(),
                    "since": b["rate_since_ms"].to_numpy(),
                    "ratio": b["service_ms"].to_numpy() / fitted,
                }
            )
        )
    return pd.concat(out, ignore_index=True)


def level_speeds(run: Path) -> tuple[pd.DataFrame, dict]:
    """Per level of ``run``: its rate, its speed before ``by_rate`` (mean log ratio, %) and
    ``by_rate``'s mean log factor (%); and per batch of every level, its log speed, its
    level and its scheduled recent arrivals."""
    profile = json.loads((run / "profile.json").read_text())
    by_rate = {float(k): v for k, v in profile["service_time"]["by_rate"].items()}
    every = pd.read_csv(run / "measurements.csv.gz")
    known = every.dropna(subset=["received_at_ns"])
    start = (known["received_at_ns"] / 1e9 - known["scheduled_s"]).groupby(known["slice"]).transform("min")
    arrivals = ((known["scheduled_s"] + start) * 1e3).to_numpy()  # the schedule on the server's clock
    got = level_batches(run, profile)
    b = pd.DataFrame(
        {
            "level": got["level"],
            "y": np.log(got["ratio"]),
            "f": np.log(idle.rate_factor_at(got["rate"].to_numpy(), by_rate)),
            "at": got["at"],
            "slice": got["slice"],
            "w": (got["at"] - got.groupby("slice")["at"].transform("min")) // 100,  # its 0.1 s window in the slice
        }
    )
    b["x"] = scheduled_rate(b["at"].to_numpy(), arrivals)  # every batch's in one pass over the schedule
    rows = [
        {
            "level": level,
            "rate": float(got.loc[got["level"] == level, "offered"].iloc[0]),
            "speed": 100 * g["y"].mean(),
            "by_rate": 100 * g["f"].mean(),
        }
        for level, g in b.groupby("level")
    ]
    return pd.DataFrame(rows).set_index("level"), {"batches": b, "fit": [f["level"] for f in profile["fit_levels"]]}


def speeds(runs: list[Path]) -> None:
    misses = {"bands": [], "line": []}
    slopes = []
    for run in runs:
        lv, extra = level_speeds(run)
        fit, b = extra["fit"], extra["batches"]
        held = [k for k in lv.index if k not in fit]
        offset = (lv.loc[fit, "speed"] - lv.loc[fit, "by_rate"]).mean()
        bands = lv["speed"] - lv["by_rate"] - offset
        line = lv["speed"] - np.polyval(np.polyfit(lv.loc[fit, "rate"], lv.loc[fit, "speed"], 1), lv["rate"])
        misses["bands"].append(bands[held])
        misses["line"].append(line[held])
        within = b.assign(
            x=b["x"] - b.groupby("level")["x"].transform("mean"), y=b["y"] - b.groupby("level")["y"].transform("mean")
        )
        means = b.groupby("level")[["x", "y"]].mean()
        windows = b[b["level"].isin(fit)].groupby(["level", "slice", "w"])[["x", "y"]].mean()
        share = np.mean([np.corrcoef(g["x"], g["y"])[0, 1] ** 2 for _, g in windows.groupby(level=0)])
        slopes.append(
            (np.polyfit(within["x"], within["y"], 1)[0] * 1e4, np.polyfit(means["x"], means["y"], 1)[0] * 1e4, share)
        )
        say(
            f"{run.name}: speed by level (%) "
            + " ".join(f"{lv.loc[k, 'rate']:.0f}: {lv.loc[k, 'speed']:+.1f}" for k in lv.index)
            + " | held-out misses, bands "
            + " ".join(f"{v:+.1f}" for v in bands[held])
            + ", line "
            + " ".join(f"{v:+.1f}" for v in line[held])
        )
    for how, m in misses.items():
        m = pd.DataFrame(m)
        say(
            f"{how}: mean miss by held-out level "
            + " ".join(f"{v:+.2f}" for v in m.mean())
            + f", root mean square {np.sqrt((m.to_numpy() ** 2).mean()):.2f} points"
        )
    s = np.array(slopes)
    within, between, share = s[:, 0], s[:, 1], 100 * s[:, 2].mean()

    def spread(v: np.ndarray) -> str:
        return f" (sd {v.std(ddof=1):.2f} over {len(v)} runs)" if len(v) > 1 else ""

    say(
        f"log speed on the arrivals scheduled in the last {TAU_MS:.0f} ms, %/100 req/s: "
        f"within levels {within.mean():+.2f}{spread(within)}, between levels {between.mean():+.2f}{spread(between)}; "
        f"share of a fitted level's 0.1 s windows' speed it explains {share:.1f}%"
    )


def refit(runs: list[Path], modes: list[str]) -> None:
    for run in runs:
        for mode in modes:
            idle.BY_RATE_FIT = mode
            service, text, met, inside = refit_copy(run)
            table = service.get("by_rate")
            shown = "none" if table is None else ", ".join(f"{float(k):.0f}: {v:.3f}" for k, v in table.items())
            say(f"{run} by_rate {mode} ({shown}): {text} | met {met}, inside {inside}", flush=True)
    idle.BY_RATE_FIT = "bands"


if __name__ == "__main__":
    what, args = (sys.argv[1:2] or ["speeds"])[0], sys.argv[2:]
    modes = ["bands", "levels"]
    if args[:1] == ["--mode"]:
        modes, args = [args[1]], args[2:]
    runs = [Path(a) for a in args] or [Path("calibrate/profiles/cpu-resnet64-epyc")]
    speeds(runs) if what == "speeds" else refit(runs, modes)
