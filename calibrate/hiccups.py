"""Platform hiccups, measured the way jHiccup does: sleep 1 ms, record how much longer it took;
and the platform's speed: how long a fixed chunk of work takes.

One small process per CPU core, pinned to it, wakes every period (1 ms, as jHiccup) and
keeps each overshoot above :data:`RECORD_US`. What it sees is what any thread on that core sees and
the application did not cause: the host stealing the CPU, interrupts, the kernel's
scheduler. A process (not a thread) so that the meter does not queue for anyone's GIL, and
so that the GIL does not show as a platform pause.

A meter is not free on a core that computes: measured on this VM, a 1 ms meter on a model
instance's core made a batch-1 ResNet forward take twice as long (5.15 → 10.5 ms) by
preempting it every millisecond. The calibration gives the instances' cores a coarse
period (:data:`COARSE_PERIOD_S`), fine enough for the stalls it acts on (over 10 ms).

A sleep meter sees pauses, not slowdowns. On a lent H100 machine the CPUs' speed drifted by
±25% for seconds, idle or loaded (a fixed chunk of work took up to 1.47× its usual time on
the median core for 250 ms windows, for 1.5 s at a stretch), and a small model's forward
followed its core's speed (Spearman 0.84), while no sleep overshot 16 ms. So every
:data:`SPEED_EVERY` wake-ups (every one on a coarse core) the meter also times a chunk of
pure-Python work of :data:`CHUNK_US` (sized once, the same on every core), so that the chunk
costs its core about 0.4%. Its CPU time is the speed (a chunk preempted by the server on a
shared core is not slower, only later); its wall time is kept beside it.

:meth:`HiccupMeter.collect` returns the overshoots and the chunk times since the last call:
the calibration collects once per load slice and repeats a slice that held a stall.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

PERIOD_S = 0.001
COARSE_PERIOD_S = 0.02  # on a model instance's core
RECORD_US = 500.0  # overshoots below this are the sleep's own jitter, and are only counted
CHUNK_US = 40.0  # the speed meter's chunk of work, on this machine when it starts
SPEED_EVERY = 10  # wake-ups between chunks on a fine (1 ms) core


def _chunk(n: int) -> int:
    x = 0
    for i in range(n):
        x += i * i
    return x


def chunk_size(target_us: float = CHUNK_US) -> int:
    """Iterations of :func:`_chunk` that take about ``target_us`` here (the fastest of a few)."""
    n = 2000
    best = min(_timed(n) for _ in range(5))
    return max(50, int(n * target_us * 1e3 / max(best, 1)))


def _timed(n: int) -> int:
    t0 = time.perf_counter_ns()
    _chunk(n)
    return time.perf_counter_ns() - t0


def _meter(conn, core: int | None, period_s: float, chunk_n: int, every: int) -> None:
    if core is not None:
        os.sched_setaffinity(0, {core})
    conn.send("ready")
    times: list[int] = []
    over: list[float] = []
    speed_t: list[int] = []
    speed_ns: list[int] = []  # the chunk's CPU time: its speed, whoever else ran on the core
    wall_ns: list[int] = []
    samples = 0
    worst = 0.0
    while True:
        if conn.poll():
            try:
                msg = conn.recv()
                if msg is not None:
                    conn.send(
                        (
                            np.asarray(times, dtype=np.int64),
                            np.asarray(over),
                            samples,
                            worst,
                            np.asarray(speed_t, dtype=np.int64),
                            np.asarray(speed_ns, dtype=np.int64),
                            np.asarray(wall_ns, dtype=np.int64),
                        )
                    )
            except (EOFError, OSError):  # the parent is gone: closed, killed, or reset the pipe stopping
                return
            if msg is None:
                return
            times, over, speed_t, speed_ns, wall_ns, samples, worst = [], [], [], [], [], 0, 0.0
        t0 = time.perf_counter_ns()
        time.sleep(period_s)
        t1 = time.perf_counter_ns()
        extra_us = (t1 - t0) / 1e3 - period_s * 1e6
        samples += 1
        worst = max(worst, extra_us)
        if extra_us > RECORD_US:
            times.append(t0)
            over.append(extra_us)
        if samples % every == 0:
            c0 = time.process_time_ns()
            _chunk(chunk_n)
            speed_ns.append(time.process_time_ns() - c0)
            wall_ns.append(time.perf_counter_ns() - t1)
            speed_t.append(t1)


@dataclass(frozen=True)
class Hiccups:
    """Overshoots of the 1 ms sleep on each core over one interval."""

    core: np.ndarray  # the core of each recorded overshoot
    t_ns: np.ndarray  # when it began (perf_counter_ns)
    overshoot_ms: np.ndarray
    samples: int  # wake-ups in all, per core summed
    max_ms: float  # the longest overshoot, recorded or not
    speed_core: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    speed_t_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    chunk_us: np.ndarray = field(default_factory=lambda: np.zeros(0))  # each chunk's CPU time
    chunk_wall_us: np.ndarray = field(default_factory=lambda: np.zeros(0))  # and its wall time (+ preemption)

    def above(self, ms: float) -> int:
        return int((self.overshoot_ms > ms).sum())

    def speed_windows(self, start_ns: int, window_s: float) -> pd.DataFrame:
        """The median chunk time per core and window of ``window_s`` from ``start_ns``:
        columns core, window (its start, s), chunk_us (CPU), chunk_wall_us, chunks."""
        if not len(self.chunk_us):
            return pd.DataFrame(columns=["core", "window", "chunk_us", "chunk_wall_us", "chunks"])
        df = pd.DataFrame(
            {
                "core": self.speed_core,
                "window": np.floor((self.speed_t_ns - start_ns) / 1e9 / window_s) * window_s,
                "chunk_us": self.chunk_us,
                "chunk_wall_us": self.chunk_wall_us,
            }
        )
        return (
            df.groupby(["core", "window"], as_index=False)
            .agg(
                chunk_us=("chunk_us", "median"), chunk_wall_us=("chunk_wall_us", "median"), chunks=("chunk_us", "size")
            )
            .astype({"core": int})
        )


class HiccupMeter:
    """A meter process on each of ``cores`` (all the machine's, by default), waking every
    :data:`PERIOD_S`, or every :data:`COARSE_PERIOD_S` on the ``coarse`` ones."""

    def __init__(self, cores: list[int] | None = None, *, coarse: set[int] | frozenset = frozenset()):
        self.cores = sorted(os.sched_getaffinity(0)) if cores is None else list(cores)
        ctx = mp.get_context("spawn")
        self.chunk_n = chunk_size()
        self._procs, self._conns = [], []
        for core in self.cores:
            parent, child = ctx.Pipe()
            period, every = (COARSE_PERIOD_S, 1) if core in coarse else (PERIOD_S, SPEED_EVERY)
            p = ctx.Process(
                target=_meter, args=(child, core, period, self.chunk_n, every), daemon=True, name=f"hiccups-{core}"
            )
            p.start()
            child.close()
            self._procs.append(p)
            self._conns.append(parent)
        for c in self._conns:  # started and metering: the start-up itself is no longer on the cores
            if not c.poll(60) or c.recv() != "ready":
                self.close()
                raise RuntimeError("a hiccup meter did not start")

    def collect(self) -> Hiccups:
        """The overshoots since the last collect (or the start)."""
        for c in self._conns:
            c.send("collect")
        cores, times, over, samples, worst = [], [], [], 0, 0.0
        s_cores, s_times, s_ns, s_wall = [], [], [], []
        for core, c in zip(self.cores, self._conns, strict=True):
            t, o, n, w, st, sn, sw = c.recv()
            cores.append(np.full(len(t), core))
            times.append(t)
            over.append(o)
            samples += n
            worst = max(worst, w)
            s_cores.append(np.full(len(st), core))
            s_times.append(st)
            s_ns.append(sn)
            s_wall.append(sw)
        return Hiccups(
            np.concatenate(cores),
            np.concatenate(times),
            np.concatenate(over) / 1e3,
            samples,
            worst / 1e3,
            np.concatenate(s_cores),
            np.concatenate(s_times),
            np.concatenate(s_ns) / 1e3,
            np.concatenate(s_wall) / 1e3,
        )

    def close(self) -> None:
        for c in self._conns:
            with contextlib.suppress(OSError, BrokenPipeError):
                c.send(None)
        for p in self._procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        for c in self._conns:
            c.close()

    def __enter__(self) -> HiccupMeter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


SLOW = 1.25  # a window whose median core takes this much longer than usual is a slowdown


def platform_speed(
    speed: pd.DataFrame, slice_p99: pd.Series | None = None, *, coarse: set[int] | frozenset = frozenset()
) -> tuple[pd.DataFrame, dict]:
    """The speed meter's windows as a platform slowdown: each window's chunk time over its
    core's median for the run, the median of that over the cores per window (1.25: the
    platform 25% slower), and per slice run its slowest and mean window.

    Returns (per slice run: slice, attempt, slowdown_max, slowdown_mean) and a summary for
    the profile: window quantiles, the share of windows over :data:`SLOW`, the time series of
    windows in run order, and, with ``slice_p99`` (each kept slice's p99 over its level's
    median slice p99, indexed by slice), the Spearman correlation between that and the
    slice's slowest window.

    The ``coarse`` cores (the instances') are left out where other cores were metered: their
    few chunks a window (one per 20 ms) run just after a forward pass has filled the core's
    caches, and on the 2-core VM took 1.46× their median in 10% of the windows at every load
    alike, while the other core's chunks read 1.07×."""
    if not speed.empty and set(speed["core"]) - set(coarse):
        speed = speed[~speed["core"].isin(list(coarse))]
    if speed.empty:
        return pd.DataFrame(columns=["slice", "attempt", "slowdown_max", "slowdown_mean"]), {}
    df = speed.copy()
    df["ratio"] = df["chunk_us"] / df.groupby("core")["chunk_us"].transform("median")
    win = df.groupby(["slice", "attempt", "window"], as_index=False)["ratio"].median()
    per_slice = win.groupby(["slice", "attempt"], as_index=False).agg(
        slowdown_max=("ratio", "max"), slowdown_mean=("ratio", "mean")
    )
    r = win["ratio"].to_numpy()
    summary = {
        "window_s": float(np.diff(np.unique(win["window"]))[:1].item()) if win["window"].nunique() > 1 else None,
        "windows": len(r),
        "quantiles": {str(q): float(np.quantile(r, q)) for q in (0.5, 0.9, 0.99)},
        "max": float(r.max()),
        "share_slow": float((r >= SLOW).mean()),
        "slow_threshold": SLOW,
        "series": [round(float(x), 3) for x in r],
    }
    if slice_p99 is not None and len(slice_p99) > 2:
        kept = per_slice.drop_duplicates("slice", keep="last").set_index("slice")["slowdown_max"]
        both = pd.concat([kept, slice_p99.rename("p99")], axis=1, join="inner").dropna()
        if len(both) > 2:
            summary["spearman_p99_vs_slowest"] = float(both.corr(method="spearman").iloc[0, 1])
            summary["slices_correlated"] = len(both)
    return per_slice, summary
