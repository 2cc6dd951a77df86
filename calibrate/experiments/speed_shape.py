"""Is the light load's p99 miss the shape of the speed process, or the held-out slices' own
speed? (calibrate/README, "The held-out slices' own speed, not the process's shape".)

For a run folder of ``servesim calibrate run``: every held-out slice's exact arrivals (the
load generator's schedule) through the fitted model, ``SEEDS`` times, at six speeds:

* ``process``: the fitted log-AR(1), as the validation simulates it;
* ``gauss_w``: a path of that process averaged over 0.25 s windows, as a trace: the
  resolution of the measured traces below, the process's Gaussian shape;
* ``shaped``: a fitted slice's own measured 0.25 s trace, drawn at random, its level's mean
  log taken out and its log scaled to the spread of ``gauss_w``'s windows: the measured
  shape (skew, runs of slow windows) at the process's spread;
* ``borrowed``: the same, unscaled;
* ``own``, ``own01``: the held-out slice's own trace, over 0.25 s and 0.1 s windows
  (:func:`calibrate.replay.window_trace`; the replay's ``windowed`` mode).

``gauss_w`` against ``shaped`` changes only the shape; ``process`` against ``own01`` the
speed the held-out slices ran at. Per held-out level, the pooled p50 and p99 errors (the
mean over seeds) and the seeds' standard deviation of the p99's.

    python calibrate/experiments/speed_shape.py RUN [SEEDS]   # ~40 s at 30 seeds
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.replay import window_trace, write_arrivals
from calibrate.scenario import scenario_dict
from calibrate.speed import window_var
from simulator.engine import simulate
from simulator.results.metrics import window
from simulator.scenario.config import Scenario
from simulator.scenario.platform import LogAR1Speed
from simulator.stages.speed import draw_path

MODES = ("process", "gauss_w", "shaped", "borrowed", "own", "own01")
WINDOW_S = 0.25
say = print


def fitted_traces(profile: dict, requests: pd.DataFrame, kept: pd.DataFrame) -> list[dict]:
    """Each fitted slice's 0.25 s trace, its level's mean log factor taken out."""
    fitted = {f["level"] for f in profile["fit_levels"]}
    rows = []
    for _, row in kept[kept["level"].isin(fitted)].iterrows():
        tr = window_trace(profile, requests[requests["slice"] == row["slice"]], float(row["seconds"]), WINDOW_S)
        rows.append((int(row["level"]), np.log(tr["factors"]), tr))
    mean = {lv: np.mean(np.concatenate([x for l2, x, _ in rows if l2 == lv])) for lv in fitted}
    return [dict(tr, factors=np.exp(x - mean[lv]).tolist()) for lv, x, tr in rows]


def main(run: Path, seeds: int) -> None:
    profile = json.loads((run / "profile.json").read_text())
    requests = pd.read_csv(run / "measurements.csv.gz")
    requests["warmup"] = requests["warmup"].astype(bool)
    slices = pd.read_csv(run / "slices.csv")
    kept = slices[slices["kept"]]
    fitted = {f["level"] for f in profile["fit_levels"]}
    warm = float((profile.get("design") or {}).get("warmup_s", 0.25))
    speed = profile["speed_process"]["speed"]
    borrowed = fitted_traces(profile, requests, kept)
    spread = sum(window_var(c["sigma"], c["correlation_time_s"], WINDOW_S) for c in speed["components"])
    scale = float(np.sqrt(spread / np.var(np.concatenate([np.log(t["factors"]) for t in borrowed]))))
    shaped = [dict(t, factors=np.exp(np.log(t["factors"]) * scale).tolist()) for t in borrowed]
    process = LogAR1Speed.model_validate({k: v for k, v in speed.items() if k != "episodes"})
    say(f"{run}: the process's 0.25 s windows' log variance {spread:.4f}; the fitted traces scaled by {scale:.3f}")
    rng = np.random.default_rng(0)

    def gauss_trace(duration_s: float) -> dict:
        path = draw_path(process, duration_s * 1000.0 + 1000.0, rng)
        k = (path.t / (WINDOW_S * 1000.0)).astype(int)
        n = int(np.ceil(duration_s / WINDOW_S))
        log_f = np.bincount(k, weights=np.log(path.f))[:n] / np.bincount(k)[:n]
        return dict(borrowed[0], factors=np.exp(log_f).tolist())

    lat: dict[tuple[int, str], list[list[np.ndarray]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _, row in kept[~kept["level"].isin(fitted)].iterrows():
            g = requests[requests["slice"] == row["slice"]]
            arrivals, duration = write_arrivals(g, row, Path(tmp))
            level = int(row["level"])
            lat.setdefault((level, "measured"), [[]])[0].append(
                g[~g["warmup"] & (g["status"] == 200)]["latency_ms"].to_numpy()
            )
            for mode in MODES:
                for k in range(seeds):
                    doc = scenario_dict(profile, float(row["rate_rps"]), duration_s=duration, warmup_s=warm, seed=k)
                    doc["traffic"] = {"arrivals_file": str(arrivals)}
                    match mode:
                        case "gauss_w":
                            doc["platform"] = {"speed": gauss_trace(duration)}
                        case "shaped":
                            doc["platform"] = {"speed": shaped[rng.integers(len(shaped))]}
                        case "borrowed":
                            doc["platform"] = {"speed": borrowed[rng.integers(len(borrowed))]}
                        case "own" | "own01":
                            own_s = 0.1 if mode == "own01" else WINDOW_S
                            doc["platform"] = {"speed": window_trace(profile, g, duration, own_s)}
                    s = Scenario.model_validate(doc)
                    rec = simulate(s).records
                    lat.setdefault((level, mode), [[] for _ in range(seeds)])[k].append(
                        (rec.t_response - rec.arrival)[window(rec, s) & rec.completed]
                    )
    for level in sorted({lv for lv, _ in lat}):
        meas = np.concatenate(lat[level, "measured"][0])
        m50, m99 = np.percentile(meas, 50), np.percentile(meas, 99)
        cells = [f"level {level}: measured p50 {m50:.1f}, p99 {m99:.1f} ms"]
        for mode in MODES:
            p50 = np.array([np.percentile(np.concatenate(x), 50) for x in lat[level, mode]])
            p99 = np.array([np.percentile(np.concatenate(x), 99) for x in lat[level, mode]])
            cells.append(
                f"{mode} {np.mean(p50) / m50 * 100 - 100:+.1f}, {np.mean(p99) / m99 * 100 - 100:+.1f}% "
                f"(sd {np.std(p99) / m99 * 100:.1f})"
            )
        say(" | ".join(cells))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 30)
