"""The in-memory graph: :class:`Value`, :class:`Node` and :class:`Graph`.

After import every value has a dtype and, unless only the data decides it (a *dynamic*
value, downstream of NonZero or a control-flow node: :mod:`dispatch.subgraph`), a static
shape; constants (initializers and folded values) carry their data in :attr:`Value.const`.
Nodes are kept in topological order.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dispatch.errors import PlanError, TensorTooLargeError, known

#: Largest tensor (bytes) a model may declare or infer; ``None``: this machine's physical
#: memory (:func:`max_tensor_bytes`). A tensor that cannot fit in memory can never be
#: computed, so the model is refused when it is loaded rather than failing (or exhausting
#: the machine's memory) when it runs.
MAX_TENSOR_BYTES: int | None = None


@dataclass(eq=False)
class Value:
    """A tensor in the graph: name, static shape, dtype and, for constants, the data."""

    name: str
    shape: tuple[int, ...] | None
    dtype: np.dtype | None
    const: np.ndarray | None = None
    #: whether the shape is known only when the model runs (``shape`` is then ``None``; set
    #: by :func:`dispatch.shape_folding.fill_node`), as opposed to not yet inferred
    dynamic: bool = False

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def rank(self) -> int:
        if self.shape is None:
            raise PlanError(f"value {self.name!r} has no static shape")
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor (0 when its shape or dtype is unknown); exact for any size
        (Python integers: a declared shape of 2**62 x 2**62 does not wrap around)."""
        if self.shape is None or self.dtype is None:
            return 0
        return math.prod(int(d) for d in self.shape) * self.dtype.itemsize

    def __repr__(self) -> str:
        kind = "const " if self.is_const else ""
        return f"Value({self.name!r}, {kind}shape={self.shape}, dtype={self.dtype})"


@dataclass(eq=False)
class Node:
    """One operator application.

    ``inputs`` holds ``None`` for an omitted optional input; ``outputs`` may hold values that
    nothing consumes (e.g. Dropout's mask). ``opset`` is the opset version of the node's
    domain, so that implementations can read attribute-or-input forms of older opsets.
    """

    name: str
    op_type: str
    inputs: list[Value | None]
    outputs: list[Value]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""
    opset: int = 21
    #: a control-flow node's outer-scope reads (:mod:`dispatch.subgraph`): the names its
    #: bodies use for them; the node's last ``len(captures)`` inputs are those values
    captures: tuple[str, ...] = ()

    def attr(self, name: str, default: Any = None) -> Any:
        """Return attribute ``name`` or ``default`` when the node does not set it."""
        return self.attrs.get(name, default)

    def input(self, i: int) -> Value | None:
        """Return input ``i`` or ``None`` when it is absent or omitted."""
        return self.inputs[i] if i < len(self.inputs) else None

    @property
    def explicit_inputs(self) -> list[Value | None]:
        """The inputs ONNX lists for the node (without a control-flow node's captures)."""
        return self.inputs[: len(self.inputs) - len(self.captures)]

    def const_input(self, i: int) -> np.ndarray | None:
        """Return the constant data of input ``i``, or ``None`` when it is not constant."""
        v = self.input(i)
        return None if v is None else v.const

    @property
    def key_op(self) -> str:
        """Operator key in the registry: ``op_type`` for the default domain, else ``domain::op``."""
        return op_key(self.domain, self.op_type)

    def __repr__(self) -> str:
        ins = ", ".join(v.name if v else "<none>" for v in self.inputs)
        outs = ", ".join(v.name for v in self.outputs)
        return f"Node({self.name!r}: {self.op_type}({ins}) -> {outs})"


def op_key(domain: str, op_type: str) -> str:
    """The registry key of an operator: bare for ONNX's default domain."""
    return op_type if domain in ("", "ai.onnx") else f"{domain}::{op_type}"


@dataclass(eq=False)
class Graph:
    """A model after import: values by name, nodes in topological order, inputs and outputs."""

    name: str
    nodes: list[Node]
    values: dict[str, Value]
    inputs: list[Value]
    outputs: list[Value]
    opsets: dict[str, int] = field(default_factory=dict)
    #: the model's inputs as declared, symbolic dimensions kept
    #: (:class:`dispatch.input_shapes.DeclaredInput`; empty for a graph built by hand)
    declared: list[Any] = field(default_factory=list)
    #: the structure's identity with input shapes left open
    #: (:func:`dispatch.input_shapes.family_digest`; empty until the graph is loaded)
    family: str = ""
    #: producers' habits the import rewrote, one line each (e.g. Paddle2ONNX's ``-1`` dims)
    quirks: list[str] = field(default_factory=list)
    #: the dynamic values (shape known only at run time), each with why
    dynamic: dict[str, str] = field(default_factory=dict)

    def value(self, name: str) -> Value:
        try:
            return self.values[name]
        except KeyError:
            raise PlanError(
                f"graph {self.name!r} has no value {name!r}; known: {known(self.values)}"
            ) from None

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise PlanError(
            f"graph {self.name!r} has no node {name!r}; known: {known(n.name for n in self.nodes)}"
        )

    def producers(self) -> dict[str, Node]:
        """Map each non-constant value name to the node producing it."""
        return {o.name: n for n in self.nodes for o in n.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        """Map each value name to the nodes that read it, in graph order."""
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                if v is not None:
                    out.setdefault(v.name, []).append(n)
        return out

    def ops(self) -> Iterator[str]:
        return (n.key_op for n in self.nodes)

    def remove_unused(self) -> None:
        """Drop nodes none of whose outputs reach a graph output, and unreferenced values."""
        needed = {v.name for v in self.outputs}
        keep: list[Node] = []
        for n in reversed(self.nodes):
            if any(o.name in needed for o in n.outputs):
                keep.append(n)
                needed.update(v.name for v in n.inputs if v is not None)
        self.nodes = keep[::-1]
        live = needed | {v.name for v in self.inputs}
        for n in self.nodes:
            live.update(o.name for o in n.outputs)
        self.values = {k: v for k, v in self.values.items() if k in live}

    def summary(self) -> str:
        from collections import Counter

        counts = Counter(n.op_type for n in self.nodes)
        ops = ", ".join(f"{k} x{c}" for k, c in counts.most_common())
        return f"graph {self.name!r}: {len(self.nodes)} nodes ({ops})"


def topological_order(nodes: Sequence[Node], available: set[str]) -> list[Node]:
    """Order ``nodes`` so that each comes after the producers of its inputs.

    ``available`` holds value names ready before any node runs (graph inputs, constants).
    Raises :class:`PlanError` naming the nodes on a cycle or with a missing input.
    """
    ready = set(available)
    pending = list(nodes)
    ordered: list[Node] = []
    while pending:
        progressed = False
        rest: list[Node] = []
        for n in pending:
            if all(v is None or v.name in ready for v in n.inputs):
                ordered.append(n)
                ready.update(o.name for o in n.outputs)
                progressed = True
            else:
                rest.append(n)
        if not progressed:
            missing = sorted(
                {v.name for n in rest for v in n.inputs if v is not None and v.name not in ready}
                - {o.name for n in rest for o in n.outputs}
            )
            names = ", ".join(n.name for n in rest[:10])
            if missing:
                raise PlanError(
                    f"nodes {names} read values that nothing produces: {', '.join(missing[:10])}"
                )
            raise PlanError(f"the graph has a cycle through nodes: {names}")
        pending = rest
    return ordered


def hoist_input_readers(nodes: Sequence[Node], graph_inputs: set[str],
                        constants: set[str]) -> list[Node]:
    """``nodes`` (in a topological order) with the *input readers* (the nodes that read graph
    inputs and nothing but graph inputs and constants) first, the one whose first reader comes
    last first, so that each ends next to its reader where it can; the rest keep their order.

    Exporters place such a node where its first reader is: the Cast of a transformer's attention
    mask comes after the word embeddings' Gather, far from the encoder that reads it. A backend
    that refuses the Cast (OpenVINO, with int64 inputs) split its region in two around it, since
    regions are ranges of this order (:func:`impls.regions.propose`); first, it leaves one range
    (MiniLM's plans: a numpy Cast and one OpenVINO region instead of two around the Cast; no
    latency difference was measured from it)."""
    position = {id(n): k for k, n in enumerate(nodes)}
    first_reader: dict[str, int] = {}
    for k, n in enumerate(nodes):
        for v in n.inputs:
            if v is not None:
                first_reader.setdefault(v.name, k)
    readers = [n for n in nodes
               if any(v is not None and v.name in graph_inputs for v in n.inputs)
               and all(v is None or v.name in graph_inputs or v.name in constants for v in n.inputs)]
    if not readers:
        return list(nodes)

    def nearest_reader(n: Node) -> int:
        return min((first_reader.get(o.name, len(nodes)) for o in n.outputs), default=len(nodes))

    readers.sort(key=lambda n: (-nearest_reader(n), position[id(n)]))
    moved = {id(n) for n in readers}
    return readers + [n for n in nodes if id(n) not in moved]


def max_tensor_bytes() -> int:
    """The largest tensor a model may hold: :data:`MAX_TENSOR_BYTES`, else this machine's
    physical memory (``1 << 40`` where the system does not say)."""
    if MAX_TENSOR_BYTES is not None:
        return int(MAX_TENSOR_BYTES)
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return 1 << 40


def _fmt_bytes(n: int) -> str:
    for unit, size in (("EiB", 1 << 60), ("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30),
                       ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def check_tensor_sizes(values: Iterable[Value], where: str = "") -> None:
    """Raise :class:`TensorTooLargeError` for the first value with a negative dimension or
    larger than :func:`max_tensor_bytes`, naming it, its shape and the limit."""
    limit = max_tensor_bytes()
    for v in values:
        if v.shape is None:
            continue
        if any(int(d) < 0 for d in v.shape):
            raise TensorTooLargeError(
                f"value {v.name!r}{where} has shape {list(v.shape)}, with a negative dimension; "
                f"expected dimensions >= 0"
            )
        size = v.nbytes
        nonzero = math.prod(int(d) for d in v.shape if d) * (v.dtype.itemsize if v.dtype else 1)
        if nonzero >= 1 << 63:
            raise TensorTooLargeError(
                f"value {v.name!r}{where} has shape {list(v.shape)}: even with "
                f"{'no elements' if size == 0 else 'its elements'}, numpy cannot hold an array "
                f"of this shape (its non-zero dimensions multiply to {nonzero} bytes, more than "
                f"2**63); expected dimensions whose product fits in 64 bits"
            )
        if size > limit:
            raise TensorTooLargeError(
                f"value {v.name!r}{where} has shape {list(v.shape)} ({v.dtype}): "
                f"{_fmt_bytes(size)} ({size} bytes), more than the {_fmt_bytes(limit)} a tensor "
                f"may take on this machine (its physical memory; "
                f"dispatch.graph.MAX_TENSOR_BYTES sets another limit); the model cannot run here"
            )
