"""Subgraphs of control-flow operators (If, Loop, Scan) and the values whose shapes only the
data decides.

A control-flow node carries its bodies as graph attributes. They are kept as
:class:`Subgraph` objects (the GraphProto, a digest that identifies it in fingerprints and
measurement signatures, and the outer-scope names it reads). The values a body reads from
the enclosing graph without declaring them (ONNX's outer-scope references) become *implicit
inputs* of the node: :attr:`dispatch.graph.Node.captures` names them as the body spells them,
and they are the node's last inputs, so that ordering, liveness and regions see the
dependency like any other.

Dynamic values: an operator of :data:`DATA_DEPENDENT_OPS` (NonZero, NonMaxSuppression...) or
a control-flow node produces values whose shape is known only when it runs, and so does every
node downstream of such a value whose shape onnx's inference cannot fix. Those values keep
``shape=None`` (their dtype is known); see :func:`dispatch.shape_folding.fill_node`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # onnx is not imported on a start from the caches (issue 13)
    import onnx

#: operators whose bodies are subgraphs
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})

#: operators whose output shape follows the *values* of their inputs, whatever their types
#: (those reading sizes from integer inputs are found by evaluating them: see
#: :func:`dispatch.shape_folding.fill_node`)
DATA_DEPENDENT_OPS = frozenset({"NonZero", "NonMaxSuppression", "Unique", "Compress",
                                "StringSplit", "RegexFullMatch"}) | CONTROL_FLOW_OPS


@dataclass(frozen=True, eq=False)
class Subgraph:
    """A control-flow node's body: the GraphProto, its digest and the outer-scope names it
    reads (its own nested bodies' included)."""

    proto: onnx.GraphProto
    digest: str
    captures: tuple[str, ...]
    #: the opset versions of the model it belongs to (domain -> version)
    opsets: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, proto: onnx.GraphProto, opsets: dict[str, int] | None = None) -> Subgraph:
        digest = hashlib.sha256(proto.SerializeToString(deterministic=True)).hexdigest()[:32]
        return cls(proto, digest, tuple(outer_names(proto)), dict(opsets or {}))

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.proto.input]

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.proto.output]

    def canonical(self) -> dict[str, object]:
        """What fingerprints and signatures hash of it."""
        return {"subgraph": self.digest}

    def __repr__(self) -> str:  # deterministic: fingerprints fall back on repr
        return f"Subgraph(sha256={self.digest}, nodes={len(self.proto.node)})"


def outer_names(graph: onnx.GraphProto) -> list[str]:
    """Names ``graph``'s nodes (and their nested bodies) read that ``graph`` does not define:
    its outer-scope references, in the order first read."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    defined |= {s.values.name for s in graph.sparse_initializer}
    seen: dict[str, None] = {}
    for node in graph.node:
        reads = [i for i in node.input if i]
        for a in node.attribute:
            for body in _bodies(a):
                reads.extend(outer_names(body))
        for name in reads:
            if name not in defined:
                seen.setdefault(name, None)
        defined.update(o for o in node.output if o)
    return list(seen)


def _bodies(a: onnx.AttributeProto) -> list[onnx.GraphProto]:
    import onnx

    if a.type == onnx.AttributeProto.GRAPH:
        return [a.g]
    if a.type == onnx.AttributeProto.GRAPHS:
        return list(a.graphs)
    return []


def node_captures(subgraphs: Iterable[Subgraph]) -> tuple[str, ...]:
    """The outer-scope names a node's bodies read, in order, each once."""
    out: dict[str, None] = {}
    for sub in subgraphs:
        for name in sub.captures:
            out.setdefault(name, None)
    return tuple(out)


def subgraphs_of(attrs: dict[str, object]) -> list[Subgraph]:
    """The :class:`Subgraph` attributes of a node, in attribute order."""
    return [a for a in attrs.values() if isinstance(a, Subgraph)]


def data_decides(graph) -> bool:
    """Whether what ``graph`` computes takes a path or a size only the data decides (dynamic
    values or control flow): such a model is checked on several inputs."""
    return bool(graph.dynamic) or any(n.op_type in CONTROL_FLOW_OPS and n.domain == ""
                                      for n in graph.nodes)
