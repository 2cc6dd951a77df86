"""Draining a server for a shutdown that resets no request: readiness 503 and
``Connection: close`` for a while, idle keep-alive connections closed, then new connection
attempts dropped while the kernel's queue of connections already made is served or, past
what the grace period can serve, answered 503 (:func:`quiesce`, :func:`draining_server`)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import math
import os
import socket
import struct
import threading
import time

from reference_server.connections import Joiner, accept_eagerly

# draining, a keep-alive connection idle this long is closed (swept every SWEEP_S). An active
# client retires its idle connections itself: each is used once more and answered
# ``Connection: close`` (aiohttp takes the most recent free connection, so it goes through
# them at its request rate); closing one under it resets the request it sends on it. At
# 0.5 s, with the load generator short of CPU (three busy processes beside an 800 req/s
# drain), a sweep closed 115 connections that it used 60 ms later (13, 19 and 115 resets in
# three failing runs); at 2 s none were idle that long, and none reset in 10 runs.
IDLE_CLOSE_S = 2.0
SWEEP_S = 0.25


def refuse_new_connections(sock) -> bool:
    """Make a listening socket drop every new connection attempt (a socket filter that
    keeps no packet: SYNs go unanswered, the client retries, then meets the closed port)
    while the connections it has already made can still be accepted and answered. False
    where the platform has no socket filters (then nothing changes)."""

    class Instruction(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Instruction))]

    keep_nothing = (Instruction * 1)(Instruction(0x06, 0, 0, 0))  # BPF_RET | BPF_K, 0 bytes
    program = Program(1, keep_nothing)
    try:
        with socket.socket(fileno=os.dup(sock.fileno())) as dup:  # the same socket, a second descriptor
            dup.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_ATTACH_FILTER", 26), bytes(program))
    except OSError:
        return False
    return True


def accept_queue(sock) -> int:
    """Connections the kernel has made on a listening socket and nobody has accepted yet
    (``tcpi_unacked`` of a listener's TCP_INFO, as ``ss -lt`` shows it); 0 where unknown."""

    try:
        with socket.socket(fileno=os.dup(sock.fileno())) as dup:
            info = dup.getsockopt(socket.IPPROTO_TCP, getattr(socket, "TCP_INFO", 11), 104)
    except OSError:
        return 0
    return struct.unpack_from("I", info, 24)[0] if len(info) >= 28 else 0


RATE_AFTER_S, RATE_AFTER_N = 0.1, 16  # a rate is known after this long, or this many accepted over 20 ms
TURN_S = 0.25  # at least this long for a turn of the loop: one short of CPU is off it for as long


def _seconds(n: int, per_s: float) -> float:
    return n / per_s if per_s > 0 else math.inf


def quiesce(listeners, within_s: float, shed=None) -> int:
    """Wait until no listener in ``listeners()`` has a connection the kernel made and nobody
    accepted, at most ``within_s`` (a thread's wait: the loop goes on accepting); return how
    many are left, logged (closing the listener resets them).

    ``shed(on)``, where given, switches the server between serving what it accepts and
    answering it with a cheap 503, so that the grace period serves what it can and answers
    the rest, none reset. An event loop short of CPU accepted as slowly as it served (uvloop
    accepts one connection per turn of the loop; the front end now takes all it may, but
    past its connection cap they wait in the kernel's queue too): a starved front end
    serving ~150 requests a second left 48-854 of a queue of ~1,800 unaccepted after a 10 s
    grace period in 7 of 10 runs. Serving first and shedding last serves the most; the
    rule, judged every 10 ms from the rates at which the queue has emptied in each mode (each measured over
    :data:`RATE_AFTER_S`, or :data:`RATE_AFTER_N` connections): shed once the queue, at the
    shedding rate, would take more than half the time left (plus a turn of the serving loop,
    which a 503 waits for, at least :data:`TURN_S`: with 10 s of grace a starved loop once
    left 1 of 1,688 without it); serve again once it would take less than a quarter. Until
    the shedding rate is measured it is taken to be the serving rate, so a queue that
    serving cannot empty in half the time left is shed for a moment, long enough to measure
    how fast."""

    deadline = time.monotonic() + within_s
    time.sleep(0.02)
    shedding, said = False, False
    took = {False: [0.0, 0], True: [0.0, 0]}  # per mode: seconds spent in it, connections accepted in it
    mark = None  # (time, queue) at the last poll
    while (left := sum(accept_queue(s) for s in listeners())) and (now := time.monotonic()) < deadline:
        if shed is not None and mark is not None:
            took[shedding][0] += now - mark[0]
            took[shedding][1] += mark[1] - left
            serving, shedding_rate = (
                n / t if t >= RATE_AFTER_S or (n >= RATE_AFTER_N and t >= 0.02) else None for t, n in took.values()
            )
            if serving is not None:
                # the queue at the shedding rate, and a turn of the serving loop before a 503 takes effect
                turn = max(_seconds(1, serving), TURN_S)
                need = _seconds(left, serving if shedding_rate is None else shedding_rate) + turn
                rest = deadline - now
                if not shedding and need > rest / 2:
                    shedding = True
                    if not said:
                        said = True
                        logging.getLogger("servesim.serve").warning(
                            f"{left} connections queued, accepted at {max(serving, 0):.0f}/s: more than the "
                            f"{rest:.1f} s left of --grace-s can serve; the excess is answered 503"
                        )
                    shed(True)
                elif shedding and shedding_rate is not None and need < rest / 4:
                    shedding = False
                    shed(False)
        mark = (now, left)
        time.sleep(0.01)
    if left:
        logging.getLogger("servesim.serve").warning(
            f"{left} connections still unaccepted {within_s:g} s (--grace-s) after the drain: closing resets them"
        )
    return left


def draining_server(base, config, drain, drain_s: float, signals: tuple | None = None, shed=None, listener=None):
    """A uvicorn server whose first SIGTERM (or Ctrl-C) turns readiness false and keeps
    serving for ``drain_s`` before uvicorn's own graceful shutdown (stop accepting, finish
    what is in flight within the grace period); a second signal skips the wait. Draining,
    responses say ``Connection: close`` and keep-alive connections idle for
    :data:`IDLE_CLOSE_S` are closed, so clients reconnect while the listener is still open
    instead of sending on a connection that the shutdown resets.

    At the drain's end the listener first drops new connection attempts, and keeps
    accepting until the kernel's queue of connections already made is empty (at most the
    grace period, ``config.timeout_graceful_shutdown``), so that their requests are read
    and answered; only then does it close. Closing it at once reset every connection still
    in the accept queue, with its request sent: under 1.9x load, 595 of a second's
    requests. A fixed 5 s bound was too short for a front end starved of CPU (three busy
    processes beside it on 2 cores: it answered about 150 requests a second, and up to
    1,119 connections still queued after 5 s were reset); past the grace period the
    count left is logged. ``shed(on)`` (called from a thread) makes the server answer every
    request with a 503, or serve again, so that the grace period serves what it can of a
    queue and answers the rest (:func:`quiesce`). ``listener``, a bound socket, is served
    instead of one uvicorn opens, its connections accepted eagerly
    (:func:`reference_server.connections.accept_eagerly`)."""

    class Draining(base):
        draining = False
        _stop_accepting = None

        async def startup(self, sockets=None) -> None:
            if listener is None:
                return await super().startup(sockets)
            await super().startup(sockets=[])  # no listener of uvicorn's: the one given, accepted here
            loop = asyncio.get_running_loop()
            join, most = Joiner(loop, self.protocol), getattr(config.http_protocol_class, "max_open", math.inf)
            self._stop_accepting = accept_eagerly(
                loop, listener, join, lambda: len(self.server_state.connections) + len(join) < most
            )

        async def shutdown(self, sockets=None) -> None:
            if self._stop_accepting is not None:
                self._stop_accepting()
                listener.close()  # new connection attempts are refused from here
            await super().shutdown(sockets)

        def protocol(self):
            """A connection's protocol, as uvicorn's own listener makes it."""
            return config.http_protocol_class(
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )

        def _close_idle(self) -> None:
            for conn in list(self.server_state.connections):
                if hasattr(conn, "close_if_idle"):
                    conn.close_if_idle(IDLE_CLOSE_S)
            if not self.should_exit:
                asyncio.get_running_loop().call_later(SWEEP_S, self._close_idle)

        def _refuse_new(self, done: threading.Event) -> None:
            for sock in self._listeners():
                refuse_new_connections(sock)
            done.set()

        def _listeners(self) -> list:
            if listener is not None:
                return [] if listener.fileno() < 0 else [listener]
            return [sock for server in getattr(self, "servers", []) for sock in server.sockets]

        def _quiesce_then_exit(self, loop, sig, frame) -> None:
            if loop is not None:
                with contextlib.suppress(RuntimeError):  # the loop is gone: nothing to quiesce
                    refused, grace = threading.Event(), config.timeout_graceful_shutdown
                    loop.call_soon_threadsafe(self._refuse_new, refused)
                    # the queue's rate is measured once nothing joins it (a busy loop is slow to it)
                    t0 = time.monotonic()
                    refused.wait(grace)
                    quiesce(self._listeners, max(grace - (time.monotonic() - t0), 0.0), shed)
            super().handle_exit(sig, frame)

        def handle_exit(self, sig, frame):
            if signals is not None and sig not in signals:  # a front-end worker: the hub passes SIGTERM on
                return
            again, self.draining = self.draining, True
            if not again:
                drain()
            if again or drain_s <= 0:
                return super().handle_exit(sig, frame)
            loop = None
            with contextlib.suppress(RuntimeError):  # from the signal handler, on the loop's thread
                loop = asyncio.get_running_loop()
                loop.call_soon_threadsafe(self._close_idle)
            threading.Timer(drain_s, self._quiesce_then_exit, (loop, sig, frame)).start()

    return Draining(config)
