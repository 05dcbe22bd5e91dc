"""The HTTP inference route of the models served here, answered without the framework's
per-request machinery.

``POST /v2/models/NAME/infer`` is what a server spends its time on. Through ``kserve``'s
FastAPI application each request passes a dozen middlewares, FastAPI's dependency solving, the
data plane's decoding into ``InferRequest`` objects and back into ``InferResponse`` ones, and its
body is copied four times on the way (uvicorn's chunks, the body-limit middleware, Starlette's
``Request.body``, kserve's slicing); then the model's threads wait for the event loop. Measured
with py-spy and ``/proc`` CPU times on a 2-core AMD EPYC, a 1x3x224x224 float32 request cost the
event loop about 2 ms of CPU on a model whose inference takes 0.05 ms: on mobilenet_v2 (7.7 ms
of CPU per inference) a fifth of the machine.

:class:`InferFastPath` is an ASGI application wrapped around the framework's: for a served model
with a :class:`~tuner.serve.runner.ModelRunner` it reads the body once into a buffer aligned so
that the binary tensor data extension's tensors are views of it (no copy, writable, aligned),
decodes the protocol's JSON header with ``orjson``, runs the request on the runner (queue,
batcher, streams and metrics as before) and writes the response (binary or JSON per output, as
the client asked). Everything else passes through to the framework unchanged: the other routes,
model versions, models of other kinds (Ray Serve deployments, the bench's plain onnxruntime
model), and any request this route cannot decode, which the framework then refuses with its own
error. So the protocol's answers, status codes and messages are the framework's; only the
common case is faster.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np
import orjson

from tuner.serve.runner import InvalidRequest, ModelRunner, ModelUnavailable, Overloaded

logger = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_INFER = re.compile(r"/v2/models/([^/]+)/infer")
#: the protocol's datatypes this route decodes (``BYTES`` goes to the framework)
_DTYPES = {"BOOL": np.dtype(bool), "INT8": np.dtype(np.int8), "INT16": np.dtype(np.int16),
           "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
           "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
           "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64),
           "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32),
           "FP64": np.dtype(np.float64)}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
#: where the binary tensors start in the receive buffer (a cache line)
_ALIGN = 64
_HEADER = b"inference-header-content-length"


class Undecodable(Exception):
    """This route does not decode the request: the framework answers it (and refuses it with
    its own error when it is wrong)."""


class BodyTooLarge(Exception):
    """The body is over the server's limit."""


class InferFastPath:
    """ASGI application: the inference route of ``runners``' models (see the module
    docstring), everything else to ``app``.

    Args:
        app: the framework's ASGI application.
        runners: ``{model name: runner}`` of the models this route answers.
        max_bytes: the largest body accepted (413 over it, with the sizes).
    """

    def __init__(self, app: Any, runners: Mapping[str, ModelRunner], max_bytes: int) -> None:
        self.app = app
        self.runners = dict(runners)
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST":
            match = _INFER.fullmatch(scope.get("path", ""))
            runner = self.runners.get(match.group(1)) if match else None
            if runner is not None:
                await self._infer(runner, scope, receive, send)
                return
        await self.app(scope, receive, send)

    # -- one request ----------------------------------------------------------------------
    async def _infer(self, runner: ModelRunner, scope: Scope, receive: Receive,
                     send: Send) -> None:
        headers = dict(scope.get("headers") or ())
        json_length = int_header(headers.get(_HEADER))
        try:
            view = await self._read(headers, json_length, receive)
        except BodyTooLarge as exc:
            await refuse_oversized(send, str(exc), self.max_bytes)
            return
        if view is None:
            return  # the client went away
        try:
            feeds, requested, binary_default, request_id = _decode(view, json_length)
        except Undecodable:
            await self.app(scope, replaying(bytes(view), receive), send)
            return
        try:
            results = await runner.infer(feeds, [name for name, _ in requested] or None)
        except InvalidRequest as exc:
            await _respond(send, 400, {"error": str(exc)})
            return
        except (Overloaded, ModelUnavailable) as exc:
            await _respond(send, 503, {"error": str(exc)})
            return
        except Exception as exc:  # the model failed: the client hears why, the server goes on
            logger.exception("model %s failed a request", runner.name)
            await _respond(send, 500, {"error": f"{type(exc).__name__}: {exc}"})
            return
        await _send_results(send, runner, results, requested, binary_default, request_id)

    async def _read(self, headers: Mapping[bytes, bytes], json_length: int | None,
                    receive: Receive) -> memoryview | None:
        """The body in one buffer, the binary part aligned; ``None`` when the client left."""
        declared = int_header(headers.get(b"content-length"))
        if declared is not None and declared > self.max_bytes:
            raise BodyTooLarge(f"a body of {declared} bytes")
        size = declared if declared is not None else 1 << 16
        buffer, start = _aligned(size, json_length or 0)
        end = start
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            if chunk:
                if end - start + len(chunk) > self.max_bytes:
                    raise BodyTooLarge(f"a body of at least {end - start + len(chunk)} bytes")
                if end + len(chunk) > len(buffer):  # undeclared length: grow
                    grown, gstart = _aligned(2 * (end - start + len(chunk)), json_length or 0)
                    grown[gstart:gstart + end - start] = buffer[start:end]
                    buffer, end, start = grown, gstart + end - start, gstart
                buffer[end:end + len(chunk)] = np.frombuffer(chunk, np.uint8)
                end += len(chunk)
            if not message.get("more_body"):
                break
        return memoryview(buffer[start:end])


# -- decoding ---------------------------------------------------------------------------
def _decode(view: memoryview, json_length: int | None
            ) -> tuple[dict[str, np.ndarray], list[tuple[str, bool | None]], bool, Any]:
    """``(feeds, requested outputs with their binary flag, the request's binary default, the
    request id)``; raises :class:`Undecodable` for anything but a well-formed request of
    numeric tensors."""
    if json_length is not None and not 0 <= json_length <= len(view):
        raise Undecodable
    try:
        request = orjson.loads(view[:json_length] if json_length is not None else view)
    except orjson.JSONDecodeError:
        raise Undecodable from None
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise Undecodable
    array = np.frombuffer(view, np.uint8)
    offset = json_length or 0
    feeds: dict[str, np.ndarray] = {}
    for item in request["inputs"]:
        if not isinstance(item, dict):
            raise Undecodable
        name, shape, dtype = item.get("name"), item.get("shape"), _DTYPES.get(item.get("datatype"))
        if (not isinstance(name, str) or name in feeds or dtype is None
                or not isinstance(shape, list)
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                           for d in shape)):
            raise Undecodable
        count = int(np.prod(shape, dtype=np.int64))
        parameters = item.get("parameters")
        if item.get("data") is not None:
            if dtype == np.float16:
                raise Undecodable
            try:
                tensor = np.asarray(item["data"], dtype=dtype)
            except (TypeError, ValueError, OverflowError):
                raise Undecodable from None
            if tensor.size != count:
                raise Undecodable
            feeds[name] = tensor.reshape(shape)
        elif isinstance(parameters, dict) and "binary_data_size" in parameters:
            size = parameters["binary_data_size"]
            if (isinstance(size, bool) or not isinstance(size, int)
                    or size != count * dtype.itemsize or offset + size > len(array)):
                raise Undecodable
            tensor = array[offset:offset + size].view(dtype) if size else np.empty(0, dtype)
            offset += size
            if not tensor.flags.aligned:  # a tensor after one of a smaller item size
                tensor = tensor.copy()
            feeds[name] = tensor.reshape(shape)
        else:
            raise Undecodable
    parameters = request.get("parameters")
    binary_default = isinstance(parameters, dict) and parameters.get("binary_data_output") is True
    requested: list[tuple[str, bool | None]] = []
    for out in request.get("outputs") or []:
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise Undecodable
        params = out.get("parameters")
        flag = params.get("binary_data") if isinstance(params, dict) else None
        requested.append((out["name"], flag if isinstance(flag, bool) else None))
    return feeds, requested, binary_default, request.get("id")


def _aligned(size: int, json_length: int) -> tuple[np.ndarray, int]:
    """A buffer of ``size`` bytes from ``start``, where ``start + json_length`` is aligned."""
    buffer = np.empty(size + _ALIGN, np.uint8)
    address = buffer.ctypes.data + json_length
    return buffer, (-address) % _ALIGN


def int_header(value: bytes | None) -> int | None:
    """A header's value as a non-negative integer, else ``None``."""
    return int(value) if value is not None and value.isdigit() else None


# -- responses --------------------------------------------------------------------------
async def _send_results(send: Send, runner: ModelRunner, results: Mapping[str, np.ndarray],
                        requested: list[tuple[str, bool | None]], binary_default: bool,
                        request_id: Any) -> None:
    """The protocol's response: each output in binary or JSON, as the client asked (a requested
    output's own ``binary_data`` flag over the request's ``binary_data_output``, as kserve)."""
    wanted = requested or [(name, None) for name in results]
    outputs, raw = [], []
    for name, flag in wanted:
        array = np.ascontiguousarray(results[name])
        datatype = _NAMES.get(array.dtype)
        if datatype is None:
            await _respond(send, 500, {"error": f"output {name!r} has dtype {array.dtype}, which "
                                                f"the protocol's datatypes do not include"})
            return
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if (binary_default if flag is None else flag) or datatype == "FP16":
            data = array.tobytes()
            entry["parameters"] = {"binary_data_size": len(data)}
            raw.append(data)
        else:
            entry["data"] = array.reshape(-1)
        outputs.append(entry)
    body: dict[str, Any] = {"model_name": runner.name, "outputs": outputs}
    if runner.spec.version:
        body["model_version"] = runner.spec.version
    if request_id is not None:
        body["id"] = request_id
    header = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    if not raw:
        await _respond_bytes(send, 200, header, b"application/json")
        return
    await _respond_bytes(send, 200, b"".join([header, *raw]), b"application/octet-stream",
                         [(_HEADER, str(len(header)).encode())])


async def _respond(send: Send, status: int, content: Mapping[str, Any],
                   close: bool = False) -> None:
    extra = [(b"connection", b"close")] if close else []
    await _respond_bytes(send, status, orjson.dumps(content), b"application/json", extra)


async def refuse_oversized(send: Send, what: str, max_bytes: int) -> None:
    """413 for a body over the server's limit (``what``: the size seen), closing the
    connection: the rest of the body is not read."""
    await _respond(send, 413, {"error": f"request refused: {what}, over the server's limit of "
                                        f"{max_bytes} bytes (--max-body-mb)"}, close=True)


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


async def _respond_bytes(send: Send, status: int, payload: bytes, content_type: bytes,
                         extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(payload)).encode()),
               *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def runners_of(models: Any) -> dict[str, ModelRunner]:
    """``{name: runner}`` of the models that answer through a local runner (the others, Ray
    Serve deployments for instance, go through the framework)."""
    return {m.name: m.runner for m in models if isinstance(getattr(m, "runner", None), ModelRunner)}

