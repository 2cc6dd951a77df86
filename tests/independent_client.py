"""A load generator that shares nothing with ``calibrate.loadgen``: its own process, plain
``http.client`` connections on a thread pool instead of aiohttp, and a renewal process of
gamma gaps (cv 0.5: more regular than Poisson) instead of Poisson arrivals. Open loop: each
request is sent at its scheduled time, whatever the others are doing, and its latency is
measured from that scheduled time.

    python tests/independent_client.py URL MODEL PAYLOADS.json RATE_RPS SECONDS SEED OUT.csv

PAYLOADS.json: a list of {"body": base64, "headers": {...}}. Writes one CSV row per
request (scheduled_s, latency_ms, status) and the schedule itself beside it
(OUT.csv.arrivals, seconds, one per line) for ``traffic.arrivals_file``.
"""

from __future__ import annotations

import base64
import csv
import http.client
import json
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import numpy as np

GAMMA_SHAPE = 4.0  # cv = 1 / sqrt(shape) = 0.5


def main(url: str, model: str, payloads: str, rate: float, seconds: float, seed: int, out: str) -> None:
    rng = np.random.default_rng(seed)
    n = int(rate * seconds * 1.2) + 10
    gaps = rng.gamma(GAMMA_SHAPE, 1.0 / (GAMMA_SHAPE * rate), n)
    times = np.cumsum(gaps)
    times = times[times < seconds]
    with open(payloads) as f:
        docs = json.load(f)
    bodies = [(base64.b64decode(d["body"]), d["headers"]) for d in docs]
    target = urllib.parse.urlparse(url)
    path = f"/v2/models/{model}/infer"
    local = threading.local()
    rows: list[tuple[float, float, int]] = [(0.0, 0.0, 0)] * len(times)
    start = time.perf_counter() + 0.2

    def send(i: int) -> None:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
        wait = start + times[i] - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        body, headers = bodies[i % len(bodies)]
        try:
            conn.request("POST", path, body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
            status = resp.status
        except (OSError, http.client.HTTPException):
            local.conn = None
            status = 599
        rows[i] = (float(times[i]), (time.perf_counter() - start - times[i]) * 1e3, status)

    with ThreadPoolExecutor(max_workers=64) as pool:
        list(pool.map(send, range(len(times))))
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scheduled_s", "latency_ms", "status"])
        w.writerows(rows)
    np.savetxt(out + ".arrivals", times, fmt="%.6f")


if __name__ == "__main__":
    u, m, p, r, s, k, o = sys.argv[1:]
    main(u, m, p, float(r), float(s), int(k), o)
