"""An independent load pattern, predicted by ``servesim run scenario.yaml`` (slow).

A short calibration of the default server writes its ``scenario.yaml``; the same server
is started again and driven by ``tests/independent_client.py``: another process, another client
(``http.client`` threads, not aiohttp), another arrival process (gamma gaps, cv 0.5, not
Poisson), at 40% and 70% of the calibrated capacity. Each is predicted by the CLI a user
would run, ``servesim run scenario.yaml`` with the client's own schedule as
``traffic.arrivals_file``, over 20 seeds; judged by the calibration's rules: p50 within
10% and p99 within 15% of the median prediction, or inside the seeds' 90% band.

A calibration's fixed delay holds its own client's overhead (the latency is the client's):
another client has its own. So the test first measures that difference alone, both clients
at 5% load one after the other (the p50 of each, less the other's), and moves the
predictions by it (printed with ``-s``; calibrate/README gives the figures).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from servesim.cli import app

SEEDS = 20
RUN_S = 8.0
SKIP_S = 0.5


def _predict(scenario, arrivals, duration, tmp_path) -> dict[str, np.ndarray]:
    runner = CliRunner()
    got = {"p50": [], "p99": []}
    for seed in range(SEEDS):
        out = tmp_path / f"pred-{seed}.json"
        sets = [f"traffic.arrivals_file={arrivals}", "traffic.rate_rps=null", f"duration_s={duration:.3f}"]
        sets += [f"warmup_s={SKIP_S}"]
        args = ["run", str(scenario), "--seed", str(seed), "--json", str(out)]
        for s in sets:
            args += ["--set", s]
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.output
        lat = json.loads(out.read_text())["latency_ms"]["e2e"]
        got["p50"].append(lat["p50"])
        got["p99"].append(lat["p99"])
    return {k: np.asarray(v) for k, v in got.items()}


@pytest.mark.slow
def test_an_independent_client_and_arrival_process_are_predicted(tmp_path, calibrated_default):
    from calibrate.loadgen import Slice, run_slices
    from calibrate.payloads import image_payloads
    from tests.conftest import DEFAULT_SERVER
    from tests.servers import reference_server

    cal = calibrated_default
    profile = json.loads((cal / "profile.json").read_text())
    capacity = float(profile["capacity_rps"])
    payloads = image_payloads(16, 64, np.random.default_rng(3))
    docs = [{"body": base64.b64encode(p.body).decode(), "headers": dict(p.headers)} for p in payloads]
    (tmp_path / "payloads.json").write_text(json.dumps(docs))
    cores = profile["server"]["frontend_cores"]
    figures = {}
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None

    def independent(url: str, rate: float, seconds: float, seed: int, out) -> pd.DataFrame:
        cmd = [sys.executable, "tests/independent_client.py", url, "resnet", str(tmp_path / "payloads.json")]
        subprocess.run(
            [*cmd, f"{rate:.2f}", str(seconds), str(seed), str(out)], check=True, timeout=120, preexec_fn=pin
        )
        return pd.read_csv(out)

    with reference_server(*DEFAULT_SERVER) as (url, _proc):
        # the clients' own overheads, alone: both at 5% load, the p50 of the successful requests
        light = independent(url, 0.05 * capacity, 6.0, 7, tmp_path / "light.csv")
        before = os.sched_getaffinity(0)
        if cores:  # where the calibration's client ran: on the front end's cores
            os.sched_setaffinity(0, cores)
        try:
            theirs, *_ = run_slices(
                url, "resnet", [Slice(0, 0, 0.05 * capacity, 7)], payloads, slice_s=6.0, warmup_s=0.5
            )
        finally:
            os.sched_setaffinity(0, before)
        offset = float(
            np.median(light.loc[(light["status"] == 200) & (light["scheduled_s"] >= SKIP_S), "latency_ms"])
            - np.median(theirs.loc[(theirs["status"] == 200) & ~theirs["warmup"], "latency_ms"])
        )
        for k, load in enumerate((0.4, 0.7)):
            out = tmp_path / f"measured-{k}.csv"
            m = independent(url, load * capacity, RUN_S, 100 + k, out)
            ok = m[(m["status"] == 200) & (m["scheduled_s"] >= SKIP_S)]
            assert len(ok) > 0.95 * len(m[m["scheduled_s"] >= SKIP_S])
            pred = {
                q: v + offset
                for q, v in _predict(cal / "scenario.yaml", f"{out}.arrivals", RUN_S + 1.0, tmp_path).items()
            }
            for q, pct in (("p50", 50), ("p99", 99)):
                meas = float(np.percentile(ok["latency_ms"], pct))
                med = float(np.median(pred[q]))
                lo, hi = np.quantile(pred[q], [0.05, 0.95])
                figures[(load, q)] = (meas, med, lo, hi)
    problems = []
    for (load, q), (meas, med, lo, hi) in figures.items():
        bound = 10.0 if q == "p50" else 15.0
        err = (med / meas - 1) * 100
        if abs(err) > bound and not lo <= meas <= hi:
            problems.append(
                f"{load:.0%} {q}: measured {meas:.1f}, predicted {med:.1f} [{lo:.1f}, {hi:.1f}] ({err:+.1f}%)"
            )
    print(f"client offset {offset:+.2f} ms", {k: tuple(round(float(v), 1) for v in f) for k, f in figures.items()})  # noqa: T201
    assert not problems, problems
