"""The command line's consoles and its one way to fail: a message, exit status 2."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.console import Console


def _width(stream) -> int | None:
    """Rich's own width on a terminal; piped, a wide one (COLUMNS, else 200) instead of 80,
    so table rows are not split across lines in a log or a file."""
    if stream.isatty():
        return None
    try:
        return max(80, int(os.environ.get("COLUMNS", "200")))
    except ValueError:
        return 200


out = Console(width=_width(sys.stdout))
err = Console(stderr=True, width=_width(sys.stderr))


def keep_freed_memory() -> None:
    """Let this process reuse the memory a run frees instead of handing it back (glibc).

    A run allocates and frees arrays as long as itself, a few MB each. By default glibc
    serves each of them with a fresh ``mmap`` (or returns the heap's top), and the next
    array faults its pages in again: about 2 us per 4 KiB page on a VM, 15 of the 65 ms
    of an M/M/8 run of 240,000 requests (``benchmarks/README.md``). With blocks up to 32 MiB
    from the heap and the heap never trimmed, freed memory is reused; the process's
    peak is unchanged and ends with the command. A no-op off glibc. Only for the
    commands that simulate and exit, not for servers."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 << 20)  # glibc's largest; a larger value is refused
    mallopt(m_trim_threshold, (1 << 31) - 1)  # an int: 2 GiB, never in practice


def fail(message: str) -> typer.Exit:
    """Print ``message`` as an error (rich markup in it is shown as text); the exit to raise."""
    safe = message.replace("[", r"\[")
    err.print(f"[bold red]error:[/] {safe}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def check_output(path: Path | None, option: str, suffixes: tuple[str, ...] | None = None) -> None:
    """Refuse an output path that cannot be written, before any work is done."""
    if path is None:
        return
    if suffixes is not None and path.suffix not in suffixes:
        raise fail(f"{option} {path}: use a {' or '.join(suffixes)} file name")
    if path.is_dir():
        raise fail(f"{option} {path}: is a folder; give a file name")
    parent = path.parent  # Path("x.csv").parent is Path(".")
    if not parent.is_dir():
        raise fail(f"{option} {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise fail(f"{option} {path}: not writable")


def budget(
    s,
    *,
    runs: int = 1,
    what: str = "this run",
    quiet: bool = False,
    streamed: bool = False,
    records: bool = False,
    interval_s: float = 1.0,
):
    """Refuse (exit 2) a run of scenario ``s`` that cannot fit in memory, before it starts;
    say so when it will take over a minute. Returns the :class:`~simulator.planning.budget.Budget`."""
    from simulator.planning.budget import BudgetError, check

    try:
        b = check(s, runs=runs, what=what, streamed=streamed, records=records, interval_s=interval_s)
    except BudgetError as e:
        raise fail(str(e)) from None
    if b.wall_s > 60 and not quiet:
        err.print(f"note: {what}: {b.describe()}", highlight=False, soft_wrap=True)
    return b
