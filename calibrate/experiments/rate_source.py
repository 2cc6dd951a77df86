"""What the host's speed follows: the requests it took, the requests it was given, or how
busy it was, and over how long (calibrate/README, "The load, not the throughput").

For each run folder of ``servesim calibrate run``, every batch of every kept slice, its time
over the fitted batch table (log; the ``after_idle`` factor divided out, ``by_rate`` left
in), and candidate averages before it, carried over the whole run by the server's clocks:

* ``batches``: requests a second taken into batches (``service_time.by_rate`` as fitted);
* ``arrivals``: requests a second the server enqueued (``rate_of: arrivals``);
* ``busy``: the share of the time the instance was computing (tried here only).

Each is fitted as the calibration fits ``by_rate`` (:func:`calibrate.idle.fit_by_rate`:
eight quantile bands over the fitted levels' batches, a quarter second or more into their
slice) and read back at every batch. Per load, the median over runs of:

* ``first``: how much slower a slice's first second (0.25-1 s) runs than from 2 s on,
  measured and as the fitted factor says (log x100);
* ``level``: the level's mean from 1 s on, measured and predicted (log x100);
* ``within``: the slope, within slices, of the measured log time on the factor's (1: the
  factor moves as the host does; below 1: it moves too much).

    python calibrate/experiments/rate_source.py RUN [RUN ...]   # about 1 s a run
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate import idle
from calibrate.experiments.hand_back import table_ms
from calibrate.experiments.two_speeds import read_run
from calibrate.samples import batch_time_us

CANDIDATES = (
    ("batches", 500.0),
    ("batches", 125.0),
    ("arrivals", 500.0),
    ("arrivals", 125.0),
    ("busy", 125.0),
    ("busy", 500.0),
)
say = print


def busy_share(start_ms: np.ndarray, end_ms: np.ndarray, tau_ms: float) -> np.ndarray:
    """The share of the time the instance computed (batches [start, end], in order, not
    overlapping), an exponential average over ``tau_ms``, read as each batch starts."""
    out = np.empty(len(start_ms))
    x, t = 0.0, float(start_ms[0]) if len(start_ms) else 0.0
    for i, (s, e) in enumerate(zip(start_ms, end_ms, strict=True)):
        out[i] = x * np.exp(-(s - t) / tau_ms)
        x = out[i] * np.exp(-(e - s) / tau_ms) + (1.0 - np.exp(-(e - s) / tau_ms))
        t = e
    return out


def batches(run: Path) -> pd.DataFrame | None:
    """One row per batch of ``run``: its slice, load, whether fitted, seconds into its slice,
    log time over the table and each candidate average. None without the enqueue clock."""
    profile, requests, summary = read_run(run)
    st = profile["service_time"]
    ok = requests[requests["status"] == 200].dropna(subset=["batch_size"])
    if "enqueued_at_ns" not in ok or ok["enqueued_at_ns"].isna().any():
        return None
    ms = batch_time_us(ok).to_numpy() / 1e3
    gap = idle.idle_before_ms(ok, ms)
    lr = np.log(ms / table_ms(profile)[ok["batch_size"].to_numpy(int)])
    if st.get("after_idle") and gap is not None:
        lr = lr - np.log(idle.idle_factor(gap, st["after_idle"]))
    ok = ok.assign(lr=lr, ms=ms)
    b = ok.drop_duplicates("dispatched_at_ns").sort_values("dispatched_at_ns")
    start = b["dispatched_at_ns"].to_numpy() / 1e6
    origin = ok.groupby("slice")["received_at_ns"].min() / 1e9 - ok.groupby("slice")["scheduled_s"].min()
    loads = dict(zip(summary["level"], summary["load"], strict=True))
    fitted = {f["level"] for f in profile["fit_levels"]}
    out = pd.DataFrame(
        {
            "run": run.name,
            "slice": b["slice"].to_numpy(),
            "load": [round(float(loads[v]), 2) for v in b["level"]],
            "fitted": b["level"].isin(fitted).to_numpy(),
            "t": start / 1e3 - b["slice"].map(origin).to_numpy(),
            "lr": b["lr"].to_numpy(),
        }
    )
    enqueued = ok["enqueued_at_ns"].to_numpy() / 1e6
    share = 1.0 / max(int(ok["instance"].nunique()), 1) if "instance" in ok else 1.0
    for kind, tau in CANDIDATES:
        if kind == "batches":
            x = idle.recent_rate(start, b["batch_size"].to_numpy(float), tau)
        elif kind == "arrivals":
            x = idle.arrival_rate(enqueued, start, tau, 0.0, share)
        else:
            x = 1000.0 * busy_share(start, start + b["ms"].to_numpy(), tau)  # per mille: the bands' scale
        out[f"{kind} {tau:.0f}"] = x
    return out


def judge(b: pd.DataFrame) -> list[dict]:
    """Per candidate and load: ``first``, ``level`` and ``within`` (module docstring)."""
    rows = []
    for kind, tau in CANDIDATES:
        name = f"{kind} {tau:.0f}"
        fit = b[b["fitted"] & (b["t"] >= 0.25)]
        table = idle.fit_by_rate(fit[name].to_numpy(), np.exp(fit["lr"].to_numpy()))
        if table is None:
            continue
        g = b.assign(pf=np.log(idle.rate_factor_at(b[name].to_numpy(), table)))
        for load, h in g.groupby("load"):
            early, late, on = h[(h["t"] >= 0.25) & (h["t"] < 1)], h[h["t"] >= 2], h[h["t"] >= 1]
            w = h[h["t"] >= 0.25]
            dl = w["lr"] - w.groupby("slice")["lr"].transform("mean")
            dp = w["pf"] - w.groupby("slice")["pf"].transform("mean")
            rows.append(
                {
                    "run": h["run"].iloc[0],
                    "candidate": name,
                    "load": load,
                    "first measured": 100 * (early["lr"].mean() - late["lr"].mean()),
                    "first factor": 100 * (early["pf"].mean() - late["pf"].mean()),
                    "level measured": 100 * on["lr"].mean(),
                    "level factor": 100 * on["pf"].mean(),
                    "within": float((dl * dp).sum() / max((dp * dp).sum(), 1e-12)),
                }
            )
    return rows


def main(runs: list[Path]) -> None:
    rows = []
    for run in runs:
        b = batches(run)
        if b is None:
            say(f"{run.name}: no enqueue clock, left out")
            continue
        rows += judge(b)
    t = pd.DataFrame(rows)
    say(f"median over {t['run'].nunique()} runs (log x100; within: slope, 1 is the host's)")
    for name, g in t.groupby("candidate", sort=False):
        say(f"== {name}")
        say(g.drop(columns=["run", "candidate"]).groupby("load").median().round(2).to_string())


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
