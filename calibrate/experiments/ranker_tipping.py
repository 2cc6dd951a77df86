"""How often a slice tips, measured and simulated (calibrate/README, "The loop's cost is not
a straight line", and "The ranker on a slower host"): at each level from ``--from-load`` of a
`calibrate run` folder, the share of its measured slices whose p99 passed 30 ms and 100 ms (a
slice that tips climbs to hundreds of milliseconds and stays), and the share already past 30
ms at the median of its first second (it tipped as it began), against the same shares over
``--slices`` slices simulated from the folder's profile at the level's rate (each slice of
the run's length and warm-up, after the slice before it as the validation runs one, the
fitted parameters at their point values; the speed process drawn afresh in each).

``--parts`` adds where the measured requests' time went, by level and whether their slice tipped
(p99 past 100 ms): the means of the latency, the fetch (the handler's time from its Redis call to
its answer, the loop's waits included), the batch queue, the hand-off and the time outside the
server, and the front end's garbage collection a request (the server's own metric, per slice).

``--speeds 1,1.05,1.1`` simulates each level again with the front end's CPU times multiplied
by each factor (``calibrate.scenario.scenario_dict``'s ``speed``): how much more loop work a
request would take for the model to tip as often as the server did.

    python calibrate/experiments/ranker_tipping.py RUN --slices 100   # ~2 minutes
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.validate import slice_requests

TIPPED_MS = (30.0, 100.0)
FIRST_S = 1.0  # the part of a slice, after its warm-up, whose median says it tipped as it began


def measured_slices(req: pd.DataFrame, warm_s: float) -> pd.DataFrame:
    """Each measured slice's level, p99 and median over its first second after the warm-up."""
    ok = req[~req["warmup"] & (req["status"] == 200)]
    g = ok.groupby(["level", "slice"])
    first = ok[ok["scheduled_s"] < warm_s + FIRST_S].groupby(["level", "slice"])["latency_ms"].median()
    return pd.DataFrame({"p99": g["latency_ms"].quantile(0.99), "first": first}).reset_index()


def shares(p99: np.ndarray, first: np.ndarray) -> list[float]:
    """The shares of slices past each of :data:`TIPPED_MS` at p99, and past the first at the
    median of their first second."""
    return [float(np.mean(p99 > t)) for t in TIPPED_MS] + [float(np.mean(first > TIPPED_MS[0]))]


def simulated_slices(
    profile: dict, rate: float, *, n: int, slice_s: float, warm_s: float, speed: float
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` simulated slices' p99 and median over their first second after the warm-up."""
    p99, first = np.empty(n), np.empty(n)
    for k in range(n):
        at, lat = slice_requests(profile, rate, slice_s=slice_s, warmup_s=warm_s, seed=1000 + k, speed=speed)
        p99[k] = np.percentile(lat, 99)
        early = lat[at < warm_s + FIRST_S]
        first[k] = np.median(early) if early.size else np.nan
    return p99, first


PARTS_US = {"fetch": "feature_us", "batch queue": "queue_us", "hand-off": "handoff_us"}


def parts(req: pd.DataFrame, slices: pd.DataFrame, from_level: int) -> pd.DataFrame:
    """The means of each measured request's parts (ms), and its slice's garbage collection
    a request, by level and whether its slice tipped (p99 past the higher of :data:`TIPPED_MS`)."""
    ok = req[~req["warmup"] & (req["status"] == 200) & (req["level"] >= from_level)].copy()
    ok = ok.join(measured_slices(req, 0.0).set_index(["level", "slice"])["p99"], on=["level", "slice"])
    ok["tipped"] = ok["p99"] > TIPPED_MS[-1]
    for name, col in PARTS_US.items():
        ok[name] = ok[col] / 1000.0
    ok["outside the server"] = ok["latency_ms"] - ok["request_us"] / 1000.0
    kept = slices[slices["kept"]].drop_duplicates("slice").set_index("slice")
    gc_ms = 1000.0 * kept["frontend_gc_s"] / kept["requests"]
    ok["gc a request"] = ok["slice"].map(gc_ms)
    cols = ["latency_ms", *PARTS_US, "outside the server", "batch_size", "gc a request"]
    out = ok.groupby(["level", "tipped"])[cols].mean()
    out["slices"] = ok.groupby(["level", "tipped"])["slice"].nunique()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="A `calibrate run` folder (refitted or not).")
    ap.add_argument("--slices", type=int, default=100, help="Simulated slices a level.")
    ap.add_argument("--from-load", type=float, default=0.7)
    ap.add_argument("--speeds", default="1", help="Factors on the front end's CPU times, comma-separated.")
    ap.add_argument("--parts", action="store_true", help="Where the measured requests' time went, tipped or not.")
    a = ap.parse_args()
    speeds = [float(x) for x in a.speeds.split(",")]
    profile = json.loads((a.run / "profile.json").read_text())
    levels = pd.DataFrame(json.loads((a.run / "validation.json").read_text())["levels"])
    req = pd.read_csv(a.run / "measurements.csv.gz")
    slice_s = round(float(req["scheduled_s"].max()), 1)  # the schedule's length (the slices' 4 s)
    warm = float(req.loc[req["warmup"], "scheduled_s"].max()) if req["warmup"].any() else 0.0
    measured = measured_slices(req, warm)
    head = " | ".join(f"p99 > {t:g} ms" for t in TIPPED_MS) + f" | first second's median > {TIPPED_MS[0]:g} ms"
    print(f"| load | source | {head} | median slice p99 (ms) |")  # noqa: T201
    print("|---|---|---|---|---|---|")  # noqa: T201
    for _, lv in levels[levels["load"] >= a.from_load].iterrows():
        m = measured[measured["level"] == int(lv["level"])]
        name = f"{lv['load']:.0%} ({lv['offered_rps']:.0f} req/s, {'held out' if lv['held_out'] else 'fitted'})"
        counts = [int((m["p99"] > t).sum()) for t in TIPPED_MS] + [int((m["first"] > TIPPED_MS[0]).sum())]
        cells = " | ".join(f"{c}/{len(m)}" for c in counts)
        print(f"| {name} | measured | {cells} | {m['p99'].median():.1f} |")  # noqa: T201
        for speed in speeds:
            p99, first = simulated_slices(
                profile, float(lv["offered_rps"]), n=a.slices, slice_s=slice_s, warm_s=warm, speed=speed
            )
            cells = " | ".join(f"{s:.0%}" for s in shares(p99, first))
            print(f"| | model, front end ×{speed:g} | {cells} | {np.median(p99):.1f} |")  # noqa: T201
    if a.parts:
        first = int(levels.loc[levels["load"] >= a.from_load, "level"].min())
        table = parts(req, pd.read_csv(a.run / "slices.csv"), first)
        print(table.round(2).to_string())  # noqa: T201


if __name__ == "__main__":
    main()
