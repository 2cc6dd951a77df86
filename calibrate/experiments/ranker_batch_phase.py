"""Where in the batch cycle requests reach the server's loop and its batch queue, measured
and simulated (calibrate/README, "The queue's share of the light loads' p50"): at one level
of a `calibrate run` folder, the density (per ms, over all requests) of the server's
receipts and queue arrivals in bins after the latest batch dispatch and after the latest
batch's return (its hand-back done), from the server's clocks; and of the simulated queue
arrivals after the simulated dispatches and returns (the folder's profile, 60 s at the
level's rate). Also per batch: its size, how often the next batch's oldest request was
queued before this batch came back, and how long after its dispatch the next batch's
oldest was queued (calibrate/README, "The batcher is a task on the loop"); and where in the
monotonic clock's millisecond the server's dispatches, receipts and queue arrivals fall
(tenths of a millisecond).

    python calibrate/experiments/ranker_batch_phase.py RUN --load 0.5   # seconds
    python calibrate/experiments/ranker_batch_phase.py RUN --load 0.7 --no-batcher-yields
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

import calibrate.scenario as scenario
from calibrate.fit import batch_time_us
from simulator.engine import simulate
from simulator.results.metrics import window
from simulator.scenario.config import Scenario

EDGES = np.array([0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0])


def density(t: np.ndarray, marks: np.ndarray) -> np.ndarray:
    """Per ms, the share of ``t`` that falls in each bin of :data:`EDGES` after the latest
    of ``marks`` strictly before it."""
    marks = np.sort(marks)
    k = np.searchsorted(marks, t, side="left") - 1
    ok = k >= 0
    h, _ = np.histogram(t[ok] - marks[k[ok]], EDGES)
    return h / max(ok.sum(), 1) / np.diff(EDGES)


def cycles(dispatch: np.ndarray, oldest: np.ndarray, back: np.ndarray, size: np.ndarray) -> tuple[float, float]:
    """Mean batch size, and the share of batches whose oldest request was queued before
    the batch before them came back (one slice or run, batches in dispatch order)."""
    o = np.argsort(dispatch)
    early = oldest[o][1:] < back[o][:-1]
    return float(size.mean()), float(early.mean()) if len(early) else float("nan")


GAPS = np.array([0.0, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, np.inf])


def gaps(dispatch: np.ndarray, oldest: np.ndarray) -> np.ndarray:
    """From each dispatch to the next batch's oldest queue arrival (ms; one slice or run,
    batches in dispatch order): the share of the batches in each bin of :data:`GAPS` (below
    0, a full batch's leftover queued before it went, in no bin)."""
    o = np.argsort(dispatch)
    g = oldest[o][1:] - dispatch[o][:-1]
    h, _ = np.histogram(g, GAPS)
    return h / max(len(g), 1)


def measured(run: Path, level: int) -> tuple[dict, tuple[float, float]]:
    req = pd.read_csv(run / "measurements.csv.gz")
    m = req[(req["level"] == level) & ~req["warmup"] & (req["status"] == 200)].copy()
    m["bt_ms"] = batch_time_us(m) / 1e3
    parts = {
        "receipts after dispatch": [],
        "queue arrivals after dispatch": [],
        "queue arrivals after return": [],
        "gap to the next batch's oldest": [],
    }
    sizes, early, weights = [], [], []
    for _, g in m.groupby("slice"):
        b = g.groupby("dispatched_at_ns").agg(
            size=("batch_size", "first"), oldest=("enqueued_at_ns", "min"), bt=("bt_ms", "first")
        )
        d = b.index.to_numpy() / 1e6
        back = d + b["bt"].to_numpy()
        recv, enq = g["received_at_ns"].to_numpy() / 1e6, g["enqueued_at_ns"].to_numpy() / 1e6
        parts["receipts after dispatch"].append(density(recv, d))
        parts["queue arrivals after dispatch"].append(density(enq, d))
        parts["queue arrivals after return"].append(density(enq, back))
        parts["gap to the next batch's oldest"].append(gaps(d, b["oldest"].to_numpy() / 1e6))
        s, e = cycles(d, b["oldest"].to_numpy() / 1e6, back, b["size"].to_numpy())
        sizes.append(s)
        early.append(e)
        weights.append(len(g))
    w = np.array(weights, dtype=float)
    out = {k: np.average(np.array(v), axis=0, weights=w) for k, v in parts.items()}
    return out, (float(np.average(sizes, weights=w)), float(np.average(early, weights=w)))


def clock_phase(run: Path, level: int) -> dict[str, np.ndarray]:
    """The share of the dispatches, receipts and queue arrivals in each tenth of the
    monotonic clock's millisecond (the server's ``*_at_ns`` stamps)."""
    req = pd.read_csv(run / "measurements.csv.gz")
    m = req[(req["level"] == level) & ~req["warmup"] & (req["status"] == 200)]
    out = {}
    for name, col in (
        ("dispatches", "dispatched_at_ns"),
        ("receipts", "received_at_ns"),
        ("queue arrivals", "enqueued_at_ns"),
    ):
        x = np.unique(m[col].to_numpy()) if col == "dispatched_at_ns" else m[col].to_numpy()
        h, _ = np.histogram((x % 1_000_000) / 1e6, np.linspace(0.0, 1.0, 11))
        out[name] = h / max(h.sum(), 1)
    return out


def simulated(profile: dict, rate: float) -> tuple[dict, tuple[float, float]]:
    doc = scenario.scenario_dict(profile, rate, duration_s=60.0, warmup_s=2.0, seed=1)
    s = Scenario.model_validate(doc)
    rec = simulate(s).records
    w = window(rec, s) & rec.completed
    b = (
        pd.DataFrame({"d": rec.t_dispatch[w], "enq": rec.t_preprocessed[w], "back": rec.t_inferred[w]})
        .assign(size=rec.batch_size[w])
        .groupby("d")
        .agg(size=("size", "first"), oldest=("enq", "min"), back=("back", "first"))
    )
    d = b.index.to_numpy()
    enq = rec.t_preprocessed[w]
    out = {
        "queue arrivals after dispatch": density(enq, d),
        "queue arrivals after return": density(enq, b["back"].to_numpy()),
        "gap to the next batch's oldest": gaps(d, b["oldest"].to_numpy()),
    }
    return out, cycles(d, b["oldest"].to_numpy(), b["back"].to_numpy(), b["size"].to_numpy())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="A `calibrate run` folder of a server with its clocks (the ranker).")
    ap.add_argument("--load", type=float, default=0.5, help="The level, as a share of the capacity.")
    ap.add_argument("--responds-first", action="store_true", help="Simulate with event_loop.responds_first.")
    ap.add_argument(
        "--batcher-yields",
        action=argparse.BooleanOptionalAction,
        default=scenario.BATCHER_YIELDS,
        help="Simulate with event_loop.batcher_yields (default: as calibration writes it).",
    )
    a = ap.parse_args()
    scenario.RESPONDS_FIRST = a.responds_first
    scenario.BATCHER_YIELDS = a.batcher_yields
    profile = json.loads((a.run / "profile.json").read_text())
    levels = pd.DataFrame(json.loads((a.run / "validation.json").read_text())["levels"])
    row = levels.iloc[int(np.argmin(np.abs(levels["load"] - a.load)))]
    meas, (m_size, m_early) = measured(a.run, int(row["level"]))
    sim, (s_size, s_early) = simulated(profile, float(row["offered_rps"]))
    print(  # noqa: T201
        f"load {row['load']:.0%} ({row['offered_rps']:.0f} req/s); bins, ms: {EDGES.tolist()}; "
        f"the gap's bins: {GAPS.tolist()}"
    )
    for k, v in meas.items():
        print(f"  measured  {k}: {np.round(v, 3).tolist()}")  # noqa: T201
    for k, v in sim.items():
        print(f"  simulated {k}: {np.round(v, 3).tolist()}")  # noqa: T201
    for k, v in clock_phase(a.run, int(row["level"])).items():
        print(f"  measured  {k} by tenth of the clock's millisecond: {np.round(v, 3).tolist()}")  # noqa: T201
    print(  # noqa: T201
        f"  a batch: {m_size:.2f} requests measured, {s_size:.2f} simulated; the next batch's oldest queued "
        f"before it came back: {m_early:.1%} measured, {s_early:.1%} simulated"
    )


if __name__ == "__main__":
    main()
