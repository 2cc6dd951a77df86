"""A front-end worker's side of the hub (``servesim serve --frontends N``,
:mod:`reference_server.hub`): the wire between them.

Messages go both ways as length-prefixed pickles written through asyncio transports
(:func:`pack`, :func:`receive`; a write never blocks either side). In a worker,
:class:`Relay` stands where a :class:`~reference_server.batcher.DynamicBatcher` stands in a
single front end: a request's preprocessed item goes to the hub's one batcher and its
outputs come back, with the hub's queue length and the instances' health as the hub last
told them; :class:`RelayMetrics` sends every observation to the hub's one set of metrics.
:func:`reference_server.relay_worker.worker_main` is the worker process: the whole front
end of :mod:`reference_server.frontend`, serving the connections the hub deals it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import pickle
import socket
import struct
import time
from dataclasses import dataclass, field

from reference_server.batcher import Overloaded
from reference_server.instances import InstanceDied

_HEAD = struct.Struct("!I")


def pack(msg) -> bytes:
    """One message as written on a relay socket: its length, then its pickle."""
    data = pickle.dumps(msg, protocol=5)
    return _HEAD.pack(len(data)) + data


async def receive(reader: asyncio.StreamReader):
    """The next message on a relay socket (raises IncompleteReadError when it closes)."""
    (n,) = _HEAD.unpack(await reader.readexactly(_HEAD.size))
    return pickle.loads(await reader.readexactly(n))


@dataclass
class HubInfo:
    """What a worker is told about the server it is part of (picklable)."""

    index: int
    frontends: int
    instances: list[dict]  # index, pid, core, device
    frontend_cores: list[int]
    pinned: bool
    hub_pid: int


@dataclass
class RelayPending:
    """A request the hub is batching; the worker-side twin of :class:`~reference_server.batcher.Pending`."""

    future: asyncio.Future
    t_sent_ns: int
    t_enqueue_ns: int = 0
    t_dispatch_ns: int = 0
    batch_size: int = 0
    timing: dict = field(default_factory=dict)
    relay_ns: int = 0


class _InstanceView:
    """A worker's view of one instance: what ``/config`` and readiness read."""

    def __init__(self, info: dict):
        self.pid, self.device, self.index = info["pid"], info["device"], info["index"]
        self.died: str | None = None

    @property
    def alive(self) -> bool:
        return self.died is None


class Relay:
    """A worker's link to the hub: requests out, outputs and the hub's state back.

    It stands where a :class:`~reference_server.batcher.DynamicBatcher` stands in a single
    front end (``submit``, ``full``, ``unavailable``, ``instances``, ``queue``)."""

    def __init__(self, sock: socket.socket, info: HubInfo, max_queue_size: int | None):
        self._sock, self.info = sock, info
        self.max_queue_size = max_queue_size
        self.instances = [_InstanceView(i) for i in info.instances]
        self.queued = 0  # the hub's queue, as last told
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._waiting: dict[int, RelayPending] = {}
        self._asked: dict[int, asyncio.Future] = {}
        self._next = 0
        self.lost: str | None = None
        self.on_drain = None  # called when the hub starts draining

    @property
    def queue(self) -> range:  # len() of it is what /metrics reports as pending
        return range(self.queued)

    async def connect(self) -> None:
        reader, self._writer = await asyncio.open_connection(sock=self._sock)
        self._reader_task = asyncio.create_task(self._read(reader))

    def start(self) -> None:  # the batcher's interface: the hub's batcher is already running
        pass

    async def stop(self) -> None:
        """Wait for the requests still with the hub (the hub outlives its workers), then close."""
        deadline = time.monotonic() + 30
        while self._waiting and self.lost is None and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        if self._reader_task is not None:
            self._reader_task.cancel()
            await asyncio.gather(self._reader_task, return_exceptions=True)
        if self._writer is not None:
            self._writer.close()

    def send(self, msg) -> None:
        if self._writer is not None and self.lost is None:
            send_to(self._writer, pack(msg))

    def full(self, ahead: int = 0) -> bool:
        return self.max_queue_size is not None and self.queued + ahead >= self.max_queue_size

    def unavailable(self) -> str | None:
        if self.lost is not None:
            return self.lost
        if any(inst.alive for inst in self.instances):
            return None
        return "; ".join(inst.died or "model instance stopped" for inst in self.instances)

    async def submit(self, item: dict, n: int) -> RelayPending:
        """Send one request's item to the hub's batcher; returns it answered."""
        dead = self.unavailable()
        if dead:
            raise InstanceDied(dead)
        self._next += 1
        rid = self._next
        p = RelayPending(asyncio.get_running_loop().create_future(), time.perf_counter_ns())
        self._waiting[rid] = p
        try:
            self.send(("infer", rid, item, n))
            await p.future
        finally:
            self._waiting.pop(rid, None)
        return p

    async def ask(self, what: str):
        """Ask the hub for ``scrape`` (the /metrics text) or ``stats`` (Triton's statistics)."""
        if self.lost is not None:
            raise InstanceDied(self.lost)
        self._next += 1
        qid = self._next
        fut = asyncio.get_running_loop().create_future()
        self._asked[qid] = fut
        try:
            self.send(("ask", qid, what))
            async with asyncio.timeout(10):
                return await fut
        finally:
            self._asked.pop(qid, None)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                self._take(await receive(reader))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            self.lost = "the server's batcher process is gone"
            err = InstanceDied(self.lost)
            for p in self._waiting.values():
                if not p.future.done():
                    p.future.set_exception(err)
            for fut in self._asked.values():
                if not fut.done():
                    fut.set_exception(err)

    def _take(self, msg) -> None:
        kind = msg[0]
        if kind == "done":
            _, rid, outputs, t_enq, t_disp, size, timing, t_in, t_out, self.queued = msg
            p = self._waiting.get(rid)
            if p is not None and not p.future.done():
                p.t_enqueue_ns, p.t_dispatch_ns, p.batch_size, p.timing = t_enq, t_disp, size, timing
                p.relay_ns = max((t_in - p.t_sent_ns) + (time.perf_counter_ns() - t_out), 0)
                p.future.set_result(outputs)
        elif kind == "error":
            _, rid, what, text, self.queued = msg
            p = self._waiting.get(rid)
            if p is not None and not p.future.done():
                err = {"overloaded": Overloaded, "instance_died": InstanceDied}.get(what, RuntimeError)(text)
                p.future.set_exception(err)
        elif kind == "answer":
            _, qid, payload = msg
            fut = self._asked.get(qid)
            if fut is not None and not fut.done():
                fut.set_result(payload)
        elif kind == "state":
            _, self.queued, died = msg
            for inst, why in zip(self.instances, died, strict=True):
                inst.died = why
        elif kind == "drain" and self.on_drain is not None:
            self.on_drain()


class RelayMetrics:
    """A worker's metrics: every observation goes to the hub's one set; scrapes ask it."""

    def __init__(self, relay: Relay):
        self.relay = relay
        self.gpu = _NoNotice()
        self._gc_t0 = 0
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter_ns()
        elif self._gc_t0:
            self.relay.send(("gc", str(info["generation"]), (time.perf_counter_ns() - self._gc_t0) / 1e9))

    def observe(self, timing_us: dict[str, float], items: int) -> None:
        self.relay.send(("observe", timing_us, items))

    def observe_batch(self, size: int, timing_ns: dict[str, int]) -> None:  # the hub's batcher counts batches
        pass

    def fail(self, reason: str) -> None:
        self.relay.send(("fail", reason))

    def close(self) -> None:
        if self._gc in gc.callbacks:
            gc.callbacks.remove(self._gc)


class _NoNotice:
    notice = None  # the hub prints the GPU notice once


def send_to(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Write to the other side (a worker, or the hub), unless it is gone (its transport closed
    under us)."""
    if writer.is_closing():
        return
    with contextlib.suppress(RuntimeError, ConnectionError):
        writer.write(data)


__all__ = ["HubInfo", "Relay", "RelayMetrics", "RelayPending", "pack", "receive", "send_to"]
