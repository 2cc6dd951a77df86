"""Where the MGET ranker's tail comes from (calibrate/README, "The load generator on the
loop's core"): the same server and load with this load generator on the front end's core,
as `servesim calibrate run` keeps it (with the server's event loop and its redis-server),
or on the model instance's core, which the ranker's small forward leaves idle most of the
time. Nothing else changes: each condition is a fresh redis-server (on the front end's
core) and a fresh server, in a random order per round; each rate is 20 s of open-loop
Poisson load after a 5 s warm-up. Per condition and rate: latency p50/p99 and the fetch's
(``feature_us``) p50/p90/p99 and maximum, ms, each round's and the rounds' mean; with ``--refit`` (a
refit of a `calibrate run` folder, ranker_loop_models.py --model loop_await) the
calibrated model's p50/p99 at the same rates, 60 s simulated.

    python calibrate/experiments/ranker_client_core.py --refit /tmp/rk3_wake   # ~6 minutes
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from calibrate.loadgen import sweep
from calibrate.payloads import ranker_payloads
from calibrate.servers import get_json, redis_server, server

SERVER = ["--model", "ranker", "--max-batch-size", "32", "--max-queue-delay-ms", "2", "--feature-batch-size", "26"]
CONDITIONS = ("front end's core", "instance's core")


def measure(client_on_instance: bool, rates: list[float], secs: float, seed: int) -> pd.DataFrame:
    before = os.sched_getaffinity(0)
    with redis_server({0}) as redis, server([*SERVER, "--redis-url", redis]) as url:
        cfg = get_json(url + "/v2/models/ranker/config")["parameters"]["servesim"]
        cores = {i["core"] for i in cfg["instances"]} if client_on_instance else set(cfg["frontend_cores"])
        os.sched_setaffinity(0, cores)
        try:
            payloads = ranker_payloads(32, cfg["model"]["dense"], 10_000, np.random.default_rng(seed))
            sweep(url, "ranker", [rates[0]], payloads, duration_s=5.0, seed=seed + 99)  # warm
            df = sweep(url, "ranker", rates, payloads, duration_s=secs, seed=seed)
        finally:
            os.sched_setaffinity(0, before)
    return df[(df["status"] == 200) & ~df["warmup"]]


def modelled(refit: Path, rates: list[float]) -> dict[float, tuple[float, float]]:
    doc = yaml.safe_load((refit / "scenario.yaml").read_text())
    doc["duration_s"] = 60.0
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rate in rates:
            doc["traffic"] = {"rate_rps": rate}
            path, rec = Path(tmp) / "s.yaml", Path(tmp) / "s.parquet"
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
            subprocess.run(["servesim", "run", str(path), "--records", str(rec)], check=True, capture_output=True)
            r = pd.read_parquet(rec)
            e = (r["t_response_ms"] - r["arrival_ms"])[~r["warmup"] & (r["outcome"] == "completed")]
            out[rate] = (float(e.quantile(0.5)), float(e.quantile(0.99)))
    return out


def figures(d: pd.DataFrame, *, tails: bool = False, **labels) -> list[dict]:
    """Per rate of a measured condition: latency p50/p99 and the fetch's p50/p90/p99 and max,
    ms; with ``tails``, the latency's p99.9 and the fetches over 20 ms too."""
    rows = []
    for rate, g in d.groupby("offered_rps"):
        f, lat = g["feature_us"] / 1e3, g["latency_ms"]
        more = {"p99.9": lat.quantile(0.999), "fetches > 20 ms": int((f > 20).sum())} if tails else {}
        rows.append(
            {**labels, "rate": rate, "p50": lat.quantile(0.5), "p99": lat.quantile(0.99),
             **{f"fetch p{q}": f.quantile(q / 100) for q in (50, 90, 99)}, "fetch max": f.max(), **more}
        )  # fmt: skip
    return rows


def show(rows: list[dict], by: str) -> None:
    """Each round's figures, and their mean over the rounds, by rate and condition ``by``."""
    t = pd.DataFrame(rows)
    pd.set_option("display.width", 160)
    print(t.sort_values(["rate", by, "round"]).round(2).to_string(index=False))  # noqa: T201
    print("\nmean over rounds")  # noqa: T201
    print(t.groupby(["rate", by]).mean(numeric_only=True).drop(columns="round").round(2).to_string())  # noqa: T201


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="240,600,840", help="Open-loop rates, req/s, comma-separated.")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--secs", type=float, default=20.0)
    ap.add_argument("--refit", type=Path, help="A refit folder whose scenario.yaml is simulated at the same rates.")
    a = ap.parse_args()
    rates = [float(r) for r in a.rates.split(",")]
    rng = np.random.default_rng(0)
    rows = []
    for rnd in range(a.rounds):
        for k in rng.permutation(len(CONDITIONS)):
            rows += figures(measure(bool(k), rates, a.secs, seed=rnd), round=rnd, client=CONDITIONS[k])
    show(rows, "client")
    if a.refit is not None:
        for rate, (p50, p99) in modelled(a.refit, rates).items():
            print(f"model {rate:7.1f} req/s  p50/p99 {p50:.2f}/{p99:.2f}")  # noqa: T201


if __name__ == "__main__":
    main()
