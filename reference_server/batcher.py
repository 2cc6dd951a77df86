"""The server's dynamic batcher, with the simulator's (and Triton's) semantics.

Requests wait in one FIFO queue. A model instance that is free takes a batch: at once when
``max_batch_size`` items are queued, otherwise when the oldest queued request has waited
``max_queue_delay_ms`` (then everything queued, up to the maximum). A request that finds
``max_queue_size`` requests queued is refused (:class:`Overloaded`, HTTP 503). Each
model instance runs one batch at a time (:mod:`reference_server.instances`: a process of
its own, or a thread), so the event loop keeps accepting requests while the model
computes. An instance that dies takes no more batches; when none is left, queued and new
requests fail with :class:`~reference_server.instances.InstanceDied` (HTTP 503).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from reference_server.instances import InstanceDied

Outputs = tuple[list, dict]  # outputs per request, stage timings (ns)


class Instance(Protocol):
    """A model instance: runs one batch at a time."""

    alive: bool
    died: str | None

    def run(self, items: list[dict]) -> Awaitable[Outputs]: ...

    # optional: ``start(items) -> Future`` hands a batch over synchronously, and the instance
    # calls ``on_free()`` from its I/O callback the moment a batch is back (ProcessInstance)

    def close(self, timeout_s: float = 10.0) -> None: ...


class CallableInstance:
    """A plain ``run(items) -> (outputs, timings)`` function as an instance, on a thread."""

    def __init__(self, run: Callable[[list[dict]], Outputs]):
        self._fn = run
        self.alive, self.died = True, None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")

    async def run(self, items: list[dict]) -> Outputs:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._fn, items)

    def close(self, timeout_s: float = 10.0) -> None:
        self._pool.shutdown(wait=True)


class Overloaded(Exception):
    """The queue is full."""


@dataclass
class Pending:
    """A request waiting for its batch."""

    item: dict
    n: int  # items in the request (its batch dimension)
    t_enqueue_ns: int
    future: asyncio.Future
    t_dispatch_ns: int = 0
    batch_size: int = 0
    timing: dict = field(default_factory=dict)


class DynamicBatcher:
    """Batches requests for model instances (or one ``run(items) -> (outputs, timings)``)."""

    def __init__(
        self,
        instances: Sequence[Instance] | Callable[[list[dict]], Outputs],
        *,
        max_batch_size: int,
        max_queue_delay_ms: float,
        max_queue_size: int | None = None,
        on_batch: Callable[[int, dict], None] | None = None,
    ):
        if callable(instances):
            instances = [CallableInstance(instances)]
        if max_batch_size < 1 or max_queue_delay_ms < 0 or not instances:
            raise ValueError("max_batch_size >= 1, max_queue_delay_ms >= 0 and at least one instance")
        if max_queue_size is not None and max_queue_size < 1:
            raise ValueError("max_queue_size must be >= 1")
        self.instances = list(instances)
        self.on_batch = on_batch  # (items, stage timings ns) of every batch that ran
        self.max_batch_size = max_batch_size
        self.delay_ns = int(max_queue_delay_ms * 1e6)
        self.max_queue_size = max_queue_size
        self.queue: deque[Pending] = deque()
        self.in_flight = 0  # requests taken into batches and not yet answered
        self.batches = 0
        self._arrived: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self._arrived = asyncio.Event()
        self._tasks = [asyncio.create_task(self._instance(inst)) for inst in self.instances]

    async def stop(self) -> None:
        """Finish everything queued, then stop the instances."""
        while (self.queue and self.serving) or self.in_flight:
            await asyncio.sleep(0.005)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._fail_queued()  # only when every instance died with requests still queued
        for inst in self.instances:
            inst.close()

    @property
    def serving(self) -> bool:
        """Whether any instance is alive."""
        return any(inst.alive for inst in self.instances)

    def unavailable(self) -> str | None:
        """Why no request can be served (every instance died), or None."""
        if self.serving:
            return None
        return "; ".join(inst.died or "model instance stopped" for inst in self.instances)

    def full(self, ahead: int = 0) -> bool:
        """Whether a request arriving now would be refused, with ``ahead`` more on their way in."""
        return self.max_queue_size is not None and len(self.queue) + ahead >= self.max_queue_size

    async def submit(self, item: dict, n: int) -> Pending:
        """Queue one request of ``n`` items; returns it answered (``future`` holds its outputs)."""
        p = self.enqueue(item, n)
        await p.future
        return p

    def enqueue(self, item: dict, n: int) -> Pending:
        """Queue one request of ``n`` items now; its ``future`` is answered with its outputs
        (a caller that needs no task per request adds a done callback)."""
        if not 1 <= n <= self.max_batch_size:
            raise ValueError(f"a request carries 1..{self.max_batch_size} items (max_batch_size); got {n}")
        if self.full():
            raise Overloaded(f"queue full ({self.max_queue_size} requests)")
        dead = self.unavailable()
        if dead:
            raise InstanceDied(dead)
        p = Pending(item, n, time.perf_counter_ns(), asyncio.get_running_loop().create_future())
        self.queue.append(p)
        self._arrived.set()
        return p

    def _queued_items(self) -> int:
        total = 0
        for p in self.queue:
            total += p.n
            if total >= self.max_batch_size:
                break
        return total

    def _fail_queued(self) -> None:
        """Every instance is gone: nothing queued will be served."""
        err = InstanceDied(self.unavailable() or "no model instance")
        while self.queue:
            p = self.queue.popleft()
            if not p.future.done():
                p.future.set_exception(err)

    def _ready(self) -> bool:
        """Whether a free instance would take a batch now: a full one is queued, or the oldest
        request has waited its ``max_queue_delay_ms``."""
        return bool(self.queue) and (
            self._queued_items() >= self.max_batch_size
            or time.perf_counter_ns() >= self.queue[0].t_enqueue_ns + self.delay_ns
        )

    def _launch(self, inst: Instance) -> tuple[list[Pending], int, asyncio.Future]:
        """Take a batch from the queue and hand it to ``inst``."""
        batch, size = [], 0
        while self.queue and size + self.queue[0].n <= self.max_batch_size:
            p = self.queue.popleft()
            batch.append(p)
            size += p.n
        now = time.perf_counter_ns()
        for p in batch:
            p.t_dispatch_ns, p.batch_size = now, size
        self.in_flight += len(batch)
        self.batches += 1
        items = [p.item for p in batch]
        start = getattr(inst, "start", None)
        try:
            job = start(items) if start is not None else asyncio.ensure_future(inst.run(items))
        except Exception as err:  # the instance is gone: the batch gets the error
            job = asyncio.get_running_loop().create_future()
            job.set_exception(err)
        return batch, size, job

    async def _instance(self, inst: Instance) -> None:
        early: list = []  # a batch handed over the moment the last one came back

        def on_free() -> None:
            if self._ready() and inst.alive:
                early.append(self._launch(inst))

        if hasattr(inst, "start"):
            inst.on_free = on_free
        while inst.alive:
            if early:
                batch, size, job = early.pop()
            else:
                while not self.queue:
                    self._arrived.clear()
                    await self._arrived.wait()
                deadline = self.queue[0].t_enqueue_ns + self.delay_ns
                while self.queue and self._queued_items() < self.max_batch_size:
                    remaining = (deadline - time.perf_counter_ns()) / 1e9
                    if remaining <= 0:
                        break
                    self._arrived.clear()
                    # a timeout is checked against the clock, not trusted: uvloop's timers are
                    # whole milliseconds on a loop clock cached at the last iteration, and fire
                    # up to ~0.4 ms early (measured: 9.6% of a light load's batches went before
                    # their window); the loop then waits out what is left (under a millisecond,
                    # uvloop rounds the timeout to zero: a few loop iterations, not a sleep)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._arrived.wait(), remaining)
                if not self.queue:  # another instance took them
                    continue
                batch, size, job = self._launch(inst)
            try:
                outputs, timing = await job
            except Exception as err:  # the model failed: every request of the batch gets the error
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(err)
            else:
                if self.on_batch is not None:
                    self.on_batch(size, timing)
                for p, out in zip(batch, outputs, strict=True):
                    p.timing = timing
                    if not p.future.done():
                        p.future.set_result(out)
            finally:
                self.in_flight -= len(batch)
        if not self.serving:
            self._fail_queued()
