"""The server: ``kserve``'s ``ModelServer`` (HTTP/REST on uvicorn and FastAPI, gRPC on grpcio,
the Open Inference Protocol's endpoints, Prometheus' ``/metrics``), bound to the address the
user names (loopback by default: the framework itself listens on every address), with:

- a request body limit on HTTP (413 with the sizes; gRPC's ``max_receive_message_length`` is set
  to the same) so that an oversized body is refused before it is read into memory;
- model readiness that says why (``GET /v2/models/NAME/ready`` answers 503 with the reason, a
  missing plan for this machine for instance) and model metadata that names the plan
  (``GET /v2/models/NAME``: the protocol's fields plus ``parameters`` with the plan id,
  objective, hardware fingerprint, serving configuration and batch sizes; over gRPC the
  protocol's fields only);
- every model registered, ready or not (the framework registers only ready ones, so that a
  model without a plan would be "not found" instead of "not ready, because ...");
- the inference route of the models served here answered by :mod:`tuner.serve.fast_infer`
  in front of the framework's application (the event loop's CPU per 600 KB request from about
  2 ms to 0.75 ms); the framework answers everything else, and any request that route cannot
  decode;
- graceful shutdown (SIGTERM, SIGINT): new requests are refused with 503, those in flight are
  answered (uvicorn's and grpcio's grace periods), then the model threads are released.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tuner.serve.fast_infer import (
    InferFastPath,
    int_header,
    refuse_oversized,
    replaying,
    runners_of,
)
from tuner.serve.runner import ModelRunner

#: the ``platform`` the model metadata names
PLATFORM = "opdispatch_onnx"


@contextlib.contextmanager
def _own_argv() -> Iterator[None]:
    """kserve's ``model_server`` module parses ``sys.argv`` when imported: hide ours."""
    saved = sys.argv
    sys.argv = saved[:1]
    try:
        yield
    finally:
        sys.argv = saved


def _framework() -> Any:
    with _own_argv():
        import kserve.model_server as framework
    return framework


class BodyLimit:
    """ASGI middleware: refuse an HTTP request whose body is over ``max_bytes`` (413), whether
    it declares its length or streams it in chunks, before the application sees it; and read a
    POST body without the binary extension's header as the JSON the protocol says it is."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if (scope.get("method") == "POST" and b"inference-header-content-length" not in headers
                and headers.get(b"content-type", b"").split(b";")[0] != b"application/json"):
            # the protocol: a body without the binary extension's header is JSON, whatever its
            # content type says (Triton's client sends none); the framework reads it as bytes
            scope = dict(scope, headers=[(k, v) for k, v in scope.get("headers") or []
                                         if k != b"content-type"]
                         + [(b"content-type", b"application/json")])
        declared = int_header(headers.get(b"content-length"))
        if declared is not None and declared > self.max_bytes:
            await refuse_oversized(send, f"a body of {declared} bytes", self.max_bytes)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await refuse_oversized(send, f"a body of at least {len(body)} bytes",
                                       self.max_bytes)
                return
            if not message.get("more_body"):
                break
        await self.app(scope, replaying(bytes(body), receive), send)


def keep_binary_inputs() -> None:
    """Make kserve keep the binary tensor data extension's inputs as bytes.

    kserve 0.21's ``InferRequest.from_bytes`` turns every binary input into a Python list of
    numbers and back into an array (``set_data_from_numpy(..., binary_data=False)``), on the
    event loop: measured with py-spy on a 224x224 image request, 1278 of 1649 samples, against
    143 in the model's run. The replacement parses the same request the same way and keeps each
    input's bytes, which ``InferInput.as_numpy`` reads with ``np.frombuffer``: what gRPC
    requests get already. Installed once per process, by :func:`serve_models`.
    """
    from kserve.errors import InvalidInput
    from kserve.protocol import infer_type

    if getattr(infer_type.InferRequest.from_bytes, "keeps_bytes", False):
        return

    def from_bytes(cls: Any, req_bytes: bytes, json_length: int, model_name: str) -> Any:
        import orjson

        try:
            request = orjson.loads(req_bytes[:json_length])
        except orjson.JSONDecodeError as exc:
            raise InvalidInput(f"Unrecognized request format: {exc}") from None
        if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
            raise InvalidInput("an inference request is a JSON object with a list of 'inputs'")
        inputs, start = [], json_length
        for item in request["inputs"]:
            if not isinstance(item, dict) or not {"name", "shape", "datatype"} <= set(item):
                raise InvalidInput(f"each input needs a name, a shape and a datatype; "
                                   f"received {str(item)[:200]}")
            parameters = item.get("parameters")
            tensor = infer_type.InferInput(name=item["name"], shape=item["shape"],
                                           datatype=item["datatype"], parameters=parameters)
            if item.get("data") is not None:
                if tensor.datatype == "FP16":
                    raise InvalidInput(f"FP16 data cannot be sent as JSON: send input "
                                       f"{tensor.name!r} with the binary data extension")
                tensor.data = item["data"]
            elif isinstance(parameters, dict) and "binary_data_size" in parameters:
                size = parameters["binary_data_size"]
                if isinstance(size, bool) or not isinstance(size, int) or size < 0 or (
                        start + size > len(req_bytes)):
                    raise InvalidInput(f"input {tensor.name!r}: binary_data_size {size!r} does "
                                       f"not fit the {len(req_bytes) - start} bytes left")
                tensor._raw_data = req_bytes[start:start + size]
                start += size
            else:
                raise InvalidInput(f"'data' field is missing for input {tensor.name!r} for "
                                   f"model {model_name!r}")
            inputs.append(tensor)
        outputs = request.get("outputs")
        requested = None if outputs is None else [
            infer_type.RequestedOutput(name=o["name"], parameters=o.get("parameters"))
            for o in outputs]
        return cls(model_name=model_name, request_id=request.get("id"),
                   parameters=request.get("parameters"), infer_inputs=inputs,
                   request_outputs=requested)

    from_bytes.keeps_bytes = True  # type: ignore[attr-defined]
    infer_type.InferRequest.from_bytes = classmethod(from_bytes)


def _add_routes(app: Any, models: dict[str, Any]) -> None:
    """Readiness with the reason, and metadata with the plan (registered before the
    framework's routes, so they answer first). Each model says what it is with an awaitable
    ``describe()`` (:meth:`tuner.serve.oip_model.OpdispatchModel.describe`)."""
    from fastapi.responses import JSONResponse

    def unknown(name: str) -> JSONResponse:
        return JSONResponse(status_code=404, content={
            "error": f"Model with name {name} does not exist; served models: "
                     f"{', '.join(sorted(models)) or '(none)'}"})

    async def model_ready(model_name: str) -> JSONResponse:
        model = models.get(model_name)
        if model is None:
            return unknown(model_name)
        described = await model.describe()
        if not described["ready"]:
            return JSONResponse(status_code=503, content={
                "name": model_name, "ready": False,
                "error": f"Model with name {model_name} is not ready: {described['reason']}"})
        return JSONResponse({"name": model_name, "ready": True})

    async def model_metadata(model_name: str) -> JSONResponse:
        model = models.get(model_name)
        if model is None:
            return unknown(model_name)
        d = await model.describe()
        return JSONResponse({
            "name": model_name, "versions": [d["version"]] if d["version"] else [],
            "platform": d.get("platform", PLATFORM), "inputs": d["inputs"],
            "outputs": d["outputs"],
            "parameters": {"ready": d["ready"], "reason": d["reason"], **d["plan"]},
        })

    async def malformed(_request: Any, exc: Any) -> JSONResponse:
        first = (exc.errors() or [{}])[0]
        return JSONResponse(status_code=400, content={
            "error": f"malformed request: {first.get('msg', 'not an inference request')} at "
                     f"{'/'.join(map(str, first.get('loc', ())))}; an Open Inference Protocol "
                     f"request is JSON: {{\"inputs\": [{{\"name\", \"datatype\", \"shape\", "
                     f"\"data\"}}]}}"})

    from fastapi.exceptions import RequestValidationError

    app.add_exception_handler(RequestValidationError, malformed)
    async def server_metadata() -> JSONResponse:
        from dispatch import __version__

        return JSONResponse({"name": "opdispatch", "version": __version__,
                               "extensions": ["binary_tensor_data"]})

    app.add_api_route("/v2", server_metadata, methods=["GET"])
    app.add_api_route("/v2/models/{model_name}/ready", model_ready, methods=["GET"])
    app.add_api_route("/v2/models/{model_name}", model_metadata, methods=["GET"])


def serve(runners: Sequence[ModelRunner], *, host: str = "127.0.0.1", http_port: int = 8080,
          grpc_port: int | None = 8081, max_body_bytes: int = 64 << 20,
          grace_s: float = 30.0,
          on_loaded: Callable[[Sequence[ModelRunner]], None] | None = None) -> None:
    """Load every model (each one's plan loaded and run once) and serve them until SIGTERM or
    SIGINT (see the module docstring). Blocks."""
    from tuner.serve.oip_model import OpdispatchModel

    models = [OpdispatchModel(r) for r in runners]
    for model in models:
        model.load()
    if on_loaded is not None:
        on_loaded(runners)
    try:
        serve_models(models, host=host, http_port=http_port, grpc_port=grpc_port,
                     max_body_bytes=max_body_bytes, grace_s=grace_s,
                     on_stop=lambda: [r.stop_admitting() for r in runners])
    finally:
        for runner in runners:
            runner.close()


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (the ``serve`` extra installs it), else
    ``None``: asyncio's own. kserve's server runs its HTTP server with ``asyncio.run``, on
    asyncio's selector loop whatever its ``event_loop`` setting says: its transports, flow
    control and selector calls are Python, and took about 30% of the event loop's samples
    serving mobilenet_v2 at C = 16 (py-spy, the AVX2 machine); uvloop's are C (libuv)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def serve_models(models: Sequence[Any], *, host: str, http_port: int, grpc_port: int | None,
                 max_body_bytes: int, grace_s: float,
                 on_stop: Callable[[], Any] | None = None, access_log: bool = False) -> None:
    """Serve ``models`` (``kserve`` models with an awaitable ``describe()``: local ones or
    Ray Serve deployments) over HTTP and gRPC on ``host`` until SIGTERM or SIGINT (one log line
    per HTTP request with ``access_log``). Blocks."""
    framework = _framework()
    from kserve.protocol.grpc import server as grpc_server
    from kserve.protocol.grpc.server import GRPCServer
    from kserve.protocol.rest.server import RESTServer

    keep_binary_inputs()
    app = framework.app
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    _add_routes(app, {m.name: m for m in models})

    class HostGRPCServer(GRPCServer):
        async def start(self, max_workers: int) -> None:
            from concurrent import futures

            from grpc import aio

            servicer = grpc_server.InferenceServicer(self._data_plane,
                                                     self._model_repository_extension)
            self._server = aio.server(
                futures.ThreadPoolExecutor(max_workers=max_workers),
                # the framework's LoggingInterceptor too logs every call: left out
                interceptors=(grpc_server.ExceptionToStatusInterceptor(),),
                options=[("grpc.max_send_message_length", max_body_bytes),
                         ("grpc.max_receive_message_length", max_body_bytes)])
            grpc_server.grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
                servicer, self._server)
            self._server.add_insecure_port(f"{host}:{grpc_port}")
            await self._server.start()
            await self._server.wait_for_termination()

    class QuietRESTServer(RESTServer):
        async def start(self) -> None:
            """The framework's application behind the inference route of the models served
            here (:mod:`tuner.serve.fast_infer`)."""
            self.create_application()
            self.config.app = InferFastPath(app, runners_of(models), max_body_bytes)
            await self._server.serve()

        def _add_middlewares(self, app: Any) -> None:
            """Without the framework's per-request timing middleware: it reads the process's
            CPU time (``getrusage``) and writes two log lines for every request, a fifth of
            the event loop's time at 190 requests/s (py-spy); the Prometheus metrics time
            requests instead."""

    class Server(framework.ModelServer):
        def start(self, models: list[Any]) -> None:
            for model in models:
                self.register_model(model)
            rest = QuietRESTServer(framework.FASTAPI_APP_IMPORT_STRING, self.dataplane,
                                   self.model_repository_extension, self.http_port,
                                   grace_period=self.grace_period, event_loop=self.event_loop,
                                   timeout_keep_alive=self.timeout_keep_alive)
            rest.config.host = host
            if not access_log:  # uvicorn logs a request when its logger has a handler
                access = logging.getLogger("uvicorn.access")
                access.handlers, access.propagate = [], False
            self._rest_server = rest
            self.servers.append(rest.start())
            if self.enable_grpc:
                self._grpc_server = HostGRPCServer(grpc_port, self.dataplane,
                                                   self.model_repository_extension, kwargs={},
                                                   grace_period=self.grace_period)
                self.servers.append(self._grpc_server.start(self.max_threads))
            self.setup_event_loop()
            self.register_signal_handler()
            with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
                runner.run(self._serve())

        def stop(self, sig: int) -> None:
            if on_stop is not None:
                on_stop()
            super().stop(sig)

    server = Server(http_port=http_port, grpc_port=grpc_port or 0,
                    enable_grpc=grpc_port is not None, grace_period=int(grace_s), max_threads=8)
    server.start(list(models))
