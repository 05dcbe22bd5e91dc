"""``onnx.backend.base.Backend`` over the dispatcher, so ONNX's conformance suite
(``onnx.backend.test.BackendTest``) runs against it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from dispatch.session import Session


class DispatchRep(BackendRep):
    """A prepared model: a :class:`Session` with the default heuristic plan."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        names = [i.name for i in self.session.get_inputs()]
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feeds = dict(zip(names, inputs))
        return tuple(self.session.run(None, feeds))


class DispatchBackend(Backend):
    """The opdispatch backend for ONNX's backend test runner."""

    backends: Sequence[str] | None = None

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> DispatchRep:
        return DispatchRep(Session(model, backends=kwargs.pop("backends", cls.backends), **kwargs))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() == "CPU"


prepare = DispatchBackend.prepare
run_model = DispatchBackend.run_model
supports_device = DispatchBackend.supports_device
