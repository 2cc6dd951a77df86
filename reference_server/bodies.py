"""A request body read as it streams in, for every front end: the image server's KServe v2
API (:mod:`reference_server.frontend`) and the LLM engine's OpenAI API
(:mod:`reference_server.llm.api`).

Over the limit (chunked bodies included) a body is refused at once, without buffering the
rest; all bodies being read together stay under a budget; a body that sends nothing for
``body_timeout_s``, or arrives slower than its deadline allows (``body_timeout_s`` plus a
second per ``body_min_rate_bps`` bytes received, as Apache's ``mod_reqtimeout`` MinRate),
is cut with a 408: neither a stalled nor a trickling upload holds a slot. Each front end
answers a refusal in its own error format and counts it under its ``reason``.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from starlette.requests import ClientDisconnect, Request

CLOSE = {"Connection": "close"}


@dataclass(frozen=True)
class BodyLimits:
    """What a front end accepts of request bodies."""

    max_body_bytes: int = 8 * 1024 * 1024  # one body's
    max_inflight_body_bytes: int = 64 * 1024 * 1024  # the bodies being read at once, all together
    body_timeout_s: float = 10.0  # a body that sends nothing for this long: 408
    body_min_rate_bps: float = 500.0  # after the first body_timeout_s, bytes a second (0: no rate)


class BodyRefused(Exception):
    """A body not read: the HTTP status, a message naming what was wrong, the headers to
    answer with, and the reason a front end counts it under (``too_large``, ``timeout``,
    ``client_disconnected``, ``overloaded``)."""

    def __init__(self, status: int, message: str, reason: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason
        self.headers = {**CLOSE, **(headers or {})}


class BodyReader:
    """Reads request bodies under :class:`BodyLimits`, keeping the bytes being read at once."""

    def __init__(self, limits: BodyLimits):
        self.limits = limits
        self.inflight = 0  # bytes of the bodies being read

    async def read(self, request: Request) -> bytes:
        """The whole body of ``request``, or :class:`BodyRefused`."""
        lim = self.limits
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > lim.max_body_bytes:
            raise BodyRefused(413, f"body of {declared} bytes exceeds the limit of {lim.max_body_bytes}", "too_large")
        chunks, size = [], 0
        stream = request.stream()
        loop = asyncio.get_running_loop()
        start = loop.time()
        rate = lim.body_min_rate_bps
        try:
            while True:
                deadline = start + lim.body_timeout_s + size / rate if rate > 0 else math.inf
                left = deadline - loop.time()
                try:
                    if left <= 0:
                        raise TimeoutError
                    async with asyncio.timeout(min(lim.body_timeout_s, left)):
                        chunk = await anext(stream)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    why = (
                        f"request body too slow: {size} bytes in {loop.time() - start:.1f} s (at least "
                        f"{rate:g} bytes/s after the first {lim.body_timeout_s:g} s)"
                        if left < lim.body_timeout_s
                        else f"request body stalled for {lim.body_timeout_s:g} s"
                    )
                    raise BodyRefused(408, why, "timeout") from None
                except ClientDisconnect:  # the client's doing: the front end counts it as such
                    raise BodyRefused(499, "client closed the request", "client_disconnected") from None
                size += len(chunk)
                self.inflight += len(chunk)
                if size > lim.max_body_bytes:
                    raise BodyRefused(413, f"body exceeds the limit of {lim.max_body_bytes} bytes", "too_large")
                if self.inflight > lim.max_inflight_body_bytes:
                    raise BodyRefused(
                        503, "overloaded: too many request bodies in flight", "overloaded", {"Retry-After": "1"}
                    )
                chunks.append(chunk)
        finally:
            self.inflight -= size
        return b"".join(chunks)


__all__ = ["BodyLimits", "BodyReader", "BodyRefused"]
