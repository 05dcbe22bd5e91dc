"""The model class the ``kserve`` framework calls: Open Inference Protocol requests in, a
:class:`~tuner.serve.runner.ModelRunner` answering them.

:class:`OpdispatchModel` is a ``kserve.Model`` (the custom-predictor class KServe users deploy,
and what Ray Serve replicas run: :mod:`tuner.serve.ray_app`). It decodes each input (JSON or the
binary tensor data extension, REST or gRPC: the framework's work), runs the request, and encodes
the outputs the client asked for, in binary when it asked for binary. Errors become the
protocol's statuses: the client's mistakes ``InvalidInput`` (HTTP 400, gRPC INVALID_ARGUMENT)
naming the input and what was expected, a full queue or a model that is not ready
``ModelNotReady`` (HTTP 503, gRPC UNAVAILABLE) saying why.
"""

from __future__ import annotations

import uuid
from typing import Any

from kserve import Model
from kserve.errors import InvalidInput, ModelNotReady
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse
from kserve.utils.numpy_codec import from_np_dtype

from tuner.serve.runner import InvalidRequest, ModelRunner, ModelUnavailable, Overloaded


class Unavailable(ModelNotReady):
    """HTTP 503 / gRPC UNAVAILABLE with the runner's reason (``reason`` is what the gRPC
    status carries)."""

    def __init__(self, model_name: str, message: str) -> None:
        super().__init__(model_name)
        self.error_msg = message
        self.reason = message


class OpdispatchModel(Model):
    """One served model (see the module docstring)."""

    def __init__(self, runner: ModelRunner) -> None:
        super().__init__(runner.name)
        self.runner = runner

    def load(self) -> bool:
        self.ready = self.runner.load()
        return self.ready

    def start(self) -> None:  # the framework's "start" would mark any model ready
        self.ready = self.runner.ready

    async def healthy(self) -> bool:
        return self.runner.ready

    async def describe(self) -> dict[str, Any]:
        """Readiness, the reason, the version, inputs, outputs and the plan (the server's
        readiness and metadata routes)."""
        return describe_runner(self.runner)

    def get_input_types(self) -> list[dict[str, Any]]:
        return [_tensor_metadata(t) for t in self.runner.inputs]

    def get_output_types(self) -> list[dict[str, Any]]:
        return [_tensor_metadata(t) for t in self.runner.outputs]

    async def predict(self, payload: InferRequest, headers: dict[str, str] | None = None,
                      response_headers: dict[str, str] | None = None) -> InferResponse:
        if not isinstance(payload, InferRequest):
            raise InvalidInput(f"model {self.name!r} speaks the Open Inference Protocol (v2): "
                               f"POST /v2/models/{self.name}/infer, received a "
                               f"{type(payload).__name__} request")
        feeds = {}
        for tensor in payload.inputs:
            try:
                array = tensor.as_numpy()
                if not (array.flags.aligned and array.flags.writeable):  # np.frombuffer's
                    array = array.copy()
                feeds[tensor.name] = array
            except Exception as exc:
                raise InvalidInput(
                    f"model {self.name!r}: input {tensor.name!r} ({tensor.datatype} "
                    f"{list(tensor.shape)}) cannot be decoded: {exc}") from None
        requested = [o.name for o in payload.request_outputs or []]
        try:
            results = await self.runner.infer(feeds, requested or None)
        except InvalidRequest as exc:
            raise InvalidInput(str(exc)) from None
        except (Overloaded, ModelUnavailable) as exc:
            raise Unavailable(self.name, str(exc)) from None
        return infer_response(payload, self.name, results, self.runner.spec.version)


def infer_response(payload: InferRequest, model_name: str, results: dict[str, Any],
                   version: str | None = None) -> InferResponse:
    """The protocol's response to ``payload`` with ``results`` (``{output name: array}``): over
    gRPC raw bytes, over REST each array as it is, encoded once in binary or JSON as the client
    asked for that output (the framework's ``to_rest``)."""
    outputs = []
    for name, array in results.items():
        out = InferOutput(name=name, shape=list(array.shape), datatype=from_np_dtype(array.dtype))
        if payload.from_grpc:  # the framework's to_grpc wants bytes, not an array
            out.set_data_from_numpy(array, binary_data=True)
        else:
            out.data = array
        outputs.append(out)
    return InferResponse(
        response_id=payload.id or str(uuid.uuid4()), model_name=model_name,
        infer_outputs=outputs, model_version=version, from_grpc=payload.from_grpc,
        use_binary_outputs=payload.use_binary_outputs, requested_outputs=payload.request_outputs)


def _tensor_metadata(t: Any) -> dict[str, Any]:
    """An input or output as the protocol's ``$metadata_tensor``."""
    return {"name": t.name, "datatype": from_np_dtype(t.dtype),
            "shape": list(t.shape) if t.shape is not None else [-1]}


def describe_runner(runner: ModelRunner) -> dict[str, Any]:
    """What :meth:`OpdispatchModel.describe` returns, for a runner (here or in a replica)."""
    return {"ready": runner.ready, "reason": runner.reason, "version": runner.spec.version,
            "inputs": [_tensor_metadata(t) for t in runner.inputs],
            "outputs": [_tensor_metadata(t) for t in runner.outputs],
            "plan": dict(runner.plan_info)}
