"""A front-end worker of the hub (``servesim serve --frontends N``,
:mod:`reference_server.hub`): a spawned process that runs the whole front end of
:mod:`reference_server.frontend` behind its own uvicorn server, with no listener of its
own. It serves the connections the hub deals it (``SCM_RIGHTS``), and its batcher is the
hub's, over :class:`~reference_server.relay.Relay`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket

import uvicorn

from reference_server.app import create_app
from reference_server.config import ServerConfig
from reference_server.connections import Joiner, guarded_http
from reference_server.draining import draining_server
from reference_server.lifetime import die_with_parent
from reference_server.relay import HubInfo, Relay


def worker_main(cfg: ServerConfig, info: HubInfo, relay_sock: socket.socket, dealt: socket.socket, kw: dict) -> None:
    """A front-end worker: the whole front end, serving the connections the hub deals it, its
    batcher the hub's."""
    die_with_parent()
    if info.pinned:
        os.sched_setaffinity(0, info.frontend_cores)
    relay = Relay(relay_sock, info, cfg.max_queue_size)
    app = create_app(cfg, relay=relay)
    config = uvicorn.Config(
        app,
        log_level="warning",
        timeout_graceful_shutdown=kw["grace_s"],
        http=guarded_http(kw["max_connections"], kw["header_timeout_s"]),
        timeout_keep_alive=5,
    )
    # the hub drains (it deals the connections) and then sends SIGTERM: the worker stops at
    # once; Ctrl-C reaches the whole process group, and only the hub acts on it
    base = draining_server(uvicorn.Server, config, app.state.drain, 0.0, signals=(signal.SIGTERM,))

    class Dealt(type(base)):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=[])  # no listener of its own
            loop = asyncio.get_running_loop()
            join = Joiner(loop, self.protocol)

            def take() -> None:
                try:
                    _, fds, _, _ = socket.recv_fds(dealt, 16, 16)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError:
                    fds = []
                if not fds:  # the hub is gone
                    loop.remove_reader(dealt.fileno())
                    return
                for fd in fds:
                    join(socket.socket(fileno=fd))

            def drain() -> None:
                self.draining = True
                app.state.drain()
                self._close_idle()

            relay.on_drain = drain
            dealt.setblocking(False)
            loop.add_reader(dealt.fileno(), take)

    Dealt(config).run()


__all__ = ["worker_main"]
