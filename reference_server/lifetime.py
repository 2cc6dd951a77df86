"""A child process that dies with its parent: Linux's ``PR_SET_PDEATHSIG``, asked for in the
child (an instance, the LLM engine, a relay, or a test's server), so that a parent killed
outright (SIGKILL, or a SIGTERM that runs no cleanup) leaves no orphan behind."""

from __future__ import annotations

import contextlib
import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent exits (a crashed front end)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
