"""The reference inference server: an ASGI app speaking the Open Inference Protocol.

Pipeline per request, mirroring the simulator's stages: optional feature fetch from Redis
→ preprocessing (JPEG decode and resize, on the event loop) → the dynamic batcher → a model
instance (hand-off over shared memory, forward, outputs back) → the response, which carries
the request's stage timings in its ``parameters`` and a ``Server-Timing`` header.

This process is the front end (:mod:`reference_server.frontend`): HTTP, decoding, the
batcher. The model instances run in processes of their own
(:mod:`reference_server.instances`), each on a core of its own when there are cores to
spare, so the model never competes with the front end for the GIL. A plain ASGI layer
(:mod:`reference_server.door`) refuses what it can cheaply. Bad input gets a 4xx with a
message, overload a 503 with ``Retry-After``, a dead instance a 503 and readiness false;
nothing a client sends can crash the server.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

from reference_server.config import VERSION, ServerConfig, describe, redact
from reference_server.door import Door
from reference_server.frontend import FrontEnd, error

__all__ = ["ServerConfig", "create_app", "describe", "redact"]


def create_app(cfg: ServerConfig, relay=None) -> FastAPI:
    """The FastAPI app serving one model under the configuration ``cfg`` (``relay``: one of
    several front ends, whose batcher is the hub's, :mod:`reference_server.hub`).

    Raises ValueError for a configuration that cannot be served. ``app.state.drain()``
    starts draining (readiness 503, ``Connection: close``) before a shutdown;
    ``app.state.shed(on)`` (from any thread) turns on or off a 503 for every inference
    request, while the shutdown has more waiting than its grace period can serve.
    """
    fe = FrontEnd(cfg, relay)
    name = fe.name
    app = FastAPI(title="servesim reference server", lifespan=fe.lifespan)
    app.state.config = cfg
    app.state.drain = fe.drain
    app.state.shed = fe.shed

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, err: Exception):
        fe.metrics.fail("internal")
        fe.errors.error(f"{type(err).__name__} outside inference", err)
        return error(500, "internal error (details in the server log)", {"Connection": "close"})

    app.add_middleware(
        Door,
        api_key=cfg.api_key,
        open_paths=("/v2/health/live", "/v2/health/ready"),
        infer_paths={f"/v2/models/{name}/infer", f"/v2/models/{name}/versions/{VERSION}/infer"},
        full=fe.full,
        draining=lambda: fe.draining,
        shedding=lambda: fe.shedding,
        refused=fe.metrics.fail,
        overloaded=f"overloaded: queue full ({cfg.max_queue_size} requests)",
    )
    _server_routes(app, fe)
    _model_routes(app, fe)
    return app


def _server_routes(app: FastAPI, fe: FrontEnd) -> None:
    """Health, server metadata, the repository index and Prometheus metrics."""

    @app.get("/v2/health/live")
    async def live():
        return Response(status_code=200)

    @app.get("/v2/health/ready")
    async def ready():
        if fe.draining:
            return Response(status_code=503)
        store_ok = fe.store is None or await fe.store.healthy()
        return Response(status_code=200 if fe.is_ready() and store_ok else 503)

    @app.get("/v2")
    async def server_metadata():
        return {"name": "servesim-reference", "version": "0.1", "extensions": ["binary_tensor_data", "statistics"]}

    @app.post("/v2/repository/index")
    async def repository_index():
        return [{"name": fe.name, "version": VERSION, "state": "READY" if fe.ready else "LOADING"}]

    @app.get("/metrics")
    async def prometheus():
        return Response(await fe.scrape(), media_type="text/plain; version=0.0.4")


def _model_routes(app: FastAPI, fe: FrontEnd) -> None:
    """The model's metadata, readiness, configuration, statistics and inference."""

    @app.get("/v2/models/{model_name}")
    @app.get("/v2/models/{model_name}/versions/{version}")
    async def model_metadata(model_name: str, version: str | None = None):
        return fe.known(model_name, version) or fe.metadata()

    @app.get("/v2/models/{model_name}/ready")
    @app.get("/v2/models/{model_name}/versions/{version}/ready")
    async def model_ready(model_name: str, version: str | None = None):
        return fe.known(model_name, version) or Response(status_code=200 if fe.is_ready() else 503)

    @app.get("/v2/models/{model_name}/config")
    async def model_config(model_name: str):
        return fe.known(model_name) or fe.config()

    @app.get("/v2/models/{model_name}/stats")
    async def model_stats(model_name: str):
        return fe.known(model_name) or await fe.stats()

    @app.post("/v2/models/{model_name}/infer")
    @app.post("/v2/models/{model_name}/versions/{version}/infer")
    async def infer(model_name: str, request: Request, version: str | None = None):
        return await fe.infer(model_name, request, version)
