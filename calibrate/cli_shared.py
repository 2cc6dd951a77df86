"""What the ``servesim calibrate`` commands share: the message for a missing extra, a
server's URL and a calibration folder checked, and SIGTERM as a Ctrl-C (so a run stopped by
its supervisor still reaps its servers)."""

from __future__ import annotations

from pathlib import Path

import typer

MET = ("within target", "inside prediction interval", "inside interval")  # the verdicts that meet the target


def need(what: str):
    """The error to raise when ``what`` cannot import what it needs: one line, exit 2."""

    def fail(err: ImportError):
        typer.echo(
            f"error: {what} needs the calibrate extra ({err.name} is missing): "
            "pip install torch==2.13.0 && pip install -e '.[calibrate]'",
            err=True,
        )
        return typer.Exit(code=2)

    return fail


def unreadable(folder: Path, err: Exception) -> typer.Exit:
    """The error to raise when a calibration folder cannot be read: one line naming the
    file it lacks (``[Errno 2] ...`` said it less plainly), or the reading's own message; exit 2."""
    if isinstance(err, FileNotFoundError) and err.filename:
        missing = Path(err.filename)
        if not Path(folder).is_dir():
            message = f"{folder}: no such folder"
        else:
            message = f"{folder}: no {missing.name} there (a `servesim calibrate run` folder holds it)"
    else:
        message = str(err)
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def server_url(url: str) -> str:
    """``--url`` without its trailing slash, or one line and exit 2 where it is not
    ``http(s)://HOST[:PORT]`` (urllib raised ValueError on 'localhost:8000')."""
    from urllib.parse import urlsplit

    base = url.rstrip("/")
    try:
        parts = urlsplit(base)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - a port out of range raises here
    except ValueError:
        ok = False
    if not ok:
        typer.echo(f"error: --url {url!r}: expected http://HOST:PORT (an http or https URL)", err=True)
        raise typer.Exit(code=2)
    return base


def terminated(signum, _frame) -> None:
    """A SIGTERM handler: stop as Ctrl-C does, through every ``finally``."""
    raise KeyboardInterrupt(f"signal {signum}")


__all__ = ["need", "server_url", "terminated", "unreadable"]
