"""The reference inference server: an ASGI app speaking the Open Inference Protocol.

Pipeline per request, mirroring the simulator's stages: optional feature fetch from Redis
→ preprocessing (JPEG decode and resize, on the event loop) → the dynamic batcher → a model
instance (hand-off over shared memory, forward, outputs back) → the response, which carries
the request's stage timings in its ``parameters`` and a ``Server-Timing`` header.

This process is the front end: HTTP, decoding, the batcher. The model instances run in
processes of their own (:mod:`reference_server.instances`), each on a core of its own when
there are cores to spare, so the model never competes with the front end for the GIL.
Bad input gets a 4xx with a message, overload a 503 with ``Retry-After``, a dead instance
a 503 and readiness false; nothing a client sends can crash the server.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import json
import logging
import math
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from reference_server.batcher import DynamicBatcher, Overloaded
from reference_server.features import FeatureStore, FeatureStoreConfig, StoreUnavailable
from reference_server.instances import (
    InstanceDied,
    InstanceSpec,
    ProcessInstance,
    ThreadInstance,
    blocks,
    instance_cores,
)
from reference_server.logs import ErrorLog
from reference_server.metrics import ServerMetrics
from reference_server.models import ModelConfig, ServedModel
from reference_server.protocol import (
    ProtocolError,
    TensorSpec,
    check_inputs,
    check_outputs,
    decode_request,
    encode_response,
)

VERSION = "1"


@dataclass
class ServerConfig:
    """Everything ``servesim serve`` sets."""

    model: ModelConfig = field(default_factory=ModelConfig)
    max_batch_size: int = 8
    max_queue_delay_ms: float = 2.0
    max_queue_size: int | None = 256
    instances: int = 1
    threads: int = 1  # torch intra-op threads per instance (CPU)
    features: FeatureStoreConfig | None = None
    max_body_bytes: int = 8 * 1024 * 1024
    instance_mode: Literal["process", "thread"] = "process"
    instance_cores: str = "auto"  # auto | none | a core per instance, e.g. "1"
    # inline: decode on the event loop; thread: in a decode thread, which the GIL's 5 ms
    # switch interval makes wait behind the loop (a 28 ms p99 at 20% load on a 16-core host)
    preprocess: Literal["inline", "thread"] = "inline"
    warmup_batches: int = 3
    max_inflight_body_bytes: int = 64 * 1024 * 1024  # request bodies being read at once, all together
    api_key: str | None = None  # a bearer token every route but health checks requires
    body_timeout_s: float = 10.0  # a request body that sends nothing for this long: 408


log = logging.getLogger("servesim.server")


def redact(url: str | None) -> str | None:
    """A URL with its password (and user) replaced, for logs and the config endpoint."""
    if not url or "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    _creds, _, host = rest.rpartition("@")
    return f"{scheme}://***@{host}" if scheme else f"***@{host}"


def _features_public(features: FeatureStoreConfig | None) -> dict | None:
    if features is None:
        return None
    d = asdict(features)
    d["url"] = redact(d.get("url"))
    return d


def _error(status: int, msg: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": msg}, status_code=status, headers=headers)


class Door:
    """The server's door, a plain ASGI layer in front of FastAPI's routing: a request without
    the bearer token gets 401, and an inference request that finds the queue full gets 503
    before anything else is spent on it (no routing, no Request object, its body unread).
    Shedding has to cost a small fraction of serving, else at twice the capacity the loop
    spends itself on refusals and goodput collapses."""

    def __init__(self, app, *, api_key, open_paths, infer_paths, full, draining, refused, overloaded: str):
        self.app, self.open_paths, self.infer_paths = app, open_paths, infer_paths
        self.token = f"Bearer {api_key}".encode() if api_key else None
        self.full, self.draining, self.refused = full, draining, refused
        self.busy = _plain(503, overloaded, [(b"retry-after", b"1")])
        self.denied = _plain(401, "missing or wrong bearer token", [(b"www-authenticate", b"Bearer")])

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        if self.token is not None and path not in self.open_paths:
            got = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(got, self.token):
                return await _send(send, self.denied)
        if path in self.infer_paths and scope["method"] == "POST" and self.full():
            self.refused()
            return await _send(send, self.busy)
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


def _instances(cfg: ServerConfig, front: ServedModel, cores: list[int | None]) -> list:
    """Start the model instances (processes: spawned together, then awaited)."""
    if cfg.instance_mode == "thread":
        return [ThreadInstance(k, front, core) for k, core in enumerate(cores)]
    layout_in, layout_out = blocks(front, cfg.max_batch_size)
    started = []
    try:
        for k, core in enumerate(cores):
            spec = InstanceSpec(
                index=k,
                model=cfg.model,
                max_batch_size=cfg.max_batch_size,
                inputs=layout_in,
                outputs=layout_out,
                core=core,
                threads=cfg.threads,
                device=None,
                warmup_batches=cfg.warmup_batches,
            )
            started.append(ProcessInstance(spec))
        for inst in started:
            inst.wait_ready()
    except BaseException:
        for inst in started:
            inst.close(timeout_s=2)
        raise
    return started


def create_app(cfg: ServerConfig) -> FastAPI:
    """The FastAPI app serving one model under the configuration ``cfg``."""
    if cfg.instance_mode not in ("process", "thread") or cfg.instances < 1:
        raise ValueError("--instance-mode is process or thread, and --instances at least 1")
    if cfg.preprocess not in ("inline", "thread"):
        raise ValueError(f"--preprocess is inline or thread; got {cfg.preprocess!r}")
    cores = instance_cores(cfg.instance_cores, cfg.instances)
    pinned = {c for c in cores if c is not None}
    frontend_cores = sorted(set(range(os.cpu_count() or 1)) - pinned)
    if pinned and not frontend_cores:
        raise ValueError("--instance-cores leaves no core for the front end")
    torch.set_num_threads(cfg.threads if cfg.instance_mode == "thread" else 1)
    # the front end decodes and batches; in process mode it holds no weights at all
    threaded = cfg.instance_mode == "thread"
    model = ServedModel(cfg.model, None if threaded else "cpu", weights=threaded)
    name = cfg.model.name
    metrics = ServerMetrics(name, VERSION)
    store = FeatureStore(cfg.features) if cfg.features is not None else None
    if store is not None and cfg.model.kind != "ranker":
        raise ValueError("the feature store feeds the ranker's sparse ids: use --model ranker")
    inputs: list[TensorSpec] = model.inputs
    if store is not None:  # ids come from Redis: the request names the entity instead
        inputs = [s for s in inputs if s.name != "sparse"] + [TensorSpec("entity", "INT64", (-1, 1))]
    pre_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="preprocess")
    # admitted: past the door, not yet in the batcher's queue; body_bytes: of bodies being read
    state = {"ready": False, "draining": False, "admitted": 0, "body_bytes": 0}
    holder: dict = {}

    def batcher() -> DynamicBatcher:
        return holder["batcher"]

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        loop = asyncio.get_running_loop()
        instances = await loop.run_in_executor(None, _instances, cfg, model, cores)
        if pinned:  # the front end (event loop, decode thread) keeps off the instances' cores
            os.sched_setaffinity(0, frontend_cores)
        holder["batcher"] = DynamicBatcher(
            instances,
            max_batch_size=cfg.max_batch_size,
            max_queue_delay_ms=cfg.max_queue_delay_ms,
            max_queue_size=cfg.max_queue_size,
            on_batch=metrics.observe_batch,
        )
        batcher().start()
        if threaded:
            rng = np.random.default_rng(cfg.model.seed)
            for _ in range(cfg.warmup_batches):  # warm-up outside the statistics
                await loop.run_in_executor(None, lambda: model.forward(model.collate(model.example(2, rng))))
        if store is not None:
            await store.populate(cfg.model.vocab, cfg.model.seed)
        if metrics.gpu.notice:
            print(f"servesim serve: {metrics.gpu.notice}", flush=True)  # noqa: T201 - the server's console
        # Everything alive now (torch's, FastAPI's and our modules: ~240k objects) lives as long as
        # the server: out of the collector's reach, a full collection takes 0.0 ms instead of ~100 ms,
        # which stalled the event loop (and every request with it) once every few thousand requests.
        gc.collect()
        gc.freeze()
        state["ready"] = True
        try:
            yield
        finally:
            state["ready"] = False
            await batcher().stop()
            pre_pool.shutdown(wait=True)
            if store is not None:
                await store.close()
            metrics.close()

    app = FastAPI(title="servesim reference server", lifespan=lifespan)
    app.state.config = cfg

    def drain() -> None:  # shutting down: tell load balancers first, keep serving meanwhile
        state["draining"] = True

    app.state.drain = drain

    errors = ErrorLog(log)

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, err: Exception):
        metrics.fail("internal")
        errors.error(f"{type(err).__name__} outside inference", err)
        return _error(500, "internal error (details in the server log)", {"Connection": "close"})

    open_paths = ("/v2/health/live", "/v2/health/ready")
    infer_paths = {f"/v2/models/{name}/infer", f"/v2/models/{name}/versions/{VERSION}/infer"}
    app.add_middleware(
        Door,
        api_key=cfg.api_key,
        open_paths=open_paths,
        infer_paths=infer_paths,
        full=lambda: state["ready"] and batcher().full(state["admitted"]),
        draining=lambda: state["draining"],
        refused=lambda: metrics.fail("overloaded"),
        overloaded=f"overloaded: queue full ({cfg.max_queue_size} requests)",
    )

    def _known(model_name: str, version: str | None = None) -> JSONResponse | None:
        if model_name != name:
            return _error(404, f"unknown model {model_name!r}; this server has {name!r}")
        if version not in (None, "", VERSION):
            return _error(404, f"model {name!r} has no version {version!r}; it has {VERSION!r}")
        return None

    @app.get("/v2/health/live")
    async def live():
        return Response(status_code=200)

    def is_ready() -> bool:
        return state["ready"] and all(inst.alive for inst in batcher().instances)

    @app.get("/v2/health/ready")
    async def ready():
        if state["draining"]:
            return Response(status_code=503)
        store_ok = store is None or await store.healthy()
        return Response(status_code=200 if is_ready() and store_ok else 503)

    @app.get("/v2")
    async def server_metadata():
        return {"name": "servesim-reference", "version": "0.1", "extensions": ["binary_tensor_data", "statistics"]}

    def _metadata() -> dict:
        return {
            "name": name,
            "versions": [VERSION],
            "platform": "pytorch_libtorch",
            "inputs": [s.metadata() for s in inputs],
            "outputs": [s.metadata() for s in model.outputs],
        }

    @app.get("/v2/models/{model_name}")
    @app.get("/v2/models/{model_name}/versions/{version}")
    async def model_metadata(model_name: str, version: str | None = None):
        return _known(model_name, version) or _metadata()

    @app.get("/v2/models/{model_name}/ready")
    @app.get("/v2/models/{model_name}/versions/{version}/ready")
    async def model_ready(model_name: str, version: str | None = None):
        return _known(model_name, version) or Response(status_code=200 if is_ready() else 503)

    @app.get("/v2/models/{model_name}/config")
    async def model_config(model_name: str):
        devices = [inst.device for inst in batcher().instances]
        return _known(model_name) or {
            "name": name,
            "platform": "pytorch_libtorch",
            "max_batch_size": cfg.max_batch_size,
            "dynamic_batching": {
                "max_queue_delay_microseconds": int(cfg.max_queue_delay_ms * 1000),
                "default_queue_policy": {"max_queue_size": cfg.max_queue_size or 0},
            },
            "instance_group": [
                {"count": cfg.instances, "kind": "KIND_GPU" if devices[0].startswith("cuda") else "KIND_CPU"}
            ],
            "parameters": {
                "servesim": {
                    "model": asdict(cfg.model),
                    "device": devices[0],
                    "threads": cfg.threads,
                    "instance_mode": cfg.instance_mode,
                    "preprocess": cfg.preprocess,
                    "instances": [
                        {"index": k, "pid": inst.pid, "core": cores[k], "device": inst.device, "alive": inst.alive}
                        for k, inst in enumerate(batcher().instances)
                    ],
                    "frontend_cores": frontend_cores if pinned else sorted(os.sched_getaffinity(0)),
                    "features": _features_public(cfg.features),
                    "cpu": platform.processor() or platform.machine(),
                    "torch": torch.__version__,
                }
            },
        }

    @app.get("/v2/models/{model_name}/stats")
    async def model_stats(model_name: str):
        return _known(model_name) or metrics.triton_stats()

    @app.post("/v2/repository/index")
    async def repository_index():
        return [{"name": name, "version": VERSION, "state": "READY" if state["ready"] else "LOADING"}]

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.scrape(len(batcher().queue)), media_type="text/plain; version=0.0.4")

    # a request carries at most max_batch_size items of each input's per-item size
    per_item = max(math.prod(abs(d) for d in spec.shape[1:]) for spec in inputs)
    max_elements = cfg.max_batch_size * max(per_item, 1)

    async def read_body(request: Request) -> bytes | JSONResponse:
        """The body, read as it streams in: over the limit (chunked bodies included) it is
        refused at once, all bodies being read together stay under a budget, and a body that
        sends nothing for ``body_timeout_s`` is answered 408 (a slow upload holds no slot)."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cfg.max_body_bytes:
            metrics.fail("too_large")
            return _error(
                413, f"body of {declared} bytes exceeds the limit of {cfg.max_body_bytes}", {"Connection": "close"}
            )
        chunks, size = [], 0
        stream = request.stream()
        try:
            while True:
                try:
                    async with asyncio.timeout(cfg.body_timeout_s):
                        chunk = await anext(stream)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    metrics.fail("timeout")
                    return _error(408, f"request body stalled for {cfg.body_timeout_s:g} s", {"Connection": "close"})
                size += len(chunk)
                state["body_bytes"] += len(chunk)
                if size > cfg.max_body_bytes:
                    metrics.fail("too_large")
                    return _error(413, f"body exceeds the limit of {cfg.max_body_bytes} bytes", {"Connection": "close"})
                if state["body_bytes"] > cfg.max_inflight_body_bytes:
                    metrics.fail("overloaded")
                    return _error(
                        503,
                        "overloaded: too many request bodies in flight",
                        {"Retry-After": "1", "Connection": "close"},
                    )
                chunks.append(chunk)
        finally:
            state["body_bytes"] -= size
        return b"".join(chunks)

    @app.post("/v2/models/{model_name}/infer")
    @app.post("/v2/models/{model_name}/versions/{version}/infer")
    async def infer(model_name: str, request: Request, version: str | None = None):
        try:
            return await _infer(model_name, request, version)
        except Exception as err:  # answered, logged once, and the connection kept for the client's next request
            metrics.fail("internal")
            errors.error(f"{type(err).__name__} in inference", err)
            return _error(500, "internal error (details in the server log)")

    async def _infer(model_name: str, request: Request, version: str | None):
        t_start = time.perf_counter_ns()
        bad = _known(model_name, version)
        if bad is not None:
            metrics.fail("unknown_model")
            return bad
        if not state["ready"]:
            return _error(503, "model is loading", {"Retry-After": "1"})
        dead = batcher().unavailable()
        if dead:
            metrics.fail("instance_died")
            return _error(503, f"unavailable: {dead}")
        body = await read_body(request)
        if isinstance(body, Response):
            return body
        timing: dict[str, float] = {}
        try:
            # refuse at the door, before spending CPU on the request: the queue bound counts the
            # requests still fetching features or preprocessing, else those pile up unbounded
            if batcher().full(state["admitted"]):
                raise Overloaded(f"queue full ({cfg.max_queue_size} requests)")
            req = decode_request(body, request.headers.get("inference-header-content-length"), max_elements)
            check_inputs(req, inputs)
            check_outputs(req, model.outputs)
            sizes = {a.shape[0] for a in req.inputs.values()}
            if len(sizes) != 1:
                raise ProtocolError("all inputs must have the same batch dimension (first)")
            n = sizes.pop()
            if not 1 <= n <= cfg.max_batch_size:
                raise ProtocolError(f"a request carries 1..{cfg.max_batch_size} items (max_batch_size); got {n}")
            tensors = dict(req.inputs)
            state["admitted"] += 1
            try:
                if store is not None:
                    tensors["sparse"], fetched = await store.fetch(tensors.pop("entity"))
                    timing.update(fetched)
                t0 = time.perf_counter_ns()
                if cfg.preprocess == "inline":
                    item = model.preprocess(tensors)
                else:
                    item = await asyncio.get_running_loop().run_in_executor(pre_pool, model.preprocess, tensors)
                timing["preprocess_us"] = (time.perf_counter_ns() - t0) / 1e3
            finally:
                state["admitted"] -= 1
            pending = await batcher().submit(item, n)
        except Overloaded as err:
            metrics.fail("overloaded")
            return _error(503, f"overloaded: {err}", {"Retry-After": "1"})
        except InstanceDied as err:
            metrics.fail("instance_died")
            return _error(503, f"unavailable: {err}")
        except StoreUnavailable as err:
            metrics.fail("feature_store")
            errors.error("feature store unavailable", err)
            return _error(503, str(err), {"Retry-After": "1"})
        except (ProtocolError, ValueError, KeyError) as err:
            metrics.fail("bad_request")
            return _error(400, str(err).strip("'\""))
        outputs = pending.future.result()
        timing["queue_us"] = (pending.t_dispatch_ns - pending.t_enqueue_ns) / 1e3
        for stage, ns in pending.timing.items():
            timing[f"{stage}_us"] = ns / 1e3
        timing["request_us"] = (time.perf_counter_ns() - t_start) / 1e3
        metrics.observe(timing, n)
        params = {**{k: round(v, 1) for k, v in timing.items()}, "batch_size": pending.batch_size}
        try:
            payload, header_len = encode_response(name, VERSION, req, outputs, model.outputs, params)
        except ProtocolError as err:
            return _error(400, str(err))
        headers = {
            "Server-Timing": ", ".join(f"{k[:-3]};dur={v / 1e3:.3f}" for k, v in timing.items() if k[-3:] == "_us")
        }
        if header_len is None:
            return Response(payload, media_type="application/json", headers=headers)
        headers["Inference-Header-Content-Length"] = str(header_len)
        return Response(payload, media_type="application/octet-stream", headers=headers)

    return app


def describe(cfg: ServerConfig) -> str:
    """One line for the console: what is served, how."""
    m = cfg.model
    what = f"{m.kind} ({m.resolution}px, width {m.width}, depth {m.depth})" if m.kind == "resnet" else m.kind
    return json.dumps(
        {
            "model": what,
            "precision": m.precision,
            "max_batch_size": cfg.max_batch_size,
            "max_queue_delay_ms": cfg.max_queue_delay_ms,
            "max_queue_size": cfg.max_queue_size,
            "instances": cfg.instances,
            "instance_mode": cfg.instance_mode,
            "instance_cores": cfg.instance_cores,
            "preprocess": cfg.preprocess,
            "features": _features_public(cfg.features),
        }
    )
