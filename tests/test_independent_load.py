"""An independent load pattern, predicted by ``servesim run scenario.yaml`` (slow).

A calibration of the tiny model writes its ``scenario.yaml``; the same server is started
again and driven by ``tests/independent_client.py``: another process, another client
(``http.client`` threads, not aiohttp), another arrival process (gamma gaps, cv 0.5, not
Poisson), at 40% and 70% of the calibrated capacity. Each is predicted by the CLI a user
would run, ``servesim run scenario.yaml`` with the client's own schedule as
``traffic.arrivals_file``, over 20 seeds; judged by the calibration's rules: p50 within
10% and p99 within 15% of the median prediction, or inside the seeds' 90% band.
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

ARGS = ["--resolution", "32", "--width", "16", "--max-batch-size", "4", "--max-queue-delay-ms", "2"]
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
def test_an_independent_client_and_arrival_process_are_predicted(tmp_path):
    pytest.importorskip("torch", reason="calibration drives the reference server (torch)")
    pytest.importorskip("aiohttp", reason="the calibration's load generator needs aiohttp")
    from calibrate.payloads import image_payloads
    from calibrate.run import Design, calibrate_run
    from tests.servers import reference_server

    cal = tmp_path / "cal"
    calibrate_run(ARGS, cal, design=Design(rounds=4, slice_s=2.0, min_requests=0), draws=20, log=lambda _m: None)
    profile = json.loads((cal / "profile.json").read_text())
    capacity = float(profile["capacity_rps"])
    payloads = image_payloads(16, 64, np.random.default_rng(3))
    docs = [{"body": base64.b64encode(p.body).decode(), "headers": dict(p.headers)} for p in payloads]
    (tmp_path / "payloads.json").write_text(json.dumps(docs))
    cores = profile["server"]["frontend_cores"]
    figures = {}
    with reference_server(*ARGS) as (url, _proc):
        for k, load in enumerate((0.4, 0.7)):
            out = tmp_path / f"measured-{k}.csv"
            cmd = [sys.executable, "tests/independent_client.py", url, "resnet", str(tmp_path / "payloads.json")]
            cmd += [f"{load * capacity:.2f}", str(RUN_S), str(100 + k), str(out)]
            subprocess.run(
                cmd, check=True, timeout=120, preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None
            )
            m = pd.read_csv(out)
            ok = m[(m["status"] == 200) & (m["scheduled_s"] >= SKIP_S)]
            assert len(ok) > 0.95 * len(m[m["scheduled_s"] >= SKIP_S])
            pred = _predict(cal / "scenario.yaml", f"{out}.arrivals", RUN_S + 1.0, tmp_path)
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
    print({k: tuple(round(v, 1) for v in f) for k, f in figures.items()})  # noqa: T201 (-s shows the figures)
    assert not problems, problems
