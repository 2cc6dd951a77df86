"""Does the host run faster when the schedule loads it? (calibrate/README, "What the speed
keeps time with: the schedule's backlog".)

The alignment experiment (``alignment.py``) found the host's speed in time with the load,
more than a speed process of its own would be. Regressed on the measured backlog, the speed
cannot say which way that goes: a slow spell builds a backlog, so the two move together
whatever load does to the host. This experiment uses what the host cannot move: the load
generator's schedule.

For every kept slice of a ``calibrate run`` folder, per window of ``WINDOW_S``:

* ``lf``: the slice's measured log speed (:func:`calibrate.replay.window_trace`: each
  batch's time over the fit, ``after_idle`` and ``by_rate`` divided out at the instance's
  throughput as it ran, from where the slice before left it);
* ``x``: the requests in the system as measured (endogenous);
* ``z``: the requests in the system that the slice's exact arrivals put there through the
  fitted model at a constant speed (one simulation; exogenous: the schedule alone).

Within slices (each about its own mean, the first and last windows left out), per load:
the OLS slope of ``lf`` on ``x``, the reduced form on ``z``, the first stage (``x`` on
``z``), and their ratio, the instrumental-variable slope (:func:`iv_slope`): the speed's
change per request that the schedule puts in the system, in log × 100 (about % per
request).

The control (``--synthetic``) runs the same where the speed is a process of its own by
construction: each slice simulated with the fitted model on its own arrivals is the
"measurement", its own batches the trace (``alignment.own_trace``). There the
instrumental slope is zero but for luck.

    python calibrate/experiments/pressure.py RUN [RUN ...]               # ~2 s a run
    python calibrate/experiments/pressure.py --synthetic RUN [RUN ...]   # ~2 s a run
    python calibrate/experiments/pressure.py --window 0.5 RUN [RUN ...]
    python calibrate/experiments/pressure.py --count queue RUN [RUN ...]  # the batch queue's count
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.backlog import iv_slope
from calibrate.experiments.alignment import own_trace
from calibrate.experiments.two_speeds import read_run
from calibrate.replay import start_rates, window_trace, write_arrivals
from calibrate.scenario import scenario_dict
from simulator.engine import simulate
from simulator.scenario.config import Scenario

WINDOW_S = 0.25
COUNT = "system"  # what is counted: "system" (arrived, not answered) or "queue" (waiting to be batched)
POINTS = 10  # instants a window at which the count in the system is read
say = print


def in_system(arrived_s: np.ndarray, done_s: np.ndarray, windows: int, window_s: float) -> np.ndarray:
    """The mean number of requests in the system (arrived, not yet answered) over each of
    ``windows`` windows of ``window_s`` from 0, read at ``POINTS`` instants a window."""
    at = (np.arange(windows * POINTS) + 0.5) * window_s / POINTS
    inside = np.searchsorted(np.sort(arrived_s), at, side="right") - np.searchsorted(np.sort(done_s), at, side="right")
    return inside.reshape(windows, POINTS).mean(axis=1)


def _scenario(profile: dict, rate: float, arrivals: Path, duration: float, start: float | None, seed: int) -> dict:
    doc = scenario_dict(profile, rate, duration_s=duration, warmup_s=0.0, seed=seed)
    doc["traffic"] = {"arrivals_file": str(arrivals)}
    if start is not None and profile["service_time"].get("by_rate"):
        doc["workers"]["service_time"]["rate_initial_rps"] = start
    return doc


def _count(records, windows: int, window_s: float) -> np.ndarray:
    done = records.completed
    if COUNT == "queue":  # waiting in the batch queue: enqueued, not yet dispatched
        return in_system(records.t_preprocessed[done] / 1e3, records.t_dispatch[done] / 1e3, windows, window_s)
    return in_system(records.arrival[done] / 1e3, records.t_response[done] / 1e3, windows, window_s)


def _measured_count(ok: pd.DataFrame, windows: int, window_s: float) -> np.ndarray:
    sent = ok["scheduled_s"].to_numpy()
    if COUNT == "queue":  # the server's clock onto the client's, by the slice's median offset
        offset = np.median(ok["received_at_ns"].to_numpy() / 1e9 - sent)
        enq, disp = (ok[c].to_numpy() / 1e9 - offset for c in ("enqueued_at_ns", "dispatched_at_ns"))
        return in_system(enq, disp, windows, window_s)
    return in_system(sent, sent + ok["latency_ms"].to_numpy() / 1e3, windows, window_s)


def slice_windows(run: Path, *, synthetic: bool = False, window_s: float = WINDOW_S) -> pd.DataFrame:
    """One row per window of every kept slice of ``run``: its load, slice, ``lf``, ``x``
    and ``z`` (module docstring), each about its slice's mean, the first and last windows
    left out."""
    profile, requests, summary = read_run(run)
    slices = pd.read_csv(run / "slices.csv")
    starts = start_rates(requests[requests["status"] == 200], profile["service_time"]) or {}
    loads = dict(zip(summary["level"], summary["load"], strict=True))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for _, row in slices[slices["kept"]].iterrows():
            g = requests[requests["slice"] == row["slice"]]
            arrivals, duration = write_arrivals(g, row, Path(tmp))
            n, start, rate = int(np.ceil(duration / window_s)), starts.get(int(row["slice"])), float(row["rate_rps"])
            flat = _scenario(profile, rate, arrivals, duration, start, seed=1)
            flat["platform"] = {"speed": {"kind": "trace", "step_ms": window_s * 1e3, "factors": [1.0] * n}}
            z = _count(simulate(Scenario.model_validate(flat)).records, n, window_s)
            if synthetic:  # the "measurement": the fitted model, its own speed process, the same arrivals
                got = simulate(
                    Scenario.model_validate(_scenario(profile, rate, arrivals, duration, start, 7 + int(row["slice"])))
                )
                lf = own_trace(profile, got.batches, duration, window_s, start or 0.0, got.records.t_preprocessed)[:n]
                x = _count(got.records, n, window_s)
            else:
                lf = np.log(window_trace(profile, g, duration, window_s, start)["factors"])[:n]
                x = _measured_count(g[g["status"] == 200], n, window_s)
            inner = slice(1, n - 1)
            lf, x, z = lf[inner], x[inner], z[inner]
            rows.append(
                pd.DataFrame(
                    {
                        "load": round(float(loads[row["level"]]), 2),
                        "slice": int(row["slice"]),
                        "lf": lf - lf.mean(),
                        "x": x - x.mean(),
                        "z": z - z.mean(),
                    }
                )
            )
    return pd.concat(rows, ignore_index=True)


def slopes(t: pd.DataFrame, run: str) -> list[dict]:
    """:func:`iv_slope` per load of one run's windows, and over its loads of 50% and more
    pooled, × 100 (log per request in the system)."""
    rows = []
    for load, g in [*t.groupby("load"), ("50-85%", t[t["load"] >= 0.5])]:
        got = iv_slope(g["lf"], g["x"], g["z"])
        slopes_x100 = {k: v * 100 for k, v in got.items() if k != "first"}
        rows.append({"run": run, "load": load, **slopes_x100, "first": got["first"], "sd_z": float(g["z"].std())})
    return rows


def main(args: list[str]) -> None:
    synthetic = "--synthetic" in args
    args = [a for a in args if a != "--synthetic"]
    global COUNT
    window_s = WINDOW_S
    if args[:1] == ["--window"]:
        window_s, args = float(args[1]), args[2:]
    if args[:1] == ["--count"]:
        COUNT, args = args[1], args[2:]
    runs = [Path(a) for a in args] or [Path("calibrate/profiles/cpu-resnet64-epyc")]
    say(
        f"{'synthetic control' if synthetic else 'measured'}: {window_s:g} s windows, "
        f"log speed x 100 per request in the {COUNT}"
    )
    rows = []
    for run in runs:
        got = slopes(slice_windows(run, synthetic=synthetic, window_s=window_s), run.name)
        pooled = got[-1]
        say(f"{run.name}: 50-85% pooled ols {pooled['ols']:+.3f}, iv {pooled['iv']:+.3f}", flush=True)
        rows += got
    t = pd.DataFrame(rows).astype({"load": str})
    by = t.groupby("load", sort=True)
    table = by[["ols", "reduced", "first", "iv", "sd_z"]].median().round(3)
    table["iv<0"] = by["iv"].apply(lambda s: int((s < 0).sum()))
    table["ols<0"] = by["ols"].apply(lambda s: int((s < 0).sum()))
    say(f"median over {len(runs)} runs (and runs with a negative slope):")
    say(table.to_string())


if __name__ == "__main__":
    main(sys.argv[1:])
