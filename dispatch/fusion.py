"""Multi-node candidates: fused patterns over chains of nodes, and regions.

A fused implementation (e.g. ``Conv+Relu.native.nchw16c``) runs a chain of nodes as one step.
A chain ``n0 -> n1 -> ... -> nk`` matches a pattern of op types when each ``n{i+1}`` consumes
``n{i}``'s only output, and that output has no other consumer and is not a graph output (so
nothing else needs the intermediate tensor).

The fused step is presented to implementations as a :class:`FusedNode`: a ``Node`` whose
inputs are the chain's external inputs in a fixed order — every input of the first node
(``None`` kept for omitted optional inputs), then, for each later node, its inputs other than
the chained value — and whose outputs are the last node's outputs. ``FusedNode.nodes`` holds
the real nodes, so build functions read each node's attributes there.

A *region* is any convex set of nodes that a subgraph backend (e.g. onnxruntime) runs as one
step; it is presented as a FusedNode with ``op_type`` :data:`REGION_OP` whose inputs are the
non-constant values its nodes read from outside (constants stay inside: the backend embeds
them when it builds the step) and whose outputs are the values its nodes produce that are read
outside or are graph outputs, both in order of first appearance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from dispatch.errors import PlanError
from dispatch.graph import Graph, Node, Value

SEPARATOR = "+"
#: the op type of a region step (see the module docstring)
REGION_OP = "Region"


@dataclass(eq=False, repr=False)
class FusedNode(Node):
    """A chain of nodes run as one step (see the module docstring)."""

    nodes: list[Node] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"FusedNode({self.name!r}: {self.op_type})"


def pattern_key(ops: Sequence[str]) -> str:
    """The registry op key of a pattern, e.g. ``Conv+Relu``."""
    return SEPARATOR.join(ops)


def fuse(nodes: Sequence[Node]) -> FusedNode:
    """The :class:`FusedNode` of a chain (which the caller has matched)."""
    if not nodes:
        raise PlanError("cannot fuse an empty chain of nodes")
    inputs: list[Value | None] = list(nodes[0].inputs)
    for prev, node in pairwise(nodes):
        chained = prev.outputs[0].name
        skipped = False
        for v in node.inputs:
            if not skipped and v is not None and v.name == chained:
                skipped = True
                continue
            inputs.append(v)
        if not skipped:
            raise PlanError(f"node {node.name!r} does not consume {chained!r}; not a chain")
    first = nodes[0]
    return FusedNode(
        name=SEPARATOR.join(n.name for n in nodes),
        op_type=pattern_key([n.op_type for n in nodes]),
        inputs=inputs,
        outputs=list(nodes[-1].outputs),
        attrs=dict(first.attrs),
        domain=first.domain,
        opset=first.opset,
        nodes=list(nodes),
    )


def match_chain(
    start: Node,
    ops: Sequence[str],
    consumers: Mapping[str, list[Node]],
    graph_outputs: set[str],
) -> list[Node] | None:
    """The chain of nodes starting at ``start`` whose op types are ``ops``, or ``None``."""
    if start.key_op != ops[0]:
        return None
    chain = [start]
    for op in ops[1:]:
        prev = chain[-1]
        live = [o for o in prev.outputs if consumers.get(o.name) or o.name in graph_outputs]
        if len(live) != 1 or live[0] is not prev.outputs[0]:
            return None
        out = prev.outputs[0].name
        users = consumers.get(out, [])
        if out in graph_outputs or len(users) != 1 or users[0].key_op != op:
            return None
        nxt = users[0]
        if sum(1 for v in nxt.inputs if v is not None and v.name == out) != 1:
            return None
        chain.append(nxt)
    return chain


def region_node(graph: Graph, names: Sequence[str]) -> FusedNode:
    """The :class:`FusedNode` of the region ``names`` of ``graph`` (see the module docstring);
    its ``nodes`` are in the graph's (topological) order."""
    wanted = set(names)
    missing = wanted - {n.name for n in graph.nodes}
    if missing:
        raise PlanError(f"region names nodes not in graph {graph.name!r}: {sorted(missing)[:10]}")
    nodes = [n for n in graph.nodes if n.name in wanted]
    inside = {v.name for n in nodes for v in n.outputs}
    inputs: list[Value] = []
    seen: set[str] = set()
    for n in nodes:
        for v in n.inputs:
            if v is not None and not v.is_const and v.name not in inside and v.name not in seen:
                seen.add(v.name)
                inputs.append(v)
    read_outside = {v.name for n in graph.nodes if n.name not in wanted for v in n.inputs if v is not None}
    read_outside |= {v.name for v in graph.outputs}
    outputs = [v for n in nodes for v in n.outputs if v.name in read_outside]
    return FusedNode(
        name=SEPARATOR.join(n.name for n in nodes) if len(nodes) <= 4
        else f"{nodes[0].name}..{nodes[-1].name}({len(nodes)} nodes)",
        op_type=REGION_OP,
        inputs=list(inputs),
        outputs=outputs,
        attrs={"whole_graph": len(nodes) == len(graph.nodes)},
        domain="",
        opset=nodes[0].opset,
        nodes=nodes,
    )


def step_node(graph: Graph, names: Sequence[str], op: str | None = None) -> Node:
    """The node a plan step runs: the node itself, the FusedNode of a chain, or the region
    node when ``op`` is :data:`REGION_OP` (a region may have one node)."""
    if op == REGION_OP:
        return region_node(graph, names)
    if len(names) == 1:
        return graph.node(names[0])
    return fuse([graph.node(n) for n in names])
