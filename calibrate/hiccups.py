"""Platform hiccups, measured the way jHiccup does: sleep 1 ms, record how much longer it took.

One small process per CPU core, pinned to it, wakes every period (1 ms, as jHiccup) and
keeps each overshoot above :data:`RECORD_US`. What it sees is what any thread on that core sees and
the application did not cause: the host stealing the CPU, interrupts, the kernel's
scheduler. A process (not a thread) so that the meter does not queue for anyone's GIL, and
so that the GIL does not show as a platform pause.

A meter is not free on a core that computes: measured on this VM, a 1 ms meter on a model
instance's core made a batch-1 ResNet forward take twice as long (5.15 → 10.5 ms) by
preempting it every millisecond. The calibration gives the instances' cores a coarse
period (:data:`COARSE_PERIOD_S`), fine enough for the stalls it acts on (over 10 ms).

:meth:`HiccupMeter.collect` returns the overshoots since the last call: the calibration
collects once per load slice and repeats a slice that held a stall.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
from dataclasses import dataclass

import numpy as np

PERIOD_S = 0.001
COARSE_PERIOD_S = 0.02  # on a model instance's core
RECORD_US = 500.0  # overshoots below this are the sleep's own jitter, and are only counted


def _meter(conn, core: int | None, period_s: float) -> None:
    if core is not None:
        os.sched_setaffinity(0, {core})
    conn.send("ready")
    times: list[int] = []
    over: list[float] = []
    samples = 0
    worst = 0.0
    while True:
        if conn.poll():
            try:
                msg = conn.recv()
            except EOFError:
                return
            if msg is None:
                return
            conn.send((np.asarray(times, dtype=np.int64), np.asarray(over), samples, worst))
            times, over, samples, worst = [], [], 0, 0.0
        t0 = time.perf_counter_ns()
        time.sleep(period_s)
        t1 = time.perf_counter_ns()
        extra_us = (t1 - t0) / 1e3 - period_s * 1e6
        samples += 1
        worst = max(worst, extra_us)
        if extra_us > RECORD_US:
            times.append(t0)
            over.append(extra_us)


@dataclass(frozen=True)
class Hiccups:
    """Overshoots of the 1 ms sleep on each core over one interval."""

    core: np.ndarray  # the core of each recorded overshoot
    t_ns: np.ndarray  # when it began (perf_counter_ns)
    overshoot_ms: np.ndarray
    samples: int  # wake-ups in all, per core summed
    max_ms: float  # the longest overshoot, recorded or not

    def above(self, ms: float) -> int:
        return int((self.overshoot_ms > ms).sum())


class HiccupMeter:
    """A meter process on each of ``cores`` (all the machine's, by default), waking every
    :data:`PERIOD_S`, or every :data:`COARSE_PERIOD_S` on the ``coarse`` ones."""

    def __init__(self, cores: list[int] | None = None, *, coarse: set[int] | frozenset = frozenset()):
        self.cores = sorted(os.sched_getaffinity(0)) if cores is None else list(cores)
        ctx = mp.get_context("spawn")
        self._procs, self._conns = [], []
        for core in self.cores:
            parent, child = ctx.Pipe()
            period = COARSE_PERIOD_S if core in coarse else PERIOD_S
            p = ctx.Process(target=_meter, args=(child, core, period), daemon=True, name=f"hiccups-{core}")
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
        for core, c in zip(self.cores, self._conns, strict=True):
            t, o, n, w = c.recv()
            cores.append(np.full(len(t), core))
            times.append(t)
            over.append(o)
            samples += n
            worst = max(worst, w)
        return Hiccups(np.concatenate(cores), np.concatenate(times), np.concatenate(over) / 1e3, samples, worst / 1e3)

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
