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
  2 ms to 0.75 ms); the framework answers everything else. Its own inference route is ours too
  (registered before the framework's): the request decoded by :mod:`tuner.serve.oip_codec`, the
  fast route's decoder, then the framework's handler. One decoder and one body limit
  (:func:`tuner.serve.oip_codec.read_body`) for the whole server, and nothing of the framework
  patched: what is added goes through its public classes and FastAPI's and Starlette's API;
- token generation for the decoder models (``POST /v2/models/NAME/generate`` and
  ``.../generate_stream``, Server-Sent Events): :mod:`tuner.serve.generate_route`; such a model
  is ready when it can generate, and its metadata says so (``generate``, the ways);
- graceful shutdown (SIGTERM, SIGINT): new requests are refused with 503, those in flight are
  answered (uvicorn's and grpcio's grace periods), then the model threads are released.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from tuner.serve.fast_infer import InferFastPath, runners_of
from tuner.serve.oip_codec import (
    HEADER,
    BodyTooLarge,
    RequestError,
    decode_request,
    json_length_of,
    parse_header,
    read_body,
    refuse_oversized,
    replaying,
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
    it declares its length or streams it in chunks, before the application sees it (the body
    limit of the fast route: :func:`tuner.serve.oip_codec.read_body`); and read a POST body
    without the binary extension's header as the JSON the protocol says it is."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if (scope.get("method") == "POST" and HEADER not in headers
                and headers.get(b"content-type", b"").split(b";")[0] != b"application/json"):
            # the protocol: a body without the binary extension's header is JSON, whatever its
            # content type says (Triton's client sends none); the framework reads it as bytes
            scope = dict(scope, headers=[(k, v) for k, v in scope.get("headers") or []
                                         if k != b"content-type"]
                         + [(b"content-type", b"application/json")])
        try:
            view = await read_body(receive, headers, self.max_bytes)
        except BodyTooLarge as exc:
            await refuse_oversized(send, str(exc), self.max_bytes)
            return
        if view is None:
            return  # the client went away
        await self.app(scope, replaying(bytes(view), receive), send)


def _add_infer_route(app: Any, dataplane: Any, model_repository_extension: Any) -> None:
    """``POST /v2/models/NAME/infer`` on the framework's application, registered before its
    own route so that it answers first: the body decoded by :mod:`tuner.serve.oip_codec` (the
    decoder of the fast route) into the framework's ``InferRequest``, then the framework's own
    handler (readiness, the model's ``predict``, the response in binary or JSON as asked).
    kserve's handler takes an ``InferRequest`` as it is; its own decoder never runs. It answers
    the models without a local runner (Ray Serve deployments, the bench's onnxruntime model) and
    the requests the fast route leaves to the framework (the codec's errors: HTTP 400)."""
    from fastapi import Request, Response
    from kserve.errors import InvalidInput
    from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput
    from kserve.protocol.rest.v2_endpoints import V2Endpoints

    endpoints = V2Endpoints(dataplane, model_repository_extension)

    async def infer(request: Request, response: Response, model_name: str) -> Any:
        body = await request.body()
        try:
            json_length = json_length_of(dict(request.scope["headers"]).get(HEADER))
            header = parse_header(body, json_length)
            feeds = decode_request(body, json_length, header).feeds
        except RequestError as exc:
            raise InvalidInput(str(exc)) from None
        inputs = [InferInput(name=name, shape=list(array.shape), datatype=item["datatype"],
                             data=array, parameters=item.get("parameters"))
                  for item, (name, array) in zip(header["inputs"], feeds.items())]
        outputs = header.get("outputs")
        payload = InferRequest(
            model_name=model_name, infer_inputs=inputs, request_id=header.get("id"),
            parameters=header.get("parameters"),
            request_outputs=None if outputs is None else [
                RequestedOutput(name=o["name"], parameters=o.get("parameters")) for o in outputs])
        return await endpoints.infer(request, response, model_name, payload)

    # FastAPI reads the parameters' types from the annotations: strings here (postponed
    # annotations), which it would look up in this module's globals, where it is not imported
    infer.__annotations__.update(request=Request, response=Response)
    app.add_api_route("/v2/models/{model_name}/infer", infer, methods=["POST"],
                      response_model=None)


def _add_routes(app: Any, models: dict[str, Any], generation: Mapping[str, Any] | None = None
                ) -> None:
    """Readiness with the reason, and metadata with the plan (registered before the
    framework's routes, so they answer first). Each model says what it is with an awaitable
    ``describe()`` (:meth:`tuner.serve.oip_model.OpdispatchModel.describe`); a decoder's
    generation pool (``generation``: :class:`tuner.serve.generate_route.GenerationPool` by
    name) adds its parameters, and the model is ready when either route can answer."""
    generation = generation or {}
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
        pool = generation.get(model_name)
        if not described["ready"] and not (pool is not None and pool.ready):
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
            "parameters": {"ready": d["ready"], "reason": d["reason"], **d["plan"],
                           **(generation[model_name].describe() if model_name in generation else {})},
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
    from tuner.serve.generate_route import generation_pools
    from tuner.serve.oip_model import OpdispatchModel

    models = [OpdispatchModel(r) for r in runners]
    for model in models:
        model.load()
    pools, refused = generation_pools(runners)
    if on_loaded is not None:
        on_loaded(runners)
    for name, pool in pools.items():
        print(f"  {name}: generates (POST /v2/models/{name}/generate, .../generate_stream): "
              + (pool.info.get("generate_plan", "") if pool.ready else f"NOT READY: {pool.reason}"),
              file=sys.stderr, flush=True)
    try:
        serve_models(models, host=host, http_port=http_port, grpc_port=grpc_port,
                     max_body_bytes=max_body_bytes, grace_s=grace_s,
                     on_stop=lambda: [x.stop_admitting() for x in (*runners, *pools.values())],
                     generation=(pools, refused))
    finally:
        for runner in runners:
            runner.close()
        for pool in pools.values():
            pool.close()


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


def _without_timing(app: Any) -> None:
    """Take the framework's per-request timing middleware (``timing_asgi``'s, added by its
    ``RESTServer``) off ``app`` before it serves: it reads the process's CPU time
    (``getrusage``), matches the route a second time and writes two log lines for every
    request, a fifth of the event loop's time at 190 requests/s (py-spy); the Prometheus
    metrics time requests instead. A framework that adds no such middleware is left as it is."""
    try:
        from timing_asgi import TimingMiddleware
    except ImportError:
        return
    app.user_middleware[:] = [m for m in app.user_middleware if m.cls is not TimingMiddleware]


class _GRPCServer:
    """The framework's gRPC service (its servicer, its exception-to-status interceptor) on
    ``host``, messages up to ``max_bytes`` (the framework listens on every address and logs
    every call)."""

    def __init__(self, dataplane: Any, model_repository_extension: Any, host: str, port: int,
                 max_bytes: int, grace_s: float) -> None:
        self.dataplane = dataplane
        self.model_repository_extension = model_repository_extension
        self.address = f"{host}:{port}"
        self.max_bytes = max_bytes
        self.grace_s = grace_s
        self.server: Any = None

    async def start(self, max_workers: int) -> None:
        """Serve until :meth:`stop`."""
        from concurrent import futures

        from grpc import aio
        from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
        from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor
        from kserve.protocol.grpc.servicer import InferenceServicer

        self.server = aio.server(
            futures.ThreadPoolExecutor(max_workers=max_workers),
            interceptors=(ExceptionToStatusInterceptor(),),
            options=[("grpc.max_send_message_length", self.max_bytes),
                     ("grpc.max_receive_message_length", self.max_bytes)])
        grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
            InferenceServicer(self.dataplane, self.model_repository_extension), self.server)
        self.server.add_insecure_port(self.address)
        await self.server.start()
        await self.server.wait_for_termination()

    async def stop(self) -> None:
        """Refuse new calls, answer those in flight within the grace period."""
        if self.server is not None:
            await self.server.stop(grace=self.grace_s)


def serve_models(models: Sequence[Any], *, host: str, http_port: int, grpc_port: int | None,
                 max_body_bytes: int, grace_s: float,
                 on_stop: Callable[[], Any] | None = None, access_log: bool = False,
                 generation: tuple[Mapping[str, Any], Mapping[str, str]] | None = None) -> None:
    """Serve ``models`` (``kserve`` models with an awaitable ``describe()``: local ones or
    Ray Serve deployments) over HTTP and gRPC on ``host`` until SIGTERM or SIGINT (one log line
    per HTTP request with ``access_log``); ``generation``: the decoders' generation pools and
    why the other models are not decoders (:func:`tuner.serve.generate_route.generation_pools`),
    whose routes are added. Blocks."""
    framework = _framework()
    from kserve.protocol.rest.server import RESTServer

    app = framework.app

    class QuietRESTServer(RESTServer):
        def create_application(self) -> None:
            """The framework's application, without its timing middleware
            (:func:`_without_timing`)."""
            super().create_application()
            _without_timing(app)

    class Server(framework.ModelServer):
        grpc: _GRPCServer | None = None
        stopping: asyncio.Task | None = None

        def start(self, models: list[Any]) -> None:
            for model in models:
                self.register_model(model)
            app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
            _add_routes(app, {m.name: m for m in models}, generation and generation[0])
            if generation is not None:
                from tuner.serve.generate_route import add_generate_routes

                add_generate_routes(app, *generation)
            _add_infer_route(app, self.dataplane, self.model_repository_extension)
            # uvicorn serves the fast route in front of the framework's application
            rest = QuietRESTServer(InferFastPath(app, runners_of(models), max_body_bytes),
                                   self.dataplane, self.model_repository_extension,
                                   self.http_port, grace_period=self.grace_period,
                                   event_loop=self.event_loop,
                                   timeout_keep_alive=self.timeout_keep_alive)
            rest.config.host = host
            if not access_log:  # uvicorn logs a request when its logger has a handler
                access = logging.getLogger("uvicorn.access")
                access.handlers, access.propagate = [], False
            servers = [rest.start()]
            if self.enable_grpc and grpc_port is not None:
                self.grpc = _GRPCServer(self.dataplane, self.model_repository_extension, host,
                                        grpc_port, max_body_bytes, self.grace_period)
                servers.append(self.grpc.start(self.max_threads))
            self.setup_event_loop()
            self.register_signal_handler()

            async def serve_all() -> None:
                await asyncio.gather(*servers)

            with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
                runner.run(serve_all())

        def stop(self, sig: int) -> None:
            if on_stop is not None:
                on_stop()
            if self.grpc is not None:
                self.stopping = asyncio.get_running_loop().create_task(self.grpc.stop())
            super().stop(sig)

    server = Server(http_port=http_port, grpc_port=grpc_port or 0,
                    enable_grpc=grpc_port is not None,
                    grace_period=int(grace_s), max_threads=8)
    server.start(list(models))
