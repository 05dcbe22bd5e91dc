"""Operator implementations and the table a backend declares them in.

An :class:`Implementation` is one way to run one operator: a unique name such as
``Conv.numpy.im2col``, the backend it belongs to, the layouts it consumes and produces, a
priority, a ``supports(node)`` check that returns ``None`` or a human-readable reason, and a
``build(node)`` function that prepares a kernel once per plan (packing weights, choosing an
algorithm) and returns a callable run on every inference.

Backends declare their implementations in an :class:`ImplTable` with a decorator and hand
the table to the :class:`dispatch.registry.Registry` when they register; nothing is discovered
by scanning module globals. :mod:`dispatch.registry` re-exports every name here.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatch.errors import RegistryError
from dispatch.graph import Node, op_key
from layouts.registry import STANDARD

#: A prepared kernel: called with one array (or ``None`` for an omitted optional input) per
#: node input, in the layouts the implementation declared; returns one array or a tuple with
#: one array per node output.
Kernel = Callable[..., Any]
#: Prepares a kernel for one node, once per plan.
BuildFn = Callable[[Node], Kernel]
#: Returns ``None`` when the implementation can run the node, else the reason it cannot.
SupportsFn = Callable[[Node], "str | None"]
#: Layouts per input (or output): a tuple, or a function of the node for variadic ops.
LayoutSpec = "tuple[str, ...] | Callable[[Node], tuple[str, ...]]"


#: The backend whose implementations define every operator's semantics: the tuner checks every
#: candidate against it and validates whole plans against an all-reference plan. A backend that
#: brings a custom operator contributes its reference implementation under this backend name.
REFERENCE_BACKEND = "numpy"


class Priority(enum.IntEnum):
    """Named priority levels. Within a backend the highest priority that supports a node wins
    in an untuned plan; a tuned plan overrides priorities with measurements, and ties within
    the measured noise go to the higher priority."""

    FALLBACK = 10
    DEFAULT = 20
    PREFERRED = 30
    #: a kernel for a special case that a PREFERRED one also covers (1x1, depthwise), so the
    #: special case wins the untuned plan
    SPECIALISED = 35


def _all_standard(node: Node) -> tuple[str, ...]:
    return (STANDARD,) * len(node.inputs)


def _outputs_standard(node: Node) -> tuple[str, ...]:
    return (STANDARD,) * len(node.outputs)


@dataclass(frozen=True)
class Implementation:
    """One registered way to run one operator."""

    name: str
    op: str
    backend: str
    build: BuildFn
    priority: int = Priority.DEFAULT
    supports_fn: SupportsFn | None = None
    layouts_in: Any = _all_standard
    layouts_out: Any = _outputs_standard
    doc: str = ""
    #: op types of the chain a fused implementation covers (empty for single-node ones)
    pattern: tuple[str, ...] = ()
    #: a region implementation's proposer: ``propose(graph) -> [[node name, ...], ...]``,
    #: the convex node sets it offers to run as one step (see dispatch.fusion.region_node)
    propose: Callable[[Any], list[list[str]]] | None = None
    #: the library settings this implementation builds its kernels with (e.g. onnxruntime's
    #: graph optimisation level): variants of one library differ only here, and the tuner
    #: measures each like any other candidate; the plan records the implementation, so its
    #: settings, and a plan is refused when the library's version changes
    settings: Mapping[str, Any] = field(default_factory=dict)
    #: whether it runs nodes whose shapes are known only at run time (dynamic values:
    #: :mod:`dispatch.subgraph`); the reference backend's do, sizing outputs from the arrays
    dynamic_shapes: bool = False
    #: ``float32``, or a reduced precision (``bf16``, ``int8``) only accuracy tuning may choose;
    #: ``calibrate(region, input samples) -> JSON`` what its build needs of the data (ranges)
    precision: str = "float32"
    calibrate: Callable[[Any, list], Any] | None = None

    @property
    def is_region(self) -> bool:
        return self.propose is not None

    def supports(self, node: Node) -> str | None:
        """``None`` when this implementation can run ``node``, else the reason it cannot."""
        if self.supports_fn is None:
            return None
        try:
            return self.supports_fn(node)
        except Exception as exc:  # a faulty check must not take the planner down
            return f"supports() raised {type(exc).__name__}: {exc}"

    def input_layouts(self, node: Node) -> tuple[str, ...]:
        lay = self.layouts_in(node) if callable(self.layouts_in) else tuple(self.layouts_in)
        return _fit(lay, len(node.inputs))

    def output_layouts(self, node: Node) -> tuple[str, ...]:
        lay = self.layouts_out(node) if callable(self.layouts_out) else tuple(self.layouts_out)
        return _fit(lay, len(node.outputs))


def _fit(layouts: Sequence[str], n: int) -> tuple[str, ...]:
    """Extend a layout tuple to ``n`` entries with the standard layout (optional extras)."""
    lay = tuple(layouts)[:n]
    return lay + (STANDARD,) * (n - len(lay))


class ImplTable:
    """A backend's own table of implementations, filled with the :meth:`register` decorator."""

    def __init__(self, backend: str, *, dynamic_shapes: bool = False) -> None:
        """``dynamic_shapes``: see :attr:`Implementation.dynamic_shapes` (single-node ones)."""
        self.backend = backend
        self.dynamic_shapes = dynamic_shapes
        self._impls: list[Implementation] = []
        self._names: set[str] = set()

    def register(
        self,
        op: str,
        variant: str,
        *,
        priority: int = Priority.DEFAULT,
        supports: SupportsFn | None = None,
        layouts_in: Any = None,
        layouts_out: Any = None,
        domain: str = "",
    ) -> Callable[[BuildFn], BuildFn]:
        """Decorate a build function ``build(node) -> kernel`` as ``{op}.{backend}.{variant}``."""

        def deco(build: BuildFn) -> BuildFn:
            self.add(
                Implementation(
                    name=f"{op}.{self.backend}.{variant}",
                    op=op_key(domain, op),
                    backend=self.backend,
                    build=build,
                    priority=int(priority),
                    supports_fn=supports,
                    layouts_in=layouts_in if layouts_in is not None else _all_standard,
                    layouts_out=layouts_out if layouts_out is not None else _outputs_standard,
                    doc=(build.__doc__ or "").strip().split("\n")[0],
                    dynamic_shapes=self.dynamic_shapes,
                )
            )
            return build

        return deco

    def register_pattern(
        self,
        ops: Sequence[str],
        variant: str,
        *,
        priority: int = Priority.DEFAULT,
        supports: SupportsFn | None = None,
        layouts_in: Any = None,
        layouts_out: Any = None,
    ) -> Callable[[BuildFn], BuildFn]:
        """Decorate a fused implementation of the chain ``ops`` (e.g. ``("Conv", "Relu")``),
        named ``Conv+Relu.{backend}.{variant}``. Its ``supports``, layout functions and build
        function receive a :class:`dispatch.fusion.FusedNode`."""
        from dispatch.fusion import pattern_key

        ops = tuple(ops)
        if len(ops) < 2:
            raise RegistryError(f"a pattern covers at least two ops, received {ops}")
        key = pattern_key(ops)

        def deco(build: BuildFn) -> BuildFn:
            self.add(
                Implementation(
                    name=f"{key}.{self.backend}.{variant}",
                    op=key,
                    backend=self.backend,
                    build=build,
                    priority=int(priority),
                    supports_fn=supports,
                    layouts_in=layouts_in if layouts_in is not None else _all_standard,
                    layouts_out=layouts_out if layouts_out is not None else _outputs_standard,
                    doc=(build.__doc__ or "").strip().split("\n")[0],
                    pattern=ops,
                )
            )
            return build

        return deco

    def register_region(
        self,
        variant: str,
        *,
        propose: Callable[[Any], list[list[str]]],
        priority: int = Priority.DEFAULT,
        supports: SupportsFn | None = None,
        settings: Mapping[str, Any] | None = None,
        dynamic_shapes: bool = False,
        precision: str = "float32",
        calibrate: Callable | None = None,
        layouts_in: Any = None,
        layouts_out: Any = None,
    ) -> Callable[[BuildFn], BuildFn]:
        """Decorate the build function of a region implementation ``Region.{backend}.{variant}``:
        ``propose(graph)`` lists the convex node sets it offers (several granularities, so the
        tuner can mix it with other backends); ``supports`` and ``build`` receive the region's
        :class:`dispatch.fusion.FusedNode` (op type ``Region``). Regions read and write the
        standard layout unless ``layouts_in`` / ``layouts_out`` say otherwise (as for single
        ops; a reduced-precision region may hold its precision's: :mod:`layouts.precision`).
        ``settings`` names the library settings the build uses (shown in reports; a variant of
        the same library with other settings is another registration). ``dynamic_shapes``: its
        regions may hold values whose shapes are known only at run time (its ``supports``
        still decides node by node). ``precision``, ``calibrate``: see :class:`Implementation`."""
        from dispatch.fusion import REGION_OP

        def deco(build: BuildFn) -> BuildFn:
            self.add(
                Implementation(
                    name=f"{REGION_OP}.{self.backend}.{variant}",
                    op=REGION_OP,
                    backend=self.backend,
                    build=build,
                    priority=int(priority),
                    supports_fn=supports,
                    doc=(build.__doc__ or "").strip().split("\n")[0],
                    propose=propose,
                    layouts_in=layouts_in or _all_standard,
                    layouts_out=layouts_out or _outputs_standard,
                    settings=dict(settings or {}),
                    dynamic_shapes=dynamic_shapes,
                    precision=precision,
                    calibrate=calibrate,
                )
            )
            return build

        return deco

    def add(self, impl: Implementation) -> None:
        if impl.backend != self.backend:
            raise RegistryError(
                f"implementation {impl.name!r} declares backend {impl.backend!r} but was added "
                f"to the table of backend {self.backend!r}"
            )
        if impl.name in self._names:
            raise RegistryError(f"duplicate implementation name {impl.name!r}")
        self._impls.append(impl)
        self._names.add(impl.name)

    def __iter__(self):
        return iter(self._impls)

    def __len__(self) -> int:
        return len(self._impls)
