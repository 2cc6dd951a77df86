"""The processes a calibration starts: ``servesim serve`` and a throwaway redis-server, each
on a free loopback port, each stopped (and waited for) when its ``with`` block ends."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def server(args: list[str], *, timeout_s: float = 120.0, command: str = "serve", health: str = "/v2/health/ready"):
    """``servesim serve`` (or ``command``: ``serve-llm``) on a free loopback port; yields its
    URL once ``health`` answers; stops it afterwards."""
    port = _free_port()
    exe = Path(sys.executable).with_name("servesim")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "servesim"]
    proc = subprocess.Popen([*cmd, command, "--port", str(port), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the reference server exited: {proc.stderr.read().decode()[-2000:]}")
            with contextlib.suppress(OSError), urllib.request.urlopen(url + health, timeout=1) as r:
                if r.status == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("the reference server did not become ready")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def beside_llm_front_end(url: str):
    """This process (a load generator) on ``servesim serve-llm``'s front-end cores while the
    block runs, off the engine's core, as the front end keeps itself (where the server
    pinned no engine, or this OS has no affinity, nothing changes)."""
    info = get_json(url + "/v1/models")["data"][0].get("servesim", {})
    cores = set(info.get("frontend_cores") or ())
    if not cores or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def redis_server(cores: set[int] | None = None):
    """A throwaway redis-server on a free loopback port (on ``cores`` only, if given); yields its URL."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise FileNotFoundError("redis-server is not installed (apt-get install redis-server)")
    port = _free_port()
    args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=pin)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            if time.monotonic() > deadline:
                raise TimeoutError("redis-server did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
