"""An OpenAI-compatible HTTP front end for the engine, with vLLM's metrics.

- ``POST /v1/completions`` and ``POST /v1/chat/completions``: ``stream: true`` answers as
  server-sent events, one chunk per token, then a chunk with ``usage``, then
  ``data: [DONE]``; otherwise one JSON body. ``max_tokens`` is honoured exactly (the
  engine ignores EOS, as vLLM's ``ignore_eos``); decoding is greedy whatever
  ``temperature`` says. A prompt is text (one token a byte) or a list of token ids.
- ``GET /v1/models``, ``GET /health``.
- ``GET /metrics``: vLLM's names, labels (``model_name``) and histogram buckets, so a
  dashboard or :mod:`calibrate.watch` built for vLLM reads this server as it reads vLLM
  (:mod:`reference_server.llm.metrics`).

A bad request gets a 4xx with an OpenAI-style body, ``{"error": {"message", "type",
"param", "code"}}``, naming the field; the engine never sees it. A body is read under the
image server's limits (:mod:`reference_server.bodies`): too large a 413, stalled or
trickling a 408, past the bodies' budget a 503, each closing the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import time
import uuid
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import generate_latest

from reference_server.bodies import BodyLimits, BodyReader, BodyRefused
from reference_server.llm.engine import EngineConfig, StepRecord
from reference_server.llm.metrics import Metrics
from reference_server.llm.model import VOCAB, decode, encode
from reference_server.llm.worker import EngineClient, EngineDied


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code


def error(
    status: int, message: str, param: str | None = None, code: str | None = None, headers: dict | None = None
) -> JSONResponse:
    kind = {400: "invalid_request_error", 404: "not_found_error", 503: "service_unavailable"}.get(status, "error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": code or status}}
    return JSONResponse(body, status_code=status, headers=headers)


@dataclass
class Asked:
    """A validated request."""

    prompt: list[int]
    max_tokens: int
    stream: bool
    chat: bool
    usage_in_stream: bool = True
    extra: dict = field(default_factory=dict)


def _int(body: dict, name: str, default: int) -> int:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"{name} must be an integer, not {json.dumps(v)}", name)
    return v


def _content(content, i: int) -> str:
    """A message's text: a string, or OpenAI's array of content parts (text parts only:
    the engine reads no images or audio), joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequest(
                    f"messages[{i}].content[{j}] must be a text part, {{'type': 'text', 'text': a string}} "
                    "(this engine reads text only)",
                    "messages",
                )
            parts.append(part["text"])
        return "".join(parts)
    raise BadRequest(f"messages[{i}].content must be a string or a non-empty list of text parts", "messages")


def parse(body, *, chat: bool, served: str, cfg: EngineConfig) -> Asked:
    """The request in ``body`` (parsed JSON), or :class:`BadRequest` naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    model = body.get("model", served)
    if model != served:
        raise BadRequest(
            f"the model {model!r} does not exist (this server serves {served!r})", "model", 404, "model_not_found"
        )
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list of {role, content}", "messages")
        text = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise BadRequest(f"messages[{i}] must be an object with a string role and a content", "messages")
            text.append(f"<{m['role']}>{_content(m.get('content'), i)}\n")
        prompt = encode("".join(text) + "<assistant>")
    else:
        p = body.get("prompt")
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str | list):
            p = p[0]
        if isinstance(p, str):
            prompt = encode(p)
        elif isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            if any(not 0 <= t < VOCAB for t in p):
                raise BadRequest(f"prompt token ids must be in 0..{VOCAB - 1}", "prompt")
            prompt = list(p)
        else:
            raise BadRequest("prompt must be a string or a list of token ids (one prompt)", "prompt")
    if not prompt:
        raise BadRequest("the prompt is empty", "prompt")
    name = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = _int(body, name, 16)
    if max_tokens < 1:
        raise BadRequest(f"{name} must be at least 1, not {max_tokens}", name)
    if len(prompt) + max_tokens > cfg.max_model_len:
        raise BadRequest(
            f"this model's maximum context length is {cfg.max_model_len} tokens; the prompt has {len(prompt)} "
            f"and {name} asks for {max_tokens}",
            name,
        )
    if _int(body, "n", 1) != 1:
        raise BadRequest("n must be 1 (one choice a request)", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be true or false", "stream")
    for name in ("temperature", "top_p"):  # vLLM's ranges: temperature >= 0, top_p in (0, 1]
        v = body.get(name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise BadRequest(f"{name} must be a number", name)
        if name == "temperature" and v < 0:
            raise BadRequest(f"temperature must be at least 0, not {v:g}", name)
        if name == "top_p" and not 0 < v <= 1:
            raise BadRequest(f"top_p must be above 0 and at most 1, not {v:g}", name)
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise BadRequest("stream_options must be an object", "stream_options")
    return Asked(prompt, max_tokens, stream, chat, bool(opts.get("include_usage", True)))


def create_llm_app(
    cfg: EngineConfig,
    *,
    served: str = "servesim-tiny",
    threads: int = 1,
    core: int | None = None,
    idle: str = "sleep",
    bodies: BodyLimits | None = None,
) -> FastAPI:
    """The app serving the engine (started in its own process when the app starts, pinned
    to ``core`` when given; the front end then keeps to the other cores, as the image
    server's does: left free, the scheduler moves it onto the engine's core while the engine
    idles, and the engine's forward passes after run 10-20% slower, more at low load than at
    high; calibrate/README, "What the misses are made of")."""
    state: dict = {}
    reader = BodyReader(bodies or BodyLimits())  # too large, stalled or trickling: refused at once
    frontend_cores = sorted(set(os.sched_getaffinity(0)) - {core}) if core is not None else []

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        client = EngineClient(cfg, threads, core, idle)
        if frontend_cores:  # after the spawn: the engine process sets its own core
            os.sched_setaffinity(0, frontend_cores)
        await asyncio.get_running_loop().run_in_executor(None, client.wait_ready)
        client.attach(asyncio.get_running_loop())
        state["client"] = client
        state["metrics"] = Metrics(served, cfg, client)
        try:
            yield
        finally:
            client.close()

    app = FastAPI(title="servesim tiny LLM engine", lifespan=lifespan)

    @app.get("/health")
    async def health():
        return Response(status_code=200 if state["client"].alive else 503)

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [
                {
                    "id": served,
                    "object": "model",
                    "created": 0,
                    "owned_by": "servesim",
                    "max_model_len": cfg.max_model_len,
                    "servesim": {
                        "engine_core": core,
                        "frontend_cores": frontend_cores,
                        "engine_pid": state["client"].proc.pid,
                        "device": state["client"].device,
                        "idle": idle,
                    },
                }
            ],
        }

    @app.get("/servesim/steps")
    async def steps():
        """The engine's step records since the last call (servesim's own: calibration fits
        its step time on them), as columns."""
        rows = await state["client"].step_records()
        names = [f.name for f in dataclasses.fields(StepRecord)]
        return {name: [row[k] for row in rows] for k, name in enumerate(names)}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(state["metrics"].registry), media_type="text/plain; version=0.0.4")

    async def handle(request: Request, chat: bool):
        arrival = time.perf_counter_ns()
        try:
            raw = await reader.read(request)
        except BodyRefused as no:
            return error(no.status, no.message, headers=no.headers)
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            return error(400, f"the body is not valid JSON: {err}")
        try:
            asked = parse(body, chat=chat, served=served, cfg=cfg)
        except BadRequest as err:
            return error(err.status, err.message, err.param, err.code)
        client: EngineClient = state["client"]
        if not client.alive:
            return error(503, "the engine process is not running")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        stamps: dict[str, int] = {}
        tokens = client.generate(rid, asked.prompt, asked.max_tokens, arrival, stamps)
        if asked.stream:
            return StreamingResponse(
                _sse(rid, asked, tokens, arrival, stamps, state["metrics"], served, chat),
                media_type="text/event-stream",
            )
        out, first, last, info = [], 0, 0, {}
        try:
            async for t in tokens:
                now = time.perf_counter_ns()
                if first:
                    state["metrics"].itl.observe((now - last) * 1e-9)
                out.append(t.token)
                first = first or now
                last = now
                info = t.info or info
        except (EngineDied, ValueError) as err:
            return error(503 if isinstance(err, EngineDied) else 400, str(err))
        state["metrics"].finished(arrival, first, last, info)
        text = "".join(decode(t) for t in out)
        usage = {
            "prompt_tokens": len(asked.prompt),
            "completion_tokens": len(out),
            "total_tokens": len(asked.prompt) + len(out),
        }
        choice = {"index": 0, "finish_reason": "length", "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        obj = "chat.completion" if chat else "text_completion"
        return {
            "id": rid,
            "object": obj,
            "created": int(time.time()),
            "model": served,
            "choices": [choice],
            "usage": usage,
        }

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, chat=True)

    return app


def _timing(arrival: int, sent: int, first: int, info: dict) -> dict[str, int]:
    """Where a streamed request's first token spent its time, for a client on the same host
    (servesim's own, beside ``usage``; CLOCK_MONOTONIC ns, which ``time.perf_counter_ns``
    reads on Linux): the front end's handler got the request, handed it to the engine's
    process, the engine took it in (at the top of its loop: after the step in flight), its
    first forward pass began, that pass ended with its first token, the front end had the
    token."""
    return {
        "arrival_ns": arrival,
        "sent_ns": sent,
        "received_ns": info.get("received_ns", 0),
        "scheduled_ns": info.get("scheduled_ns", 0),
        "first_ns": info.get("first_ns", 0),
        "frontend_first_ns": first,
    }


async def _sse(
    rid: str, asked: Asked, tokens, arrival: int, stamps: dict, metrics: Metrics, served: str, chat: bool
):  # arrival: when the handler got the request; stamps["sent_ns"]: when it went to the engine
    created = int(time.time())
    obj = "chat.completion.chunk" if chat else "text_completion"
    first = last = 0
    n = 0
    info: dict = {}

    def chunk(choices, usage=None, timing=None) -> bytes:
        body = {"id": rid, "object": obj, "created": created, "model": served, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        if timing is not None:
            body["servesim_timing"] = timing
        return f"data: {json.dumps(body)}\n\n".encode()

    try:
        async for t in tokens:
            now = time.perf_counter_ns()
            if first:
                metrics.itl.observe((now - last) * 1e-9)
            first = first or now
            last = now
            n += 1
            reason = "length" if t.finished else None
            if chat:
                delta = {"content": decode(t.token)}
                if n == 1:
                    delta["role"] = "assistant"
                yield chunk([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}])
            else:
                yield chunk([{"index": 0, "text": decode(t.token), "logprobs": None, "finish_reason": reason}])
            info = t.info or info
    except (EngineDied, ValueError) as err:
        yield f"data: {json.dumps({'error': {'message': str(err), 'type': 'server_error', 'code': 500}})}\n\n".encode()
        return
    metrics.finished(arrival, first, last, info)
    if asked.usage_in_stream:
        usage = {"prompt_tokens": len(asked.prompt), "completion_tokens": n, "total_tokens": len(asked.prompt) + n}
        yield chunk([], usage, _timing(arrival, stamps.get("sent_ns", 0), first, info))
    yield b"data: [DONE]\n\n"
