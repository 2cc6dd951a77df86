"""The front end: one model's state in this process and what it does with a request.

It holds the model's description (no weights in process mode), the batcher, the feature
store and the counters, starts and stops them with the app (:meth:`FrontEnd.lifespan`),
and runs a request's path: admission → body → decode and checks → feature fetch →
preprocessing → the batcher → the response with its stage timings. The routes in
:mod:`reference_server.app` are thin: they call into this.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import multiprocessing
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict

import numpy as np
import torch
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from reference_server.batcher import DynamicBatcher, Overloaded, Pending
from reference_server.bodies import BodyReader, BodyRefused
from reference_server.config import VERSION, ServerConfig, features_public
from reference_server.features import FeatureStore, StoreUnavailable
from reference_server.instances import InstanceDied, instance_cores
from reference_server.launch import batcher_for, start_instances
from reference_server.lifetime import die_with_parent
from reference_server.logs import ErrorLog
from reference_server.metrics import ServerMetrics
from reference_server.models import ServedModel
from reference_server.protocol import (
    InferRequest,
    ProtocolError,
    TensorSpec,
    check_inputs,
    check_outputs,
    decode_request,
    encode_response,
)
from reference_server.relay import RelayMetrics

log = logging.getLogger("servesim.server")

# bodies above this are parsed off the event loop (~35 ms of json.loads a MB, holding the GIL)
PARSE_OFF_LOOP_BYTES = 256 * 1024
_WARM = b'{"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [0]}]}'


def error(status: int, msg: str, headers: dict | None = None) -> JSONResponse:
    """A JSON error response, ``{"error": msg}``."""
    return JSONResponse({"error": msg}, status_code=status, headers=headers)


def _parse_process_init(cores: list[int] | None) -> None:
    """The parse process: it dies with the front end and, where the front end keeps off the
    instances' cores, keeps off them too (it is spawned before the front end pins itself)."""
    die_with_parent()
    if cores:
        os.sched_setaffinity(0, cores)


class FrontEnd:
    """One served model's front end under the configuration ``cfg``.

    Raises ValueError for a configuration that cannot be served (the CLI's exit 2).
    """

    def __init__(self, cfg: ServerConfig, relay=None):
        if cfg.instance_mode not in ("process", "thread") or cfg.instances < 1:
            raise ValueError("--instance-mode is process or thread, and --instances at least 1")
        if cfg.instance_idle not in ("sleep", "spin"):
            raise ValueError(f"--instance-idle is sleep or spin; got {cfg.instance_idle!r}")
        if cfg.preprocess not in ("inline", "thread"):
            raise ValueError(f"--preprocess is inline or thread; got {cfg.preprocess!r}")
        # a worker of several front ends (--frontends): the hub owns the instances and the batcher
        self.relay = relay
        if relay is not None:
            self.cores = [i["core"] for i in relay.info.instances]
        else:
            self.cores = instance_cores(cfg.instance_cores, cfg.instances)
        self.pinned = {c for c in self.cores if c is not None}
        self.frontend_cores = sorted(set(range(os.cpu_count() or 1)) - self.pinned)
        if self.pinned and not self.frontend_cores:
            raise ValueError("--instance-cores leaves no core for the front end")
        if cfg.features is not None and cfg.model.kind != "ranker":
            raise ValueError("the feature store feeds the ranker's sparse ids: use --model ranker")
        self.cfg, self.name = cfg, cfg.model.name
        self.threaded = cfg.instance_mode == "thread"
        torch.set_num_threads(cfg.threads if self.threaded else 1)
        # the front end decodes and batches; in process mode it holds no weights at all
        self.model = ServedModel(cfg.model, None if self.threaded else "cpu", weights=self.threaded)
        self.metrics = ServerMetrics(self.name, VERSION) if relay is None else RelayMetrics(relay)
        self.store = FeatureStore(cfg.features) if cfg.features is not None else None
        self.inputs: list[TensorSpec] = self.model.inputs
        if self.store is not None:  # ids come from Redis: the request names the entity instead
            self.inputs = [s for s in self.inputs if s.name != "sparse"] + [TensorSpec("entity", "INT64", (-1, 1))]
        # a request carries at most max_batch_size items of each input's per-item size
        per_item = max(math.prod(abs(d) for d in spec.shape[1:]) for spec in self.inputs)
        self.max_elements = cfg.max_batch_size * max(per_item, 1)
        self.pre_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="preprocess")
        self.parse_pool: ProcessPoolExecutor | None = None  # big bodies are parsed here, off the loop
        self.errors = ErrorLog(log)
        self.batcher: DynamicBatcher  # set when the app starts
        self.ready = False
        self.draining = False
        self.shedding = False  # the shutdown answers every inference request 503 (set from its thread)
        self.admitted = 0  # past the door, not yet in the batcher's queue
        self.bodies = BodyReader(cfg.body_limits())

    @asynccontextmanager
    async def lifespan(self, _app):
        """Start the instances, the batcher and the store; stop them when the app stops."""
        cfg, model, store = self.cfg, self.model, self.store
        loop = asyncio.get_running_loop()
        # a JSON body of megabytes takes the parser a quarter of a second, holding the GIL: such
        # bodies are parsed in a process of their own, started (and warmed: a spawned Python,
        # ~1.8 s) now, beside the instances' start rather than after it
        self.parse_pool = ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_parse_process_init,
            initargs=(self.frontend_cores if self.relay is None and self.pinned else None,),
        )
        parse_warm = loop.run_in_executor(self.parse_pool, decode_request, _WARM, None, None)
        try:
            if self.relay is not None:  # the hub's batcher, over the relay
                await self.relay.connect()
                self.batcher = self.relay
            else:
                instances = await loop.run_in_executor(None, start_instances, cfg, model, self.cores)
                if self.pinned:  # the front end (event loop, decode thread) keeps off the instances' cores
                    os.sched_setaffinity(0, self.frontend_cores)
                self.batcher = batcher_for(cfg, instances, self.metrics.observe_batch)
            self.batcher.start()
            if self.threaded:
                rng = np.random.default_rng(cfg.model.seed)
                for _ in range(cfg.warmup_batches):  # warm-up outside the statistics
                    await loop.run_in_executor(None, lambda: model.forward(model.collate(model.example(2, rng))))
            if store is not None:
                await store.populate(cfg.model.vocab, cfg.model.seed)
            await parse_warm
        except BaseException:  # an instance that fails to start: the parse process goes too
            self.parse_pool.shutdown(wait=False, cancel_futures=True)
            raise
        if self.metrics.gpu.notice:
            print(f"servesim serve: {self.metrics.gpu.notice}", flush=True)  # noqa: T201 - the server's console
        # Everything alive now (torch's, FastAPI's and our modules: ~240k objects) lives as long as
        # the server: out of the collector's reach, a full collection takes 0.0 ms instead of ~100 ms,
        # which stalled the event loop (and every request with it) once every few thousand requests.
        gc.collect()
        gc.freeze()
        self.ready = True
        if self.relay is not None:
            self.relay.send(("ready",))
        try:
            yield
        finally:
            self.ready = False
            await self.batcher.stop()
            self.pre_pool.shutdown(wait=True)
            self.parse_pool.shutdown(wait=True, cancel_futures=True)
            if store is not None:
                await store.close()
            self.metrics.close()

    def drain(self) -> None:
        """Shutting down: tell load balancers first (readiness 503), keep serving meanwhile."""
        self.draining = True

    def shed(self, on: bool) -> None:
        """Whether the shutdown answers every inference request with a cheap 503
        (``Retry-After``): more connections wait than its grace period can serve."""
        self.shedding = on

    def full(self) -> bool:
        """Whether a new inference request would find the queue full."""
        return self.ready and self.batcher.full(self.admitted)

    async def scrape(self) -> bytes:
        """The Prometheus text of /metrics: this process's, or the hub's for a worker."""
        if self.relay is not None:
            return await self.relay.ask("scrape")
        return self.metrics.scrape(len(self.batcher.queue))

    async def stats(self) -> dict:
        """Triton's statistics JSON: this process's, or the hub's for a worker."""
        if self.relay is not None:
            return await self.relay.ask("stats")
        return self.metrics.triton_stats()

    def is_ready(self) -> bool:
        """Started, and every instance alive."""
        return self.ready and all(inst.alive for inst in self.batcher.instances)

    def known(self, model_name: str, version: str | None = None) -> JSONResponse | None:
        """None for this server's model (and version), else the 404 to answer."""
        if model_name != self.name:
            return error(404, f"unknown model {model_name!r}; this server has {self.name!r}")
        if version not in (None, "", VERSION):
            return error(404, f"model {self.name!r} has no version {version!r}; it has {VERSION!r}")
        return None

    def metadata(self) -> dict:
        """The model's metadata: its name, versions, inputs and outputs."""
        return {
            "name": self.name,
            "versions": [VERSION],
            "platform": "pytorch_libtorch",
            "inputs": [s.metadata() for s in self.inputs],
            "outputs": [s.metadata() for s in self.model.outputs],
        }

    def config(self) -> dict:
        """The model's configuration, Triton's fields and ours (under ``parameters.servesim``)."""
        cfg, instances = self.cfg, self.batcher.instances
        devices = [inst.device for inst in instances]
        return {
            "name": self.name,
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
                    "instance_idle": cfg.instance_idle,
                    "preprocess": cfg.preprocess,
                    "frontends": cfg.frontends,
                    # the hub deals connections to its front ends in turn; one front end is one queue
                    "frontend_dispatch": "round_robin" if cfg.frontends > 1 else "shared",
                    "instances": [
                        {"index": k, "pid": inst.pid, "core": self.cores[k], "device": inst.device, "alive": inst.alive}
                        for k, inst in enumerate(instances)
                    ],
                    "frontend_cores": self.frontend_cores if self.pinned else sorted(os.sched_getaffinity(0)),
                    "frontend_pid": os.getpid(),  # the front end that answered (its event loop's process)
                    "features": features_public(cfg.features),
                    "cpu": platform.processor() or platform.machine(),
                    "torch": torch.__version__,
                }
            },
        }

    async def read_body(self, request: Request) -> bytes | JSONResponse:
        """The body, read as it streams in under the server's limits
        (:class:`~reference_server.bodies.BodyReader`: too large, stalled, trickling or
        past the bodies' budget, it is refused at once), or the error to answer."""
        try:
            return await self.bodies.read(request)
        except BodyRefused as no:
            self.metrics.fail(no.reason)
            if no.reason == "client_disconnected":  # one line, no traceback
                self.errors.warning("client disconnected before sending its whole body")
            return error(no.status, no.message, no.headers)

    async def infer(self, model_name: str, request: Request, version: str | None) -> Response:
        """Answer one inference request; never raises (an unexpected error is a logged 500)."""
        try:
            return await self._infer(model_name, request, version)
        except asyncio.CancelledError:
            if not self.draining:
                raise
            # the shutdown's grace period ran out on this request (a slow upload, say): a 503
            # that tells the client to come back elsewhere, not uvicorn's 500 and traceback
            self.metrics.fail("shutdown")
            self.errors.warning("requests cut off by the shutdown's grace period")
            return error(503, "shutting down", {"Retry-After": "1", "Connection": "close"})
        except Exception as err:  # answered, logged once, and the connection kept for the client's next request
            self.metrics.fail("internal")
            self.errors.error(f"{type(err).__name__} in inference", err)
            return error(500, "internal error (details in the server log)")

    async def _infer(self, model_name: str, request: Request, version: str | None) -> Response:
        t_start = time.perf_counter_ns()
        metrics = self.metrics
        bad = self.known(model_name, version)
        if bad is not None:
            metrics.fail("unknown_model")
            return bad
        if not self.ready:
            return error(503, "model is loading", {"Retry-After": "1"})
        dead = self.batcher.unavailable()
        if dead:
            metrics.fail("instance_died")
            return error(503, f"unavailable: {dead}", {"Retry-After": "1"})
        body = await self.read_body(request)
        if isinstance(body, Response):
            return body
        timing: dict[str, float] = {}
        try:
            # refuse at the door, before spending CPU on the request: the queue bound counts the
            # requests still fetching features or preprocessing, else those pile up unbounded
            if self.batcher.full(self.admitted):
                raise Overloaded(f"queue full ({self.cfg.max_queue_size} requests)")
            req, n = await self._decode(body, request.headers.get("inference-header-content-length"))
            item = await self._prepare(dict(req.inputs), timing)
            pending = await self.batcher.submit(item, n)
        except Overloaded as err:
            metrics.fail("overloaded")
            return error(503, f"overloaded: {err}", {"Retry-After": "1"})
        except InstanceDied as err:
            metrics.fail("instance_died")
            return error(503, f"unavailable: {err}", {"Retry-After": "1"})
        except StoreUnavailable as err:
            metrics.fail("feature_store")
            self.errors.error("feature store unavailable", err)
            return error(503, str(err), {"Retry-After": "1"})
        except (ProtocolError, ValueError, KeyError) as err:
            metrics.fail("bad_request")
            # a KeyError's str() is its key quoted: its own text, not a message's closing quote
            return error(400, str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err))
        return self._respond(req, n, pending, timing, t_start)

    async def _decode(self, body: bytes, header_len: str | None) -> tuple[InferRequest, int]:
        """The request decoded and checked against the model; and its batch size. A body
        over :data:`PARSE_OFF_LOOP_BYTES` is parsed in the parse process, so the event loop
        goes on answering meanwhile."""
        if len(body) > PARSE_OFF_LOOP_BYTES and self.parse_pool is not None:
            loop = asyncio.get_running_loop()
            req = await loop.run_in_executor(self.parse_pool, decode_request, body, header_len, self.max_elements)
        else:
            req = decode_request(body, header_len, self.max_elements)
        check_inputs(req, self.inputs)
        check_outputs(req, self.model.outputs)
        sizes = {a.shape[0] for a in req.inputs.values()}
        if len(sizes) != 1:
            raise ProtocolError("all inputs must have the same batch dimension (first)")
        n = sizes.pop()
        if not 1 <= n <= self.cfg.max_batch_size:
            raise ProtocolError(f"a request carries 1..{self.cfg.max_batch_size} items (max_batch_size); got {n}")
        return req, n

    async def _prepare(self, tensors: dict, timing: dict[str, float]):
        """Fetch the features and preprocess: the item the batcher takes. Counted as admitted
        meanwhile, so the queue bound sees these requests too."""
        self.admitted += 1
        try:
            if self.store is not None:
                tensors["sparse"], fetched = await self.store.fetch(tensors.pop("entity"))
                timing.update(fetched)
            t0 = time.perf_counter_ns()
            if self.cfg.preprocess == "inline":
                item = self.model.preprocess(tensors)
            else:
                item = await asyncio.get_running_loop().run_in_executor(self.pre_pool, self.model.preprocess, tensors)
            timing["preprocess_us"] = (time.perf_counter_ns() - t0) / 1e3
        finally:
            self.admitted -= 1
        return item

    def _respond(self, req: InferRequest, n: int, pending: Pending, timing: dict[str, float], t_start: int) -> Response:
        """The response: the outputs, and the request's stage timings in its parameters and
        in a ``Server-Timing`` header."""
        outputs = pending.future.result()
        timing["queue_us"] = (pending.t_dispatch_ns - pending.t_enqueue_ns) / 1e3
        for stage, ns in pending.timing.items():
            timing[f"{stage}_us"] = ns / 1e3
        if self.relay is not None:  # the two hops to the hub and back
            timing["relay_us"] = pending.relay_ns / 1e3
        timing["request_us"] = (time.perf_counter_ns() - t_start) / 1e3
        self.metrics.observe(timing, n)
        params = {
            **{k: round(v, 1) for k, v in timing.items()},
            "batch_size": pending.batch_size,
            # when, on CLOCK_MONOTONIC (one clock for the host's processes): a client on the
            # host lines requests up against the batches they made (calibrate/cycle.py)
            "received_at_ns": t_start,
            "enqueued_at_ns": pending.t_enqueue_ns,
            "dispatched_at_ns": pending.t_dispatch_ns,
        }
        if self.relay is not None:
            params["frontend"] = self.relay.info.index
        try:
            payload, header_len = encode_response(self.name, VERSION, req, outputs, self.model.outputs, params)
        except ProtocolError as err:
            return error(400, str(err))
        headers = {
            "Server-Timing": ", ".join(f"{k[:-3]};dur={v / 1e3:.3f}" for k, v in timing.items() if k[-3:] == "_us")
        }
        if header_len is None:
            return Response(payload, media_type="application/json", headers=headers)
        headers["Inference-Header-Content-Length"] = str(header_len)
        return Response(payload, media_type="application/octet-stream", headers=headers)
