"""``servesim serve``: start the reference server standalone (heavy imports happen inside)."""

from __future__ import annotations

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
    resolution: Annotated[
        int, typer.Option(help="resnet: input side in pixels (images are resized to it).", min=1)
    ] = 64,
    width: Annotated[int, typer.Option(help="resnet: channels of the first stage (64 is ResNet-18).", min=1)] = 32,
    depth: Annotated[int, typer.Option(help="resnet: 18 or 34 layers.")] = 18,
    precision: Annotated[str, typer.Option(help="fp32, fp16, bf16, or int8 (dynamic quantization, CPU).")] = "fp32",
    max_batch_size: Annotated[int, typer.Option(help="Dynamic batcher: most items in one batch.", min=1)] = 8,
    max_queue_delay_ms: Annotated[
        float, typer.Option(help="Dynamic batcher: window counted from the oldest queued request, ms.", min=0)
    ] = 2.0,
    max_queue_size: Annotated[
        int, typer.Option(help="Queued requests beyond which new ones get 503 (0: no cap).", min=0)
    ] = 256,
    instances: Annotated[
        int, typer.Option(help="Model instances (Triton's instance group), each running one batch at a time.", min=1)
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
    instance_idle: Annotated[
        str,
        typer.Option(
            help="An idle instance: sleep (on its pipe) or spin (poll it, keeping its core busy: an experiment's "
            "lever for what a sleeping core does to light loads)."
        ),
    ] = "sleep",
    preprocess: Annotated[
        str,
        typer.Option(
            help="inline: decode on the event loop; thread: in a decode thread (which waits for the GIL behind "
            "the loop, up to Python's 5 ms switch interval at a time)."
        ),
    ] = "inline",
    threads: Annotated[int, typer.Option(help="torch intra-op threads per instance on the CPU.", min=1)] = 1,
    redis_url: Annotated[
        str | None,
        typer.Option(
            envvar="SERVESIM_REDIS_URL",
            help="Fetch the ranker's sparse ids from this Redis (e.g. redis://127.0.0.1:6379/0). A URL with a "
            "password belongs in SERVESIM_REDIS_URL: a command line is visible to every user of the host.",
        ),
    ] = None,
    feature_keys: Annotated[
        int, typer.Option(help="Feature store: ids per item (the ranker's sparse inputs).", min=1)
    ] = 26,
    feature_batch_size: Annotated[
        int, typer.Option(help="Feature store: keys per round trip (1 = GET per key).", min=1)
    ] = 1,
    feature_parallelism: Annotated[
        int, typer.Option(help="Feature store: round trips in flight per request.", min=1)
    ] = 1,
    feature_entities: Annotated[
        int, typer.Option(help="Feature store: entities written at start-up (each with --feature-keys ids).", min=1)
    ] = 10_000,
    redis_connections: Annotated[
        int, typer.Option(help="Feature store: pooled Redis connections; round trips beyond these wait for one.", min=1)
    ] = 32,
    max_image_pixels: Annotated[
        int,
        typer.Option(
            help="Pixels an image may declare; more is a 400 before decoding (0: max(2048², (16·res)²)).", min=0
        ),
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
    port: Annotated[int, typer.Option(help="TCP port (0: any free one).", min=0, max=65535)] = 8000,
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
        instance_idle=instance_idle,  # type: ignore[arg-type] - checked by create_app
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
    import uvicorn

    from reference_server.app import create_app, describe
    from reference_server.connections import guarded_http
    from reference_server.draining import draining_server

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
    listener = listen(host, port)
    port = listener.getsockname()[1]  # the one it took, where --port 0 asked for any
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
        with listen(host, port) as sock:
            port = sock.getsockname()[1]  # the one it took, where --port 0 asked for any
            code = serve_frontends(
                hub,
                sock,
                serve_kwargs=kw,
                announce=lambda: typer.echo(f"servesim serve: http://{host}:{port} {describe(cfg)}"),
            )
    except (StartFailed, InstanceDied, OSError) as err:  # a worker's or instance's own error is on the console
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=1) from None
    if code:
        raise typer.Exit(code=code)


def listen(host: str, port: int):
    """The listening socket, bound before any instance starts; a port taken (or an address
    not this host's): one line, exit 1."""
    import socket

    try:
        return socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET, backlog=2048
        )
    except OSError as err:
        typer.echo(f"error: cannot listen on {host}:{port}: {err.strerror or err}", err=True)
        raise typer.Exit(code=1) from None


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


def _loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (all of 127.0.0.0/8, ::1) or ``localhost``."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False
