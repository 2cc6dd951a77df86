"""The command line's consoles and its one way to fail: a message, exit status 2."""

from __future__ import annotations

import typer
from rich.console import Console

out = Console()
err = Console(stderr=True)


def fail(message: str) -> typer.Exit:
    """Print ``message`` as an error (rich markup in it is shown as text); the exit to raise."""
    safe = message.replace("[", r"\[")
    err.print(f"[bold red]error:[/] {safe}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)
