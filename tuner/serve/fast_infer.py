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
with a :class:`~tuner.serve.runner.ModelRunner` it reads the body once under the server's limit
into a buffer aligned so that the binary tensor data extension's tensors are views of it (no
copy, writable, aligned), decodes it (:mod:`tuner.serve.oip_codec`, the decoder and the body
limit the framework's path uses too), runs the request on the runner (queue, batcher, streams
and metrics as before) and writes the response (binary or JSON per output, as the client asked).
Everything else passes through to the framework unchanged: the other routes, model versions,
models of other kinds (Ray Serve deployments, the bench's plain onnxruntime model), and any
request the codec refuses, which the framework's inference route then refuses with the codec's
message, in the framework's error format (HTTP 400). So only the common case is answered here.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson

from tuner.serve.oip_codec import (
    HEADER,
    NAMES,
    BodyTooLarge,
    Receive,
    RequestError,
    Scope,
    Send,
    decode_request,
    int_header,
    json_length_of,
    read_body,
    refuse_oversized,
    replaying,
    respond,
)
from tuner.serve.runner import InvalidRequest, ModelRunner, ModelUnavailable, Overloaded

logger = logging.getLogger(__name__)

_INFER = re.compile(r"/v2/models/([^/]+)/infer")


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
        try:  # the binary part aligned where the header says it starts
            view = await read_body(receive, headers, self.max_bytes,
                                   int_header(headers.get(HEADER)))
        except BodyTooLarge as exc:
            await refuse_oversized(send, str(exc), self.max_bytes)
            return
        if view is None:
            return  # the client went away
        try:
            feeds, requested, binary_default, request_id = decode_request(
                view, json_length_of(headers.get(HEADER)))
        except RequestError:  # the framework's route decodes it the same way and says why
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
        datatype = NAMES.get(array.dtype)
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
        await respond(send, 200, header, b"application/json")
        return
    await respond(send, 200, b"".join([header, *raw]), b"application/octet-stream",
                  [(HEADER, str(len(header)).encode())])


async def _respond(send: Send, status: int, content: Mapping[str, Any]) -> None:
    await respond(send, status, orjson.dumps(content), b"application/json")


def runners_of(models: Any) -> dict[str, ModelRunner]:
    """``{name: runner}`` of the models that answer through a local runner (the others, Ray
    Serve deployments for instance, go through the framework)."""
    return {m.name: m.runner for m in models if isinstance(getattr(m, "runner", None), ModelRunner)}

