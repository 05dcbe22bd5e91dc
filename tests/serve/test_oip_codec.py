"""The Open Inference Protocol's request decoder and body limit (:mod:`tuner.serve.oip_codec`),
which the fast route and the framework's route share: JSON and binary bodies, the
``Inference-Header-Content-Length`` header, datatypes and shapes, and errors that say what was
received and what was expected. No framework, no model."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from tuner.serve.oip_codec import (
    BodyTooLarge,
    RequestError,
    decode_request,
    json_length_of,
    read_body,
)


def binary_body(arrays: dict[str, np.ndarray], datatypes: dict[str, str],
                **parameters: Any) -> tuple[bytes, int]:
    header: dict[str, Any] = {"inputs": [
        {"name": n, "shape": list(a.shape), "datatype": datatypes[n],
         "parameters": {"binary_data_size": a.nbytes}} for n, a in arrays.items()]}
    if parameters:
        header["parameters"] = parameters
    text = json.dumps(header).encode()
    return text + b"".join(a.tobytes() for a in arrays.values()), len(text)


def read(chunks: Sequence[bytes], max_bytes: int, declared: int | None = None,
         json_length: int | None = None) -> memoryview | None:
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                for i, c in enumerate(chunks)]

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    headers = {} if declared is None else {b"content-length": str(declared).encode()}
    return asyncio.run(read_body(receive, headers, max_bytes, json_length))


def test_a_json_body_decodes_to_arrays_with_the_outputs_asked_for():
    body = json.dumps({
        "id": "r1", "parameters": {"binary_data_output": True},
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4]},
                   {"name": "ids", "datatype": "INT64", "shape": [1, 3],
                    "data": [[7, 8, 9]]}],
        "outputs": [{"name": "y", "parameters": {"binary_data": False}}, {"name": "z"}],
    }).encode()
    feeds, requested, binary, request_id = decode_request(body, None)
    assert list(feeds) == ["x", "ids"] and request_id == "r1" and binary is True
    np.testing.assert_array_equal(feeds["x"], np.arange(1, 5, dtype=np.float32).reshape(2, 2))
    assert feeds["x"].dtype == np.float32 and feeds["ids"].dtype == np.int64
    np.testing.assert_array_equal(feeds["ids"], [[7, 8, 9]])
    assert requested == [("y", False), ("z", None)]


def test_a_binary_body_decodes_each_input_from_its_bytes():
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3),
              "m": np.array([[True, False]]), "h": np.ones(3, np.float16)}
    body, length = binary_body(arrays, {"a": "FP32", "m": "BOOL", "h": "FP16"})
    decoded = decode_request(memoryview(body), length)
    for name, array in arrays.items():
        np.testing.assert_array_equal(decoded.feeds[name], array)
        assert decoded.feeds[name].dtype == array.dtype
    assert decoded.requested == [] and decoded.binary_output is False and decoded.id is None


def test_the_header_length_is_a_byte_count_within_the_body():
    assert json_length_of(None) is None and json_length_of(b"12") == 12
    assert json_length_of("12") == 12
    for bad in (b"-1", b"12a", b"", "\u00b2"):
        with pytest.raises(RequestError, match="Inference-Header-Content-Length.*expected"):
            json_length_of(bad)
    body, length = binary_body({"a": np.zeros(2, np.float32)}, {"a": "FP32"})
    with pytest.raises(RequestError) as err:
        decode_request(body, len(body) + 1)
    assert f"{len(body) + 1} bytes" in str(err.value) and f"{len(body)} bytes" in str(err.value)
    with pytest.raises(RequestError, match="malformed request"):  # the header cut short
        decode_request(body, length - 3)


def test_a_binary_input_without_the_header_or_short_of_its_bytes_is_refused():
    body, length = binary_body({"a": np.zeros(4, np.float32)}, {"a": "FP32"})
    with pytest.raises(RequestError, match="binary_data_size without the Inference-Header"):
        decode_request(body[:length], None)
    with pytest.raises(RequestError) as err:
        decode_request(body[:-4], length)
    assert "'a'" in str(err.value) and "binary_data_size 16 does not fit the 12 bytes left" \
        in str(err.value)
    header = json.dumps({"inputs": [{"name": "a", "datatype": "FP32", "shape": [4],
                                     "parameters": {"binary_data_size": 12}}]}).encode()
    with pytest.raises(RequestError, match="binary_data_size 12; expected 16 bytes for FP32"):
        decode_request(header + bytes(12), len(header))


@pytest.mark.parametrize(("item", "expected"), [
    ({"name": "x", "datatype": "BYTES", "shape": [1], "data": ["a"]},
     "input 'x': datatype 'BYTES'; expected one of BOOL, INT8"),
    ({"name": "x", "datatype": "FLOAT", "shape": [1], "data": [1.0]},
     "input 'x': datatype 'FLOAT'; expected one of"),
    ({"name": "x", "datatype": "FP32", "shape": [2, -1], "data": [1.0]},
     re.escape("input 'x': shape [2, -1]; expected a list of non-negative integers")),
    ({"name": "x", "datatype": "FP32", "shape": "2x3", "data": [1.0]},
     "input 'x': shape 2x3; expected a list"),
    ({"name": "x", "datatype": "FP32", "shape": [2, 3], "data": [1.0]},
     re.escape("input 'x': 1 values; expected 6 for shape [2, 3]")),
    ({"name": "x", "datatype": "INT8", "shape": [1], "data": [1000]},
     re.escape("input 'x': its data are not INT8 values in shape [1]")),
    ({"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [[1.0], [2.0, 3.0]]},
     re.escape("input 'x': its data are not FP32 values in shape [2, 2]")),
    ({"name": "x", "datatype": "FP16", "shape": [1], "data": [1.0]},
     "input 'x': FP16 data cannot be sent as JSON"),
    ({"name": "x", "datatype": "FP32", "shape": [1]},
     "input 'x': neither 'data' nor parameters.binary_data_size"),
    ({"datatype": "FP32", "shape": [1], "data": [1.0]},
     "input #0: received .*; expected an object with a 'name'"),
])
def test_a_wrong_input_is_refused_saying_what_was_received_and_expected(item, expected):
    with pytest.raises(RequestError, match=expected):
        decode_request(json.dumps({"inputs": [item]}).encode(), None)


@pytest.mark.parametrize(("body", "expected"), [
    (b'{"inputs": [', "malformed request: .*; an Open Inference Protocol request is"),
    (b"[1, 2]", "malformed request: received a JSON list"),
    (b'{"input": []}', r"malformed request: received an object with keys \['input'\]"),
    (b'{"inputs": [], "outputs": {"name": "y"}}', "'outputs' is a dict; expected a list"),
    (b'{"inputs": [], "outputs": [{"binary_data": true}]}', "requested output .*'name'"),
])
def test_a_malformed_request_is_refused_saying_what_a_request_is(body, expected):
    with pytest.raises(RequestError, match=expected):
        decode_request(body, None)


def test_an_input_given_twice_is_refused():
    item = {"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}
    with pytest.raises(RequestError, match="input 'x' is given twice"):
        decode_request(json.dumps({"inputs": [item, item]}).encode(), None)


def test_the_body_is_read_whole_with_its_binary_part_aligned():
    body, length = binary_body({"a": np.arange(5, dtype=np.float64)}, {"a": "FP64"})
    for declared in (len(body), None):  # declared, or streamed (the buffer grows)
        chunks = [body[i:i + 7] for i in range(0, len(body), 7)]
        view = read(chunks, max_bytes=len(body), declared=declared, json_length=length)
        assert view is not None and bytes(view) == body
        feeds = decode_request(view, length).feeds
        assert feeds["a"].ctypes.data % 64 == 0 and feeds["a"].flags.writeable


def test_a_body_over_the_limit_is_refused_declared_or_streamed():
    with pytest.raises(BodyTooLarge, match="a body of 2000 bytes"):
        read([b"x" * 2000], max_bytes=1000, declared=2000)
    with pytest.raises(BodyTooLarge, match="a body of at least 1200 bytes"):
        read([b"x" * 400] * 5, max_bytes=1000)
    assert bytes(read([b"x" * 1000], max_bytes=1000)) == b"x" * 1000


def test_a_client_gone_before_the_end_of_the_body_reads_as_none():
    messages = [{"type": "http.request", "body": b"{", "more_body": True},
                {"type": "http.disconnect"}]

    async def receive() -> dict:
        return messages.pop(0)

    assert asyncio.run(read_body(receive, {}, 100)) is None
