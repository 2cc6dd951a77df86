"""calibrate.sender.send_on_schedule on connections the caller keeps (``sender=``), against
a real HTTP server on 127.0.0.1 that counts the connections it accepts."""

from __future__ import annotations

import asyncio

import numpy as np

from calibrate.loadgen import TIMING_KEYS
from calibrate.sender import Sender, parse, request_bytes, send_on_schedule

BODY = b'{"parameters": {}}'
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)


async def _serve(accepted: list[int]):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.lower().split(b"\r\n")
                length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
                await reader.readexactly(length)
                writer.write(ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def _two_slices(keep: bool) -> tuple[int, list[dict]]:
    accepted: list[int] = []
    srv = await _serve(accepted)
    url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    requests = [request_bytes(url, "/v2/models/m/infer", b'{"inputs": []}', {"Content-Type": "application/json"})]
    times = np.linspace(0.0, 0.2, 20)
    pick = np.zeros(20, dtype=int)
    sender = None
    if keep:
        sender = Sender(url, 8)
        await sender.start(4)
    rows = []
    try:
        for _ in range(2):
            got = await send_on_schedule(url, requests, times, pick, connections=8, warm=4, sender=sender)
            rows += parse(got, TIMING_KEYS)
    finally:
        if sender is not None:
            sender.close()
        srv.close()
        await srv.wait_closed()
    return len(accepted), rows


def test_kept_connections_are_opened_once_and_fresh_ones_each_slice():
    fresh, rows = asyncio.run(_two_slices(keep=False))
    assert [r["status"] for r in rows] == [200] * 40
    assert fresh >= 8  # four opened ahead of each of the two slices
    kept, rows = asyncio.run(_two_slices(keep=True))
    assert [r["status"] for r in rows] == [200] * 40
    assert 4 <= kept < fresh  # the caller's four, and any grown for a burst, kept for the second
