"""The HTTP inference route of the served models (:mod:`tuner.serve.fast_infer`), driven as
ASGI on a real model runner (the committed CNN and BERT exports, their untuned plans): the
binary tensor data extension and JSON in and out, against ``Session.run``; the errors; and what
the route leaves to the framework (given the request's body intact).

The live-server tests (``test_oip_server.py``) check the same route end to end with Triton's
client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dispatch
from tests.serve.conftest import BERT, CNN, bert_feeds, cnn_feeds
from tests.serve.test_serve_units import make_runner
from tuner.serve.fast_infer import InferFastPath, runners_of
from tuner.serve.oip_codec import aligned as _aligned
from tuner.serve.oip_codec import decode_request as _decode
from tuner.serve.runner import ModelRunner

NAMES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32",
         np.dtype(np.float64): "FP64"}


class FrameworkApp:
    """Stands in for the framework's application: records what reached it and its body."""

    def __init__(self) -> None:
        self.path: str | None = None
        self.body = b""

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        self.path = scope["path"]
        while True:
            message = await receive()
            self.body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"framework"})


@pytest.fixture(scope="module")
def runners(tmp_path_factory) -> Iterator[dict[str, ModelRunner]]:
    store = tmp_path_factory.mktemp("fast") / "plans.sqlite"
    cnn = make_runner(CNN, store, "fast-cnn", allow_untuned=True)
    bert = make_runner(BERT, store, "fast-bert", allow_untuned=True,
                       shapes={n: [1, 8] for n in bert_feeds(0)})
    for runner in (cnn, bert):
        assert runner.load(), runner.reason
    yield {"cnn": cnn, "bert": bert, "store": store}  # type: ignore[dict-item]
    for runner in (cnn, bert):
        asyncio.run(runner.drain(grace_s=5))


def binary_request(feeds: Mapping[str, np.ndarray], outputs: Sequence[Mapping] | None = None,
                   **parameters: Any) -> tuple[bytes, int]:
    """A request as Triton's HTTP client sends it: the JSON header, then each input's bytes."""
    header: dict[str, Any] = {"inputs": [
        {"name": n, "shape": list(a.shape), "datatype": NAMES[a.dtype],
         "parameters": {"binary_data_size": a.nbytes}} for n, a in feeds.items()]}
    if outputs is not None:
        header["outputs"] = list(outputs)
    if parameters:
        header["parameters"] = parameters
    text = json.dumps(header).encode()
    return text + b"".join(a.tobytes() for a in feeds.values()), len(text)


def call(runners: Mapping[str, ModelRunner], name: str, body: bytes, json_length: int | None,
         chunk: int = 1000, max_bytes: int = 1 << 24, declare: bool = True
         ) -> tuple[int, dict[bytes, bytes], bytes, FrameworkApp]:
    """POST ``body`` in chunks to ``/v2/models/NAME/infer``; returns the status, the headers,
    the body answered and the framework's stand-in."""
    headers = [(b"content-type", b"application/octet-stream")]
    if declare:
        headers.append((b"content-length", str(len(body)).encode()))
    if json_length is not None:
        headers.append((b"inference-header-content-length", str(json_length).encode()))
    scope = {"type": "http", "method": "POST", "path": f"/v2/models/{name}/infer",
             "headers": headers}
    pieces = [body[i:i + chunk] for i in range(0, len(body), chunk)] or [b""]
    messages = [{"type": "http.request", "body": p, "more_body": k < len(pieces) - 1}
                for k, p in enumerate(pieces)]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    app = FrameworkApp()
    models = {v.name: v for v in runners.values() if isinstance(v, ModelRunner)}
    asyncio.run(InferFastPath(app, models, max_bytes)(scope, receive, send))
    start = sent[0]
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:]), app


def decode(headers: Mapping[bytes, bytes], body: bytes) -> dict[str, np.ndarray]:
    """The outputs of a response, binary or JSON, as arrays."""
    length = int(headers.get(b"inference-header-content-length", len(body)))
    answer, offset, out = json.loads(body[:length]), length, {}
    dtypes = {v: k for k, v in NAMES.items()}
    for o in answer["outputs"]:
        if "data" in o:
            out[o["name"]] = np.asarray(o["data"], dtypes[o["datatype"]]).reshape(o["shape"])
        else:
            size = o["parameters"]["binary_data_size"]
            out[o["name"]] = np.frombuffer(body[offset:offset + size],
                                           dtypes[o["datatype"]]).reshape(o["shape"])
            offset += size
    return out


def expected(runners: Mapping[str, Any], path: Path, feeds: Mapping[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
    session = dispatch.Session(str(path), store=str(runners["store"]),
                               input_shapes={n: list(a.shape) for n, a in feeds.items()})
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, dict(feeds))))


@pytest.mark.parametrize("chunk", [1000, 1 << 20])
def test_a_binary_request_answers_binary_outputs_equal_to_session_run(runners, chunk):
    feeds = cnn_feeds(4)
    body, length = binary_request(feeds, binary_data_output=True)
    status, headers, answer, app = call(runners, runners["cnn"].name, body, length, chunk=chunk)
    assert status == 200 and app.path is None  # answered here, not by the framework
    assert headers[b"content-type"] == b"application/octet-stream"
    got = decode(headers, answer)
    want = expected(runners, CNN, feeds)
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_a_json_request_answers_json_and_a_requested_output_in_its_own_format(runners):
    feeds = cnn_feeds(5)
    request = {"id": "r-7", "inputs": [{"name": "pixel_values", "shape": [2, 3, 32, 32],
                                        "datatype": "FP32",
                                        "data": feeds["pixel_values"].tolist()}],
               "outputs": [{"name": "pooler_output", "parameters": {"binary_data": False}}]}
    status, headers, answer, _ = call(runners, runners["cnn"].name,
                                      json.dumps(request).encode(), None)
    assert status == 200 and headers[b"content-type"] == b"application/json"
    parsed = json.loads(answer)
    assert parsed["id"] == "r-7" and parsed["model_name"] == runners["cnn"].name
    assert [o["name"] for o in parsed["outputs"]] == ["pooler_output"]
    np.testing.assert_allclose(decode(headers, answer)["pooler_output"],
                               expected(runners, CNN, feeds)["pooler_output"], rtol=1e-6)
    body, length = binary_request(feeds, outputs=[{"name": "last_hidden_state",
                                                   "parameters": {"binary_data": True}}])
    status, headers, answer, _ = call(runners, runners["cnn"].name, body, length)
    assert status == 200 and list(decode(headers, answer)) == ["last_hidden_state"]


def test_binary_inputs_are_aligned_writable_views_of_the_body_or_aligned_copies():
    feeds = {"a": np.arange(3, dtype=np.int32), "b": np.arange(2, dtype=np.int64) + 7,
             "c": np.ones((2, 2), np.float32)}
    body, length = binary_request(feeds)
    buffer, start = _aligned(len(body), length)
    buffer[start:start + len(body)] = np.frombuffer(body, np.uint8)
    decoded, requested, binary, request_id = _decode(memoryview(buffer[start:start + len(body)]),
                                                     length)
    assert requested == [] and binary is False and request_id is None
    for name, array in feeds.items():
        np.testing.assert_array_equal(decoded[name], array)
        assert decoded[name].dtype == array.dtype and decoded[name].flags.writeable
        assert decoded[name].flags.aligned
    assert decoded["a"].ctypes.data % 64 == 0 and np.shares_memory(decoded["a"], buffer)
    assert not np.shares_memory(decoded["b"], buffer)  # at offset 12: copied to align it


def test_integer_inputs_answer_equal_to_session_run_and_a_wrong_dtype_is_refused(runners):
    feeds = bert_feeds(6)
    want = expected(runners, BERT, feeds)
    mixed = dict(feeds, attention_mask=feeds["attention_mask"].astype(np.int32))
    body, length = binary_request(mixed, binary_data_output=True)
    status, _headers, answer, _ = call(runners, runners["bert"].name, body, length)
    assert status == 400 and b"attention_mask" in answer and b"int64" in answer
    body, length = binary_request(feeds, binary_data_output=True)
    status, headers, answer, _ = call(runners, runners["bert"].name, body, length, chunk=7)
    assert status == 200
    for name, array in decode(headers, answer).items():
        np.testing.assert_array_equal(array, want[name])


def test_a_wrong_shape_is_refused_naming_the_input_and_what_is_expected(runners):
    body, length = binary_request({"pixel_values": np.zeros((1, 3, 32, 32), np.float32)})
    status, _headers, answer, app = call(runners, runners["cnn"].name, body, length)
    assert status == 400 and app.path is None
    message = json.loads(answer)["error"]
    assert "pixel_values" in message and "[2, 3, 32, 32]" in message


@pytest.mark.parametrize("body", [
    b'{"inputs": [',  # malformed JSON
    json.dumps({"inputs": [{"name": "pixel_values", "datatype": "FP32", "shape": [2, 3],
                            "data": [1.0]}]}).encode(),  # data that does not fill the shape
    json.dumps({"inputs": [{"name": "pixel_values", "datatype": "BYTES", "shape": [1],
                            "data": ["a"]}]}).encode(),  # a datatype this route leaves alone
    json.dumps({"inputs": [{"name": "pixel_values", "datatype": "INT8", "shape": [1],
                            "data": [1000]}]}).encode(),  # a value its datatype cannot hold
    json.dumps({"inputs": [{"name": "pixel_values", "datatype": "FP32", "shape": [2, 2],
                            "data": [[1.0], [2.0, 3.0]]}]}).encode(),  # ragged data
])
def test_what_the_route_cannot_decode_reaches_the_framework_intact(runners, body):
    status, _headers, answer, app = call(runners, runners["cnn"].name, body, None, chunk=5)
    assert status == 299 and answer == b"framework"
    assert app.path == f"/v2/models/{runners['cnn'].name}/infer" and app.body == body


def test_a_binary_part_shorter_than_declared_reaches_the_framework(runners):
    body, length = binary_request(cnn_feeds(0))
    status, _headers, _answer, app = call(runners, runners["cnn"].name, body[:-100], length)
    assert status == 299 and app.body == body[:-100]


def test_other_models_and_routes_reach_the_framework(runners):
    body, length = binary_request(cnn_feeds(0))
    status, _h, _a, app = call(runners, "not-served-here", body, length)
    assert status == 299 and app.path == "/v2/models/not-served-here/infer"


@pytest.mark.parametrize("declare", [True, False])
def test_a_body_over_the_limit_is_refused_with_413(runners, declare):
    body, length = binary_request(cnn_feeds(0))
    status, headers, answer, app = call(runners, runners["cnn"].name, body, length,
                                        max_bytes=10_000, declare=declare)
    assert status == 413 and app.path is None and headers[b"connection"] == b"close"
    assert b"over the server's limit of 10000 bytes" in answer


def test_only_models_with_a_local_runner_take_the_route(runners):
    class Remote:
        name = "remote"

    class Local:
        name = "local"
        runner = runners["cnn"]

    assert runners_of([Remote(), Local()]) == {"local": runners["cnn"]}
