"""A whole calibration: start the reference server, find its capacity, sweep load levels,
fit a profile on some levels and validate it on the others (held out), write it all.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.fit import fit_profile
from calibrate.loadgen import image_payloads, level_summary, ranker_payloads, sweep
from calibrate.validate import chart, compare

PROFILE_SCHEMA = 1
FIT_LOADS = (0.3, 0.6, 0.8)
VALIDATE_LOADS = (0.2, 0.5, 0.7, 0.85)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def server(args: list[str], *, timeout_s: float = 120.0):
    """``servesim serve`` on a free loopback port; yields its URL; stops it afterwards."""
    port = _free_port()
    exe = Path(sys.executable).with_name("servesim")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "simulator"]
    proc = subprocess.Popen([*cmd, "serve", "--port", str(port), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the reference server exited: {proc.stderr.read().decode()[-2000:]}")
            with contextlib.suppress(OSError), urllib.request.urlopen(url + "/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("the reference server did not become ready")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def redis_server():
    """A throwaway redis-server on a free loopback port; yields its URL."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise FileNotFoundError("redis-server is not installed (apt-get install redis-server)")
    port = _free_port()
    args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            if time.monotonic() > deadline:
                raise TimeoutError("redis-server did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def build_profile(config: dict, requests: pd.DataFrame, fit_levels: list[int], *, rng) -> dict:
    """A versioned profile: fits from ``requests`` (levels ``fit_levels``) and the server's
    ``/v2/models/{m}/config``, with hardware, software and date."""
    servesim = config["parameters"]["servesim"]
    server_cfg = {
        "max_batch_size": config["max_batch_size"],
        "max_queue_delay_ms": config["dynamic_batching"]["max_queue_delay_microseconds"] / 1000.0,
        "max_queue_size": config["dynamic_batching"]["default_queue_policy"]["max_queue_size"] or None,
        "instances": config["instance_group"][0]["count"],
        "preprocess_threads": 1,
        "device": servesim["device"],
        "threads": servesim["threads"],
    }
    return {
        "schema_version": PROFILE_SCHEMA,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "hardware": hardware(),
        "software": software(),
        "model": servesim["model"],
        "server": server_cfg,
        **fit_profile(requests, fit_levels=fit_levels, rng=rng, features=servesim.get("features")),
        "fit_levels": [{"level": i} for i in fit_levels],
    }


def hardware() -> dict:
    """What the measurements ran on."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    gpu = {"name": None, "driver": None}
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        gpu = {"name": pynvml.nvmlDeviceGetName(h), "driver": pynvml.nvmlSystemGetDriverVersion()}
    except Exception:  # no GPU or no driver: recorded as none
        pass
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "gpu": gpu}


def software() -> dict:
    import scipy
    import simpy
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "simpy": simpy.__version__,
        "servesim": "0.1.0",
    }


def cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) CPU ticks so far (Linux), to report how much the host took from this VM."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[7] if len(fields) > 7 else 0), sum(fields)


MAX_PROBE_RPS = 1000.0  # about what one client process offers on these 2-core machines


def capacity(url: str, model: str, payloads, *, guess_rps: float, seconds: float, seed: int) -> float:
    """Completed requests per second under an overload of about twice ``guess_rps``
    (capped at :data:`MAX_PROBE_RPS`: past that the client, not the server, is measured)."""
    df = sweep(
        url,
        model,
        [min(2 * guess_rps, MAX_PROBE_RPS)],
        payloads,
        duration_s=seconds,
        min_queries=50,
        seed=seed,
        warmup_s=0.5,
    )
    summary = level_summary(df)
    return float(summary["achieved_rps"].iloc[0])


def calibrate_run(
    server_args: list[str], out: Path, *, duration_s: float = 20.0, seed: int = 0, pin: bool = False, log=print
) -> dict:
    """The whole calibration (the ranker with a redis-server of its own); writes profile.json, measurements.csv,
    validation.json, validation.md and validation.png under ``out``. Returns the report."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    before = os.sched_getaffinity(0)
    if not pin:
        server_args = [*server_args, "--instance-cores", "none"]
    model = server_args[server_args.index("--model") + 1] if "--model" in server_args else "resnet"
    try:
        with contextlib.ExitStack() as stack:
            if model == "ranker" and "--redis-url" not in server_args:  # its ids come from a real Redis
                server_args = [*server_args, "--redis-url", stack.enter_context(redis_server())]
            return _calibrate(server_args, out, model, duration_s=duration_s, seed=seed, rng=rng, log=log)
    finally:
        os.sched_setaffinity(0, before)


def _calibrate(server_args: list[str], out: Path, model: str, *, duration_s: float, seed: int, rng, log) -> dict:
    ticks0 = cpu_ticks()
    with server(server_args) as url:
        config = _get(url + f"/v2/models/{model}/config")
        frontend = config["parameters"]["servesim"]["frontend_cores"]
        if any(i["core"] is not None for i in config["parameters"]["servesim"]["instances"]):
            os.sched_setaffinity(0, frontend)  # this load generator keeps off the instances' cores too
        mcfg = config["parameters"]["servesim"]["model"]
        if model == "ranker":
            payloads = ranker_payloads(32, mcfg["dense"], 10_000, rng)
        else:
            payloads = image_payloads(32, side=max(64, mcfg["resolution"]), rng=rng)
        sweep(url, model, [5.0], payloads, duration_s=2.0, min_queries=10, seed=seed)  # warm the path
        b = config["max_batch_size"]
        stats = _get(url + f"/v2/models/{model}/stats")["model_stats"][0]["batch_stats"]
        per_item = min(s["compute_infer"]["ns"] / s["compute_infer"]["count"] / 1e6 / s["batch_size"] for s in stats)
        cap = capacity(url, model, payloads, guess_rps=1000.0 / per_item, seconds=6.0, seed=seed + 100)
        log(f"capacity: {cap:.1f} req/s (batch up to {b})")
        loads = sorted(FIT_LOADS + VALIDATE_LOADS)
        rates = [round(f * cap, 2) for f in loads]
        log(f"levels: {', '.join(f'{f:.0%}={r:g}' for f, r in zip(loads, rates, strict=True))} req/s")
        # levels in a shuffled order, so a slow spell of the machine does not line up with load
        parts = []
        for k in rng.permutation(len(rates)):
            part = sweep(url, model, [rates[k]], payloads, duration_s=duration_s, min_queries=200, seed=seed + 200 + k)
            part["level"] = k
            parts.append(part)
        requests = pd.concat(parts, ignore_index=True).sort_values(["level", "scheduled_s"], ignore_index=True)
    ticks1 = cpu_ticks()
    steal = (ticks1[0] - ticks0[0]) / max(ticks1[1] - ticks0[1], 1) * 100 if ticks0 and ticks1 else None
    fit_levels = [i for i, f in enumerate(loads) if f in FIT_LOADS]
    profile = build_profile(config, requests, fit_levels, rng=rng)
    profile["hardware"]["cpu_steal_pct_during_run"] = steal
    profile["capacity_rps"] = cap
    profile["fit_levels"] = [{"load": loads[i], "rate_rps": rates[i]} for i in fit_levels]
    profile["instances"] = config["parameters"]["servesim"]["instances"]
    summary = level_summary(requests)
    summary["load"] = loads
    summary["held_out"] = [f in VALIDATE_LOADS for f in loads]
    table = compare(profile, summary[summary["held_out"]])
    requests.to_csv(out / "measurements.csv", index=False)
    (out / "profile.json").write_text(json.dumps(profile, indent=2) + "\n")
    report = {"levels": summary.to_dict(orient="records"), "validation": table.to_dict(orient="records")}
    (out / "validation.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "validation.md").write_text(markdown(profile, summary, table))
    chart(table, out / "validation.png")
    return report


def markdown(profile: dict, summary: pd.DataFrame, table: pd.DataFrame) -> str:
    """The validation report as a Markdown table."""
    st = profile["service_time"]
    if st["kind"] == "table":
        model = "per batch size " + ", ".join(f"{b}: {ms:.1f}" for b, ms in st["batch_ms"].items()) + " ms"
    else:
        model = f"{st['base_ms']:.2f} + {st['per_item_ms']:.2f} × B ms"
    lines = [
        f"# Calibration of {profile['model']['kind']} "
        + (f"({profile['model']['resolution']} px, " if profile["model"]["kind"] == "resnet" else "(")
        + f"{profile['model']['precision']}) on {profile['hardware']['cpu']}",
        "",
        f"Measured {profile['created']}; capacity {profile['capacity_rps']:.1f} req/s; batch service "
        f"{model} (noise CV {st['noise_cv']:.2f}, R² {st['r2']:.3f}). CPU time stolen by the host "
        f"during the run: {profile['hardware'].get('cpu_steal_pct_during_run') or 0:.1f}%.",
        "Fitted on loads "
        + ", ".join(f"{x['load']:.0%}" for x in profile["fit_levels"])
        + "; validated on the others.",
        "",
        "| load | offered req/s | percentile | measured ms | predicted ms | error |",
        "|---|---|---|---|---|---|",
    ]
    for _, r in table.iterrows():
        lines.append(
            f"| {r['load']:.0%} | {r['offered_rps']:.1f} | {r['percentile']} | {r['measured_ms']:.1f} | "
            f"{r['predicted_ms']:.1f} | {r['error_pct']:+.1f}% |"
        )
    return "\n".join(lines) + "\n"
