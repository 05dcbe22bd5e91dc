"""A live ``opdispatch serve`` on loopback, driven by Triton's own client over HTTP/REST and
gRPC: outputs equal ``Session.run``, the protocol's errors, readiness with its reason,
metadata, metrics, dynamic batching, a throughput plan's streams and graceful shutdown."""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import dispatch
from tests.serve.conftest import (
    BERT,
    CNN,
    SEQ,
    THROUGHPUT,
    UNTUNED,
    bert_feeds,
    cnn_feeds,
    live_server,
)

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

BERT_CONFIG = f"""
shapes = {{ input_ids = [1, {SEQ}], attention_mask = [1, {SEQ}], token_type_ids = [1, {SEQ}] }}
max_batch_size = 4
max_queue_delay_ms = 150
"""


def _repository(root: Path) -> Path:
    """cnn (versions 1 and 2), bert (batching configured) and an untuned model."""
    repo = root / "models"
    for version in ("1", "2"):
        (repo / "cnn" / version).mkdir(parents=True)
        shutil.copy(CNN, repo / "cnn" / version / "model.onnx")
    (repo / "bert").mkdir()
    shutil.copy(BERT, repo / "bert" / "model.onnx")
    (repo / "bert" / "config.toml").write_text(BERT_CONFIG)
    (repo / "untuned").mkdir()
    shutil.copy(UNTUNED, repo / "untuned" / "model.onnx")
    return repo


@pytest.fixture(scope="module")
def server(tuned_store, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    with live_server([str(_repository(root)), "--store", tuned_store, "--max-body-mb", "1"],
                     root) as live:
        yield live


@pytest.fixture(scope="module")
def expected(tuned_store):
    """What Session.run gives with the same stored plans, per model and seed."""
    cnn = dispatch.Session(str(CNN), store=tuned_store, require_plan=True)
    bert = dispatch.Session(str(BERT), store=tuned_store, require_plan=True)

    def outputs(model: str, seed: int) -> dict[str, np.ndarray]:
        sess, feeds = (cnn, cnn_feeds(seed)) if model == "cnn" else (bert, bert_feeds(seed))
        names = [o.name for o in sess.for_shapes({k: v.shape for k, v in feeds.items()})
                 .get_outputs()]
        return dict(zip(names, sess.run(None, feeds)))

    return outputs


def _inputs(module, feeds: dict[str, np.ndarray], binary: bool = True) -> list:
    inputs = []
    for name, array in feeds.items():
        datatype = "FP32" if array.dtype == np.float32 else "INT64"
        tensor = module.InferInput(name, list(array.shape), datatype)
        if module is httpclient:
            tensor.set_data_from_numpy(array, binary_data=binary)
        else:
            tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _feeds(model: str, seed: int) -> dict[str, np.ndarray]:
    return cnn_feeds(seed) if model == "cnn" else bert_feeds(seed)


@pytest.mark.parametrize("model", ["cnn", "bert"])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_http_outputs_equal_session_run(server, expected, model, binary):
    client = httpclient.InferenceServerClient(server.http_url)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary)
               for n in expected(model, 0)]
    result = client.infer(model, _inputs(httpclient, _feeds(model, 0), binary), outputs=outputs)
    for name, want in expected(model, 0).items():
        got = result.as_numpy(name)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("model", ["cnn", "bert"])
def test_grpc_outputs_equal_session_run(server, expected, model):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    result = client.infer(model, _inputs(grpcclient, _feeds(model, 1)))
    for name, want in expected(model, 1).items():
        np.testing.assert_array_equal(result.as_numpy(name), want)


def test_requested_output_only(server, expected):
    client = httpclient.InferenceServerClient(server.http_url)
    result = client.infer("bert", _inputs(httpclient, bert_feeds(2)),
                          outputs=[httpclient.InferRequestedOutput("pooler_output")])
    assert result.as_numpy("last_hidden_state") is None
    np.testing.assert_array_equal(result.as_numpy("pooler_output"),
                                  expected("bert", 2)["pooler_output"])


def _still_answers(server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_server_live()
    result = client.infer("cnn", _inputs(httpclient, cnn_feeds(3)))
    assert result.as_numpy("pooler_output").shape == (2, 64, 1, 1)


def test_unknown_model(server):
    with pytest.raises(InferenceServerException) as http_err:
        httpclient.InferenceServerClient(server.http_url).infer(
            "nope", _inputs(httpclient, cnn_feeds(0)))
    assert http_err.value.status() == "404"
    with pytest.raises(InferenceServerException) as grpc_err:
        grpcclient.InferenceServerClient(server.grpc_url).infer(
            "nope", _inputs(grpcclient, cnn_feeds(0)))
    assert grpc_err.value.status() == "StatusCode.NOT_FOUND"
    status, body = server.get("/v2/models/nope/ready")
    assert status == 404 and b"bert" in body  # the served models are listed
    _still_answers(server)


@pytest.mark.parametrize("client_module", ["http", "grpc"])
def test_wrong_dtype_and_shape(server, client_module):
    module, url, code = ((httpclient, server.http_url, "400") if client_module == "http" else
                         (grpcclient, server.grpc_url, "StatusCode.INVALID_ARGUMENT"))
    client = module.InferenceServerClient(url)
    wrong_dtype = {"pixel_values": cnn_feeds(0)["pixel_values"].astype(np.float64)}
    tensor = module.InferInput("pixel_values", [2, 3, 32, 32], "FP64")
    tensor.set_data_from_numpy(wrong_dtype["pixel_values"])
    with pytest.raises(InferenceServerException) as err:
        client.infer("cnn", [tensor])
    assert err.value.status() == code
    assert "pixel_values" in err.value.message() and "float32" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.infer("cnn", _inputs(module, {"pixel_values": np.zeros((1, 3, 32, 32),
                                                                       np.float32)}))
    assert err.value.status() == code
    assert "pixel_values" in err.value.message() and "[2, 3, 32, 32]" in err.value.message()
    with pytest.raises(InferenceServerException) as err:  # a shape no plan is stored for
        client.infer("bert", _inputs(module, bert_feeds(0, batch=3)))
    assert err.value.status() == code and "3x8" in err.value.message()
    _still_answers(server)


def test_malformed_and_oversized_bodies(server):
    status, body = server.post("/v2/models/cnn/infer", b'{"inputs": [')
    assert status == 400 and b"malformed" in body
    answer = server.post_oversized("/v2/models/cnn/infer", 2 << 20)
    assert answer.startswith(b"HTTP/1.1 413") and b"over the server's limit" in answer
    big = np.zeros((2, 3, 400, 400), np.float32)  # 3.8 MB over gRPC, the limit is 1 MiB
    with pytest.raises(InferenceServerException) as err:
        grpcclient.InferenceServerClient(server.grpc_url).infer(
            "cnn", _inputs(grpcclient, {"pixel_values": big}))
    assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    status, body = server.post(
        "/v2/models/cnn/infer",
        json.dumps({"inputs": [{"name": "pixel_values", "datatype": "FP32", "shape": [2, 3],
                                "data": [1.0]}]}).encode())
    assert status == 400 and b"pixel_values" in body
    header = json.dumps({"inputs": [{"name": "pixel_values", "datatype": "FP32",
                                     "shape": [2, 3, 32, 32],
                                     "parameters": {"binary_data_size": 24576}}]}).encode()
    request = urllib.request.Request(  # the binary extension, 100 bytes short
        f"http://{server.http_url}/v2/models/cnn/infer", data=header + b"\0" * 24476,
        headers={"Inference-Header-Content-Length": str(len(header)),
                 "Content-Type": "application/octet-stream"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=30)
    assert err.value.code == 400 and b"binary_data_size" in err.value.read()
    _still_answers(server)


def test_model_without_plan_is_not_ready_and_says_why(server):
    status, body = server.get("/v2/models/untuned/ready")
    assert status == 503
    assert b"no usable tuned plan" in body and b"opdispatch tune" in body
    assert not httpclient.InferenceServerClient(server.http_url).is_model_ready("untuned")
    assert not grpcclient.InferenceServerClient(server.grpc_url).is_model_ready("untuned")
    assert httpclient.InferenceServerClient(server.http_url).is_model_ready("cnn")
    feeds = {"pixel_values": np.zeros((2, 3, 32, 32), np.float32)}
    with pytest.raises(InferenceServerException) as err:
        httpclient.InferenceServerClient(server.http_url).infer(
            "untuned", _inputs(httpclient, feeds))
    assert err.value.status() == "503"
    metadata = json.loads(server.get("/v2/models/untuned")[1])
    assert metadata["parameters"]["ready"] is False
    assert "no usable tuned plan" in metadata["parameters"]["reason"]


def test_metadata_names_the_plan(server, tuned_store):
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.get_server_metadata()["name"] == "opdispatch"
    cnn = client.get_model_metadata("cnn")
    assert cnn["versions"] == ["2"]
    assert cnn["inputs"] == [{"name": "pixel_values", "datatype": "FP32",
                              "shape": [2, 3, 32, 32]}]
    plan = cnn["parameters"]
    assert plan["plan_source"] == "store" and plan["objective"] == "latency"
    assert len(plan["plan_id"]) == 16 and len(plan["hardware"]) == 16
    bert = client.get_model_metadata("bert")
    assert all(t["shape"] == [-1, -1] for t in bert["inputs"])
    assert bert["parameters"]["batch_sizes"] == [1, 4]
    grpc_meta = grpcclient.InferenceServerClient(server.grpc_url).get_model_metadata("bert")
    assert [i.name for i in grpc_meta.inputs] == ["input_ids", "attention_mask",
                                                  "token_type_ids"]
    assert list(grpc_meta.inputs[0].shape) == [-1, -1]


def _metrics(server) -> dict[tuple[str, tuple], float]:
    status, body = server.get("/metrics")
    assert status == 200
    values = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def test_metrics_count_requests(server):
    before = _metrics(server)
    key = ("opdispatch_requests_total", (("model", "cnn"), ("outcome", "ok")))
    client = httpclient.InferenceServerClient(server.http_url)
    for seed in range(3):
        client.infer("cnn", _inputs(httpclient, cnn_feeds(seed)))
    with pytest.raises(InferenceServerException):
        client.infer("cnn", _inputs(httpclient, {"pixel_values": np.zeros((1, 3, 32, 32),
                                                                           np.float32)}))
    after = _metrics(server)
    assert after[key] - before.get(key, 0) == 3
    invalid = ("opdispatch_requests_total", (("model", "cnn"), ("outcome", "invalid")))
    assert after[invalid] - before.get(invalid, 0) == 1
    assert after[("opdispatch_request_seconds_count", (("model", "cnn"),))] >= 3
    assert after[("opdispatch_model_ready", (("model", "cnn"),))] == 1
    assert after[("opdispatch_model_ready", (("model", "untuned"),))] == 0
    backends = [k for k in after if k[0] == "opdispatch_backend_seconds_total"
                and ("model", "cnn") in k[1]]
    assert backends and all(after[k] > 0 for k in backends)


def test_dynamic_batching_groups_concurrent_requests(server, expected):
    before = _metrics(server)
    count_key = ("opdispatch_batch_size_count", (("model", "bert"),))
    sum_key = ("opdispatch_batch_size_sum", (("model", "bert"),))
    barrier = threading.Barrier(8)

    def one(seed: int):
        client = httpclient.InferenceServerClient(server.http_url)
        barrier.wait()
        return client.infer("bert", _inputs(httpclient, bert_feeds(seed)))

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    for seed, result in enumerate(results):
        for name, want in expected("bert", seed).items():
            np.testing.assert_allclose(result.as_numpy(name), want, rtol=1e-4, atol=1e-5)
    after = _metrics(server)
    runs = after[count_key] - before.get(count_key, 0)
    requests = after[sum_key] - before.get(sum_key, 0)
    assert requests == 8
    assert runs < 8, f"8 concurrent requests ran in {runs} runs: none was batched"


def test_a_bad_request_fails_alone_among_batched_ones(server, expected):
    barrier = threading.Barrier(5)

    def one(seed: int):
        client = httpclient.InferenceServerClient(server.http_url)
        feeds = bert_feeds(seed)
        if seed == 2:
            feeds["attention_mask"] = feeds["attention_mask"].astype(np.int32)
        inputs = []
        for name, array in feeds.items():
            tensor = httpclient.InferInput(name, list(array.shape),
                                           "INT32" if array.dtype == np.int32 else "INT64")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        barrier.wait()
        try:
            return client.infer("bert", inputs)
        except InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(5) as pool:
        results = list(pool.map(one, range(5)))
    assert isinstance(results[2], InferenceServerException) and results[2].status() == "400"
    assert "attention_mask" in results[2].message()
    for seed in (0, 1, 3, 4):
        np.testing.assert_allclose(results[seed].as_numpy("pooler_output"),
                                   expected("bert", seed)["pooler_output"], rtol=1e-4,
                                   atol=1e-5)


def test_throughput_plan_serves_concurrent_requests(tuned_store, tmp_path, expected):
    with live_server([str(CNN), "--store", tuned_store, "--objective", THROUGHPUT,
                      "--grpc-port", "0"], tmp_path) as live:
        metadata = httpclient.InferenceServerClient(live.http_url).get_model_metadata(
            CNN.stem)
        plan = metadata["parameters"]
        assert plan["objective"] == THROUGHPUT and plan["serving"] is not None
        assert plan["concurrency"] == plan["serving"]["requests"]

        def one(seed: int):
            client = httpclient.InferenceServerClient(live.http_url)
            return client.infer(CNN.stem, _inputs(httpclient, cnn_feeds(seed % 3)))

        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(one, range(12)))
        single = dispatch.Session(str(CNN), store=tuned_store, objective=THROUGHPUT,
                                  require_plan=True)
        for seed, result in enumerate(results):
            (want,) = single.run(["pooler_output"], cnn_feeds(seed % 3))
            np.testing.assert_array_equal(result.as_numpy("pooler_output"), want)
        assert live.stop() == 0


def test_graceful_shutdown_answers_requests_in_flight(tuned_store, tmp_path, expected):
    repo = tmp_path / "repo" / "bert"
    repo.mkdir(parents=True)
    shutil.copy(BERT, repo / "model.onnx")
    (repo / "config.toml").write_text(BERT_CONFIG.replace("150", "1500"))
    with live_server([str(tmp_path / "repo"), "--store", tuned_store, "--grpc-port", "0"],
                     tmp_path) as live:
        client = httpclient.InferenceServerClient(live.http_url, network_timeout=60)
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(client.infer, "bert", _inputs(httpclient, bert_feeds(5)))
            time.sleep(0.5)  # the request waits 1.5 s in the batcher for company
            assert not pending.done()
            started = time.monotonic()
            code = live.stop()
            result = pending.result(timeout=30)
        assert code == 0 and time.monotonic() - started < 30
        np.testing.assert_allclose(result.as_numpy("pooler_output"),
                                   expected("bert", 5)["pooler_output"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("client", ["raw", "triton"])
def test_the_bench_load_generator_counts_answered_requests(server, client):
    from bench.serve_load import run_closed

    report = run_closed(server.http_url, "cnn", 2, duration_s=0.5, max_requests=40,
                        warmup_s=0.1, client=client)
    assert report.errors == 0, report.error
    assert 0 < report.requests <= 40 and report.throughput > 0
    assert report.p50_ms <= report.p99_ms


def test_the_bench_raw_client_reports_refusals_and_goes_on(server):
    from bench.raw_infer_client import RawInferClient

    good = RawInferClient(server.http_url, "cnn", cnn_feeds(0), ["pooler_output"], 30)
    wrong = {"pixel_values": np.zeros((1, 3, 32, 32), np.float32)}
    bad = RawInferClient(server.http_url, "cnn", wrong, [], 30)
    missing = RawInferClient(server.http_url, "nonesuch", cnn_feeds(0), [], 30)
    try:
        assert good.send() is None
        refused = bad.send()
        assert refused is not None and refused.startswith("HTTP 400")
        assert "pixel_values" in refused
        unknown = missing.send()
        assert unknown is not None and unknown.startswith("HTTP 404")
        assert bad.send().startswith("HTTP 400")  # the same connection, still answered
        assert good.send() is None
    finally:
        for c in (good, bad, missing):
            c.close()
