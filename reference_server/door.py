"""The server's door: a plain ASGI layer in front of FastAPI's routing that answers the
requests it can refuse cheaply (a missing bearer token, a full queue, a shutdown that cannot
serve them) before anything else is spent on them, and marks responses ``Connection: close``
while the server drains."""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Collection


class Door:
    """The server's door, a plain ASGI layer in front of FastAPI's routing: a request without
    the bearer token gets 401, and an inference request that finds the queue full gets 503
    before anything else is spent on it (no routing, no Request object, its body unread).
    Shedding has to cost a small fraction of serving, else at twice the capacity the loop
    spends itself on refusals and goodput collapses. So does an inference request while the
    shutdown sheds (``shedding()``: more connections wait in the kernel's queue than the grace
    period can serve, see :func:`reference_server.draining.quiesce`): a 503 with ``Retry-After``
    that the client can send elsewhere, not a reset when the listener closes on it.

    Parameters
    ----------
    app
        The ASGI app behind the door.
    api_key : str or None
        The bearer token every path but ``open_paths`` requires; None requires none.
    open_paths, infer_paths : collections of str
        Paths open without a token (health checks); inference paths, refused when full.
    full, draining, shedding : callables returning bool
        Whether the queue is full; whether the server is shutting down; whether the shutdown
        answers every inference request 503.
    refused : callable
        Called with the reason ("overloaded" or "shutdown") once per request shed at the door
        (to count it).
    overloaded : str
        The message of the 503.
    """

    def __init__(
        self,
        app,
        *,
        api_key: str | None,
        open_paths: Collection[str],
        infer_paths: Collection[str],
        full: Callable[[], bool],
        draining: Callable[[], bool],
        shedding: Callable[[], bool],
        refused: Callable[[str], None],
        overloaded: str,
    ):
        self.app, self.open_paths, self.infer_paths = app, open_paths, infer_paths
        self.token = api_key.encode() if api_key else None
        self.full, self.draining, self.shedding, self.refused = full, draining, shedding, refused
        self.busy = _plain(503, overloaded, [(b"retry-after", b"1")])
        self.closing = _plain(
            503, "shutting down: more requests wait than the grace period can serve", [(b"retry-after", b"1")]
        )
        self.denied = _plain(401, "missing or wrong bearer token", [(b"www-authenticate", b"Bearer")])

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        if self.token is not None and path not in self.open_paths:
            got = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            scheme, _, credentials = got.partition(b" ")
            # the scheme is case-insensitive (RFC 7235); the token is compared in constant time
            if scheme.lower() != b"bearer" or not hmac.compare_digest(credentials.strip(), self.token):
                return await _send(send, self.denied)
        if path in self.infer_paths and scope["method"] == "POST":
            if self.shedding():
                self.refused("shutdown")
                return await _send(_closing(send), self.closing)
            if self.full():
                self.refused("overloaded")
                return await _send(_closing(send) if self.draining() else send, self.busy)
        if self.draining():  # shutting down: the client's next request goes on a new connection
            return await self.app(scope, receive, _closing(send))
        return await self.app(scope, receive, send)


def _closing(send):
    async def closing(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
        await send(message)

    return closing


def _plain(status: int, msg: str, headers: list[tuple[bytes, bytes]]) -> tuple[dict, dict]:
    """A ready-made JSON error response, as ASGI messages."""
    body = json.dumps({"error": msg}).encode()
    start = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers],
    }
    return start, {"type": "http.response.body", "body": body}


async def _send(send, response: tuple[dict, dict]) -> None:
    await send(response[0])
    await send(response[1])
