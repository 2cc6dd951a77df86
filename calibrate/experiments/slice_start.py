"""Where in a slice the model misses, and how fast the host gets to a level's speed
(calibrate/README, "A level's speed from its first second").

For a run folder of ``servesim calibrate run``, every kept slice at ``MIN_LOAD`` or more on
its exact arrivals (the load generator's schedule) through the full fitted model (its speed
process and factors; the instance's recent throughput from where the slice before left it,
:func:`calibrate.idle.slice_start_rates`), ``SEEDS`` times:

* ``latency``: the p50 of the requests that arrived in each part of the slice (0.25–1 s,
  1–2, 2–3, 3–4 s), measured and simulated, per load; held-out levels only;
* ``speed``: each batch's time over the fitted table at its size (log; a simulated batch's
  instance time over the instance's table, :func:`calibrate.experiments.alignment.instance_table`), averaged over
  0.25–1 s and over 2 s on, measured and simulated; the first minus the second is how much
  slower the host runs in a slice's first second than later. The model's comes from
  ``by_rate`` starting at the slice before's throughput; the host's is measured.

    python calibrate/experiments/slice_start.py RUN [RUN ...]   # 3-5 s a run
    python calibrate/experiments/slice_start.py --start offered RUN [RUN ...]

``--start offered``: the control on the start alone: each simulated slice's ``by_rate``
average starts at the slice's own offered rate, as if the instance had run at its level
before, instead of where the slice before left it; nothing else changes.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.experiments.alignment import instance_table
from calibrate.experiments.hand_back import table_ms
from calibrate.experiments.two_speeds import read_run
from calibrate.replay import start_rates, write_arrivals
from calibrate.samples import batch_time_us
from calibrate.scenario import scenario_dict
from simulator.engine import simulate
from simulator.scenario.config import Scenario

SEEDS = 3
MIN_LOAD = 0.6
PARTS_S = (0.25, 1.0, 2.0, 3.0, 4.2)  # the latency's parts of a slice, by arrival
EARLY_S, LATE_S = (0.25, 1.0), 2.0  # the speed's first second and its rest
say = print


def _speeds(t_s: np.ndarray, log_ratio: np.ndarray) -> tuple[float, float]:
    early = (t_s >= EARLY_S[0]) & (t_s < EARLY_S[1])
    late = t_s >= LATE_S
    return float(log_ratio[early].mean()) if early.any() else np.nan, float(
        log_ratio[late].mean()
    ) if late.any() else np.nan


def run_slices(run: Path, start_at: str = "carried") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(latency rows: run, load, held, part, source, latency ms; speed rows: run, load,
    slice, source, early, late) for every kept slice of ``run`` at ``MIN_LOAD`` or more."""
    profile, requests, summary = read_run(run)
    table = table_ms(profile)
    own = instance_table(profile)  # a simulated batch's: less the hand-back the loop takes
    slices = pd.read_csv(run / "slices.csv")
    starts = start_rates(requests[requests["status"] == 200], profile["service_time"]) or {}
    loads = dict(zip(summary["level"], summary["load"], strict=True))
    fitted = {f["level"] for f in profile["fit_levels"]}
    lat, spd = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _, row in slices[slices["kept"]].iterrows():
            load = round(float(loads[row["level"]]), 2)
            if load < MIN_LOAD:
                continue
            g = requests[requests["slice"] == row["slice"]]
            ok = g[g["status"] == 200].dropna(subset=["batch_size"])
            held = int(row["level"]) not in fitted
            key = {"run": run.name, "load": load, "held": held}
            lat.append(pd.DataFrame({**key, "t": ok["scheduled_s"], "src": "measured", "ms": ok["latency_ms"]}))
            b = ok.drop_duplicates("dispatched_at_ns")
            t_b = (b["dispatched_at_ns"].to_numpy() - ok["received_at_ns"].min()) / 1e9 + ok["scheduled_s"].min()
            lr = np.log(batch_time_us(b).to_numpy() / 1e3 / table[b["batch_size"].to_numpy(int)])
            spd.append(
                {
                    **key,
                    "slice": int(row["slice"]),
                    "src": "measured",
                    **dict(zip(("early", "late"), _speeds(t_b, lr), strict=True)),
                }
            )
            arrivals, duration = write_arrivals(g, row, Path(tmp))
            start = starts.get(int(row["slice"]))
            if start_at == "offered" and profile["service_time"].get("by_rate"):
                start = float(row["rate_rps"])
            for k in range(SEEDS):
                doc = scenario_dict(
                    profile, float(row["rate_rps"]), duration_s=duration, warmup_s=0.0, seed=100 * k + int(row["slice"])
                )
                doc["traffic"] = {"arrivals_file": str(arrivals)}
                if start is not None:
                    doc["workers"]["service_time"]["rate_initial_rps"] = start
                got = simulate(Scenario.model_validate(doc))
                rec, log = got.records, got.batches
                done = rec.completed
                lat.append(
                    pd.DataFrame(
                        {
                            **key,
                            "t": rec.arrival[done] / 1e3,
                            "src": "model",
                            "ms": (rec.t_response - rec.arrival)[done],
                        }
                    )
                )
                lr = np.log((log.computed - log.start) / own[log.size])
                spd.append(
                    {
                        **key,
                        "slice": int(row["slice"]),
                        "src": "model",
                        **dict(zip(("early", "late"), _speeds(log.start / 1e3, lr), strict=True)),
                    }
                )
    return pd.concat(lat, ignore_index=True), pd.DataFrame(spd)


def main(runs: list[Path], start_at: str = "carried") -> None:
    lat_rows, spd_rows = [], []
    for run in runs:
        lat, spd = run_slices(run, start_at)
        held = lat[lat["held"]]
        for (load, src), g in held.groupby(["load", "src"]):
            parts = pd.cut(g["t"], PARTS_S, right=False)
            for part, h in g.groupby(parts, observed=True):
                lat_rows.append({"run": run.name, "load": load, "part": str(part), "src": src, "p50": h["ms"].median()})
            lat_rows.append(
                {
                    "run": run.name,
                    "load": load,
                    "part": "all",
                    "src": src,
                    "p50": g.loc[g["t"] >= PARTS_S[0], "ms"].median(),
                }
            )
        per = spd.groupby(["load", "src"])[["early", "late"]].mean()
        for (load, src), v in per.iterrows():
            spd_rows.append({"run": run.name, "load": load, "src": src, "first_second": 100 * (v["early"] - v["late"])})
        say(f"{run.name} done", flush=True)
    t = pd.DataFrame(lat_rows).pivot_table(index=["run", "load", "part"], columns="src", values="p50").reset_index()
    t["error"] = 100 * (t["model"] / t["measured"] - 1)
    say("held-out levels: the model's p50 error by the arrival's part of the slice (median over runs; runs over)")
    say(
        t.groupby(["load", "part"])["error"]
        .agg(median="median", over=lambda e: int((e > 0).sum()), runs="size")
        .round(1)
        .to_string()
    )
    s = pd.DataFrame(spd_rows).pivot_table(index=["run", "load"], columns="src", values="first_second").reset_index()
    say(
        "how much slower the first second runs than from 2 s on "
        "(log x100; median over runs; runs where the model's is slower)"
    )
    say(
        s.groupby("load")
        .apply(
            lambda g: pd.Series(
                {
                    "measured": g["measured"].median(),
                    "model": g["model"].median(),
                    "model_slower": int((g["model"] > g["measured"]).sum()),
                    "runs": len(g),
                }
            ),
            include_groups=False,
        )
        .round(2)
        .to_string()
    )


if __name__ == "__main__":
    args = sys.argv[1:]
    start_at = "carried"
    if args[:1] == ["--start"]:
        if len(args) < 2 or args[1] not in ("carried", "offered"):
            sys.exit("--start takes carried (the default) or offered")
        start_at, args = args[1], args[2:]
    main([Path(a) for a in args] or [Path("calibrate/profiles/cpu-resnet64-epyc")], start_at)
