"""Connection limits uvicorn lacks: a cap on open connections that refuses the *new*
connection, a deadline for a request's headers, and idle connections closed when the server
starts draining.

uvicorn's own ``limit_concurrency`` answers 503 to *every* request while the count of open
connections is at the limit, so a client holding more connections than the limit gets nothing
served at all, however idle the server (measured: 2.6 req/s of goodput at 1,400 offered with
4,096 client connections, every other request a plain-text 503). Here the connection past the
cap gets one 503 and is closed, and the connections already open are served as before: their
requests are shed, if at all, by the batcher's queue bound.

Slow clients (a few bytes of header a second) are answered 408 and closed after
``header_timeout_s``; a new connection that sends nothing is closed after it too. Idle
keep-alive connections are uvicorn's (``timeout_keep_alive``).
"""

from __future__ import annotations

import json
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from reference_server.logs import ErrorLog

log = logging.getLogger("servesim.serve")


def _raw(status: str, msg: str, extra: bytes = b"") -> bytes:
    body = json.dumps({"error": msg}).encode()
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n".encode()
        + extra
        + b"connection: close\r\n\r\n"
        + body
    )


def guarded_http(max_connections: int, header_timeout_s: float, idle_close_s: float = 0.5) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a connection cap, a header deadline, and a
    shutdown that leaves a connection active within ``idle_close_s`` its next request."""
    if max_connections < 1 or not header_timeout_s > 0:
        raise ValueError("max_connections >= 1 and header_timeout_s > 0")
    busy = _raw("503 Service Unavailable", f"too many connections (limit {max_connections})", b"retry-after: 1\r\n")
    slow = _raw("408 Request Timeout", f"request headers not received within {header_timeout_s:g} s")
    once = ErrorLog(log)

    class GuardedHttp(HttpToolsProtocol):
        _deadline = None  # the header timer, armed from connection or request start to headers complete
        _begun = False
        _idle_since = 0.0  # the loop's time when it was made, or its last response ended

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._idle_since = self.loop.time()
            if len(self.connections) > max_connections:
                once.warning(f"refused a connection past --max-connections {max_connections}")
                transport.write(busy)
                transport.close()
                return
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._begun = True
            if self._deadline is None:  # a kept-alive connection's next request
                self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            self._begun = False
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._idle_since = self.loop.time()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._deadline = self.loop.call_later(header_timeout_s, self._too_slow)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            if self._begun:  # a request started and its headers never finished
                once.warning(f"closed a connection whose request headers took over {header_timeout_s:g} s")
                self.transport.write(slow)
            self.transport.close()

        def shutdown(self) -> None:
            """The server stops: a connection that has just been made or has just answered
            may have a request on its way, unread; closing it with unread data resets it.
            It closes after its next response (draining, every response says
            ``Connection: close``), or once idle for ``idle_close_s``."""
            idle = (self.cycle is None or self.cycle.response_complete) and not self._begun
            if idle and self.loop.time() - self._idle_since < idle_close_s and not self.transport.is_closing():
                self.loop.call_later(idle_close_s, self.close_if_idle)  # still idle then: closed
                return
            super().shutdown()

        def close_if_idle(self, for_s: float = 0.0) -> None:
            """Draining: a connection between requests for ``for_s`` or more is closed now,
            while the listener still accepts, so its client reconnects instead of meeting a
            reset at shutdown. One that has just answered is left to its client's next
            request (answered with ``Connection: close``): closing it could cross a request
            already on its way, which the client would see reset."""
            idle = (self.cycle is None or self.cycle.response_complete) and not self._begun
            if idle and self.loop.time() - self._idle_since >= for_s and not self.transport.is_closing():
                self.transport.close()

    return GuardedHttp
