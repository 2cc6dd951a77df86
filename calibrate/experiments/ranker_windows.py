"""How latency follows the bursts of arrivals, measured and simulated (calibrate/README, "Who
waits for the loop's core"): at one level of a `calibrate run` folder, the requests cut into
10 ms windows by when the server received them (the simulation's: when they reached it), and
by how many a window holds, the mean of each window's slowest and median latency; the
folder's profile simulated for 60 s at the level's rate, as calibration writes it or with the
loop's options named by ``--with``.

    python calibrate/experiments/ranker_windows.py RUN --load 0.5   # seconds
    python calibrate/experiments/ranker_windows.py RUN --load 0.5 --with reads_first
    python calibrate/experiments/ranker_windows.py RUN --load 0.5 --stages   # where the rise is
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

import calibrate.scenario as scenario
from simulator.engine import simulate
from simulator.results.metrics import window
from simulator.scenario.config import Scenario

WINDOW_MS = 10.0
BINS = [0, 4, 6, 8, 10, 12, 14, 1_000]


def by_burst(t_ms: np.ndarray, latency_ms: np.ndarray) -> pd.DataFrame:
    """Per bin of requests a window holds: the windows' share, and their slowest and median
    latency (means over the windows)."""
    w = ((t_ms - t_ms.min()) // WINDOW_MS).astype(int)
    g = pd.DataFrame({"w": w, "lat": latency_ms}).groupby("w")["lat"].agg(["size", "max", "median"])
    g["requests"] = pd.cut(g["size"], BINS)
    out = g.groupby("requests", observed=True).agg(
        windows=("size", "size"), slowest=("max", "mean"), p50=("median", "mean")
    )
    out["share"] = out["windows"] / out["windows"].sum()
    return out[["share", "slowest", "p50"]]


STAGES = ("to_queue", "fetch", "queue", "batch", "response", "outside")


def stages_by_burst(t_ms: np.ndarray, stages: pd.DataFrame) -> pd.DataFrame:
    """Per bin of requests a window holds: each stage's mean over the bin's requests."""
    w = ((t_ms - t_ms.min()) // WINDOW_MS).astype(int)
    size = pd.Series(w).map(pd.Series(w).value_counts()).to_numpy()
    return stages.groupby(pd.cut(size, BINS), observed=True)[list(STAGES)].mean().rename_axis("requests")


def measured(run: Path, level: int, *, stages: bool = False) -> pd.DataFrame:
    """The server's windows, slice by slice laid end to end (a second apart); with
    ``stages``, each stage's mean by bin: from the handler's start to the queue (its fetch
    apart too: ``feature_us``), the queue, the batch (hand-off and compute), the response
    (the rest of the server's time) and outside it (the socket before the handler, the
    client)."""
    req = pd.read_csv(run / "measurements.csv.gz")
    m = req[(req["level"] == level) & ~req["warmup"] & (req["status"] == 200)]
    t, parts, offset = [], [], 0.0
    for _, s in m.groupby("slice"):
        r = s["received_at_ns"].to_numpy() / 1e6
        t.append(r - r.min() + offset)
        parts.append(s)
        offset += r.max() - r.min() + 1_000.0
    t, m = np.concatenate(t), pd.concat(parts)
    if not stages:
        return by_burst(t, m["latency_ms"].to_numpy())
    batch = sum(m[c] for c in ("handoff_us", "compute_input_us", "compute_infer_us", "compute_output_us")) / 1e3
    st = pd.DataFrame(
        {
            "to_queue": (m["enqueued_at_ns"] - m["received_at_ns"]) / 1e6, "fetch": m["feature_us"] / 1e3,
            "queue": m["queue_us"] / 1e3, "batch": batch, "server": m["request_us"] / 1e3, "lat": m["latency_ms"],
        }
    )  # fmt: skip
    st["response"] = st["server"] - st["to_queue"] - st["queue"] - st["batch"]
    st["outside"] = st["lat"] - st["server"]
    return stages_by_burst(t, st.reset_index(drop=True))


def simulated(profile: dict, rate: float, options: list[str], *, stages: bool = False) -> pd.DataFrame:
    """The profile simulated 60 s at ``rate``; with ``stages``, each stage's mean by bin,
    as :func:`measured` cuts them (the wait for the loop before the read is in the model's
    way to the queue; its fetch is the wait from the reply to the queue, the round trip's
    pure delay apart)."""
    doc = scenario.scenario_dict(profile, rate, duration_s=60.0, warmup_s=2.0, seed=1)
    for name in options:
        doc["preprocess"]["event_loop"][name] = True
    s = Scenario.model_validate(doc)
    rec = simulate(s).records
    w = window(rec, s) & rec.completed
    if not stages:
        return by_burst(rec.t_router[w], rec.t_response[w] - rec.arrival[w])
    st = pd.DataFrame(
        {
            "to_queue": (rec.t_preprocessed - rec.t_router)[w], "fetch": (rec.t_preprocessed - rec.t_features)[w],
            "queue": (rec.t_dispatch - rec.t_preprocessed)[w], "batch": (rec.t_inferred - rec.t_dispatch)[w],
            "response": (rec.t_response - rec.t_inferred)[w], "lat": (rec.t_response - rec.arrival)[w],
        }
    )  # fmt: skip
    st["outside"] = st["lat"] - st["to_queue"] - st["queue"] - st["batch"] - st["response"]
    return stages_by_burst(rec.t_router[w], st)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="A `calibrate run` folder of the ranker (with the server's clocks).")
    ap.add_argument("--load", type=float, default=0.5, help="The level, as a share of the capacity.")
    ap.add_argument(
        "--with", dest="options", action="append", default=[], help="A boolean event_loop option to turn on."
    )
    ap.add_argument("--stages", action="store_true", help="Each stage's mean by bin rather than the latency.")
    a = ap.parse_args()
    profile = json.loads((a.run / "profile.json").read_text())
    levels = pd.DataFrame(json.loads((a.run / "validation.json").read_text())["levels"])
    row = levels.iloc[int(np.argmin(np.abs(levels["load"] - a.load)))]
    m = measured(a.run, int(row["level"]), stages=a.stages)
    s = simulated(profile, float(row["offered_rps"]), a.options, stages=a.stages)
    both = pd.merge(m, s, left_index=True, right_index=True, how="outer", suffixes=(" measured", " simulated"))
    print(  # noqa: T201
        f"load {row['load']:.0%} ({row['offered_rps']:.0f} req/s); {WINDOW_MS:g} ms windows by the requests they hold"
    )
    if a.options:
        print(f"simulated with event_loop: {', '.join(a.options)}")  # noqa: T201
    print(both.round(2).to_string())  # noqa: T201


if __name__ == "__main__":
    main()
