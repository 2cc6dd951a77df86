"""``servesim serve``: start the reference server standalone (heavy imports happen inside)."""

from __future__ import annotations

import math
import sys
from typing import Annotated, Literal

import typer

from reference_server.bodies import BodyLimits

# the request body's limits, the same options on every server (serve-llm's too)
BodyTimeout = Annotated[
    float,
    typer.Option(help="Seconds a request body may go without sending a byte; then 408 and close.", min=0.001),
]
BodyMinRate = Annotated[
    float,
    typer.Option(
        help="Bytes/s a request body must keep up after its first --body-timeout-s: its deadline is that "
        "plus a second per this many bytes received; then 408 and close (0: no deadline).",
        min=0,
    ),
]

Kind = Literal["resnet", "ranker"]
Precision = Literal["fp32", "fp16", "bf16", "int8"]


def serve(
    model: Annotated[str, typer.Option(help="Model: resnet (image classifier) or ranker (ranking MLP).")] = "resnet",
    resolution: Annotated[int, typer.Option(help="resnet: input side in pixels (images are resized to it).")] = 64,
    width: Annotated[int, typer.Option(help="resnet: channels of the first stage (64 is ResNet-18).")] = 32,
    depth: Annotated[int, typer.Option(help="resnet: 18 or 34 layers.")] = 18,
    precision: Annotated[str, typer.Option(help="fp32, fp16, bf16, or int8 (dynamic quantization, CPU).")] = "fp32",
    max_batch_size: Annotated[int, typer.Option(help="Dynamic batcher: most items in one batch.")] = 8,
    max_queue_delay_ms: Annotated[
        float, typer.Option(help="Dynamic batcher: window counted from the oldest queued request, ms.")
    ] = 2.0,
    max_queue_size: Annotated[
        int, typer.Option(help="Queued requests beyond which new ones get 503 (0: no cap).")
    ] = 256,
    instances: Annotated[
        int, typer.Option(help="Model instances (Triton's instance group), each running one batch at a time.")
    ] = 1,
    frontends: Annotated[
        int,
        typer.Option(
            help="Front-end processes (HTTP, decoding, preprocessing) sharing the port, as uvicorn's workers or "
            "Triton's HTTP threads; their requests meet in one batcher (a process of its own when above 1).",
        ),
    ] = 1,
    instance_cores: Annotated[
        str,
        typer.Option(
            help="Cores for the instances: auto (a core each, from the last, when one is left for the front end), "
            "none, or one per instance, e.g. 1."
        ),
    ] = "auto",
    instance_mode: Annotated[
        str,
        typer.Option(
            help="process: each instance in its own process (off the front end's GIL); thread: in this process "
            "(the old design, to measure what the GIL costs)."
        ),
    ] = "process",
    preprocess: Annotated[
        str,
        typer.Option(
            help="inline: decode on the event loop; thread: in a decode thread (which waits for the GIL behind "
            "the loop, up to Python's 5 ms switch interval at a time)."
        ),
    ] = "inline",
    threads: Annotated[int, typer.Option(help="torch intra-op threads per instance on the CPU.")] = 1,
    redis_url: Annotated[
        str | None,
        typer.Option(
            envvar="SERVESIM_REDIS_URL",
            help="Fetch the ranker's sparse ids from this Redis (e.g. redis://127.0.0.1:6379/0). A URL with a "
            "password belongs in SERVESIM_REDIS_URL: a command line is visible to every user of the host.",
        ),
    ] = None,
    feature_keys: Annotated[int, typer.Option(help="Feature store: ids per item (the ranker's sparse inputs).")] = 26,
    feature_batch_size: Annotated[int, typer.Option(help="Feature store: keys per round trip (1 = GET per key).")] = 1,
    feature_parallelism: Annotated[int, typer.Option(help="Feature store: round trips in flight per request.")] = 1,
    feature_entities: Annotated[
        int, typer.Option(help="Feature store: entities written at start-up (each with --feature-keys ids).")
    ] = 10_000,
    redis_connections: Annotated[
        int, typer.Option(help="Feature store: pooled Redis connections; round trips beyond these wait for one.")
    ] = 32,
    max_image_pixels: Annotated[
        int, typer.Option(help="Pixels an image may declare; more is a 400 before decoding (0: max(2048², (16·res)²)).")
    ] = 0,
    max_connections: Annotated[
        int,
        typer.Option(
            help="Open connections at once; a new one beyond gets a 503 and is closed (those open are served).",
            min=1,
        ),
    ] = 1000,
    header_timeout_s: Annotated[
        float,
        typer.Option(
            help="Seconds a request's headers (or a new connection's first request) may take; then 408 and close.",
            min=0.001,
        ),
    ] = 10.0,
    body_timeout_s: BodyTimeout = BodyLimits.body_timeout_s,
    body_min_rate: BodyMinRate = BodyLimits.body_min_rate_bps,
    drain_s: Annotated[
        float,
        typer.Option(
            help="On SIGTERM, seconds of readiness 503 while still serving, so load balancers stop sending "
            "before the listener closes (a second signal skips it).",
            min=0,
        ),
    ] = 1.0,
    grace_s: Annotated[
        float, typer.Option(help="Then, seconds to finish the requests in progress before closing.", min=0)
    ] = 10.0,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="SERVESIM_API_KEY",
            help="Require 'Authorization: Bearer KEY' on every route but the health checks.",
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    seed: Annotated[int, typer.Option(help="Seed of the random weights and feature data.")] = 0,
) -> None:
    """Serve a torch model over the Open Inference Protocol (KServe v2 / Triton HTTP) with a
    dynamic batcher, optional Redis features, per-request stage timings and /metrics."""
    try:
        import uvicorn  # noqa: F401 - here for the message below

        from reference_server.app import ServerConfig
        from reference_server.features import FeatureStoreConfig
        from reference_server.models import ModelConfig
    except ImportError as err:
        typer.echo(
            f"error: servesim serve needs the server extra ({err.name} is missing): "
            "pip install torch==2.13.0 && pip install -e '.[server]'",
            err=True,
        )
        raise typer.Exit(code=2) from None
    if frontends < 1:
        typer.echo(f"error: --frontends is at least 1; got {frontends}", err=True)
        raise typer.Exit(code=2)
    if model not in ("resnet", "ranker") or precision not in ("fp32", "fp16", "bf16", "int8"):
        typer.echo("error: --model is resnet or ranker; --precision is fp32, fp16, bf16 or int8", err=True)
        raise typer.Exit(code=2)
    if redis_url and redis_url in sys.argv and "@" in redis_url.split("//", 1)[-1]:
        typer.echo(
            "warning: --redis-url carries credentials on the command line, where every user of the host can "
            "read them (ps, /proc); pass it in SERVESIM_REDIS_URL instead",
            err=True,
        )
    cfg = ServerConfig(
        model=ModelConfig(
            kind=model,
            resolution=resolution,
            width=width,
            depth=depth,
            precision=precision,
            seed=seed,
            max_image_pixels=max_image_pixels,
            **({"sparse": feature_keys} if model == "ranker" else {}),
        ),
        max_batch_size=max_batch_size,
        max_queue_delay_ms=max_queue_delay_ms,
        max_queue_size=max_queue_size or None,
        instances=instances,
        frontends=frontends,
        threads=threads,
        features=None
        if not redis_url
        else FeatureStoreConfig(
            url=redis_url,
            keys=feature_keys,
            batch_size=feature_batch_size,
            parallelism=feature_parallelism,
            entities=feature_entities,
            max_connections=redis_connections,
        ),
        instance_mode=instance_mode,  # type: ignore[arg-type] - checked by create_app
        instance_cores=instance_cores,
        preprocess=preprocess,  # type: ignore[arg-type] - checked by create_app
        api_key=api_key or None,
        body_timeout_s=body_timeout_s,
        body_min_rate_bps=body_min_rate,
    )
    _serve(
        cfg,
        host=host,
        port=port,
        max_connections=max_connections,
        header_timeout_s=header_timeout_s,
        grace_s=grace_s,
        drain_s=drain_s,
    )


def _serve(
    cfg, *, host: str, port: int, max_connections: int, header_timeout_s: float, grace_s: float, drain_s: float
) -> None:
    """Build the app for ``cfg`` (a configuration it refuses: exit 2) and serve it until a
    signal; warn where the open-file limit or an exposed address needs it."""
    import socket

    import uvicorn

    from reference_server.app import create_app, describe
    from reference_server.connections import guarded_http

    fitted = fit_open_files(max_connections)
    if fitted < max_connections:
        typer.echo(
            f"warning: --max-connections {max_connections} lowered to {fitted}: this process may open "
            f"{fitted + FD_RESERVE} files (ulimit -n); past that, accepting fails and floods the log",
            err=True,
        )
        max_connections = fitted
    if not _loopback(host) and not cfg.api_key:
        typer.echo(
            f"warning: --host {host} serves every network this machine is on, with no authentication; "
            "set --api-key (or SERVESIM_API_KEY) to require a bearer token",
            err=True,
        )
    if cfg.frontends > 1:
        _serve_frontends(
            cfg,
            host=host,
            port=port,
            kw={
                "max_connections": max_connections,
                "header_timeout_s": header_timeout_s,
                "grace_s": grace_s,
                "drain_s": drain_s,
            },
        )
        return
    try:
        app = create_app(cfg)
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=2) from None
    config = uvicorn.Config(
        app,
        log_level="warning",
        timeout_graceful_shutdown=grace_s,
        http=guarded_http(max_connections, header_timeout_s),  # not limit_concurrency: see connections.py
        timeout_keep_alive=5,
    )
    try:  # bound before the instances start: a port taken fails at once
        listener = socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET, backlog=config.backlog
        )
    except OSError as err:
        typer.echo(f"error: cannot listen on {host}:{port}: {err.strerror or err}", err=True)
        raise typer.Exit(code=1) from None
    typer.echo(f"servesim serve: http://{host}:{port} {describe(cfg)}")
    with listener:
        draining_server(uvicorn.Server, config, app.state.drain, drain_s, shed=app.state.shed, listener=listener).run()


def _serve_frontends(cfg, *, host: str, port: int, kw: dict) -> None:
    """Several front-end processes and the hub between them and the instances
    (:mod:`reference_server.hub`)."""
    from reference_server.app import describe
    from reference_server.hub import Hub, StartFailed, serve_frontends
    from reference_server.instances import InstanceDied

    try:
        hub = Hub(cfg)
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=2) from None
    try:
        code = serve_frontends(
            hub,
            host=host,
            port=port,
            serve_kwargs=kw,
            announce=lambda: typer.echo(f"servesim serve: http://{host}:{port} {describe(cfg)}"),
        )
    except (StartFailed, InstanceDied) as err:  # the worker's or instance's own error is on the console
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=1) from None
    except OSError as err:  # the port is taken, say
        typer.echo(f"error: cannot listen on {host}:{port}: {err.strerror or err}", err=True)
        raise typer.Exit(code=1) from None
    if code:
        raise typer.Exit(code=code)


FD_RESERVE = 128  # descriptors besides its connections: libraries, pipes, Redis, 32 refused past the cap (~30 used)


def fit_open_files(max_connections: int) -> int:
    """Raise the soft limit on open files towards the hard one so that ``max_connections``
    fit beside the server's own descriptors; return how many connections do fit."""
    import contextlib
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < want:
        raised = want if hard == resource.RLIM_INFINITY else min(want, hard)
        with contextlib.suppress(ValueError, OSError):  # not allowed: keep the soft limit
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, soft - FD_RESERVE))


# draining, a keep-alive connection idle this long is closed (swept every SWEEP_S). An active
# client retires its idle connections itself: each is used once more and answered
# ``Connection: close`` (aiohttp takes the most recent free connection, so it goes through
# them at its request rate); closing one under it resets the request it sends on it. At
# 0.5 s, with the load generator short of CPU (three busy processes beside an 800 req/s
# drain), a sweep closed 115 connections that it used 60 ms later: 13-115 resets in 3 of 24
# runs; at 2 s none were idle that long, and none reset in 10 runs.
IDLE_CLOSE_S = 2.0
SWEEP_S = 0.25


def refuse_new_connections(sock) -> bool:
    """Make a listening socket drop every new connection attempt (a socket filter that
    keeps no packet: SYNs go unanswered, the client retries, then meets the closed port)
    while the connections it has already made can still be accepted and answered. False
    where the platform has no socket filters (then nothing changes)."""
    import ctypes
    import os
    import socket

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
    import os
    import socket
    import struct

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
    import logging
    import time

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
    import asyncio
    import contextlib
    import threading
    import time

    from reference_server.connections import Joiner, accept_eagerly

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


def _loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (all of 127.0.0.0/8, ::1) or ``localhost``."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False
