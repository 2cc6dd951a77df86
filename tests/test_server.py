"""The reference server over real HTTP on 127.0.0.1: protocol conformance with Triton's own
client, bad input, overload, Redis features, metrics, and a graceful SIGTERM."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

pytest.importorskip("torch", reason="the reference server needs the server extra (torch)")
th = pytest.importorskip("tritonclient.http", reason="conformance is checked with tritonclient[http]")

from calibrate.loadgen import image_payloads  # noqa: E402
from reference_server.models import jpeg  # noqa: E402
from tests.servers import free_port, redis_server, reference_server, servesim_cmd  # noqa: E402

TINY = ("--resolution", "32", "--width", "8")


@pytest.fixture(scope="module")
def server():
    with reference_server(*TINY, "--max-batch-size", "4", "--max-queue-delay-ms", "20") as (url, _proc):
        yield url


def client(url: str):
    return th.InferenceServerClient(url.removeprefix("http://"))


def image_input(n: int = 1, seed: int = 0):
    rng = np.random.default_rng(seed)
    arr = np.array([[jpeg(rng, side=48)] for _ in range(n)], dtype=object)
    inp = th.InferInput("image", [n, 1], "BYTES")
    inp.set_data_from_numpy(arr)
    return inp


def post(url: str, body: bytes, headers: dict | None = None) -> tuple[int, dict, dict]:
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, json.loads(err.read())


def test_health_metadata_and_repository(server):
    c = client(server)
    assert c.is_server_live()
    assert c.is_server_ready()
    assert c.is_model_ready("resnet")
    md = c.get_model_metadata("resnet")
    assert md["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1, 1]}]
    assert [o["name"] for o in md["outputs"]] == ["class", "probability"]
    assert c.get_model_repository_index() == [{"name": "resnet", "version": "1", "state": "READY"}]
    cfg = c.get_model_config("resnet")
    assert cfg["max_batch_size"] == 4
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 20000


@pytest.mark.parametrize("binary", [True, False])
def test_infer_with_tritonclient(server, binary):
    c = client(server)
    outputs = [th.InferRequestedOutput(n, binary_data=binary) for n in ("class", "probability")]
    r = c.infer("resnet", [image_input(2)], outputs=outputs, request_id="abc")
    cls, prob = r.as_numpy("class"), r.as_numpy("probability")
    assert cls.shape == (2, 1)
    assert cls.dtype == np.int64
    assert ((cls >= 0) & (cls < 1000)).all()
    assert ((prob > 0) & (prob <= 1)).all()
    resp = r.get_response()
    assert resp["id"] == "abc"
    params = resp["parameters"]
    for stage in ("preprocess_us", "queue_us", "compute_input_us", "compute_infer_us", "compute_output_us"):
        assert params[stage] >= 0
    assert params["request_us"] >= params["compute_infer_us"]
    assert 2 <= params["batch_size"] <= 4


def test_same_image_same_answer_and_stats(server):
    c = client(server)
    a = c.infer("resnet", [image_input(1, seed=7)]).as_numpy("class")
    b = c.infer("resnet", [image_input(1, seed=7)]).as_numpy("class")
    assert a.tolist() == b.tolist()
    stats = c.get_inference_statistics("resnet")["model_stats"][0]
    assert stats["inference_count"] >= 2
    assert sum(b["compute_infer"]["count"] for b in stats["batch_stats"]) == stats["execution_count"]


def test_concurrent_requests_are_batched(server):
    c = th.InferenceServerClient(server.removeprefix("http://"), concurrency=8)
    pending = [c.async_infer("resnet", [image_input(1, seed=i)]) for i in range(8)]
    sizes = [p.get_result().get_response()["parameters"]["batch_size"] for p in pending]
    assert max(sizes) > 1  # a 20 ms window gathers concurrent requests
    assert max(sizes) <= 4


def test_prometheus_metrics(server):
    client(server).infer("resnet", [image_input()])
    with urllib.request.urlopen(server + "/metrics", timeout=10) as r:
        text = r.read().decode()
    for name in (
        "nv_inference_request_success_total",
        "nv_inference_queue_duration_us_total",
        "nv_inference_compute_infer_duration_us_total",
        "nv_inference_exec_count_total",
        'servesim_stage_duration_seconds_bucket{le="0.01",model="resnet",stage="compute_infer",version="1"}',
    ):
        assert name in text, name


def _json_infer(inputs: list[dict]) -> bytes:
    return json.dumps({"inputs": inputs}).encode()


# a binary input that claims 99 bytes and brings 3
BINARY_SHORT = (
    json.dumps(
        {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1, 1], "parameters": {"binary_data_size": 99}}]}
    ).encode()
    + b"abc"
)


def test_an_oversized_body_is_refused_from_its_headers(server):
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v2/models/resnet/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1073741824\r\n\r\n"
        )
        head = b""
        while b"exceeds" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                break
            head += chunk
        head = head.decode()
    assert head.startswith("HTTP/1.1 413")
    assert "exceeds the limit" in head
    assert client(server).is_server_live()


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "message"),
    [
        ("resnet/infer", b"{not json", {}, 400, "not valid JSON"),
        ("resnet/infer", b"{}", {}, 400, "non-empty 'inputs'"),
        (
            "resnet/infer",
            _json_infer([{"name": "image", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]),
            {},
            400,
            "must be BYTES",
        ),
        (
            "resnet/infer",
            _json_infer([{"name": "image", "datatype": "BYTES", "shape": [1, 2], "data": ["a", "b"]}]),
            {},
            400,
            "has shape [1, 2]",
        ),
        (
            "resnet/infer",
            _json_infer([{"name": "pixels", "datatype": "BYTES", "shape": [1, 1], "data": ["a"]}]),
            {},
            400,
            "unexpected input",
        ),
        (
            "resnet/infer",
            _json_infer([{"name": "image", "datatype": "BYTES", "shape": [1, 1], "data": ["notjpeg"]}]),
            {},
            400,
            "not a decodable",
        ),
        (
            "resnet/infer",
            _json_infer([{"name": "image", "datatype": "BYTES", "shape": [9, 1], "data": ["x"] * 9}]),
            {},
            400,
            "9 elements exceed the 4 a request may carry",
        ),
        (
            "resnet/infer",
            BINARY_SHORT,
            {"Inference-Header-Content-Length": str(len(BINARY_SHORT) - 3)},
            400,
            "exceeds the binary data",
        ),
        (
            "resnet/infer",
            _json_infer([{"name": "image", "datatype": "WEIRD", "shape": [1, 1], "data": ["a"]}]),
            {},
            400,
            "unknown datatype 'WEIRD'",  # its closing quote kept (a KeyError's quotes alone are stripped)
        ),
        ("nosuch/infer", _json_infer([]), {}, 404, "unknown model"),
        ("resnet/versions/7/infer", _json_infer([]), {}, 404, "no version"),
    ],
    ids=[
        "bad-json",
        "no-inputs",
        "wrong-dtype",
        "wrong-shape",
        "unknown-input",
        "corrupt-image",
        "too-many-items",
        "binary-size",
        "unknown-datatype",
        "unknown-model",
        "unknown-version",
    ],
)
def test_bad_requests_get_a_4xx_with_a_message(server, path, body, headers, status, message):
    code, _, doc = post(f"{server}/v2/models/{path}", body, headers)
    assert code == status
    assert message in doc["error"]
    assert client(server).is_server_live()  # and the server is still there


def outcomes(pending) -> tuple[list[int], list[str]]:
    """The HTTP status of each ``async_infer`` call, and the errors' messages."""
    codes, messages = [], []
    for p in pending:
        try:
            p.get_result()
            codes.append(200)
        except th.InferenceServerException as err:
            codes.append(int(err.status()))
            messages.append(err.message())
    return codes, messages


def test_overload_gets_503_with_retry_after():
    args = ("--max-queue-size", "1", "--max-queue-delay-ms", "400", "--max-batch-size", "64")
    with reference_server(*TINY, *args) as (url, _):
        c = th.InferenceServerClient(url.removeprefix("http://"), concurrency=4)
        pending = [c.async_infer("resnet", [image_input(1, seed=i)]) for i in range(4)]
        codes, messages = outcomes(pending)
        assert all("overloaded" in m for m in messages)
        assert codes.count(200) == 1  # the first waits out its window; the queue holds only it
        assert codes.count(503) == 3
        # and the header a client backs off on: one request holds the queue for 400 ms
        image = json.dumps({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1, 1], "data": ["x"]}]})
        first = image_payloads(1, 48, np.random.default_rng(1))[0]  # a binary-tensor request of one JPEG
        holder = threading.Thread(target=post, args=(url + "/v2/models/resnet/infer", first.body, first.headers))
        holder.start()
        threading.Event().wait(0.15)
        code, headers, doc = post(url + "/v2/models/resnet/infer", image.encode())
        holder.join()
        assert code == 503
        assert headers.get("retry-after") == "1"
        assert "queue full" in doc["error"]


def test_sigterm_drains_in_flight_requests():
    with reference_server(*TINY, "--max-queue-delay-ms", "300", "--max-batch-size", "8") as (url, proc):
        c = th.InferenceServerClient(url.removeprefix("http://"), concurrency=3)
        pending = [c.async_infer("resnet", [image_input(1, seed=i)]) for i in range(3)]
        threading.Event().wait(0.1)  # they are queued, inside the 300 ms window
        proc.send_signal(signal.SIGTERM)
        shapes = [p.get_result().as_numpy("class").shape for p in pending]
        assert shapes == [(1, 1)] * 3
        # uvicorn drains, then re-raises the signal: the conventional exit of a terminated process
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        assert "Traceback" not in proc.stderr.read()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed (CI installs it)")
@pytest.mark.parametrize(("batch", "trips"), [(1, 6), (3, 2)])
def test_ranker_fetches_features_from_redis(batch, trips):
    with (
        redis_server() as redis_url,
        reference_server(
            "--model", "ranker", "--redis-url", redis_url, "--feature-keys", "6", "--feature-batch-size", str(batch)
        ) as (url, _),
    ):
        c = client(url)
        names = [i["name"] for i in c.get_model_metadata("ranker")["inputs"]]
        assert names == ["dense", "entity"]
        dense = th.InferInput("dense", [2, 13], "FP32")
        dense.set_data_from_numpy(np.ones((2, 13), dtype=np.float32))
        entity = th.InferInput("entity", [2, 1], "INT64")
        entity.set_data_from_numpy(np.array([[3], [4]], dtype=np.int64))
        r = c.infer("ranker", [dense, entity])
        assert r.as_numpy("score").shape == (2, 1)
        params = r.get_response()["parameters"]
        assert params["feature_round_trips"] == 2 * trips  # 6 keys per item, per GET or per MGET of 3
        assert params["feature_us"] > 0
        entity.set_data_from_numpy(np.array([[10**9], [4]], dtype=np.int64))
        with pytest.raises(th.InferenceServerException, match="no features for feat:1000000000"):
            c.infer("ranker", [dense, entity])


def test_a_feature_store_of_no_entities_exits_2_with_one_line():
    cmd = [*servesim_cmd(), "serve", "--port", str(free_port()), "--model", "ranker"]
    done = subprocess.run(
        [*cmd, "--redis-url", "redis://127.0.0.1:1/0", "--feature-entities", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "--feature-entities" in done.stderr  # the command's own check names the option
    assert "Traceback" not in done.stderr


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed (CI installs it)")
def test_requests_still_fetching_features_count_against_the_queue_bound():
    # a burst far past the queue bound: the requests still fetching their ids from Redis
    # count too, so the surplus is refused at the door instead of piling up in the fetch
    with (
        redis_server() as redis_url,
        reference_server(
            "--model",
            "ranker",
            "--redis-url",
            redis_url,
            "--feature-keys",
            "300",  # ~50 ms of GETs each
            "--feature-entities",
            "100",  # 30k keys written at start-up, not 3M (20 s)
            "--max-queue-size",
            "4",
            "--redis-connections",
            "2",
        ) as (url, _),
    ):
        c = th.InferenceServerClient(url.removeprefix("http://"), concurrency=32)
        dense = th.InferInput("dense", [1, 13], "FP32")
        dense.set_data_from_numpy(np.ones((1, 13), dtype=np.float32))
        entity = th.InferInput("entity", [1, 1], "INT64")
        entity.set_data_from_numpy(np.array([[7]], dtype=np.int64))
        pending = [c.async_infer("ranker", [dense, entity]) for _ in range(64)]
        codes, _ = outcomes(pending)
        assert set(codes) == {200, 503}  # the batcher's queue alone never fills: batches of 8 drain it
        assert c.infer("ranker", [dense, entity]).as_numpy("score").shape == (1, 1)  # and it still serves
