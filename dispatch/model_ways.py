"""Ways of running a whole model at any input shape: the candidates of a range plan (issue 51).

A concrete plan is made for one input shape. A *model way* runs the whole model as a library
compiles it once with its symbolic dimensions left dynamic — an onnxruntime session, an OpenVINO
model compiled with dynamic dimensions — so that every shape of a range runs on it with no
planning per shape (the library keeps its own per-shape caches). Backends offer their ways with
:meth:`dispatch.backend.Backend.model_ways`; the shape-range tuner (:mod:`tuner.shapes`)
measures them at sample shapes across the range and a range plan (:mod:`dispatch.range_plan`)
names the winner of each bucket.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dispatch.errors import PlanError, known

if TYPE_CHECKING:
    from dispatch.registry import Registry

#: a built way: ``run(feeds) -> outputs`` (every model output, in the model's order)
WayRunner = Callable[[Mapping[str, np.ndarray]], Sequence[np.ndarray]]


@dataclass(frozen=True)
class ModelWay:
    """One way of running a whole model with dynamic dimensions.

    Attributes:
        name: unique among every backend's ways (``onnxruntime``, ``openvino-latency``).
        backend: the backend that offers it (its version keys the plans that name it).
        description: one line for reports: the library and its settings.
        build: ``build(model_path) -> run``, the model compiled once for every shape.
        settings: the library settings it is built with (reported; part of the name).
        precision: ``float32``, or the reduced precision it computes in (only an accuracy
            objective may choose such a way).
        throughput_only: see the attribute.
    """

    name: str
    backend: str
    description: str
    build: Callable[[str], WayRunner]
    settings: Mapping[str, Any] = field(default_factory=dict)
    precision: str = "float32"
    #: a set-up for many requests in flight (streams), measured only for a throughput
    #: objective, where every way is measured under that load
    throughput_only: bool = False


def model_ways(registry: Registry, backends: Sequence[str]) -> dict[str, ModelWay]:
    """The ways the available ``backends`` offer, in backend order."""
    out: dict[str, ModelWay] = {}
    for name in backends:
        status = registry.backends.get(name)
        if status is None or not status.available:
            continue
        offer = getattr(status.backend, "model_ways", None)
        for way in (offer() if offer is not None else ()):
            out.setdefault(way.name, way)
    return out


def model_way(registry: Registry, backends: Sequence[str], name: str) -> ModelWay:
    """The way called ``name``; raises :class:`~dispatch.errors.PlanError` listing the ways
    the backends offer when none is."""
    ways = model_ways(registry, backends)
    if name not in ways:
        raise PlanError(f"no available backend offers the whole-model way {name!r}; offered "
                        f"here: {known(ways)}")
    return ways[name]


def model_file(model: Any) -> str:
    """A path to ``model``'s file (a path, serialized bytes or an ``onnx.ModelProto``): the
    path given, else the model written once to a temporary file kept for the process's life
    (the libraries compile files)."""
    if isinstance(model, str | os.PathLike):
        return os.fspath(model)
    data = model if isinstance(model, bytes) else model.SerializeToString()
    with tempfile.NamedTemporaryFile(prefix="opdispatch-model-", suffix=".onnx",
                                     delete=False) as handle:
        handle.write(data)
    return handle.name
