"""Operator implementations and the registry that holds them.

An :class:`Implementation` is one way to run one operator: a unique name such as
``Conv.numpy.im2col``, the backend it belongs to, the layouts it consumes and produces, a
priority, a ``supports(node)`` check that returns ``None`` or a human-readable reason, and a
``build(node)`` function that prepares a kernel once per plan (packing weights, choosing an
algorithm) and returns a callable run on every inference.

Backends declare their implementations in an :class:`ImplTable` with a decorator and hand
the table to the :class:`Registry` when they register; nothing is discovered by scanning
module globals.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dispatch.errors import RegistryError, known
from dispatch.graph import Node, op_key

if TYPE_CHECKING:
    from dispatch.backend import Backend, BackendStatus
    from layouts.registry import LayoutRegistry

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

STANDARD = "std"


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

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._impls: list[Implementation] = []

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

    def add(self, impl: Implementation) -> None:
        if impl.backend != self.backend:
            raise RegistryError(
                f"implementation {impl.name!r} declares backend {impl.backend!r} but was added "
                f"to the table of backend {self.backend!r}"
            )
        if any(i.name == impl.name for i in self._impls):
            raise RegistryError(f"duplicate implementation name {impl.name!r}")
        self._impls.append(impl)

    def __iter__(self):
        return iter(self._impls)

    def __len__(self) -> int:
        return len(self._impls)


@dataclass
class Registry:
    """Every implementation, backend and layout known to this process."""

    layouts: LayoutRegistry
    _by_op: dict[str, list[Implementation]] = field(default_factory=dict)
    _by_name: dict[str, Implementation] = field(default_factory=dict)
    backends: dict[str, BackendStatus] = field(default_factory=dict)

    # -- implementations -------------------------------------------------------------
    def add_impl(self, impl: Implementation) -> None:
        """Register one implementation; a duplicate name raises :class:`RegistryError`."""
        if impl.name in self._by_name:
            other = self._by_name[impl.name]
            raise RegistryError(
                f"duplicate implementation name {impl.name!r}: already registered by backend "
                f"{other.backend!r}, received again from backend {impl.backend!r}"
            )
        self._by_name[impl.name] = impl
        self._by_op.setdefault(impl.op, []).append(impl)

    def add_table(self, table: Iterable[Implementation]) -> None:
        for impl in table:
            self.add_impl(impl)

    def impls_for(self, op: str, backends: Sequence[str] | None = None) -> list[Implementation]:
        """Implementations of ``op`` (optionally restricted to ``backends``, kept in that
        order, then by descending priority). Unknown ops raise, listing the known ops."""
        if op not in self._by_op:
            raise RegistryError(
                f"no implementation is registered for operator {op!r}; known operators: "
                f"{known(self._by_op)}"
            )
        impls = self._by_op[op]
        if backends is None:
            return sorted(impls, key=lambda i: -i.priority)
        rank = {b: k for k, b in enumerate(backends)}
        chosen = [i for i in impls if i.backend in rank]
        return sorted(chosen, key=lambda i: (rank[i.backend], -i.priority))

    def patterns(self, backends: Sequence[str] | None = None) -> list[Implementation]:
        """Fused (multi-node) implementations, optionally of ``backends`` only."""
        return [
            i for i in self._by_name.values()
            if i.pattern and (backends is None or i.backend in backends)
        ]

    def has_op(self, op: str) -> bool:
        return op in self._by_op

    def impl(self, name: str) -> Implementation:
        try:
            return self._by_name[name]
        except KeyError:
            raise RegistryError(
                f"unknown implementation {name!r}; known: {known(self._by_name, limit=40)}"
            ) from None

    @property
    def ops(self) -> list[str]:
        return sorted(self._by_op)

    @property
    def implementations(self) -> list[Implementation]:
        return list(self._by_name.values())

    # -- backends --------------------------------------------------------------------
    def available_backends(self) -> list[str]:
        return [n for n, s in self.backends.items() if s.available]

    def backend(self, name: str) -> Backend:
        st = self.backends.get(name)
        if st is None or st.backend is None:
            raise RegistryError(f"unknown backend {name!r}; known: {known(self.backends)}")
        return st.backend


def dtype_of(node: Node, i: int = 0) -> np.dtype | None:
    """The dtype of input ``i`` of ``node`` (``None`` when absent)."""
    v = node.input(i)
    return None if v is None else v.dtype
