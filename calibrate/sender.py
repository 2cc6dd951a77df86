"""A lean open-loop HTTP/1.1 sender: requests leave on their schedule, however the server fares.

An open-loop load generator measures the server only while it keeps its own schedule. A
general-purpose client (aiohttp) spends a few hundred microseconds of CPU per request
(a task, a timer, a request object, a parsed response); on a machine the client shares
with the server, at ``--nice 19``, a server busy at twice its capacity starved it, and it
sent 116–214 ms late (p99) at 1,300 req/s: it measured itself.

Here a request costs the client one ``transport.write`` of bytes built before the level
starts, and one ``data_received`` that finds the status line and the body's length; the
body is kept as bytes and read after the level (:func:`parse`). One sender coroutine
walks the schedule and sends everything due at each wake-up; no task or timer is made
per request. The sender wakes at each request's own time, to tens of microseconds, on a
Linux timerfd the loop polls (the loop's timers are whole milliseconds: woken by them, the
requests of the last millisecond left together, a median 0.6 ms late, and the server saw
bursts a millisecond apart, not the Poisson arrivals the model is given; calibrate/README,
"A load generator that keeps its schedule"); where there is none, it sleeps at least a
millisecond and sends everything due on waking. Connections
(HTTP/1.1 keep-alive, one request at a time each) are opened ahead of the level and as
needed, up to a limit; beyond it, requests wait in this client
for the next free connection and their latency counts the wait (it is measured from the
scheduled time: no coordinated omission).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
from collections import deque
from urllib.parse import urlsplit

import numpy as np

from calibrate.wake import Wake

TIMEOUT_S = 30.0


def request_bytes(url: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """An HTTP/1.1 POST of ``body`` to ``path`` on the server at ``url``, as sent."""
    host = urlsplit(url).netloc
    head = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in ("host", "content-length")]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class _Response:
    """A response being read: its status, whether the connection closes after it, and the
    header a binary inference response carries (the JSON part's length)."""

    __slots__ = ("chunked", "close", "json_length", "length", "status")

    def __init__(self, head: bytes):
        lines = head.split(b"\r\n")
        version, status = lines[0][:8], lines[0][9:12]
        self.status = int(status)
        self.length: int | None = None
        self.json_length: int | None = None
        self.chunked = False
        self.close = version == b"HTTP/1.0"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                self.length = int(value)
            elif name == b"transfer-encoding":
                self.chunked = b"chunked" in value.lower()
            elif name == b"connection":
                v = value.strip().lower()
                self.close = v == b"close" or (self.close and v != b"keep-alive")
            elif name == b"inference-header-content-length":
                self.json_length = int(value)


def _dechunk(buf: bytearray) -> tuple[bytes, int] | None:
    """A chunked body at the front of ``buf``: (body, bytes it took), or None if incomplete."""
    out, pos = bytearray(), 0
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
        start = eol + 2
        if size == 0:
            end = buf.find(b"\r\n\r\n", eol)  # the last chunk, then trailers and a blank line
            if end < 0:
                return None
            return bytes(out), end + 4
        if len(buf) < start + size + 2:
            return None
        out += buf[start : start + size]
        pos = start + size + 2


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its row filled when answered."""

    def __init__(self, sender: Sender):
        self.sender = sender
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.response: _Response | None = None
        self.row: dict | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def send(self, data: bytes, row: dict) -> None:
        self.row = row
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self.row is not None:
            if self.response is None:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                try:
                    self.response = _Response(bytes(self.buf[:end]))
                except ValueError:
                    self._fail("BadResponse")
                    return
                del self.buf[: end + 4]
            r = self.response
            if r.chunked:
                got = _dechunk(self.buf)
                if got is None:
                    return
                body, used = got
            elif r.length is not None:
                if len(self.buf) < r.length:
                    return
                body, used = bytes(self.buf[: r.length]), r.length
            else:  # read to the close
                return
            del self.buf[:used]
            self._answered(r, body)

    def _answered(self, r: _Response, body: bytes) -> None:
        row, self.row, self.response = self.row, None, None
        row["_done"] = time.perf_counter()
        row["status"] = r.status
        row["_body"] = body
        row["_json_length"] = r.json_length
        self.sender.finished()
        if r.close:
            self.transport.close()
        else:
            self.sender.free(self)

    def _fail(self, error: str) -> None:
        row, self.row, self.response = self.row, None, None
        if row is not None:
            row["_done"] = time.perf_counter()
            row["status"] = -1
            row["error"] = error
            self.sender.finished()
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc) -> None:
        r = self.response
        if self.row is not None and r is not None and r.length is None and not r.chunked:
            self._answered(r, bytes(self.buf))  # a body that ends with the connection
        elif self.row is not None:
            self._fail("ServerDisconnectedError" if exc is None else type(exc).__name__)
        self.sender.lost(self)


class Sender:
    """Up to ``limit`` connections to the server at ``url``: :meth:`submit` sends on a free
    one at once, or queues the request here until one is free."""

    def __init__(self, url: str, limit: int):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.limit = limit
        # used in turn (the longest idle first): requests spread over every open connection, so
        # a server that deals connections to several front ends (servesim serve --frontends)
        # sees them spread too; the most recent one first put a light load on one front end
        self.free_conns: deque[_Connection] = deque()
        self.conns: set[_Connection] = set()
        self.open = 0  # connections open or opening
        self.waiting: deque[tuple[bytes, dict]] = deque()
        self.outstanding = 0
        self.idle: asyncio.Event | None = None
        self.loop = asyncio.get_running_loop()

    async def start(self, n: int) -> None:
        """Open ``n`` connections (at most the limit) before the level."""
        n = min(n, self.limit)
        self.open += n
        got = await asyncio.gather(*(self._connect() for _ in range(n)), return_exceptions=True)
        for conn in got:
            if isinstance(conn, BaseException):
                self.open -= 1
            else:
                self.free_conns.append(conn)

    async def _connect(self) -> _Connection:
        _, conn = await self.loop.create_connection(lambda: _Connection(self), self.host, self.port)
        self.conns.add(conn)
        return conn

    def submit(self, data: bytes, row: dict) -> None:
        """Send a request now on a free connection, or queue it for the next one."""
        self.outstanding += 1
        if self.free_conns:
            self.free_conns.popleft().send(data, row)
            return
        self.waiting.append((data, row))
        if self.open < self.limit:
            self.open += 1
            self.loop.create_task(self._grow())

    async def _grow(self) -> None:
        try:
            conn = await self._connect()
        except OSError as err:
            self.open -= 1
            if self.waiting:  # the server refuses connections: a queued request fails
                _, row = self.waiting.popleft()
                row["_done"] = time.perf_counter()
                row["status"] = -1
                row["error"] = type(err).__name__
                self.finished()
            return
        self.free(conn)

    def free(self, conn: _Connection) -> None:
        if self.waiting:
            conn.send(*self.waiting.popleft())
        else:
            self.free_conns.append(conn)

    def lost(self, conn: _Connection) -> None:
        self.open -= 1
        self.conns.discard(conn)
        with contextlib.suppress(ValueError):
            self.free_conns.remove(conn)
        if self.waiting and self.open < self.limit:
            self.open += 1
            self.loop.create_task(self._grow())

    def finished(self) -> None:
        self.outstanding -= 1
        if self.outstanding == 0 and self.idle is not None:
            self.idle.set()

    async def drain(self, timeout_s: float = TIMEOUT_S) -> None:
        """Wait until every request submitted is answered, or ``timeout_s``."""
        if self.outstanding:
            self.idle = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.idle.wait(), timeout_s)

    def close(self) -> None:
        """Close every connection; a request still unanswered keeps no answer (a timeout)."""
        self.waiting.clear()
        for conn in list(self.conns):
            conn.row = None
            conn.transport.close()
        self.free_conns.clear()


async def send_on_schedule(
    url: str,
    requests: list[bytes],
    times: np.ndarray,
    pick: np.ndarray,
    *,
    connections: int,
    warm: int = 64,
    precise: bool = True,
    sender: Sender | None = None,
) -> list[dict]:
    """Send ``requests[pick[i]]`` at ``times[i]`` s from the start, open loop; one row per
    request: its schedule, how late it left (``send_lag_ms``), its status and latency from
    the scheduled time, and the response's body (read by :func:`parse`). ``precise=False``
    wakes on the loop's millisecond timers instead of a timerfd (:class:`Wake`). Each call
    opens ``warm`` fresh connections and closes them all at the end; given a ``sender``
    (:meth:`Sender.start`-ed by the caller), it sends on that one's and leaves them open."""
    own = sender is None
    if own:
        sender = Sender(url, connections)
        await sender.start(min(warm, connections, len(times)))
    wake = Wake(precise)
    rows: list[dict] = [{"scheduled_s": float(t)} for t in times]
    clock = time.perf_counter
    t0 = clock() + 0.05
    at = t0 + np.asarray(times, dtype=float)
    n, i = len(times), 0
    collecting = gc.isenabled()
    gc.disable()  # a collection over the level's rows would hold the schedule for milliseconds
    try:
        while i < n:
            now = clock()
            if at[i] > now:
                await wake.until(at[i])
                now = clock()
            while i < n and at[i] <= now:  # everything due by now, in order
                row = rows[i]
                row["_scheduled"] = at[i]
                row["send_lag_ms"] = (clock() - at[i]) * 1e3
                sender.submit(requests[pick[i]], row)
                i += 1
        await sender.drain()
    finally:
        wake.close()
        if own:
            sender.close()
        if collecting:
            gc.enable()
    return rows


def read_answer(row: dict, status: int, raw: bytes, json_length: int | None, timing_keys: tuple[str, ...]) -> None:
    """Fill ``row`` from an answer's body: the server's stage timings (``parameters`` of a
    200's JSON part, NaN where absent) or, for another status, its error text (JSON's
    ``error``, or the start of a proxy's plain text). A 200 whose JSON does not parse
    raises ValueError (the caller counts it as the client's error)."""
    try:
        doc = json.loads(raw[:json_length] if json_length else raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        if status == 200:
            raise
        doc = {"error": raw[:200].decode("utf-8", "replace")}
    if not isinstance(doc, dict):
        doc = {}
    params = doc.get("parameters", {}) if status == 200 else {}
    for k in timing_keys:
        row[k] = params.get(k, np.nan)
    if status != 200:
        row["error"] = str(doc.get("error", ""))[:200]


def parse(rows: list[dict], timing_keys: tuple[str, ...]) -> list[dict]:
    """The rows as the load generator records them: latency from the scheduled time, and
    the server's stage timings (``parameters`` of a 200's JSON) or its error text."""
    for row in rows:
        done = row.pop("_done", None)
        body = row.pop("_body", None)
        json_length = row.pop("_json_length", None)
        scheduled = row.pop("_scheduled", None)
        if done is None:  # never answered
            row["status"] = -1
            row["error"] = "TimeoutError"
            row["latency_ms"] = np.nan
            continue
        row["latency_ms"] = (done - scheduled) * 1e3
        if body is None:
            continue
        try:
            read_answer(row, row["status"], body, json_length, timing_keys)
        except ValueError as err:  # a 200 that is not the protocol's JSON
            row["status"] = -1
            row["error"] = type(err).__name__
    return rows


__all__ = ["Sender", "parse", "read_answer", "request_bytes", "send_on_schedule"]
