"""The load generator keeps its schedule (issue 28.8): its lean HTTP/1.1 sender against a
scripted server (chunked, closing and HTTP/1.0 answers, a hang-up), and against a real
``servesim serve`` on its own schedule; the overload figures (slow)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest

from calibrate.loadgen import Payload, run_level
from tests.servers import reference_server, servesim_cmd

OK_JSON = b'{"parameters": {"queue_us": 1500.0, "batch_size": 2}}'


def _answers() -> list[bytes]:
    """What the scripted server answers, in turn: a keep-alive 200, a chunked 200, a 200
    that closes the connection, an HTTP/1.0 503 in plain text read to the close, and a
    hang-up without an answer."""
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(OK_JSON), OK_JSON)
    return [
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Type: application/json\r\n\r\n%s" % (len(OK_JSON), OK_JSON),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked,
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(OK_JSON), OK_JSON),
        b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\n\r\nbusy",
        b"",  # hang up
    ]


@contextlib.contextmanager
def scripted_server():
    """A raw HTTP server on loopback answering each request with the next of :func:`_answers`."""
    answers = _answers()
    sock = socket.create_server(("127.0.0.1", 0))
    served = [0]
    stop = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn:
            buf = b""
            while not stop.is_set():
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                fields = dict(h.partition(b":")[::2] for h in head.split(b"\r\n")[1:])
                length = int(next(v for k, v in fields.items() if k.lower() == b"content-length"))
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                answer = answers[served[0] % len(answers)]
                served[0] += 1
                if not answer:
                    return
                conn.sendall(answer)
                if b"Connection: close" in answer or answer.startswith(b"HTTP/1.0"):
                    return

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = sock.accept()
                threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        sock.close()


def test_the_sender_reads_every_kind_of_answer_and_counts_a_hang_up():
    """Chunked, closing and HTTP/1.0 answers are read whole; a hang-up is the client's
    error (-1), never a hang; every row has its latency from its scheduled time."""
    with scripted_server() as url:
        df = asyncio.run(run_level(url, "m", 100.0, [Payload(b"{}", {})], duration_s=0.2, min_queries=40, seed=0))
    assert len(df) >= 40
    counts = df["status"].value_counts().to_dict()
    assert set(counts) == {200, 503, -1}
    assert counts[200] >= 3 * counts[503] - 3  # three of every five answers are 200s
    assert (df.loc[df["status"] == 200, "queue_us"] == 1500.0).all()
    assert (df.loc[df["status"] == 503, "error"] == "busy").all()
    assert (df.loc[df["status"] == -1, "error"] == "ServerDisconnectedError").all()
    assert df["latency_ms"].notna().all()
    assert (df["send_lag_ms"] >= 0).all()  # never sent before its time


def _lateness_ms(precise: bool, loop_factory=None) -> tuple[np.ndarray, bool]:
    """How late :class:`~calibrate.wake.Wake` returns for 300 times 0.37 ms apart, and
    whether it woke on its timerfd."""
    from calibrate.wake import Wake

    async def go() -> tuple[np.ndarray, bool]:
        wake = Wake(precise)
        try:
            at = time.perf_counter() + 0.01 + 0.00037 * np.arange(300)
            late = []
            for t in at:
                await wake.until(float(t))
                late.append((time.perf_counter() - t) * 1e3)
            return np.array(late), wake.precise
        finally:
            wake.close()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(go())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the timerfd is Linux's")
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_sender_wakes_at_each_requests_time_not_on_the_loops_millisecond(loop):
    """The loop's timers are whole milliseconds: woken by them, the sender let the requests
    of the last millisecond go together, a median 0.27 ms late at 0.37 ms apart. On its
    timerfd it wakes for each, never early, a median tens of microseconds late. (The best of
    three tries: a test worker busy on the same core delays any wake-up.)"""
    factory = None
    if loop == "uvloop":
        factory = pytest.importorskip("uvloop").new_event_loop
    coarse, _ = _lateness_ms(False, factory)
    assert (coarse >= 0).all()
    tries = []
    for _ in range(3):
        precise, on_timerfd = _lateness_ms(True, factory)
        assert on_timerfd
        assert (precise >= 0).all()
        tries.append(float(np.median(precise)))
        if tries[-1] < 0.2 and tries[-1] < 0.5 * np.median(coarse):
            break
    assert min(tries) < 0.2, tries
    assert min(tries) < 0.5 * np.median(coarse), (tries, np.median(coarse))


def test_a_server_that_is_gone_gives_errors_not_a_hang():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    df = asyncio.run(
        run_level(f"http://127.0.0.1:{port}", "m", 50.0, [Payload(b"{}", {})], duration_s=0.1, min_queries=10, seed=0)
    )
    assert (df["status"] == -1).all()
    assert set(df["error"]) == {"ConnectionRefusedError"}


def _load(url: str, out, rates: str, duration_s: float) -> tuple[pd.DataFrame, str]:
    res = subprocess.run(
        [*servesim_cmd(), "calibrate", "load", "--url", url, "--rates", rates, "--out", str(out), "--duration-s",
         str(duration_s), "--connections", "4096"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return pd.read_csv(out), res.stdout


def test_the_load_generator_keeps_its_schedule_against_a_real_server(tmp_path):
    """``servesim calibrate load`` at 300 req/s on the reference server: every request
    answered, none sent early, the send lag reported in its table and small (the old
    aiohttp generator spent a few hundred microseconds of CPU a request; this one sends
    bytes built before the level).

    The server's queue is unbounded here: this test is about the generator, and a server
    starved of CPU by a neighbour for most of a second (CI runs two test workers on two
    cores) correctly sheds a 256-request queue's excess with 503s (60 in one CI run)."""
    pytest.importorskip("torch", reason="the reference server needs the server extra (torch)")
    with reference_server("--resolution", "32", "--width", "8", "--max-queue-size", "0") as (url, _):
        df, table = _load(url, tmp_path / "m.csv", "300", 3.0)
    assert "send_lag_p99_ms" in table
    assert (df["status"] == 200).all(), df.loc[df["status"] != 200, ["status", "error"]].value_counts()
    assert (df["send_lag_ms"] >= 0).all()
    lag = df.loc[~df["warmup"], "send_lag_ms"].to_numpy()
    assert np.percentile(lag, 99) < 20.0, np.percentile(lag, [50, 99])


@pytest.mark.slow
def test_overload_goodput_and_the_schedule_at_twice_capacity(tmp_path):
    """The reference server offered past its capacity sheds the excess with 503s and keeps
    serving: goodput at twice its capacity is at least 90% of its capacity (the goodput
    of a level that saturates it), and the generator's send lag stays within 5 ms (p99)
    at 1,300 req/s and at twice the capacity."""
    pytest.importorskip("torch", reason="the reference server needs the server extra (torch)")
    with reference_server() as (url, _):
        _load(url, tmp_path / "warm.csv", "300", 2.0)
        sat, _ = _load(url, tmp_path / "sat.csv", "1000,1300", 15.0)
        steady = sat[~sat["warmup"]]
        ok = steady[steady["status"] == 200]
        per_level = ok.groupby("level").size() / steady.groupby("level")["scheduled_s"].agg(lambda s: s.max() - s.min())
        capacity = float(per_level.loc[0])
        double, _ = _load(url, tmp_path / "double.csv", str(round(2 * capacity)), 15.0)
    for df in (sat[sat["level"] == 1], double):
        lag = df.loc[~df["warmup"], "send_lag_ms"]
        assert np.percentile(lag, 99) <= 5.0
    d = double[~double["warmup"]]
    span = d["scheduled_s"].max() - d["scheduled_s"].min()
    goodput = (d["status"] == 200).sum() / span
    assert goodput >= 0.9 * capacity, (goodput, capacity)
    assert (d["status"] == 503).sum() > 0.3 * len(d)  # the excess was shed, not queued in the client


def _sigterm_under_load(args: tuple[str, ...], rate: float, at_s: float) -> tuple[pd.DataFrame, str]:
    """Open-loop load at ``rate`` on a fresh server, SIGTERM ``at_s`` into it; every request's
    row, and what the server wrote to stderr."""
    import signal

    from calibrate.loadgen import _run
    from calibrate.payloads import image_payloads

    payloads = image_payloads(16, 96, np.random.default_rng(0))
    with reference_server(*args) as (url, proc):
        _run(run_level(url, "resnet", 200.0, payloads, duration_s=1.0, min_queries=10, seed=1))  # warm
        timer = threading.Timer(at_s, proc.send_signal, (signal.SIGTERM,))
        timer.start()
        try:
            df = _run(
                run_level(url, "resnet", rate, payloads, duration_s=at_s + 4, min_queries=10, seed=2, connections=4096)
            )
        finally:
            timer.cancel()
        proc.wait(timeout=60)
        log = proc.stderr.read()
    return df, log


def _no_request_is_reset(df: pd.DataFrame, served: float = 0.3, log: str = "") -> None:
    """Until the listener closes every request is answered (200, or a 503 while shedding);
    after it, connecting fails (the request never left). Nothing is reset or answered 500;
    more than ``served`` of the answers are 200s."""
    answered = df[df["status"] > 0]
    assert set(answered["status"]) <= {200, 503}
    failed = df[df["status"] == -1]
    assert set(failed["error"]) <= {"ConnectionRefusedError"}, (failed["error"].value_counts().to_dict(), log[-2000:])
    assert len(failed) > 0  # the run reached the closed port
    assert (answered["status"] == 200).sum() > served * len(answered)


def _wait_queued(listener: socket.socket, n: int) -> None:
    """Wait until ``n`` connections are in ``listener``'s accept queue (skip where the
    platform does not say)."""
    from reference_server.draining import accept_queue

    deadline = time.monotonic() + 5
    while accept_queue(listener) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    if accept_queue(listener) != n:
        pytest.skip("this platform does not report a listener's accept queue")


def test_the_listener_takes_every_queued_connection_while_there_is_room():
    """libuv, under uvloop, accepts one connection per turn of the loop; the front end's
    listener takes all the kernel holds in one turn, as many as ``room()`` allows, and
    leaves the rest in the kernel's queue until there is room again."""
    from reference_server.connections import accept_eagerly
    from reference_server.draining import accept_queue

    uvloop = pytest.importorskip("uvloop", reason="uvicorn's loop on Linux")
    taken: list[socket.socket] = []
    turns = [0]  # the loop's turns, counted by a callback that schedules itself for the next
    taken_in: list[int] = []  # the turn each connection was taken in
    room = [25]

    def take(conn: socket.socket) -> None:
        taken.append(conn)
        taken_in.append(turns[0])

    async def watch(listener) -> tuple[int, int, int, int]:
        loop = asyncio.get_running_loop()

        def tick() -> None:
            turns[0] += 1
            loop.call_soon(tick)

        tick()
        stop = accept_eagerly(loop, listener, take, lambda: len(taken) < room[0])
        await asyncio.sleep(0.2)
        first, queued = len(taken), accept_queue(listener)
        room[0] = 100
        await asyncio.sleep(0.2)
        stop()
        extra = socket.create_connection(listener.getsockname())
        await asyncio.sleep(0.2)
        extra.close()
        return first, queued, len(taken), accept_queue(listener)

    with socket.create_server(("127.0.0.1", 0), backlog=64) as listener:
        clients = [socket.create_connection(listener.getsockname()) for _ in range(40)]
        try:
            _wait_queued(listener, 40)
            first, queued, then, after_stop = uvloop.run(watch(listener))
        finally:
            for c in clients + taken:
                c.close()
    assert (first, queued) == (25, 15)  # room for 25: the other 15 wait in the kernel's queue
    assert then == 40  # room again: the rest
    assert len(set(taken_in[:25])) == 1, taken_in  # each lot in one turn of the loop
    assert len(set(taken_in[25:])) == 1, taken_in
    assert after_stop == 1  # stopped: a new connection is left to the kernel


def test_the_quiesce_waits_for_the_accept_queue_within_its_bound(caplog):
    """At the drain's end the server waits until the kernel's queue of connections made and
    not accepted is empty, at most its grace period: a front end short of CPU may take
    seconds to accept them (a fixed 5 s reset 7-1,119 requests in 8 of 9 runs of the
    800 req/s test below with three busy processes beside it on 2 cores). Past the bound,
    how many it leaves is logged."""
    import logging

    from reference_server.draining import quiesce

    with socket.create_server(("127.0.0.1", 0), backlog=16) as listener:
        clients = [socket.create_connection(listener.getsockname()) for _ in range(3)]
        try:
            _wait_queued(listener, 3)
            with caplog.at_level(logging.WARNING, logger="servesim.serve"):
                t0 = time.monotonic()
                assert quiesce(lambda: [listener], 0.3) == 3
                assert 0.3 <= time.monotonic() - t0 < 2.0
            assert "3 connections still unaccepted 0.3 s" in caplog.text
            accepted = []
            threading.Timer(0.2, lambda: accepted.extend(listener.accept()[0] for _ in range(3))).start()
            t0 = time.monotonic()
            assert quiesce(lambda: [listener], 10.0) == 0  # it waits while they are accepted, no longer
            assert time.monotonic() - t0 < 5.0
            for c in accepted:
                c.close()
        finally:
            for c in clients:
                c.close()


def test_the_quiesce_serves_what_its_grace_allows_and_sheds_the_rest(caplog):
    """80 connections queued on a listener whose server accepts 25 a second while serving
    and 1,000 a second while shedding (its 503s are cheap), with 2.5 s of grace: serving them
    all would take 3.2 s (2.5 s serves 62: 18 would be reset), so the quiesce sheds a moment
    to measure how fast, serves while the rest could still be shed in time, and sheds the
    last; none is left to be reset. It served 47-48 of them in three runs (shedding all at
    once, as soon as its first rate is measured, would serve about 3), and a quiesce with
    time enough never sheds."""
    import logging

    from reference_server.draining import accept_queue, quiesce

    def run(n: int, within_s: float) -> tuple[int, list[bool], int]:
        shedding, calls, served, stop = [False], [], [0], threading.Event()

        def shed(on: bool) -> None:
            shedding[0] = on
            calls.append(on)

        with socket.create_server(("127.0.0.1", 0), backlog=128) as listener:
            clients = [socket.create_connection(listener.getsockname()) for _ in range(n)]

            def server() -> None:  # one accept a turn of the loop, a turn as long as the work
                listener.settimeout(0.05)
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        conn, _ = listener.accept()
                        conn.close()
                        if not shedding[0]:
                            served[0] += 1
                        time.sleep(0.001 if shedding[0] else 0.04)

            try:
                deadline = time.monotonic() + 5
                while accept_queue(listener) < n and time.monotonic() < deadline:
                    time.sleep(0.01)
                if accept_queue(listener) != n:
                    pytest.skip("this platform does not report a listener's accept queue")
                thread = threading.Thread(target=server)
                thread.start()
                left = quiesce(lambda: [listener], within_s, shed)
                stop.set()
                thread.join()
            finally:
                stop.set()
                for c in clients:
                    c.close()
        return left, calls, served[0]

    with caplog.at_level(logging.WARNING, logger="servesim.serve"):
        left, calls, served = run(80, 2.5)
    assert left == 0
    assert calls[:2] == [True, False], calls
    assert calls[-1] is True, calls
    assert served >= 30, served  # of 80; 0-5 if all were shed at once, 75 could not be served in time
    assert "the excess is answered 503" in caplog.text
    left, calls, served = run(20, 3.0)  # 0.8 s of serving: no shedding
    assert (left, calls, served) == (0, [], 20)


def test_the_doors_refusals_while_draining_close_the_connection():
    """Draining, every response says ``Connection: close`` so the client's next request goes
    on a new connection while the listener still accepts: the door's 503 for a full queue
    too (it kept the connection alive, and at 1,500 req/s 35-116 next requests per run met
    the shutdown's close), and the shutdown's own 503, counted as such; the app behind the
    door is not reached."""
    from reference_server.door import Door

    state = {"full": True, "draining": False, "shedding": False}
    counted: list[str] = []

    async def app(scope, receive, send):  # never reached
        raise AssertionError("the door let it through")

    door = Door(
        app,
        api_key=None,
        open_paths=(),
        infer_paths={"/infer"},
        full=lambda: state["full"],
        draining=lambda: state["draining"],
        shedding=lambda: state["shedding"],
        refused=counted.append,
        overloaded="overloaded",
    )

    def answer() -> tuple[int, dict[bytes, bytes], bytes]:
        sent: list[dict] = []

        async def send(message):
            sent.append(message)

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        scope = {"type": "http", "path": "/infer", "method": "POST", "headers": []}
        asyncio.run(door(scope, receive, send))
        return sent[0]["status"], dict(sent[0]["headers"]), sent[1]["body"]

    status, headers, _ = answer()
    assert status == 503
    assert headers[b"retry-after"] == b"1"
    assert b"connection" not in headers  # serving: the connection stays for the next request
    state["draining"] = True
    status, headers, _ = answer()
    assert (status, headers[b"connection"]) == (503, b"close")
    state["shedding"] = True
    status, headers, body = answer()
    assert (status, headers[b"connection"], headers[b"retry-after"]) == (503, b"close", b"1")
    assert b"shutting down" in body
    assert counted == ["overloaded", "overloaded", "shutdown"]


def test_sigterm_under_load_resets_no_request():
    """SIGTERM while 800 req/s arrive, each drain response saying ``Connection: close`` (so
    every request comes on a new connection): at the drain's end the listener drops new
    connection attempts and accepts those the kernel has made before it closes, and a
    connection that has just been made is not closed under a request on its way. The share
    of 200s depends on the CPU the server gets, as the excess meets the door's 503 at once:
    58-73% alone, 25% beside test_server_faults.py on 2 cores."""
    pytest.importorskip("torch", reason="the reference server needs the server extra (torch)")
    df, log = _sigterm_under_load(("--resolution", "32", "--width", "8"), 800.0, 2.0)
    _no_request_is_reset(df, served=0.1, log=log)


def test_a_front_end_short_of_cpu_serves_what_its_grace_allows_and_sheds_the_rest():
    """A front end whose event loop serves ~120-150 requests a second (each image resized to
    320 px on the loop), offered 800 req/s, SIGTERM at 2 s, 5 s of grace. Accepting one
    connection per turn (uvloop's way), ~1,900 connections waited in the kernel's queue when
    the drain ended and closing on them reset 1,168 and 1,280 requests in two runs; the
    quiesce then served while the rest could still be shed in time and answered them 503,
    none reset. Accepted eagerly, the excess meets the door's 503 at once and the queue
    is short at the drain's end (the quiesce had none to shed in two runs; a queue it
    cannot serve in time is still shed, as the quiesce's own test shows). CI failed on 44
    resets of the 800 req/s test above, its front end starved by a test beside it."""
    pytest.importorskip("torch", reason="the reference server needs the server extra (torch)")
    df, log = _sigterm_under_load(("--resolution", "320", "--width", "4", "--grace-s", "5"), 800.0, 2.0)
    _no_request_is_reset(df, served=0.05, log=log)
    assert (df["status"] == 503).sum() > 0.1 * len(df), log  # shed at the door (41-44% of rows in two runs)
    assert "still unaccepted" not in log


@pytest.mark.slow
def test_a_loop_bound_front_end_answers_its_excess_at_once():
    """A front end whose event loop resizes each image (320 px) serves ~120-140 requests a
    second; offered 800, its excess is answered 503 within a turn or two of the loop, and a
    request served waits in the server's own queue (``--max-queue-size``), not in the
    kernel's: 503s after 128-155 ms (p50), 153-164 ms outside the server, in three runs.
    Accepting one connection per turn (libuv's way), its 503s came after 1.3-9.5 s (p50,
    five runs; 6.9 s with this test) and its 200s after 3-12 s, 7-11 s of which before the
    server saw them (two runs)."""
    pytest.importorskip("torch", reason="the reference server needs the server extra (torch)")
    from calibrate.loadgen import _run
    from calibrate.payloads import image_payloads

    payloads = image_payloads(16, 96, np.random.default_rng(0))
    with reference_server("--resolution", "320", "--width", "4") as (url, _):
        _run(run_level(url, "resnet", 100.0, payloads, duration_s=1.0, min_queries=10, seed=1))  # warm
        df = _run(run_level(url, "resnet", 800.0, payloads, duration_s=4.0, min_queries=10, seed=2, connections=4096))
    assert set(df["status"]) == {200, 503}, df["error"].value_counts().to_dict()
    refused, served = df[df["status"] == 503], df[df["status"] == 200]
    assert refused["latency_ms"].median() < 1000
    outside_ms = served["latency_ms"] - served["request_us"] / 1e3  # before the server's clock started
    assert outside_ms.median() < 500


@pytest.mark.slow
def test_sigterm_at_twice_capacity_resets_no_request():
    """The same at 1,500 req/s on the default model (about 1.9x its capacity on the 2-core
    VM when this was written; the share it serves depends on the host: 17-20% of the answers
    were 200s on 2026-11-28): 595 requests of the drain's last second were reset before the
    listener kept accepting. Then the door's 503 for a full queue still said keep-alive while
    draining, so a client's next request on that connection met the shutdown's close: 35-116
    resets and 13-43 disconnects in each of four runs, none in three with that 503 saying
    ``Connection: close``."""
    pytest.importorskip("torch", reason="the reference server needs the server extra (torch)")
    df, _ = _sigterm_under_load((), 1500.0, 4.0)
    _no_request_is_reset(df, served=0.1)
    assert (df["status"] == 503).sum() > 0.2 * len(df)  # it was shedding


def test_sigterm_under_load_on_several_front_ends_resets_no_request():
    """The same with two front-end processes behind the hub, at 300 req/s: the hub deals
    connections until its drain ends, then drops new attempts, deals those already made,
    and only then stops the workers."""
    pytest.importorskip("torch", reason="the reference server needs the server extra (torch)")
    _no_request_is_reset(_sigterm_under_load(("--resolution", "32", "--width", "8", "--frontends", "2"), 300.0, 2.0)[0])
