"""onnxruntime as the reference of an operator the numpy reference lacks (issue 52).

An operator without a numpy reference may still run: onnxruntime's own result is then the
reference of its node (a one-node onnxruntime region), and the plan says so: the tuner's
provenance names those nodes (``reference_from_onnxruntime``), the summary and ``explain``
repeat it, and a candidate that is onnxruntime running such a node is checked against
onnxruntime itself, which is no independent validation: its check is recorded as such,
not counted as agreement.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dispatch.fusion import REGION_OP, FusedNode
from dispatch.graph import Graph, Node, Value
from dispatch.registry import Implementation, Registry

#: the backend whose result stands in for a missing numpy reference
FALLBACK_BACKEND = "onnxruntime"
#: its implementation that runs a one-node region
FALLBACK_IMPL = "Region.onnxruntime.session"


def single_node_region(node: Node) -> FusedNode:
    """The one-node region of ``node`` (its non-constant inputs, all its outputs)."""
    inputs: list[Value] = []
    for v in node.inputs:
        if v is not None and not v.is_const and all(v is not u for u in inputs):
            inputs.append(v)
    return FusedNode(name=node.name, op_type=REGION_OP, inputs=inputs, outputs=list(node.outputs),
                     attrs={"whole_graph": False}, domain="", opset=node.opset, nodes=[node])


def fallback_impl(registry: Registry, node: Node) -> Implementation | None:
    """onnxruntime's region implementation when it runs ``node`` alone, else ``None``."""
    backend = registry.backends.get(FALLBACK_BACKEND)
    if backend is None or not backend.available:
        return None
    try:
        impl = registry.impl(FALLBACK_IMPL)
    except Exception:  # onnxruntime not registered in this process
        return None
    return impl if impl.supports(single_node_region(node)) is None else None


def fallback_kernel(impl: Implementation, node: Node) -> Callable[..., Any]:
    """A kernel with ``node``'s own signature (every input, constants and omitted ones
    included) over onnxruntime's one-node region."""
    region = single_node_region(node)
    run = impl.build(region)
    where = [next(k for k, v in enumerate(node.inputs) if v is r) for r in region.inputs]

    def kernel(*args: np.ndarray | None) -> tuple[np.ndarray, ...]:
        return tuple(run(*[args[k] for k in where]))

    return kernel


def onnxruntime_referenced(graph: Graph, registry: Registry) -> list[str]:
    """The nodes of ``graph`` without a numpy reference whose reference is onnxruntime's."""
    return [n.name for n in graph.nodes
            if registry.reference_impl(n) is None and fallback_impl(registry, n) is not None]


def self_checked(nodes: Sequence[Node], backend: str, referenced: set[str]) -> list[str]:
    """The nodes of a candidate of ``backend`` whose only reference is that same backend's
    result (``referenced``: :func:`onnxruntime_referenced`): its check is no independent one."""
    if backend != FALLBACK_BACKEND:
        return []
    return [n.name for n in nodes if n.name in referenced]
