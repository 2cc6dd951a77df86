"""The engine in a process of its own, and the front end's client of it.

The front end (HTTP, JSON, SSE) and the engine (the scheduler and the model) would fight
for one GIL in one process, as the image server's instances would
(:mod:`reference_server.instances`). So the engine runs in a spawned process that steps
while it has work and otherwise waits on its pipe; the front end sends it requests and
aborts and, woken by the pipe on its event loop, hands each step's tokens to the streams
waiting for them. The engine process dies with its parent (``PR_SET_PDEATHSIG``) and stops
when the pipe closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing as mp
import os
import signal
import threading
import time

from reference_server.lifetime import die_with_parent
from reference_server.llm.engine import EngineConfig

START_TIMEOUT_S = 120.0
MAX_STEP_RECORDS = 200_000  # kept for a calibration to fetch (GET /servesim/steps)


def engine_main(conn, cfg: EngineConfig, threads: int, core: int | None = None, idle: str = "sleep") -> None:
    """The engine process: build, warm up, say ready, then step while there is work. Idle,
    it sleeps on its pipe (``idle="sleep"``) or polls it without sleeping (``"spin"``: the
    core stays busy, as an engine that busy-polls its input keeps it)."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the front end, which stops us
    if core is not None:  # a core of its own: the front end and the clients run on the others
        os.sched_setaffinity(0, {core})
    import torch

    from reference_server.llm.engine import Engine

    torch.set_num_threads(threads)
    engine = Engine(cfg)
    engine.add("warmup", [1] * min(32, cfg.max_model_len - 2), 2)
    engine.run_all()
    engine.steps.clear()
    engine.blocks.hits = engine.blocks.queries = 0
    conn.send(("ready", os.getpid(), str(engine.model.device)))
    while True:
        begin = time.perf_counter_ns()
        try:
            timeout = 0.0 if engine.busy or idle == "spin" else 0.5
            while conn.poll(timeout):
                if timeout:  # woken from idle: the step begins with this message
                    begin = time.perf_counter_ns()
                timeout = 0.0
                msg = conn.recv()
                if msg is None:
                    return
                kind = msg[0]
                if kind == "add":
                    _, rid, prompt, max_tokens, arrival_ns = msg
                    try:
                        engine.add(rid, prompt, max_tokens, arrival_ns)
                    except ValueError as err:
                        conn.send(("refused", rid, str(err)))
                elif kind == "abort":
                    engine.abort(msg[1])
                elif kind == "steps":  # the step records not fetched yet (calibration)
                    conn.send(("steps", [dataclasses.astuple(s) for s in engine.steps]))
                    engine.steps.clear()
        except (EOFError, OSError):  # the front end is gone
            return
        if engine.busy:
            recorded = len(engine.steps)
            tokens = engine.step(begin)
            try:
                conn.send(("tokens", tokens, engine.gauges()))
            except (BrokenPipeError, OSError):
                return
            if len(engine.steps) > recorded:  # a step ran (not one whose sequences were all preempted)
                engine.steps[-1].done_ns = time.perf_counter_ns()
            if len(engine.steps) > MAX_STEP_RECORDS:  # nobody fetches them: keep the latest
                del engine.steps[: MAX_STEP_RECORDS // 2]


class EngineDied(RuntimeError):
    pass


class EngineClient:
    """The front end's handle on the engine process."""

    def __init__(self, cfg: EngineConfig, threads: int = 1, core: int | None = None, idle: str = "sleep"):
        self.cfg = cfg
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        args = (child, cfg, threads, core, idle)
        self.proc = ctx.Process(target=engine_main, args=args, daemon=True, name="llm-engine")
        self.proc.start()
        child.close()
        self.streams: dict[str, asyncio.Queue] = {}
        self.gauges = {"running": 0, "waiting": 0, "kv_usage": 0.0, "preemptions": 0, "prefix_hits": 0}
        self.gauges["prefix_queries"] = 0
        self.device = ""
        self._steps: asyncio.Future | None = None
        self.on_token = None  # called with each Token and the time it reached the front end

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        if not self.conn.poll(timeout_s):
            raise EngineDied(f"the engine did not start in {timeout_s:.0f} s")
        try:
            msg = self.conn.recv()
        except EOFError:
            raise EngineDied(f"the engine exited while starting (exit code {self.proc.exitcode})") from None
        self.device = msg[2]

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hand the engine's messages to ``loop`` from now on. A thread reads the pipe,
        blocking, and passes each message on as it arrives: an event loop's reader would
        make the pipe non-blocking (uvloop does), and a message longer than the pipe's
        buffer (a calibration's step records) would then be read in part and lost."""
        self._loop = loop
        self._reader = threading.Thread(target=self._read, name="llm-engine-reader", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self.proc.is_alive()

    def _read(self) -> None:
        loop = self._loop
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):  # the engine is gone (or the client closed)
                with contextlib.suppress(RuntimeError):  # the loop may be closed already
                    loop.call_soon_threadsafe(self._died)
                return
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._handle, msg, time.perf_counter_ns())

    def _died(self) -> None:
        for q in self.streams.values():
            q.put_nowait(EngineDied("the engine process exited"))

    def _handle(self, msg, now_ns: int) -> None:
        kind = msg[0]
        if kind == "tokens":
            _, tokens, self.gauges = msg
            for t in tokens:
                if self.on_token is not None:
                    self.on_token(t, now_ns)
                q = self.streams.get(t.rid)
                if q is not None:
                    q.put_nowait(t)
        elif kind == "refused":
            q = self.streams.get(msg[1])
            if q is not None:
                q.put_nowait(ValueError(msg[2]))
        elif kind == "steps" and self._steps is not None and not self._steps.done():
            self._steps.set_result(msg[1])

    async def generate(self, rid: str, prompt: list[int], max_tokens: int, arrival_ns: int, stamps=None):
        """The request's tokens as the engine makes them (an async iterator of Token); when it
        was handed to the engine's process goes in ``stamps["sent_ns"]`` if given."""
        q: asyncio.Queue = asyncio.Queue()
        self.streams[rid] = q
        over = False  # the engine is done with it (finished or refused): nothing to abort
        try:
            if stamps is not None:  # before the send: the engine may take it in before send returns
                stamps["sent_ns"] = time.perf_counter_ns()
            self.conn.send(("add", rid, prompt, max_tokens, arrival_ns))
            while True:
                item = await q.get()
                if isinstance(item, Exception):
                    over = True
                    raise item
                over = item.finished
                yield item
                if over:
                    return
        finally:
            self.streams.pop(rid, None)
            if not over:  # the client went away: the engine drops the request
                with contextlib.suppress(OSError):
                    self.conn.send(("abort", rid))

    async def step_records(self) -> list[tuple]:
        """The engine's step records since the last call."""
        self._steps = asyncio.get_running_loop().create_future()
        self.conn.send(("steps",))
        return await asyncio.wait_for(self._steps, 30.0)

    def close(self, timeout_s: float = 10.0) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.proc.join(timeout_s)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5.0)
        reader = getattr(self, "_reader", None)
        if reader is not None:  # the engine's end closed: its recv returns
            reader.join(5.0)
        self.conn.close()
