"""The Open Inference Protocol's HTTP request, read and decoded in one place for the whole
server: the inference route of the models served here (:mod:`tuner.serve.fast_infer`) and the
framework's path (the inference route :mod:`tuner.serve.server` registers on ``kserve``'s
application, and its body limit) call the same functions.

- :func:`read_body`: the one body limit. An ASGI body is read into one buffer, the binary part
  aligned to a cache line, and refused (:class:`BodyTooLarge`) as soon as it is over the limit,
  declared (``Content-Length``) or streamed in chunks; :func:`refuse_oversized` answers 413.
- :func:`json_length_of`: the binary tensor data extension's ``Inference-Header-Content-Length``.
- :func:`parse_header` and :func:`decode_request`: the JSON header (``orjson``) and each input,
  JSON ``data`` or the extension's bytes, as a NumPy array of the protocol's datatype and shape.
  A binary input is a view of the body (writable and aligned when the body is: no copy).

Whatever is wrong with a request raises :class:`RequestError`, whose message says what was
received and what was expected (HTTP 400 on the framework's path).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import orjson

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

#: the binary tensor data extension's header: the JSON header's length in bytes
HEADER = b"inference-header-content-length"
#: the protocol's datatypes this server decodes (``BYTES`` is not a tensor a plan runs on)
DTYPES = {"BOOL": np.dtype(bool), "INT8": np.dtype(np.int8), "INT16": np.dtype(np.int16),
          "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
          "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
          "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64),
          "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32),
          "FP64": np.dtype(np.float64)}
#: the protocol's datatype of each NumPy dtype
NAMES = {dtype: name for name, dtype in DTYPES.items()}
#: where the binary tensors start in the receive buffer (a cache line)
ALIGN = 64
_EXPECTED = ('an Open Inference Protocol request is a JSON object: {"inputs": [{"name", '
             '"datatype", "shape", "data" or "parameters": {"binary_data_size"}}], "outputs": '
             '[{"name"}] (optional)}')


class RequestError(ValueError):
    """The body is not a well-formed inference request; the message says what was received
    and what was expected."""


class BodyTooLarge(Exception):
    """The body is over the server's limit (the message: the size seen)."""


class DecodedRequest(NamedTuple):
    """An inference request as arrays."""

    #: ``{input name: array}`` in the request's order
    feeds: dict[str, np.ndarray]
    #: the outputs asked for, each with its own ``binary_data`` flag (``None``: not given)
    requested: list[tuple[str, bool | None]]
    #: the request's ``binary_data_output`` parameter
    binary_output: bool
    #: the request's ``id`` (``None``: none)
    id: Any


# -- the body --------------------------------------------------------------------------------
def int_header(value: bytes | str | None) -> int | None:
    """A header's value as a non-negative integer, else ``None``."""
    return int(value) if value is not None and value.isascii() and value.isdigit() else None


def json_length_of(value: bytes | str | None) -> int | None:
    """The ``Inference-Header-Content-Length`` header's value (``None``: absent, the body is
    all JSON); raises :class:`RequestError` when it is not a byte count."""
    if value is None:
        return None
    length = int_header(value)
    if length is None:
        shown = value.decode("latin-1") if isinstance(value, bytes) else value
        raise RequestError(f"the Inference-Header-Content-Length header is {shown[:40]!r}; "
                           f"expected the JSON header's length in bytes")
    return length


def aligned(size: int, json_length: int) -> tuple[np.ndarray, int]:
    """A buffer of ``size`` bytes from ``start``, where ``start + json_length`` is aligned."""
    buffer = np.empty(size + ALIGN, np.uint8)
    address = buffer.ctypes.data + json_length
    return buffer, (-address) % ALIGN


async def read_body(receive: Receive, headers: Mapping[bytes, bytes], max_bytes: int,
                    json_length: int | None = None) -> memoryview | None:
    """The body of an ASGI HTTP request in one writable buffer, ``json_length`` bytes in (the
    binary part) aligned; ``None`` when the client went away. Raises :class:`BodyTooLarge`
    before reading a declared length over ``max_bytes``, and at the first chunk over it."""
    declared = int_header(headers.get(b"content-length"))
    if declared is not None and declared > max_bytes:
        raise BodyTooLarge(f"a body of {declared} bytes")
    offset = json_length or 0
    buffer, start = aligned(declared if declared is not None else 1 << 16, offset)
    end = start
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        if chunk:
            if end - start + len(chunk) > max_bytes:
                raise BodyTooLarge(f"a body of at least {end - start + len(chunk)} bytes")
            if end + len(chunk) > len(buffer):  # undeclared (or wrongly declared) length: grow
                grown, gstart = aligned(2 * (end - start + len(chunk)), offset)
                grown[gstart:gstart + end - start] = buffer[start:end]
                buffer, end, start = grown, gstart + end - start, gstart
            buffer[end:end + len(chunk)] = np.frombuffer(chunk, np.uint8)
            end += len(chunk)
        if not message.get("more_body"):
            break
    return memoryview(buffer[start:end])


# -- the request -----------------------------------------------------------------------------
def parse_header(view: memoryview | bytes, json_length: int | None) -> dict[str, Any]:
    """The request's JSON header (the first ``json_length`` bytes, or the whole body), checked
    to be an object with a list of ``inputs``."""
    if json_length is not None and json_length > len(view):
        raise RequestError(f"the Inference-Header-Content-Length header says the JSON header "
                           f"is {json_length} bytes; the body is {len(view)} bytes")
    try:
        request = orjson.loads(view[:json_length] if json_length is not None else view)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"malformed request: {exc}; {_EXPECTED}") from None
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        received = (f"an object with keys {sorted(request)[:10]}" if isinstance(request, dict)
                    else f"a JSON {type(request).__name__}")
        raise RequestError(f"malformed request: received {received}; {_EXPECTED}")
    return request


def decode_request(view: memoryview | bytes, json_length: int | None,
                   header: Mapping[str, Any] | None = None) -> DecodedRequest:
    """``view`` (the whole body) as arrays; ``header``: :func:`parse_header`'s result when the
    caller has it already. Raises :class:`RequestError`."""
    request = parse_header(view, json_length) if header is None else header
    body = np.frombuffer(view, np.uint8)
    offset = json_length or 0
    feeds: dict[str, np.ndarray] = {}
    for index, item in enumerate(request["inputs"]):
        name, array, offset = _decode_input(index, item, body, offset, json_length, feeds)
        feeds[name] = array
    parameters = request.get("parameters")
    binary_output = (isinstance(parameters, dict)
                     and parameters.get("binary_data_output") is True)
    outputs = request.get("outputs")
    if outputs is not None and not isinstance(outputs, list):
        raise RequestError(f"malformed request: 'outputs' is a {type(outputs).__name__}; "
                           f"expected a list of {{\"name\"}}")
    requested: list[tuple[str, bool | None]] = []
    for out in outputs or []:
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise RequestError(f"malformed request: requested output {str(out)[:200]}; "
                               f"expected an object with a 'name'")
        params = out.get("parameters")
        flag = params.get("binary_data") if isinstance(params, dict) else None
        requested.append((out["name"], flag if isinstance(flag, bool) else None))
    return DecodedRequest(feeds, requested, binary_output, request.get("id"))


def _decode_input(index: int, item: Any, body: np.ndarray, offset: int,
                  json_length: int | None, seen: Mapping[str, np.ndarray]
                  ) -> tuple[str, np.ndarray, int]:
    """One input: ``(name, array, where the next binary input starts)``."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise RequestError(f"input #{index}: received {str(item)[:200]}; expected an object "
                           f"with a 'name', a 'datatype' and a 'shape'")
    name, datatype, shape = item["name"], item.get("datatype"), item.get("shape")
    if name in seen:
        raise RequestError(f"input {name!r} is given twice; expected each input once")
    dtype = DTYPES.get(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        raise RequestError(f"input {name!r}: datatype {datatype!r}; expected one of "
                           f"{', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise RequestError(f"input {name!r}: shape {str(shape)[:100]}; expected a list of "
                           f"non-negative integers")
    count = int(np.prod(shape, dtype=np.int64))
    parameters = item.get("parameters")
    if item.get("data") is not None:
        if datatype == "FP16":
            raise RequestError(f"input {name!r}: FP16 data cannot be sent as JSON; expected "
                               f"it with the binary data extension")
        try:
            array = np.asarray(item["data"], dtype=dtype)
        except (TypeError, ValueError, OverflowError) as exc:
            raise RequestError(f"input {name!r}: its data are not {datatype} values in shape "
                               f"{shape} ({exc})") from None
        if array.size != count:
            raise RequestError(f"input {name!r}: {array.size} values; expected {count} for "
                               f"shape {shape}")
        return name, array.reshape(shape), offset
    if not (isinstance(parameters, dict) and "binary_data_size" in parameters):
        raise RequestError(f"input {name!r}: neither 'data' nor parameters.binary_data_size; "
                           f"expected one of them")
    size = parameters["binary_data_size"]
    if json_length is None:
        raise RequestError(f"input {name!r}: binary_data_size without the "
                           f"Inference-Header-Content-Length header; expected the header with "
                           f"the JSON header's length")
    if isinstance(size, bool) or not isinstance(size, int) or size != count * dtype.itemsize:
        raise RequestError(f"input {name!r}: binary_data_size {size!r}; expected "
                           f"{count * dtype.itemsize} bytes for {datatype} {shape}")
    if offset + size > len(body):
        raise RequestError(f"input {name!r}: binary_data_size {size} does not fit the "
                           f"{len(body) - offset} bytes left in the body")
    array = body[offset:offset + size].view(dtype) if size else np.empty(0, dtype)
    if not array.flags.aligned:  # a tensor after one of a smaller item size
        array = array.copy()
    return name, array.reshape(shape), offset + size


# -- answers ---------------------------------------------------------------------------------
async def respond(send: Send, status: int, payload: bytes, content_type: bytes,
                  extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """An ASGI response of ``payload`` with its length and type (and ``extra`` headers)."""
    headers = [(b"content-type", content_type), (b"content-length", str(len(payload)).encode()),
               *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def refuse_oversized(send: Send, what: str, max_bytes: int) -> None:
    """413 for a body over the server's limit (``what``: the size seen), closing the
    connection: the rest of the body is not read."""
    error = {"error": f"request refused: {what}, over the server's limit of {max_bytes} bytes "
                      f"(--max-body-mb)"}
    await respond(send, 413, orjson.dumps(error), b"application/json",
                  [(b"connection", b"close")])


def replaying(body: bytes, receive: Receive) -> Receive:
    """An ASGI ``receive`` that gives ``body`` (already read) as one message, then whatever
    ``receive`` gives (a disconnect, when the client leaves)."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
