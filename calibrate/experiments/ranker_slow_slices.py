"""Which slices of a `calibrate run` folder tip over at its top loads (calibrate/README, "A
fair wait for a connection"): per slice of the two highest levels, its p99, the front
end's CPU per request (server, load generator and redis-server), the collector's time per
request, the requests in the system (offered rate times the server's mean request time,
Little's law) and the speed meter's mean slowdown; then, per level, the mean of each, and
the within-level spread of log CPU per request: what the meter explains with the fitted
elasticity (``frontend.speed``) and what is left.

    python calibrate/experiments/ranker_slow_slices.py /tmp/fp2   # seconds
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.station import slice_cpu_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="A `calibrate run` folder (slices.csv, measurements.csv.gz, profile.json).")
    a = ap.parse_args()
    sl = pd.read_csv(a.run / "slices.csv")
    req = pd.read_csv(a.run / "measurements.csv.gz")
    profile = json.loads((a.run / "profile.json").read_text())
    ok = req[(req["status"] == 200) & ~req["warmup"]]
    per = ok.groupby("slice").agg(
        p99=("latency_ms", lambda s: s.quantile(0.99)), request_ms=("request_us", lambda s: s.mean() / 1e3)
    )
    d = sl[sl["kept"] & (sl["requests"] > 0)].set_index("slice").join(per)
    d["cpu_ms"] = slice_cpu_s(d, client_shares_cores=True).to_numpy() / d["requests"] * 1e3
    d["gc_ms"] = d["frontend_gc_s"] / d["requests"] * 1e3
    d["in_system"] = d["rate_rps"] * d["request_ms"] / 1e3
    cols = ["level", "rate_rps", "p99", "cpu_ms", "gc_ms", "in_system", "slowdown_mean"]
    top = sorted(d["level"].unique())[-2:]
    pd.set_option("display.width", 160)
    print(d[d["level"].isin(top)].sort_values(["level", "p99"])[cols].round(3).to_string())  # noqa: T201
    rel = np.log(d["cpu_ms"]) - np.log(d["cpu_ms"]).groupby(d["level"]).transform("median")
    speed = np.log(d["slowdown_mean"]) - np.log(d["slowdown_mean"]).groupby(d["level"]).transform("median")
    beta = ((profile.get("frontend") or {}).get("speed") or {}).get("elasticity", 0.0)
    d["spread"], d["meter"], d["left"] = rel, beta * speed, rel - beta * speed
    out = d.groupby("level").agg(
        rate=("rate_rps", "first"), p99=("p99", "median"), cpu_ms=("cpu_ms", "mean"), gc_ms=("gc_ms", "mean"),
        in_system=("in_system", "mean"), sd_log_cpu=("spread", "std"), sd_meter=("meter", "std"),
        sd_left=("left", "std"),
    )  # fmt: skip
    print(f"\nper level (p99: the slices' median; the meter's elasticity {beta:.2f})")  # noqa: T201
    print(out.round(4).to_string())  # noqa: T201
    for lv in top:
        g = d[d["level"] == lv]
        r = np.corrcoef(np.log(g["in_system"]), g["spread"])[0, 1]
        print(f"level {lv}: r(log in system, log CPU per request) {r:.2f}")  # noqa: T201


if __name__ == "__main__":
    main()
