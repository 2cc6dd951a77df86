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

Connections are accepted eagerly (:func:`accept_eagerly`): every one the kernel has made,
each time the listener is readable, not libuv's one per turn of the loop.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import socket
import struct
import termios
from collections.abc import Callable

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


REFUSED_LINGER_S = 0.5  # a connection refused past the cap waits this long for its request, then its close
REFUSED_LINGERING = 32  # refused connections waiting at once, at most (their descriptors are the reserve's)


def guarded_http(max_connections: int, header_timeout_s: float, idle_close_s: float = 0.5) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a connection cap, a header deadline, and a
    shutdown that leaves a connection active within ``idle_close_s`` its next request."""
    if max_connections < 1 or not header_timeout_s > 0:
        raise ValueError("max_connections >= 1 and header_timeout_s > 0")
    busy = _raw("503 Service Unavailable", f"too many connections (limit {max_connections})", b"retry-after: 1\r\n")
    slow = _raw("408 Request Timeout", f"request headers not received within {header_timeout_s:g} s")
    once = ErrorLog(log)
    lingering = [0]  # connections refused past the cap and not yet closed

    class GuardedHttp(HttpToolsProtocol):
        max_open = max_connections + REFUSED_LINGERING  # connections held at once, the refused included
        _deadline = None  # the header timer, armed from connection or request start to headers complete
        _begun = False
        _refused = False  # past the cap: answered 503, what the client sends is dropped
        _answered = False
        _idle_since = 0.0  # the loop's time when it was made, or its last response ended

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._idle_since = self.loop.time()
            if len(self.connections) > max_connections:
                once.warning(f"refused a connection past --max-connections {max_connections}")
                if lingering[0] >= REFUSED_LINGERING:  # a flood: its descriptors are needed now
                    transport.write(busy)
                    transport.close()
                    return
                # answered 503 once its request begins to arrive (an answer before the request
                # is one no client expects: 105 of 4,861 requests disconnected), then our side
                # closed and the rest read and dropped until the client closes, at most
                # REFUSED_LINGER_S: closing with the request unread reset it, 503 and all (190
                # resets and 53 disconnects at 800 req/s with --max-connections 200)
                self._refused = True
                lingering[0] += 1
                self._deadline = self.loop.call_later(REFUSED_LINGER_S, transport.close)
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            if not self._refused:
                return super().data_received(data)
            if not self._answered and not self.transport.is_closing():
                self._answered = True
                self.transport.write(busy)
                if self.transport.can_write_eof():
                    self.transport.write_eof()
                else:
                    self.transport.close()

        def eof_received(self):
            if self._refused:
                return None  # the transport closes
            return super().eof_received()

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
            if self._refused:
                lingering[0] -= 1
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
            recent = self.loop.time() - self._idle_since < idle_close_s
            if idle and (recent or self._unread()) and not self.transport.is_closing():
                self.loop.call_later(idle_close_s, self.close_if_idle)  # still idle then: closed
                return
            super().shutdown()

        def close_if_idle(self, for_s: float = 0.0) -> None:
            """Draining: a connection between requests for ``for_s`` or more is closed now,
            while the listener still accepts, so its client reconnects instead of meeting a
            reset at shutdown. One that has just answered is left to its client's next
            request (answered with ``Connection: close``): closing it could cross a request
            already on its way, which the client would see reset. So is one whose request
            has arrived and is not read yet: a loop that takes in hundreds of connections at
            once may not read them for longer than ``for_s`` (a starved 800 req/s drain's
            sweeps met 42 such in one run)."""
            idle = (self.cycle is None or self.cycle.response_complete) and not self._begun
            old = self.loop.time() - self._idle_since >= for_s
            if idle and old and not self.transport.is_closing() and not self._unread():
                self.transport.close()

        def _unread(self) -> int:
            """Bytes the kernel has received on this connection that nobody has read yet."""
            sock = self.transport.get_extra_info("socket")
            try:
                return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
            except (AttributeError, OSError, ValueError):
                return 0

    return GuardedHttp


ACCEPT_PER_TURN = 512  # connections accepted per readiness of the listener, at most (then the loop's other work)
ACCEPT_RETRY_S = 0.1  # accepting failed (out of descriptors, say): tried again after this long
ACCEPT_PAUSE_S = 0.01  # the process holds all the connections it may: the listener is looked at again after this


def accept_eagerly(loop, sock: socket.socket, take, room: Callable[[], bool] = lambda: True) -> Callable[[], None]:
    """Accept every connection the kernel has made on the listener ``sock`` whenever it is
    readable (at most :data:`ACCEPT_PER_TURN` a turn) while ``room()``, handing each to
    ``take(conn)``; return the function that stops.

    libuv (under uvloop, uvicorn's loop) accepts one connection per turn of the loop, by
    design (libuv PR #3696: the second ``accept()`` nearly always fails). A loop that spends
    a turn preprocessing the requests it has read then accepts as slowly as it turns, and the
    connections wait in the kernel's queue, where the door's cheap 503 cannot reach them:
    ``--resolution 320 --width 4`` (images resized on the loop) at 800 req/s took ~31
    connections a second, and its 503s came after 1.3-9.5 s (p50, five runs), its 200s after
    3-12 s. Accepted here, each request meets the door within a turn.

    Without ``room()`` (the process holds all the connections it may) the listener is left
    for :data:`ACCEPT_PAUSE_S` and the connections wait in the kernel's queue, as they do
    while accepting fails (EMFILE: out of descriptors, logged once; a level-triggered reader
    would spin)."""
    failed = ErrorLog(log)
    fd = sock.fileno()
    sock.setblocking(False)
    on = True

    def pause(for_s: float) -> None:
        loop.remove_reader(fd)
        loop.call_later(for_s, resume)

    def on_readable() -> None:
        for _ in range(ACCEPT_PER_TURN):
            if not room():
                return pause(ACCEPT_PAUSE_S)
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                if err.errno in (errno.ECONNABORTED, errno.EPROTO):  # the client gave up while queued
                    continue
                if err.errno in (errno.EMFILE, errno.ENFILE):
                    failed.warning("out of file descriptors (ulimit -n): new connections wait in the kernel's queue")
                else:
                    failed.error("accepting a connection failed; the listener waits a moment", err)
                return pause(ACCEPT_RETRY_S)
            take(conn)

    def resume() -> None:
        if on:
            loop.add_reader(fd, on_readable)

    def stop() -> None:
        nonlocal on
        if on:
            on = False
            with contextlib.suppress(ValueError, OSError, RuntimeError):  # closed already, or the loop
                loop.remove_reader(fd)

    loop.add_reader(fd, on_readable)
    return stop


class Joiner:
    """``take(conn)`` for :func:`accept_eagerly`: the accepted socket served by
    ``protocol()`` on ``loop`` (a task each, as ``loop.connect_accepted_socket`` is a
    coroutine; one whose client has already gone is closed). ``len()``: those accepted and
    not yet served (their protocol not yet made)."""

    def __init__(self, loop, protocol):
        self.loop, self.protocol = loop, protocol
        self.joining: set = set()

    def __len__(self) -> int:
        return len(self.joining)

    def __call__(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        task = self.loop.create_task(self._join(conn))
        self.joining.add(task)
        task.add_done_callback(self.joining.discard)

    async def _join(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self.protocol, conn)
        except OSError:
            conn.close()
