"""Does the host's speed keep time with the load? (calibrate/README, "The host's speed keeps
time with the load".)

For a run folder of ``servesim calibrate run``, every held-out slice's exact arrivals (the
load generator's schedule) through the fitted model, ``SEEDS`` times, at the slice's own
measured speed over 0.1 s windows (:func:`calibrate.replay.window_trace`, the replay's
``windowed`` mode at 0.1 s) in three ways:

* ``aligned``: the trace as measured, each window's speed at the moment it ran;
* ``shifted``: the same windows rotated by ``SHIFT_S`` (1.3 s), so the speed keeps its
  distribution and its runs but loses its timing against the arrivals;
* ``reversed``: the same windows in reverse order.

Each replay starts the instance's recent throughput, which ``by_rate`` reads, where the
slice before left it (:func:`calibrate.idle.slice_start_rates`), and the trace divides
``by_rate`` out at the same throughput: started from none, a slice's first second ran
slow in the replay and its trace read fast, and rotating the trace moved that second.

Only the timing changes between them. If the host's speed were a process of its own, as
the model draws it, the three would predict the same tail within the seeds' spread.

The control (``--synthetic``) runs the same test where that holds by construction: a slice
simulated with the fitted process at the level's rate is the "measurement", its own
batches (their time over the batch table, per window) the trace, replayed the same three
ways on its own arrivals. Per held-out level, the pooled p50 and p99 errors against the
measurement (the mean over seeds for p50, the median for p99).

    python calibrate/experiments/alignment.py RUN [RUN ...]              # ~6 s a run at 8 seeds
    python calibrate/experiments/alignment.py --synthetic RUN [RUN ...]   # ~6 s a run
    python calibrate/experiments/alignment.py --window 0.25 RUN [RUN ...]  # other windows
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate import idle
from calibrate.experiments.two_speeds import read_run
from calibrate.replay import start_rates, window_trace, write_arrivals
from calibrate.scenario import scenario_dict
from simulator.engine import simulate
from simulator.results.metrics import window
from simulator.scenario.config import Scenario

SEEDS = 8
WINDOW_S = 0.1
SHIFT_S = 1.3
SYNTHETIC_SLICES = 10
WAYS = ("aligned", "shifted", "reversed")
say = print


def ways(log_f: np.ndarray) -> dict[str, np.ndarray]:
    """The trace's log factors as measured, rotated and reversed."""
    shift = max(1, round(SHIFT_S / WINDOW_S)) % len(log_f) or 1
    return {"aligned": log_f, "shifted": np.roll(log_f, -shift), "reversed": log_f[::-1]}


def replayed(
    profile: dict,
    rate: float,
    arrivals: Path,
    trace: dict,
    log_f: np.ndarray,
    duration: float,
    warm: float,
    initial_rps: float | None = None,
):
    """Latencies (ms) of ``SEEDS`` replays per way: {way: [per seed]}; ``by_rate`` read
    from ``initial_rps`` at the slice's start (the slice before's throughput)."""
    out = {}
    for name, lf in ways(log_f).items():
        speed = dict(trace, factors=[round(float(v), 5) for v in np.exp(lf)])
        for k in range(SEEDS):
            doc = scenario_dict(profile, rate, duration_s=duration, warmup_s=warm, seed=k)
            doc["traffic"] = {"arrivals_file": str(arrivals)}
            if initial_rps is not None:
                doc["workers"]["service_time"]["rate_initial_rps"] = initial_rps
            doc["platform"] = {"speed": speed}
            s = Scenario.model_validate(doc)
            rec = simulate(s).records
            out.setdefault(name, []).append((rec.t_response - rec.arrival)[window(rec, s) & rec.completed])
    return out


def instance_table(profile: dict) -> np.ndarray:
    """The instance's batch time by size as the profile's scenario runs it (index 0 unused):
    the fitted table less the hand-back where the event loop takes it
    (``event_loop.instance_less_ms``), scaled where the speed process's episodes hold part
    of it (:func:`calibrate.scenario.scenario_dict`). Dividing a simulated batch by the fitted
    table instead read bigger batches as slower by the hand-back's share, and so a backlog,
    which makes them, as a slowdown."""
    st = scenario_dict(profile, 100.0, duration_s=1.0, warmup_s=0.0)["workers"]["service_time"]
    sizes = np.arange(int(profile["server"]["max_batch_size"]) + 1)
    if st["kind"] == "table":
        tab = {int(k): float(v) for k, v in st["batch_ms"].items()}
        known = sorted(tab)
        return np.interp(sizes, known, [tab[k] for k in known])
    return st["base_ms"] + st["per_item_ms"] * sizes


def own_trace(
    profile: dict,
    log,
    duration: float,
    window_s: float | None = None,
    initial_rps: float = 0.0,
    enqueued: np.ndarray | None = None,
) -> np.ndarray:
    """A simulated slice's log speed per window: its batches' instance time over the batch
    table, ``after_idle`` at the instance's idle time before each and ``by_rate`` at its
    recent throughput (as the simulator keeps them), request-weighted, placed at the
    middle of their run (as :func:`calibrate.replay.window_trace` treats a measured
    batch), about its mean; over ``window_s`` (``WINDOW_S`` by default), the throughput
    from ``initial_rps`` (the simulation's ``rate_initial_rps``); where ``by_rate`` counts
    arrivals, those ``enqueued`` (ms, the simulated requests' ``t_preprocessed``)."""
    window_s = WINDOW_S if window_s is None else window_s
    st = profile["service_time"]
    own = log.computed - log.start
    fitted = instance_table(profile)[log.size]
    if st.get("after_idle"):
        # one instance, free from the run's start, then from when the loop took each batch back
        before = np.r_[log.start[:1], log.start[1:] - log.end[:-1]]
        fitted = fitted * idle.idle_factor(before, st["after_idle"])
    if st.get("by_rate"):
        tau = float(st.get("rate_window_ms", 500.0))
        if st.get("rate_of") == "arrivals":
            if enqueued is None:
                raise ValueError("by_rate counts arrivals here: give the requests' enqueue times")
            rate = idle.arrival_rate(enqueued[np.isfinite(enqueued)], log.start, tau, initial_rps)
        else:
            rate = idle.recent_rate(log.start, log.size.astype(float), tau, initial_rps)
        fitted = fitted * idle.rate_factor_at(rate, st["by_rate"])
    lr = np.log(own / fitted)
    n = int(np.ceil(duration / window_s))
    k = np.clip(((log.start + own / 2) / 1000.0 / window_s).astype(int), 0, n - 1)
    per = np.bincount(k, weights=log.size * lr, minlength=n)
    cnt = np.bincount(k, weights=log.size, minlength=n)
    mean = per.sum() / cnt.sum()
    return np.where(cnt > 0, per / np.maximum(cnt, 1e-12), mean) - mean


def run_measured(run: Path) -> dict:
    profile, requests, summary = read_run(run)
    slices = pd.read_csv(run / "slices.csv")
    kept = slices[slices["kept"]]
    fitted = {f["level"] for f in profile["fit_levels"]}
    warm = float((profile.get("design") or {}).get("warmup_s", 0.25))
    starts = start_rates(requests[requests["status"] == 200], profile["service_time"]) or {}
    lat: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _, row in kept[~kept["level"].isin(fitted)].iterrows():
            g = requests[requests["slice"] == row["slice"]]
            arrivals, duration = write_arrivals(g, row, Path(tmp))
            level = int(row["level"])
            ok = g[~g["warmup"].astype(bool) & (g["status"] == 200)]
            lat.setdefault((level, "measured"), []).append(ok["latency_ms"].to_numpy())
            start = starts.get(int(row["slice"]))
            trace = window_trace(profile, g, duration, WINDOW_S, start)
            got = replayed(
                profile, float(row["rate_rps"]), arrivals, trace, np.log(trace["factors"]), duration, warm, start
            )
            for name, per_seed in got.items():
                cell = lat.setdefault((level, name), [[] for _ in range(SEEDS)])
                for k, x in enumerate(per_seed):
                    cell[k].append(x)
    return {"run": run.name, "lat": lat, "load": lambda lv: _load(summary, lv)}


def run_synthetic(run: Path) -> dict:
    profile, _, summary = read_run(run)
    elasticity = (profile["speed_process"]["speed"] or {}).get("frontend_elasticity", 1.0)
    duration, warm = 4.0, 0.25
    lat: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _, lv in summary[summary["held_out"]].iterrows():
            level, rate = int(lv["level"]), float(lv["offered_rps"])
            for j in range(SYNTHETIC_SLICES):
                doc = scenario_dict(profile, rate, duration_s=duration, warmup_s=warm, seed=1000 + j)
                s = Scenario.model_validate(doc)
                got = simulate(s)
                rec = got.records
                lat.setdefault((level, "measured"), []).append(
                    (rec.t_response - rec.arrival)[window(rec, s) & rec.completed]
                )
                arrivals = Path(tmp) / f"arrivals-{level}-{j}.txt"
                np.savetxt(arrivals, np.sort(rec.arrival) / 1000.0, fmt="%.6f")
                log_f = own_trace(profile, got.batches, duration, enqueued=rec.t_preprocessed)
                trace = {
                    "kind": "trace",
                    "step_ms": WINDOW_S * 1000.0,
                    "factors": [],
                    "frontend_elasticity": elasticity,
                }
                for name, per_seed in replayed(profile, rate, arrivals, trace, log_f, duration, warm).items():
                    cell = lat.setdefault((level, name), [[] for _ in range(SEEDS)])
                    for k, x in enumerate(per_seed):
                        cell[k].append(x)
    return {"run": run.name + " (synthetic)", "lat": lat, "load": lambda lv: _load(summary, lv)}


def _load(summary: pd.DataFrame, level: int) -> float:
    return float(summary.loc[summary["level"] == level, "load"].iloc[0])


def report(got: dict) -> list[dict]:
    lat, rows = got["lat"], []
    for level in sorted({lv for lv, _ in lat}):
        meas = np.concatenate(lat[level, "measured"])
        m50, m99 = np.percentile(meas, 50), np.percentile(meas, 99)
        row = {"run": got["run"], "load": got["load"](level)}
        cells = [f"{got['run']} {row['load']:.0%}: measured p50 {m50:.1f}, p99 {m99:.1f} ms"]
        for name in WAYS:
            p50 = np.array([np.percentile(np.concatenate(x), 50) for x in lat[level, name]])
            p99 = np.array([np.percentile(np.concatenate(x), 99) for x in lat[level, name]])
            row[name + "_p50"] = 100 * (np.mean(p50) / m50 - 1)
            row[name + "_p99"] = 100 * (np.median(p99) / m99 - 1)
            cells.append(
                f"{name} {row[name + '_p50']:+.1f}, {row[name + '_p99']:+.1f}% "
                f"(seeds {100 * (p99.min() / m99 - 1):+.0f}..{100 * (p99.max() / m99 - 1):+.0f})"
            )
        say(" | ".join(cells), flush=True)
        rows.append(row)
    return rows


def main(args: list[str]) -> None:
    global WINDOW_S
    synthetic = "--synthetic" in args
    args = [a for a in args if a != "--synthetic"]
    if args[:1] == ["--window"]:
        WINDOW_S, args = float(args[1]), args[2:]
    runs = [Path(a) for a in args] or [Path("calibrate/profiles/cpu-resnet64-epyc")]
    say(f"speed traces over {WINDOW_S:g} s windows, shifted by {max(1, round(SHIFT_S / WINDOW_S)) * WINDOW_S:g} s")
    rows = []
    for run in runs:
        rows += report(run_synthetic(run) if synthetic else run_measured(run))
    t = pd.DataFrame(rows)
    for q in ("p99", "p50"):
        say(f"median over {len(runs)} runs, the {q}'s error (runs where it is above the aligned replay's):")
        for load, g in t.groupby("load"):
            cells = [f"{w} {g[f'{w}_{q}'].median():+.1f}%" for w in WAYS]
            above = [f"{w} {(g[f'{w}_{q}'] > g[f'aligned_{q}']).sum()}" for w in WAYS[1:]]
            say(f"  {load:.0%}: " + ", ".join(cells) + " (" + ", ".join(above) + f" of {len(g)})")


if __name__ == "__main__":
    main(sys.argv[1:])
