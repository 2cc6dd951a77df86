"""Model instances in their own processes: the shared-memory hand-off gives the in-process
outputs, instances stop with the server (SIGTERM, or a killed front end) and leave no
process behind, and a dead instance gives 503s and readiness false, never a hang."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="the reference server needs the server extra (torch)")

from calibrate.loadgen import image_payloads
from reference_server.instances import InstanceSpec, ProcessInstance, blocks, instance_cores
from reference_server.models import ModelConfig, ServedModel
from tests.servers import children, reference_server, running, wait_gone

TINY = ("--resolution", "32", "--width", "8")


def config(url: str, model: str = "resnet") -> dict:
    with urllib.request.urlopen(f"{url}/v2/models/{model}/config", timeout=10) as r:
        return json.loads(r.read())["parameters"]["servesim"]


def infer(url: str, payload) -> tuple[int, dict]:
    req = urllib.request.Request(f"{url}/v2/models/resnet/infer", data=payload.body, headers=payload.headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.parametrize(
    "cfg",
    [ModelConfig(kind="resnet", resolution=32, width=8), ModelConfig(kind="ranker", vocab=1000)],
    ids=["resnet", "ranker"],
)
def test_the_shared_memory_hand_off_gives_the_in_process_outputs(cfg):
    local = ServedModel(cfg, "cpu")
    rng = np.random.default_rng(3)
    batches = [local.example(1, rng) + local.example(1, rng), local.example(1, rng)]
    batches.append([{k: np.concatenate([a[k], b[k]]) for k in a} for a, b in [batches[0]]])  # one request of 2
    layout_in, layout_out = blocks(local, max_batch_size=4)
    spec = InstanceSpec(0, cfg, 4, layout_in, layout_out, core=None, threads=1, device="cpu", warmup_batches=1)
    inst = ProcessInstance(spec)
    try:
        inst.wait_ready()

        async def run_all():
            return [await inst.run(items) for items in batches]

        remote = asyncio.run(run_all())
    finally:
        inst.close()
    assert not running(inst.pid)
    for items, (outs, timing) in zip(batches, remote, strict=True):
        expect = local.split(local.forward(local.collate(items)), [len(next(iter(it.values()))) for it in items])
        assert len(outs) == len(expect)
        for got, want in zip(outs, expect, strict=True):
            assert got.keys() == want.keys()
            for k in want:
                assert got[k].shape == want[k].shape
                if want[k].dtype.kind == "f":
                    np.testing.assert_allclose(got[k], want[k], rtol=1e-5)
                else:
                    np.testing.assert_array_equal(got[k], want[k])
        assert set(timing) == {"compute_input", "compute_infer", "compute_output", "handoff", "handoff_in"}
        assert all(v >= 0 for v in timing.values())
        assert timing["compute_infer"] > 0
        assert timing["handoff"] > 0
        assert 0 < timing["handoff_in"] < timing["handoff"]


def test_instance_cores():
    assert instance_cores("auto", 1, cores=2) == [1]
    assert instance_cores("auto", 2, cores=4) == [3, 2]
    assert instance_cores("auto", 2, cores=2) == [None, None]  # no core left for the front end
    assert instance_cores("none", 2, cores=8) == [None, None]
    assert instance_cores("0, 1", 2, cores=2) == [0, 1]
    with pytest.raises(ValueError, match="names 1 cores for 2 instances"):
        instance_cores("1", 2, cores=4)
    with pytest.raises(ValueError, match="core 9 does not exist"):
        instance_cores("9", 1, cores=4)
    with pytest.raises(ValueError, match="'auto', 'none' or core numbers"):
        instance_cores("fast", 1, cores=4)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two cores")
def test_the_front_end_and_its_parse_process_keep_off_the_instances_core():
    """Pinned (the default on two cores or more): the instance on its core, the front end
    and its parse process (started beside the instance, before the front end pins itself)
    on the others."""
    with reference_server(*TINY) as (url, proc):
        info = config(url)
        [instance] = info["instances"]
        assert instance["core"] is not None
        assert os.sched_getaffinity(instance["pid"]) == {instance["core"]}
        others = set(os.sched_getaffinity(0)) - {instance["core"]}
        assert os.sched_getaffinity(proc.pid) == others
        spawned = [p for p in children(proc.pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
        parse = [p for p in spawned if p != instance["pid"]]
        assert len(parse) == 1
        assert os.sched_getaffinity(parse[0]) == others


def test_instances_stop_with_the_server_on_sigterm():
    with reference_server(*TINY, "--instances", "2", "--instance-cores", "none") as (url, proc):
        info = config(url)
        pids = [i["pid"] for i in info["instances"]]
        assert info["instance_mode"] == "process"
        assert len(set(pids)) == 2
        assert proc.pid not in pids
        assert set(pids) <= set(children(proc.pid))
        payload = image_payloads(1, 48, np.random.default_rng(0))[0]
        code, doc = infer(url, payload)
        assert code == 200
        assert doc["parameters"]["handoff_us"] > 0
        before = children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        assert "Traceback" not in proc.stderr.read()
    assert wait_gone(before) == []  # the instances and multiprocessing's resource tracker


def cpu_s(pid: int) -> float:
    """A process's CPU time (user + system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_spinning_instance_answers_keeps_its_core_busy_and_stops_with_the_server():
    with reference_server(*TINY, "--instance-idle", "spin", "--instance-cores", "none") as (url, proc):
        info = config(url)
        assert info["instance_idle"] == "spin"
        pid = info["instances"][0]["pid"]
        payloads = image_payloads(3, 48, np.random.default_rng(0))
        assert all(infer(url, p)[0] == 200 for p in payloads)
        before = cpu_s(pid)
        time.sleep(1.0)  # no request: a sleeping instance would use next to no CPU
        assert cpu_s(pid) - before > 0.3
        family = children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        assert "Traceback" not in proc.stderr.read()
    assert wait_gone(family) == []


def test_instances_die_with_a_killed_front_end():
    with reference_server(*TINY, "--instances", "1") as (url, proc):
        pids = [i["pid"] for i in config(url)["instances"]]
        family = children(proc.pid)
        assert set(pids) <= set(family)
        proc.kill()  # no chance to clean up: the kernel's parent-death signal and the closed pipe do it
        proc.wait(timeout=10)
    assert wait_gone(family) == []


def test_a_dead_instance_gives_503_and_readiness_false_never_a_hang():
    with reference_server(*TINY, "--max-queue-delay-ms", "600", "--max-batch-size", "8") as (url, _proc):
        payload = image_payloads(1, 48, np.random.default_rng(0))[0]
        assert infer(url, payload)[0] == 200
        assert status(url + "/v2/health/ready") == 200
        pid = config(url)["instances"][0]["pid"]
        with ThreadPoolExecutor(1) as pool:
            queued = pool.submit(infer, url, payload)  # waits out its 600 ms window in the queue
            time.sleep(0.2)
            os.kill(pid, signal.SIGKILL)
            assert wait_gone([pid]) == []
            code, doc = queued.result(timeout=10)
        assert code == 503
        assert "was killed by signal 9" in doc["error"]
        t0 = time.monotonic()
        code, doc = infer(url, payload)
        assert time.monotonic() - t0 < 5
        assert code == 503
        assert "model instance 0 was killed by signal 9" in doc["error"]
        assert str(pid) not in doc["error"]  # the pid is the server's business: its log names it
        req = urllib.request.Request(f"{url}/v2/models/resnet/infer", data=payload.body, headers=payload.headers)
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(req, timeout=30)
        assert answer.value.code == 503
        assert answer.value.headers["Retry-After"] == "1"
        assert status(url + "/v2/health/ready") == 503
        assert status(url + "/v2/models/resnet/ready") == 503
        assert status(url + "/v2/health/live") == 200  # the front end itself is alive, and says why
        assert config(url)["instances"][0]["alive"] is False
        _proc.terminate()
        _, err = _proc.communicate(timeout=30)
    assert f"model instance 0 (pid {pid}) was killed by signal 9" in err
