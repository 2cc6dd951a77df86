"""Logging that an outage or a flood cannot turn into 100k lines."""

from __future__ import annotations

import logging
import time


class ErrorLog:
    """Logged once per kind (errors with their traceback), then counted: at most one line
    per kind every ``every_s`` (an outage of a dependency must not write 100k lines)."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0):
        self.log, self.every_s = logger, every_s
        self.seen: dict[str, list] = {}  # kind -> [count since last line, time of last line]

    def error(self, kind: str, err: BaseException) -> None:
        self._note(logging.ERROR, kind, err)

    def warning(self, kind: str) -> None:
        self._note(logging.WARNING, kind, None)

    def _note(self, level: int, kind: str, err: BaseException | None) -> None:
        now = time.monotonic()
        entry = self.seen.get(kind)
        if entry is None:
            self.seen[kind] = [0, now]
            self.log.log(level, "%s (repeats are counted every %.0f s)", kind, self.every_s, exc_info=err)
            return
        entry[0] += 1
        if now - entry[1] >= self.every_s:
            self.log.log(level, "%s: %d more in the last %.0f s", kind, entry[0], now - entry[1])
            entry[0], entry[1] = 0, now
