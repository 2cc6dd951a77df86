"""``servesim serve --frontends N``: several front-end processes, one batcher (the hub),
over real HTTP on 127.0.0.1, and the process table checked after each stop."""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from calibrate.loadgen import image_payloads
from tests.servers import descendants, free_port, reference_server, servesim_cmd, wait_gone
from tests.test_server_instances import TINY, config, infer, status


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_requests_from_every_front_end_meet_in_one_batcher():
    args = (*TINY, "--frontends", "2", "--max-queue-delay-ms", "400", "--max-batch-size", "8")
    with reference_server(*args) as (url, proc):
        info = config(url)
        assert info["frontends"] == 2
        family = descendants(proc.pid)
        payload = image_payloads(1, 48, np.random.default_rng(0))[0]
        seen: collections.Counter = collections.Counter()
        answered = 0
        for _ in range(5):  # bursts of 8 on new connections, until both front ends have answered
            with ThreadPoolExecutor(8) as pool:
                results = list(pool.map(lambda _: infer(url, payload), range(8)))
            answered += len(results)
            assert all(code == 200 for code, _ in results)
            params = [doc["parameters"] for _, doc in results]
            assert all(p["relay_us"] > 0 for p in params)
            seen.update(p["frontend"] for p in params)
            if len({p["frontend"] for p in params}) == 2:
                # 8 requests that came in through both front ends made one batch of 8
                assert {p["batch_size"] for p in params} == {8}
                assert len({p["dispatched_at_ns"] for p in params}) == 1
                break
        assert set(seen) == {0, 1}, seen
        # the server's counters whichever worker answers the scrape: every success, and the CPU
        # of the hub and its workers together
        assert metric(url, "nv_inference_request_success_total") == answered
        with urllib.request.urlopen(url + "/v2/models/resnet/stats", timeout=10) as r:
            assert json.loads(r.read())["model_stats"][0]["inference_count"] == answered
        workers = [p for p in family if p not in {i["pid"] for i in info["instances"]}]
        assert len(workers) >= 2
        assert metric(url, "process_cpu_seconds_total") > 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
        assert "Traceback" not in proc.stderr.read()
    assert wait_gone(family) == []  # the workers, the instance, the parse processes


def test_the_front_ends_and_instances_die_with_a_killed_hub():
    with reference_server(*TINY, "--frontends", "2") as (url, proc):
        assert status(url + "/v2/health/ready") == 200
        family = descendants(proc.pid)
        assert len(family) >= 3
        proc.kill()
        proc.wait(timeout=10)
    assert wait_gone(family) == []


def test_a_dead_instance_behind_the_hub_gives_503_and_readiness_false():
    with reference_server(*TINY, "--frontends", "2") as (url, _proc):
        payload = image_payloads(1, 48, np.random.default_rng(0))[0]
        assert infer(url, payload)[0] == 200
        pid = config(url)["instances"][0]["pid"]
        os.kill(pid, signal.SIGKILL)
        assert wait_gone([pid]) == []
        t0 = time.monotonic()
        code, doc = infer(url, payload)
        assert time.monotonic() - t0 < 5
        assert code == 503
        assert "model instance 0 was killed by signal 9" in doc["error"]
        time.sleep(0.3)  # the hub tells every worker within 50 ms
        for _ in range(4):  # whichever worker answers
            assert status(url + "/v2/health/ready") == 503
        assert status(url + "/v2/health/live") == 200
        bad = urllib.request.Request(f"{url}/v2/models/resnet/infer", data=b"{not json", method="POST")
        with pytest.raises(urllib.error.HTTPError) as answer:  # answered, whichever the worker
            urllib.request.urlopen(bad, timeout=10)
        assert answer.value.code == 503


def test_a_bad_request_through_a_worker_is_a_400_and_the_server_goes_on():
    with reference_server(*TINY, "--frontends", "2") as (url, _proc):
        for body in (b"{not json", b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}'):
            req = urllib.request.Request(f"{url}/v2/models/resnet/infer", data=body, method="POST")
            with pytest.raises(urllib.error.HTTPError) as answer:
                urllib.request.urlopen(req, timeout=10)
            assert answer.value.code == 400
        payload = image_payloads(1, 48, np.random.default_rng(1))[0]
        assert infer(url, payload)[0] == 200


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--frontends", "0"), "--frontends is at least 1; got 0"),
        (("--frontends", "2", "--instance-mode", "thread"), "--frontends above 1 needs --instance-mode process"),
        (("--instance-idle", "nap"), "--instance-idle is sleep or spin; got 'nap'"),
    ],
)
def test_front_ends_that_cannot_be_served_exit_2_with_one_line(args, message):
    cmd = [*servesim_cmd(), "serve", "--port", str(free_port()), *TINY, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("--max-batch-size", "0"), "--max-batch-size"),
        (("--resolution", "-3"), "--resolution"),
        (("--instances", "0"), "--instances"),
        (("--threads", "0"), "--threads"),
        (("--max-queue-delay-ms", "-1"), "--max-queue-delay-ms"),
        (("--port", "99999"), "--port"),
    ],
)
def test_option_values_that_cannot_run_are_refused_before_anything_starts(args, option):
    """A batch of none, a negative side, no instance, a port past 65535: refused by the
    command naming the option, exit 2 (an instance process died with a traceback on the
    first two, exit 3; the port was a traceback)."""
    cmd = [*servesim_cmd(), "serve", "--port", str(free_port()), *TINY, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert option in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_the_load_generator_reaches_every_front_end_evenly():
    """Connections dealt in turn, used in turn by the load generator: at a light load
    (one request in flight at a time, where reusing the latest connection put 61-68% of an
    H100 host's requests on one of 8 front ends) each of two front ends takes half."""
    from calibrate.loadgen import _run, run_level

    payloads = image_payloads(8, 48, np.random.default_rng(0))
    with reference_server(*TINY, "--frontends", "2") as (url, _proc):
        df = _run(run_level(url, "resnet", 40.0, payloads, duration_s=3.0, min_queries=100, seed=0))
    assert (df["status"] == 200).all()
    share = df["frontend"].value_counts(normalize=True)
    assert set(share.index) == {0, 1}
    assert share.max() <= 0.55, share.to_dict()


# slow: in one CI run the server was still alive after 95 s, which no run here shows (it
# exits 1 in 12 s); kept out of the default suite until that is explained
@pytest.mark.slow
def test_a_front_end_that_cannot_start_stops_the_server_at_once(tmp_path):
    """Workers that fail their start-up (the ranker's Redis unreachable) end the server with
    one line and exit 1 within seconds, not after the start-up timeout, and leave nothing
    running."""
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        redis_url = f"redis://127.0.0.1:{closed.getsockname()[1]}/0"
    cmd = [*servesim_cmd(), "serve", "--port", str(free_port()), "--model", "ranker", "--frontends", "2"]
    log = tmp_path / "stderr.txt"  # a file, not a pipe: the workers' tracebacks would fill a pipe's 64 KB
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, stderr=sink, env={**os.environ, "SERVESIM_REDIS_URL": redis_url})
    family: set[int] = set()
    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < 90:
        family |= set(descendants(proc.pid))
        time.sleep(0.2)
    try:
        assert proc.wait(timeout=5) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    err = log.read_text()
    assert "error: front-end worker" in err
    assert "exited during start-up" in err
    assert "hub.py" not in err  # the hub's own path raises nothing
    assert wait_gone(list(family)) == []
