"""Exceptions raised by opdispatch.

Every error says what was received and what was expected, and where a lookup fails it
lists what exists. The CLI turns any :class:`OpDispatchError` into a one-line message and a
non-zero exit code, without a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence

# the base classes (and the name-list helper) live below both layouts and dispatch
from layouts.errors import LayoutError as LayoutError
from layouts.errors import OpDispatchError as OpDispatchError
from layouts.errors import known as known


class ModelLoadError(OpDispatchError):
    """The model file or proto could not be read, checked or imported."""


class TensorTooLargeError(ModelLoadError):
    """A tensor of the model, as declared or inferred, has a negative dimension or would not
    fit in this machine's memory (see :func:`dispatch.graph.max_tensor_bytes`)."""


class UnsupportedOpError(OpDispatchError):
    """One or more nodes have no implementation in any allowed backend."""


class ShapeInferenceError(OpDispatchError):
    """A value's shape could not be determined statically."""


class SymbolicShapeError(ShapeInferenceError):
    """An input's shape is symbolic and no concrete shape was given for it. ``inputs`` holds
    the model's declared inputs (:class:`dispatch.input_shapes.DeclaredInput`), so that a
    caller that can wait for the feeds (a Session) does not read the model again."""

    def __init__(self, message: str, inputs: list | None = None) -> None:
        super().__init__(message)
        self.inputs = list(inputs or [])


class FeedError(OpDispatchError):
    """Inputs passed to ``Session.run`` do not match the model's inputs."""


class RegistryError(OpDispatchError):
    """Duplicate registrations or failed lookups in a registry."""


class PlanError(OpDispatchError):
    """A plan is malformed, does not match its graph, or names unknown pieces."""


class KernelError(OpDispatchError):
    """An implementation raised while running; names the node, implementation and backend.

    Attributes (``None`` when not known, e.g. for a build failure):
        node: the label of the failing call (node name, fused ``a+b``, or ``convert ...``).
        impl: the implementation (or converter chain) that failed.
        backend: its backend.
    """

    def __init__(
        self, message: str, *, node: str | None = None, impl: str | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__(message)
        self.node = node
        self.impl = impl
        self.backend = backend


class ConfigError(OpDispatchError):
    """A configuration value could not be parsed."""


class ArgumentError(OpDispatchError, ValueError):
    """An argument has a value of the wrong kind, or arguments were combined that exclude
    each other (e.g. ``Session(plan=..., tune="first-run")``)."""


class PlanNotFoundError(OpDispatchError):
    """A tuned plan was required (``Session(require_plan=True)``, ``--require-plan``) and the
    plan store holds none for this model, input shapes, machine, software and objective.

    Attributes:
        store_path: the plan store that was searched (``None`` when there was none).
        reasons: why no stored plan matched, one line each (``"plan 3 (latency, stored ...):
            native: build 1a2b -> build 3c4d"``, ``"this model was never tuned here"``).
    """

    def __init__(
        self, message: str, *, store_path: str | None = None, reasons: Sequence[str] = ()
    ) -> None:
        super().__init__(message)
        self.store_path = store_path
        self.reasons = list(reasons)

