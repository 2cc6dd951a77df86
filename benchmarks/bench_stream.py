"""Long runs in bounded memory: the 200k RPS platform in chunks (issue 14).

Each case runs the real console script, ``servesim run``, in its own process, so the wall
time and peak memory are those of the whole process as a user sees them (``os.wait4``'s
rusage of that child). The peer, in the same run: a run short enough to hold in one chunk
(``--chunk-s whole``), against the same run in chunks (``--chunk-s auto`` streams it only
above 5M requests, so the peer's chunks are asked for: ``--chunk-s 1``).

    python benchmarks/bench_stream.py [--cases peer,ten_minutes,hour_sampled] [--peer-duration-s 20]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLATFORM = ROOT / "scenarios/inference_platform.yaml"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run(*args: str) -> dict:
    """``servesim run`` with ``args``: wall (s), peak RSS (GB) and the summary."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "summary.json"
        cmd = [sys.executable, "-m", "servesim", "run", str(PLATFORM), *args, "--json", str(out)]
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        stderr = proc.stderr.read()
        proc.stderr.close()
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"servesim run {' '.join(args)} failed:\n{stderr}")
        summary = json.loads(out.read_text())
    return {"wall_s": wall, "peak_gb": usage.ru_maxrss / 1024**2, "summary": summary}


def line(name: str, r: dict) -> str:
    s = r["summary"]
    n = s["sim"]["requests"]
    return (
        f"  {name:34s} {n:13,d} requests  {r['wall_s']:7.1f} s wall  {n / r['wall_s']:10,.0f} req/s  "
        f"peak {r['peak_gb']:5.2f} GB  p99 {s['latency_ms']['e2e']['p99']:6.2f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="peer,ten_minutes,hour_sampled")
    ap.add_argument("--peer-duration-s", type=float, default=20.0)
    args = ap.parse_args()
    cases = set(args.cases.split(","))
    print(f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    if "peer" in cases:
        d = f"{args.peer_duration_s:g}"
        whole = run("--chunk-s", "whole", "--duration-s", d)
        streamed = run("--chunk-s", "1", "--duration-s", d)
        print(f"platform, {d} s, one chunk and 1-s chunks (the same requests):")
        print(line("one chunk", whole))
        print(line("in chunks", streamed))
        print(
            f"  streaming / whole: {whole['wall_s'] / streamed['wall_s']:.2f}x the speed, "
            f"{streamed['peak_gb'] / whole['peak_gb']:.2f}x the memory"
        )
    if "ten_minutes" in cases:
        r = run("--duration-s", "600")
        ok = r["wall_s"] <= 90 and r["peak_gb"] <= 2
        print("platform, 10 simulated minutes (target: <= 90 s wall, <= 2 GB):")
        print(line("servesim run --duration-s 600", r) + f"  -> {'OK' if ok else 'MISSED'}")
    if "hour_sampled" in cases:
        r = run("--duration-s", "3600", "--sample-workers", "13")
        print("platform, an hour, 13 of 130 workers sampled (target: <= 2 GB):")
        print(line("--duration-s 3600 --sample-workers 13", r) + f"  -> {'OK' if r['peak_gb'] <= 2 else 'MISSED'}")


if __name__ == "__main__":
    main()
