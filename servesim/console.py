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
