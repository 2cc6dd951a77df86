"""Who holds the front end's core while the MGET ranker's fetches wait (calibrate/README,
"The fetch in the handler's own task, and the episodes at 70–85%"): the kernel's
scheduler events on core 0 (``sched_switch``, ``sched_wakeup``, from tracefs) while the
server runs one open-loop rate, with this load generator and the redis-server on core 0 as
`servesim calibrate run` keeps them. Per thread on core 0: its share of the core, and how
long it waited for the core after a wake-up and after a preemption (p50/p99/max, ms); and
the run's latency p99 and fetch p99/max. Needs root and tracefs (mounted at
/sys/kernel/tracing if it is not); tracing slows the kernel, so the run's tail is longer
than an untraced one's. Tracing is switched off and its buffer cleared afterwards.

    python calibrate/experiments/ranker_core_trace.py --rate 840 --secs 10   # ~40 s, as root
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from calibrate.loadgen import sweep
from calibrate.payloads import ranker_payloads
from calibrate.servers import get_json, redis_server, server

TRACE = Path("/sys/kernel/tracing")
SERVER = ["--model", "ranker", "--max-batch-size", "32", "--max-queue-delay-ms", "2", "--feature-batch-size", "26"]
SWITCH = re.compile(
    r"\s(\d+\.\d+): sched_switch: prev_comm=(.*?) prev_pid=(\d+) .*?prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)"
)
WAKEUP = re.compile(r"\s(\d+\.\d+): sched_wakeup: comm=(.*?) pid=(\d+) .*?target_cpu=(\d+)")


def _write(name: str, value: str) -> None:
    (TRACE / name).write_text(value)


def traced(rate: float, secs: float, out: Path):
    """One rate with core 0's scheduler events recorded to ``out``; the measured requests."""
    if not (TRACE / "trace").exists():
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACE)], check=True)
    before = os.sched_getaffinity(0)
    with redis_server({0}) as redis, server([*SERVER, "--redis-url", redis]) as url:
        cfg = get_json(url + "/v2/models/ranker/config")["parameters"]["servesim"]
        os.sched_setaffinity(0, set(cfg["frontend_cores"]))
        try:
            payloads = ranker_payloads(32, cfg["model"]["dense"], 10_000, np.random.default_rng(0))
            sweep(url, "ranker", [rate], payloads, duration_s=5.0, seed=99)  # warm
            mask = (TRACE / "tracing_cpumask").read_text().strip()
            _write("tracing_on", "0")
            _write("trace", "")
            _write("buffer_size_kb", "131072")
            _write("tracing_cpumask", "1")
            _write("set_event", "sched:sched_switch sched:sched_wakeup")
            try:
                _write("tracing_on", "1")
                df = sweep(url, "ranker", [rate], payloads, duration_s=secs, seed=1)
            finally:
                _write("tracing_on", "0")
                out.write_text((TRACE / "trace").read_text())
                _write("set_event", "")
                _write("trace", "")
                _write("buffer_size_kb", "1408")
                _write("tracing_cpumask", mask)
        finally:
            os.sched_setaffinity(0, before)
    return df[(df["status"] == 200) & ~df["warmup"]]


def core_share(path: Path) -> None:
    """Each thread's share of core 0 and its waits for it, from the recorded events."""
    names: dict[int, str] = {}
    held = collections.Counter()
    woke: dict[int, float] = {}
    ready: dict[int, float] = {}
    waits = collections.defaultdict(list)
    cur = t_in = first = last = None
    for line in path.read_text().splitlines():
        if m := SWITCH.search(line):
            t, prev, nxt = float(m.group(1)), int(m.group(3)), int(m.group(6))
            names[prev], names[nxt] = m.group(2), m.group(5)
            first = t if first is None else first
            last = t
            if cur is not None:
                held[cur] += t - t_in
            if m.group(4).startswith("R"):  # preempted while it could run
                ready[prev] = t
            if nxt in woke:
                waits["woken", nxt].append(t - woke.pop(nxt))
            elif nxt in ready:
                waits["preempted", nxt].append(t - ready.pop(nxt))
            cur, t_in = nxt, t
        elif (m := WAKEUP.search(line)) and int(m.group(4)) == 0:
            woke[int(m.group(3))] = float(m.group(1))
    span = last - first
    print(f"core 0 over {span:.1f} s")  # noqa: T201
    for pid, s in held.most_common(6):
        row = [f"{pid:7d} {names[pid]:16s} {s / span:6.1%} of the core"]
        for kind in ("woken", "preempted"):
            w = np.array(waits[kind, pid]) * 1e3
            if len(w):
                p50, p99 = np.percentile(w, [50, 99])
                row.append(f"{kind} {len(w):6d}: waited p50 {p50:.3f} p99 {p99:.3f} max {w.max():.2f} ms")
        print("  |  ".join(row))  # noqa: T201


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=840.0)
    ap.add_argument("--secs", type=float, default=10.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.txt"
        d = traced(a.rate, a.secs, path)
        f = d["feature_us"] / 1e3
        print(  # noqa: T201
            f"{a.rate:g} req/s traced: latency p50/p99 {d['latency_ms'].quantile(0.5):.2f}/"
            f"{d['latency_ms'].quantile(0.99):.2f} ms, fetch p99 {f.quantile(0.99):.2f} max {f.max():.2f} ms"
        )
        core_share(path)


if __name__ == "__main__":
    main()
