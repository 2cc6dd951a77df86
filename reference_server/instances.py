"""Model instances in processes of their own, as TorchServe's workers and Triton's
Python-backend stubs run them.

Why processes: a forward pass in a thread of the server's process re-takes the GIL from
the event loop, the decode thread and the batcher at every module call. Measured on a
2-core VM, a ResNet forward on core 1 took 6.0 ms alone, 11.7 ms beside a busy Python
*thread* of the same process on core 0, and 6.0 ms beside a busy *process* there: the
service time of an in-process model depends on the front end's load.

Each :class:`ProcessInstance` is a spawned process that builds the model from its config
(same seed, same weights), pins itself to a core when given one, runs torch with its own
intra-op threads (on CUDA: its own context and stream), warms up, and then serves one
batch at a time. The hand-off uses shared memory and a pipe:

1. the front end writes the batch's stacked inputs into the instance's input block (the
   collate is this copy) and sends ``(seq, items)`` over the pipe;
2. the instance wraps the block in tensors (no copy on the CPU), runs the forward pass,
   writes the output columns into its output block and answers with its timestamps;
3. the front end, woken by the pipe on its event loop, copies the outputs out.

``perf_counter_ns`` is CLOCK_MONOTONIC on Linux, one clock for every process, so the
hand-off (copy in, wake-up, copy out) is measured as a stage of its own, ``handoff``,
beside ``compute_input``, ``compute_infer`` and ``compute_output``.

An instance that dies (killed, out of memory, a crash in native code) is noticed on its
pipe: its batch fails with :class:`InstanceDied`, it takes no more batches, and the server
reports it (503, readiness false). An instance dies with its front end too: the pipe
closes, and on Linux the kernel sends it SIGKILL when its parent goes
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from reference_server.lifetime import die_with_parent
from reference_server.models import ModelConfig, ServedModel, split_columns
from reference_server.protocol import DTYPES

log = logging.getLogger("servesim.server")

START_TIMEOUT_S = 180.0  # spawn, import torch, build, warm up


class InstanceDied(RuntimeError):
    """A model instance's process is gone (HTTP 503)."""


@dataclass(frozen=True)
class Block:
    """Where each named column of a batch lies in a shared-memory block."""

    columns: tuple[tuple[str, str, tuple[int, ...], int], ...]  # name, dtype, per-item shape, offset
    nbytes: int

    @classmethod
    def plan(cls, columns: dict[str, tuple[np.dtype, tuple[int, ...]]], max_items: int) -> Block:
        out, offset = [], 0
        for name, (dtype, shape) in columns.items():
            dt = np.dtype(dtype)
            out.append((name, dt.str, tuple(shape), offset))
            size = dt.itemsize * int(np.prod(shape, dtype=np.int64)) * max_items
            offset += -(-size // 64) * 64  # 64-byte aligned columns
        return cls(tuple(out), max(offset, 64))

    def views(self, buf: memoryview, max_items: int) -> dict[str, np.ndarray]:
        return {
            name: np.ndarray((max_items, *shape), dtype=np.dtype(dt), buffer=buf, offset=offset)
            for name, dt, shape, offset in self.columns
        }


@dataclass(frozen=True)
class InstanceSpec:
    """What an instance process needs to start: everything picklable."""

    index: int
    model: ModelConfig
    max_batch_size: int
    inputs: Block
    outputs: Block
    core: int | None
    threads: int
    device: str | None
    warmup_batches: int
    idle: str = "sleep"  # between batches: sleep on the pipe, or "spin" (poll it, the core kept busy)
    shm_in: str = ""  # filled in by the front end, which owns the blocks
    shm_out: str = ""


def instance_main(conn, spec: InstanceSpec) -> None:
    """The instance process: build, warm up, say ready, then serve batches until told to stop."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the front end, which stops us
    if spec.core is not None:
        os.sched_setaffinity(0, {spec.core})
    import torch

    torch.set_num_threads(spec.threads)
    # a spawned child shares the front end's resource tracker, so the front end's unlink is the only one
    shm_in, shm_out = SharedMemory(spec.shm_in), SharedMemory(spec.shm_out)
    try:
        model = ServedModel(spec.model, spec.device)
        cuda = model.device.type == "cuda"
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        ins = spec.inputs.views(shm_in.buf, spec.max_batch_size)
        outs = spec.outputs.views(shm_out.buf, spec.max_batch_size)
        rng = np.random.default_rng(spec.model.seed)
        for _ in range(spec.warmup_batches):
            model.forward(model.collate(model.example(min(2, spec.max_batch_size), rng)))
        gc.collect()
        gc.freeze()  # torch's objects out of the collector's scans: no 80 ms collection inside a forward
        conn.send(("ready", os.getpid(), str(model.device)))
        spin = spec.idle == "spin"
        while True:
            try:
                while spin and not conn.poll(0):  # a busy core: the host keeps its clock up
                    pass
                msg = conn.recv()
            except (EOFError, OSError):  # the front end is gone
                break
            if msg is None:
                break
            seq, items = msg
            t0 = time.perf_counter_ns()
            try:
                batch = model.to_device({name: view[:items] for name, view in ins.items()})
                sync()
                t1 = time.perf_counter_ns()
                y = model.forward(batch)
                sync()
                t2 = time.perf_counter_ns()
                for name, col in model.columns(y).items():
                    outs[name][:items] = col
                t3 = time.perf_counter_ns()
                del batch, y  # the tensors view the input block: release them before the next batch
                conn.send((seq, (t0, t1, t2, t3)))
            except Exception as err:  # the model failed on this batch: report, keep serving
                conn.send((seq, f"{type(err).__name__}: {err}"))
    finally:
        for shm in (shm_in, shm_out):
            with contextlib.suppress(BufferError):  # views may still hold the block: the exit frees it
                shm.close()


class ProcessInstance:
    """The front end's handle on one instance process."""

    def __init__(self, spec: InstanceSpec):
        self._shm_in = SharedMemory(create=True, size=spec.inputs.nbytes)
        self._shm_out = SharedMemory(create=True, size=spec.outputs.nbytes)
        spec = dataclasses.replace(spec, shm_in=self._shm_in.name, shm_out=self._shm_out.name)
        self.spec = spec
        self._in = spec.inputs.views(self._shm_in.buf, spec.max_batch_size)
        self._out = spec.outputs.views(self._shm_out.buf, spec.max_batch_size)
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=instance_main, args=(child, spec), name=f"instance-{spec.index}", daemon=True)
        self.process.start()
        child.close()  # only the instance holds that end: its exit closes the pipe
        self.pid = self.process.pid
        self.device = ""
        self._seq = 0
        self._busy = False
        self.died: str | None = None
        self._death_logged = False
        self.on_free: Callable[[], None] | None = None  # called the moment a batch is back

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Block until the instance has built and warmed its model (raises InstanceDied)."""
        if not self._conn.poll(timeout_s):
            self.close()
            raise InstanceDied(f"instance {self.spec.index} did not start within {timeout_s:.0f} s")
        try:
            tag, _pid, self.device = self._conn.recv()
        except (EOFError, OSError):
            self.process.join(5)
            raise InstanceDied(self._death_message()) from None
        assert tag == "ready"

    @property
    def alive(self) -> bool:
        if self.died is None and not self.process.is_alive():
            self.died = self._death_message()
        return self.died is None

    def _death_message(self) -> str:
        """What a client is told (no pid: the process table is the server's business); the
        server's log names the pid, once."""
        code = self.process.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        if not self._death_logged:
            self._death_logged = True
            log.error("model instance %d (pid %s) %s", self.spec.index, self.pid, how)
        return f"model instance {self.spec.index} {how}"

    async def run(self, items: list[dict[str, np.ndarray]]) -> tuple[list[dict], dict]:
        """One batch: outputs per request, and the stage timings in ns."""
        return await self.start(items)

    def start(self, items: list[dict[str, np.ndarray]]) -> asyncio.Future:
        """Hand one batch to the instance now; the future gets (outputs per request, stage
        timings in ns). The answer is taken in the pipe's I/O callback, which then calls
        ``on_free`` (if set) before any task runs: the batcher can hand over the next batch the
        moment this one is back, instead of after the event loop's queue of ready tasks (at twice
        the capacity that wait left the instance idle ~15% of the time)."""
        if not self.alive:
            raise InstanceDied(self.died)
        if self._busy:
            raise RuntimeError("an instance runs one batch at a time")
        t_start = time.perf_counter_ns()
        sizes = [len(next(iter(it.values()))) for it in items]
        total = sum(sizes)
        for name, view in self._in.items():  # the collate: stack straight into shared memory
            pos = 0
            for it, n in zip(items, sizes, strict=True):
                view[pos : pos + n] = it[name]
                pos += n
        self._seq += 1
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        try:
            self._conn.send((self._seq, total))
        except (OSError, BrokenPipeError):
            done.set_exception(self._dead())
            return done
        self._busy = True
        loop.add_reader(self._conn.fileno(), self._answered, loop, done, sizes, t_start)
        return done

    def _dead(self) -> InstanceDied:
        self.process.join(5)
        self.died = self._death_message()
        return InstanceDied(self.died)

    def _answered(self, loop, done: asyncio.Future, sizes: list[int], t_start: int) -> None:
        loop.remove_reader(self._conn.fileno())
        self._busy = False
        try:
            seq, result = self._conn.recv()
        except (EOFError, OSError):
            if not done.done():
                done.set_exception(self._dead())
            return
        if not done.done():  # else its waiter was cancelled: nothing to answer
            if isinstance(result, str):
                done.set_exception(RuntimeError(f"model instance {self.spec.index}: {result}"))
            else:
                assert seq == self._seq
                done.set_result(self._outputs(result, sizes, t_start))
        if self.on_free is not None:
            self.on_free()

    def _outputs(self, stamps: tuple, sizes: list[int], t_start: int) -> tuple[list[dict], dict]:
        """The batch's outputs per request, copied out of shared memory, and its stage timings."""
        t0, t1, t2, t3 = stamps
        total = sum(sizes)
        cols = {name: view[:total].copy() for name, view in self._out.items()}
        t_end = time.perf_counter_ns()
        timing = {
            "compute_input": t1 - t0,
            "compute_infer": t2 - t1,
            "compute_output": t3 - t2,
            "handoff": (t0 - t_start) + (t_end - t3),  # copy in + wake-up, wake-up + copy out
            "handoff_in": t0 - t_start,  # the first half: which side was late when the hand-off is slow
        }
        return split_columns(cols, sizes), timing

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the process (asked, then terminated, then killed) and free the blocks."""
        with contextlib.suppress(OSError, BrokenPipeError, ValueError):
            self._conn.send(None)
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self._conn.close()
        self._in = self._out = {}
        for shm in (self._shm_in, self._shm_out):
            with contextlib.suppress(FileNotFoundError, BufferError):
                shm.close()
                shm.unlink()


class ThreadInstance:
    """The model in a thread of the server's process (``--instance-mode thread``): the
    design this module replaces, kept to measure what the GIL costs."""

    def __init__(self, index: int, model: ServedModel, core: int | None):
        self.index, self.model = index, model
        self.pid = os.getpid()
        self.device = str(model.device)
        self.died: str | None = None
        self.alive = True
        self._pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"model-{index}", initializer=_pin_thread, initargs=(core,)
        )

    def _batch(self, items: list[dict]) -> tuple[list, dict]:
        import torch

        sync = torch.cuda.synchronize if self.model.device.type == "cuda" else (lambda: None)
        t0 = time.perf_counter_ns()
        batch = self.model.collate(items)
        sync()
        t1 = time.perf_counter_ns()
        y = self.model.forward(batch)
        sync()
        t2 = time.perf_counter_ns()
        outs = self.model.split(y, [len(next(iter(it.values()))) for it in items])
        t3 = time.perf_counter_ns()
        return outs, {"compute_input": t1 - t0, "compute_infer": t2 - t1, "compute_output": t3 - t2, "handoff": 0}

    async def run(self, items: list[dict]) -> tuple[list[dict], dict]:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._batch, items)

    def close(self, timeout_s: float = 10.0) -> None:
        self._pool.shutdown(wait=True)


def _pin_thread(core: int | None) -> None:
    if core is not None:
        os.sched_setaffinity(0, {core})


def instance_cores(request: str, instances: int, cores: int | None = None) -> list[int | None]:
    """Which core each instance gets: ``auto`` gives each its own core, from the last one
    down, when the front end still keeps at least one; ``none`` pins nothing; or a
    comma-separated list, one core per instance."""
    cores = cores or os.cpu_count() or 1
    text = request.strip().lower()
    if text == "none":
        return [None] * instances
    if text == "auto":
        if cores <= instances:  # no core to spare for the front end: leave it to the scheduler
            return [None] * instances
        return [cores - 1 - k for k in range(instances)]
    try:
        chosen = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--instance-cores: 'auto', 'none' or core numbers like 1,2; got {request!r}") from None
    if len(chosen) != instances:
        raise ValueError(f"--instance-cores names {len(chosen)} cores for {instances} instances")
    bad = [c for c in chosen if not 0 <= c < cores]
    if bad:
        raise ValueError(f"--instance-cores: core {bad[0]} does not exist (this machine has 0..{cores - 1})")
    return list(chosen)


def blocks(model: ServedModel, max_batch_size: int) -> tuple[Block, Block]:
    """The shared-memory layouts of a batch's inputs (as preprocessed) and outputs."""
    example = model.example(1, np.random.default_rng(0))[0]
    inputs = {name: (arr.dtype, arr.shape[1:]) for name, arr in example.items()}
    outputs = {s.name: (DTYPES[s.datatype], tuple(s.shape[1:])) for s in model.outputs}
    return Block.plan(inputs, max_batch_size), Block.plan(outputs, max_batch_size)
