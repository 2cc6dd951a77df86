"""Waking at a request's own time: a Linux timerfd that the running asyncio loop polls,
armed at the absolute time, wakes to tens of microseconds, where the loop's own timers are
whole milliseconds (woken by them, the requests of the last millisecond left together, a
median 0.6 ms late: calibrate/README, "A load generator that keeps its schedule"). The
open-loop sender (:mod:`calibrate.sender`) waits on it between its sends.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time

MIN_SLEEP_S = 0.001  # the shortest sleep on the loop's timers (whole milliseconds)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_CLOCK_MONOTONIC, _TFD_TIMER_ABSTIME = 1, 1


class Wake:
    """Waits until a time on :func:`time.perf_counter`'s clock: to tens of microseconds on a
    Linux timerfd (``CLOCK_MONOTONIC``, armed at the absolute time) that the running loop
    polls; elsewhere (or with ``precise=False``) by the loop's sleep, at least ``MIN_SLEEP_S``
    (its timers are whole milliseconds: a shorter sleep wakes at once and spins)."""

    def __init__(self, precise: bool = True):
        self.loop = asyncio.get_running_loop()
        self.fd: int | None = None
        self._due: asyncio.Future | None = None
        if not (precise and sys.platform.startswith("linux")):
            return
        if time.get_clock_info("perf_counter").implementation != "clock_gettime(CLOCK_MONOTONIC)":
            return
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.timerfd_create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):
            return
        if fd < 0:
            return
        self._settime = libc.timerfd_settime
        self.fd = fd
        self.loop.add_reader(fd, self._fired)

    @property
    def precise(self) -> bool:
        return self.fd is not None

    def _fired(self) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:  # already read
            return
        if self._due is not None and not self._due.done():
            self._due.set_result(None)

    async def until(self, t: float) -> None:
        """Return at ``t`` (s, perf_counter) or just after; at once if it has passed."""
        if self.fd is None:
            await asyncio.sleep(max(t - time.perf_counter(), MIN_SLEEP_S))
            return
        ns = int(t * 1e9)
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(ns // 1_000_000_000, ns % 1_000_000_000))
        self._due = self.loop.create_future()
        if self._settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            self._due = None
            await asyncio.sleep(max(t - time.perf_counter(), MIN_SLEEP_S))
            return
        await self._due

    def close(self) -> None:
        if self.fd is not None:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = None
