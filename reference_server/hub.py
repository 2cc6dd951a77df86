"""Several front-end processes in front of one batcher: ``servesim serve --frontends N``.

One Python process parses HTTP and decodes JPEGs at about a millisecond of CPU a request,
so a single front end tops out near a thousand requests a second whatever the model: on
an H100 the front end set the capacity (852 req/s) while the instance could take 4,321.
uvicorn's ``--workers`` and Triton's HTTP threads answer this by parsing in parallel;
here, as in Triton, the parallel part stays in front of *one* scheduler, so batches still
form from every request on the host:

* **the hub** (the process ``servesim serve`` starts) owns the listening socket, the model
  instances, the dynamic batcher and the server's one set of metrics. It serves no HTTP;
  it takes preprocessed items from the workers, batches them, hands batches to the
  instances (:mod:`reference_server.instances`) and sends each request's outputs back;
* **N workers**, spawned processes, each run the whole front end of
  :mod:`reference_server.frontend` (HTTP, admission, body, decode, features, preprocessing)
  and relay the item to the hub over a socket pair, with length-prefixed pickles written
  through asyncio transports (a write never blocks either side, so neither can wait on the
  other): the worker's side and the wire are :mod:`reference_server.relay`.

**Connections are dealt round-robin.** The hub accepts every connection and passes it to
the next worker (``SCM_RIGHTS`` over a ``SOCK_SEQPACKET`` pair). Workers accepting from a
shared socket themselves, as uvicorn's and gunicorn's do, split the load by who woke
first: on an H100 host with 8 workers, one of them took 61-68% of the requests at 20-30%
load and 22% at 85% (the load generator reuses its most recent free connection, so at
light load a few connections carry everything), and its queue, not the model's, set the
tails. Dealt in turn, N connections used in turn reach the N workers evenly.

Each response's parameters add ``relay_us`` (the two hops between a worker and the hub) and
``frontend`` (which worker answered). ``/metrics`` and ``/v2/models/{m}/stats`` are the
hub's, whichever worker a scrape reaches: workers forward every success, failure and
garbage-collection pause, and ``process_cpu_seconds_total`` is the CPU of the hub and all
its workers (the front end's, as calibration reads it; the instances are not in it).

Signals go to the hub. The first tells every worker to drain (readiness 503,
``Connection: close``, idle keep-alive connections closed) while the hub goes on dealing
connections for ``--drain-s``; then the hub drops new connection attempts, deals those the
kernel has already made, closes its listener and sends the workers SIGTERM: each finishes
its requests within ``--grace-s`` and exits, and the hub stops the batcher and the
instances. A second signal skips the drain. Workers and instances die with the hub (the
kernel's parent-death signal).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing as mp
import os
import signal
import socket
import time

from reference_server.batcher import DynamicBatcher, Overloaded
from reference_server.config import VERSION, ServerConfig
from reference_server.connections import accept_eagerly
from reference_server.draining import quiesce, refuse_new_connections
from reference_server.frontend import FrontEnd  # the same checks and layout as a single front end
from reference_server.instances import InstanceDied
from reference_server.launch import batcher_for, start_instances
from reference_server.metrics import ServerMetrics
from reference_server.relay import HubInfo, pack, receive, send_to
from reference_server.relay_worker import worker_main

log = logging.getLogger("servesim.server")

STATE_EVERY_S = 0.05  # the hub tells the workers its queue length and the instances' health this often
WORKER_START_S = 180.0


class Hub:
    """The hub's side: instances, batcher and metrics, and a link to each worker."""

    def __init__(self, cfg: ServerConfig):
        """Raises ValueError for a configuration that cannot be served (the CLI's exit 2)."""
        if cfg.frontends < 2:
            raise ValueError(f"a hub has at least two front ends; --frontends is {cfg.frontends}")
        if cfg.instance_mode != "process":
            raise ValueError("--frontends above 1 needs --instance-mode process (the model in its own processes)")
        self.cfg, self.frontends = cfg, cfg.frontends
        self.fe = FrontEnd(cfg)  # checks the configuration; its model description lays out the blocks
        self.fe.metrics.close()  # the hub's metrics are made when it runs
        self.workers: list[mp.Process] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.ready: list[asyncio.Event] = []
        self.deals: list[socket.socket] = []  # where each worker's connections are passed
        self.turn = 0  # the worker dealt the next connection
        self.batcher: DynamicBatcher | None = None
        self.stopping = 0

    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.workers if p.pid is not None]

    async def run(self, sock: socket.socket, serve_kwargs: dict, announce) -> int:
        """Start everything, deal connections until a signal (or every worker is gone), stop;
        the exit code."""

        cfg, fe = self.cfg, self.fe
        loop = asyncio.get_running_loop()
        self.ready = [asyncio.Event() for _ in range(self.frontends)]
        instances = await loop.run_in_executor(None, start_instances, cfg, fe.model, fe.cores)
        if fe.pinned:
            os.sched_setaffinity(0, fe.frontend_cores)
        self.metrics = ServerMetrics(fe.name, VERSION, extra_pids=self.worker_pids)
        self.batcher = batcher_for(cfg, instances, self.metrics.observe_batch)
        self.batcher.start()
        self.signals = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._signal)
        info = [
            {"index": k, "pid": inst.pid, "core": fe.cores[k], "device": inst.device}
            for k, inst in enumerate(instances)
        ]
        # each worker caps its own share of the connections
        kw = {**serve_kwargs, "max_connections": -(-serve_kwargs["max_connections"] // self.frontends)}
        ctx = mp.get_context("spawn")
        readers = []
        code = 1
        stop_accepting = _nothing
        try:
            for k in range(self.frontends):
                mine, theirs = socket.socketpair()
                deal, dealt = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                hub_info = HubInfo(k, self.frontends, info, fe.frontend_cores, bool(fe.pinned), os.getpid())
                proc = ctx.Process(
                    target=worker_main, args=(cfg, hub_info, theirs, dealt, kw), name=f"frontend-{k}", daemon=False
                )
                proc.start()
                theirs.close()
                dealt.close()
                self.workers.append(proc)
                self.deals.append(deal)
                reader, writer = await asyncio.open_connection(sock=mine)
                self.writers.append(writer)
                readers.append(asyncio.create_task(self._serve_worker(k, reader, writer)))
            watch = asyncio.create_task(self._broadcast())
            await self._started()
            stop_accepting = accept_eagerly(loop, sock, self._deal)
            gc.collect()
            gc.freeze()
            announce()
            gone = asyncio.create_task(self._all_gone())
            signalled = asyncio.create_task(self.signals.wait())
            await asyncio.wait([signalled, gone], return_when=asyncio.FIRST_COMPLETED)
            if self.signals.is_set():
                code = 0
                await self._drain(sock, serve_kwargs)
            else:
                log.error("every front-end worker exited; stopping")
            stop_accepting()
            for p in self.workers:  # the workers finish what they have (--grace-s) and exit
                if p.is_alive():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.pid, signal.SIGTERM)
            await self._wait_workers(serve_kwargs)
            watch.cancel()
        finally:
            stop_accepting()
            for p in self.workers:
                if p.is_alive():
                    p.kill()
                p.join(5)
            for d in self.deals:
                d.close()
            for r in readers:
                r.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            await self.batcher.stop()
            self.metrics.close()
            self.fe.pre_pool.shutdown(wait=False)
        return code

    async def _started(self) -> None:
        """Every worker ready; raises StartFailed as soon as one exits first (its own error is
        on the console already), or after :data:`WORKER_START_S`."""
        starting = asyncio.ensure_future(asyncio.gather(*(r.wait() for r in self.ready)))
        died = asyncio.ensure_future(self._any_gone())
        try:
            await asyncio.wait([starting, died], timeout=WORKER_START_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            died.cancel()
            if not starting.done():
                starting.cancel()
            await asyncio.gather(starting, died, return_exceptions=True)
        if all(r.is_set() for r in self.ready):
            return
        gone = [(k, p.exitcode) for k, p in enumerate(self.workers) if not p.is_alive()]
        if gone:
            k, code = gone[0]
            raise StartFailed(f"front-end worker {k} exited during start-up (exit code {code})")
        raise StartFailed(f"the front-end workers did not start within {WORKER_START_S:.0f} s")

    async def _any_gone(self) -> None:
        while all(p.is_alive() for p in self.workers):
            await asyncio.sleep(0.1)

    def _deal(self, conn: socket.socket) -> None:
        """Deal an accepted connection to the next live worker (then close the hub's copy)."""
        with conn:
            for _ in range(self.frontends):
                k, self.turn = self.turn, (self.turn + 1) % self.frontends
                if not self.workers[k].is_alive():
                    continue
                try:
                    socket.send_fds(self.deals[k], [b"c"], [conn.fileno()])
                except OSError:  # that worker is gone: the next one
                    continue
                break

    def _signal(self) -> None:
        """SIGTERM or Ctrl-C: drain (the first), or stop at once (a second)."""
        self.stopping += 1
        if self.stopping == 1:
            for w in self.writers:  # readiness 503, Connection: close, idle connections closed
                send_to(w, pack(("drain",)))
        self.signals.set()

    async def _drain(self, sock: socket.socket, serve_kwargs: dict) -> None:
        """Keep dealing connections for ``drain_s`` (load balancers see readiness 503 and stop
        sending), then drop new attempts and deal those the kernel has already made."""

        deadline = time.monotonic() + serve_kwargs["drain_s"]
        while time.monotonic() < deadline and self.stopping == 1:
            await asyncio.sleep(0.02)
        refuse_new_connections(sock)
        # waited on a thread: this loop goes on dealing the connections the kernel has made
        await asyncio.to_thread(quiesce, lambda: [sock], serve_kwargs["grace_s"])
        await asyncio.sleep(0.05)  # the last connections' requests reach their workers

    async def _all_gone(self) -> None:
        while any(p.is_alive() for p in self.workers):
            await asyncio.sleep(0.2)

    async def _wait_workers(self, serve_kwargs: dict) -> None:
        deadline = time.monotonic() + serve_kwargs["grace_s"] + 10.0
        while any(p.is_alive() for p in self.workers) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def _broadcast(self) -> None:
        """Every :data:`STATE_EVERY_S`: the queue's length and which instances died, to every worker."""
        while True:
            died = [None if inst.alive else inst.died for inst in self.batcher.instances]
            msg = pack(("state", len(self.batcher.queue), died))
            for w in self.writers:
                send_to(w, msg)
            await asyncio.sleep(STATE_EVERY_S)

    async def _serve_worker(self, k: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                msg = await receive(reader)
                kind = msg[0]
                if kind == "infer":  # no task per request: the answer goes out from the future's callback
                    self._infer(writer, msg[1], msg[2], msg[3], time.perf_counter_ns())
                elif kind == "observe":
                    self.metrics.observe(msg[1], msg[2])
                elif kind == "fail":
                    self.metrics.fail(msg[1])
                elif kind == "gc":
                    self.metrics.gc_pause.labels(msg[1]).observe(msg[2])
                elif kind == "ask":
                    if msg[2] == "scrape":
                        payload = self.metrics.scrape(len(self.batcher.queue))
                    else:
                        payload = self.metrics.triton_stats()
                    send_to(writer, pack(("answer", msg[1], payload)))
                elif kind == "ready":
                    self.ready[k].set()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass  # the worker is gone; the hub notices in _all_gone

    def _infer(self, writer: asyncio.StreamWriter, rid: int, item: dict, n: int, t_in: int) -> None:
        batcher = self.batcher
        try:
            p = batcher.enqueue(item, n)
        except Exception as err:
            self._answer(writer, rid, None, t_in, err)
            return
        p.future.add_done_callback(lambda fut: self._answer(writer, rid, p, t_in, _failure(fut)))

    def _answer(self, writer, rid: int, p, t_in: int, err: BaseException | None) -> None:
        """The request's outputs and timings, or what went wrong, back to its worker."""
        queued = len(self.batcher.queue)
        if err is None:
            msg = (
                "done",
                rid,
                p.future.result(),
                p.t_enqueue_ns,
                p.t_dispatch_ns,
                p.batch_size,
                p.timing,
                t_in,
                time.perf_counter_ns(),
                queued,
            )
        elif isinstance(err, Overloaded):
            msg = ("error", rid, "overloaded", str(err), queued)
        elif isinstance(err, InstanceDied):
            msg = ("error", rid, "instance_died", str(err), queued)
        else:  # the model failed on the batch, or a bad item: the worker answers 500
            msg = ("error", rid, "internal", f"{type(err).__name__}: {err}", queued)
        send_to(writer, pack(msg))


def _nothing() -> None:
    pass


class StartFailed(RuntimeError):
    """The server could not start (a worker exited, or took too long)."""


def _failure(fut: asyncio.Future) -> BaseException | None:
    """What a finished future failed with (None: it has its result)."""
    if fut.cancelled():
        return InstanceDied("the batch was cancelled (the server is stopping)")
    return fut.exception()


def serve_frontends(hub: Hub, sock: socket.socket, *, serve_kwargs: dict, announce) -> int:
    """``servesim serve --frontends N``: run ``hub`` on the listener ``sock`` until a signal;
    the exit code."""
    return asyncio.run(hub.run(sock, serve_kwargs, announce))
