"""Real servers for tests: redis-server and the reference server, on free loopback ports."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from calibrate.servers import redis_server
from reference_server.lifetime import die_with_parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def servesim_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("servesim")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "servesim"]


def wait_http(url: str, timeout_s: float = 90.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as r:
            if r.status == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {timeout_s} s")


@contextlib.contextmanager
def _serving(args: list[str], health: str, host: str = "127.0.0.1", env: dict[str, str] | None = None):
    """``servesim <args> --port P`` in a subprocess until ``health`` answers 200; yields
    (base url, process) and stops it after."""
    port = free_port()
    proc = subprocess.Popen(
        [*servesim_cmd(), *args, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=None if env is None else {**os.environ, **env},
        preexec_fn=die_with_parent,  # a killed pytest runs no finally: the server goes with it
    )
    url = f"http://{host}:{port}"
    try:
        wait_http(url + health, proc=proc)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextlib.contextmanager
def reference_server(*args: str, env: dict[str, str] | None = None, host: str = "127.0.0.1"):
    """``servesim serve`` in a subprocess (``env``: variables added to this process's;
    ``host``: the address it binds); yields (base url, process)."""
    with _serving(["serve", "--host", host, *args], "/v2/health/ready", host, env) as got:
        yield got


@contextlib.contextmanager
def llm_server(*args: str):
    """``servesim serve-llm`` (the tiny LLM engine) in a subprocess on a free loopback port;
    yields (base url, process)."""
    with _serving(["serve-llm", *args], "/health") as got:
        yield got


def children(pid: int) -> list[int]:
    """Processes whose parent is ``pid``, from the process table."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pids: list[int], timeout_s: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if running(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if running(p)]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from the process table."""
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


__all__ = ["children", "descendants", "llm_server", "redis_server", "reference_server", "running", "wait_gone"]


def address(url: str) -> tuple[str, int]:
    """(host, port) of a server's base URL."""
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def read_answer(sock: socket.socket, timeout_s: float) -> bytes:
    """Everything a server sends on ``sock`` until it closes the connection (or the timeout)."""
    sock.settimeout(timeout_s)
    out = b""
    with contextlib.suppress(TimeoutError, ConnectionResetError):
        while chunk := sock.recv(65536):
            out += chunk
    return out
