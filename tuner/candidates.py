"""Candidates: every (implementation, layouts) that can run a node or a chain of nodes.

For each node, every implementation of every allowed, available backend whose ``supports()``
accepts it and whose layouts can hold its tensors; and for each fused pattern registered by a
backend, every chain of the graph it matches (a multi-node candidate). Rejected candidates are
kept with their reasons for reports.

A candidate's :attr:`Candidate.signature` identifies what is measured: the implementation, the
op types and attributes of its nodes, the shapes, dtypes and layouts of its tensors, and the
values of small non-float constant inputs and of float scalars (a Reshape's target shape and a
Pow's exponent matter; a Conv's weights and bias values do not, so a retrained model reuses the
measurements). Equal signatures share one measurement, across the graph, across models and across runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dispatch.fusion import REGION_OP, FusedNode, fuse, match_chain, region_node
from dispatch.graph import Graph, Node
from dispatch.heuristic import region_proposals
from dispatch.plan import Rejected
from dispatch.plan_assembly import candidate_reason
from dispatch.registry import Implementation, Registry
from dispatch.subgraph import Subgraph

#: non-float constant inputs up to this many elements are part of a signature by value
SMALL_CONST = 64


@dataclass(frozen=True)
class Candidate:
    """An implementation bound to one node (or a chain of nodes) with concrete layouts."""

    impl: Implementation
    node: Node
    nodes: tuple[str, ...]
    layouts_in: tuple[str, ...]
    layouts_out: tuple[str, ...]
    signature: str

    @property
    def id(self) -> str:
        return f"{self.impl.name}@{'+'.join(self.nodes)}"

    @property
    def fused(self) -> bool:
        return len(self.nodes) > 1


@dataclass
class CandidateSet:
    """Every candidate of a graph, by the first node each covers, and the rejections."""

    candidates: list[Candidate] = field(default_factory=list)
    rejected: dict[str, list[Rejected]] = field(default_factory=dict)

    def for_node(self, name: str) -> list[Candidate]:
        """Candidates covering node ``name`` (single-node and fused)."""
        return [c for c in self.candidates if name in c.nodes]

    def signatures(self) -> dict[str, list[Candidate]]:
        out: dict[str, list[Candidate]] = {}
        for c in self.candidates:
            out.setdefault(c.signature, []).append(c)
        return out


def _canon(value: Any) -> Any:
    if isinstance(value, Subgraph):  # a control-flow body: by its digest
        return value.canonical()
    if isinstance(value, np.ndarray):
        weights = value.dtype.kind in "fc" and value.size > 1
        if value.size <= SMALL_CONST and not weights:
            return {"dtype": value.dtype.str, "shape": list(value.shape), "data": value.ravel().tolist()}
        return {"dtype": value.dtype.str, "shape": list(value.shape)}
    if isinstance(value, list | tuple):
        return [_canon(v) for v in value]
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        return _canon(value.item())
    return value


def _value_key(v) -> Any:
    if v is None:
        return None
    key: dict[str, Any] = {
        "shape": list(v.shape) if v.shape is not None else None,
        "dtype": np.dtype(v.dtype).str if v.dtype is not None else None,
    }
    if v.const is not None:
        key["const"] = _canon(np.asarray(v.const))
    return key


def signature(impl: Implementation, node: Node, layouts_in: Sequence[str], layouts_out: Sequence[str]) -> str:
    """The measurement key of ``impl`` on ``node`` (see the module docstring)."""
    nodes = node.nodes if isinstance(node, FusedNode) else [node]
    wiring = None
    if node.op_type == REGION_OP:  # a region's structure: who reads what, by position
        pos: dict[str, str] = {v.name: f"in{k}" for k, v in enumerate(node.inputs)}
        for k, n in enumerate(nodes):
            for j, v in enumerate(n.outputs):
                pos[v.name] = f"n{k}.{j}"
        wiring = [[None if v is None else pos.get(v.name, "const") for v in n.inputs] for n in nodes]
        wiring.append([pos[v.name] for v in node.outputs])
    payload = {
        "impl": impl.name,
        "ops": [n.key_op for n in nodes],
        "opsets": [n.opset for n in nodes],
        "attrs": [{k: _canon(v) for k, v in sorted(n.attrs.items())} for n in nodes],
        "inputs": [_value_key(v) for v in node.inputs],
        "outputs": [_value_key(v) for v in node.outputs],
        "layouts_in": list(layouts_in),
        "layouts_out": list(layouts_out),
    }
    if wiring is not None:
        payload["wiring"] = wiring
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _candidate(registry: Registry, impl: Implementation, node: Node) -> Candidate | str:
    reason = candidate_reason(registry, impl, node)
    if reason is not None:
        return reason
    lin, lout = impl.input_layouts(node), impl.output_layouts(node)
    names = tuple(n.name for n in node.nodes) if isinstance(node, FusedNode) else (node.name,)
    return Candidate(impl, node, names, lin, lout, signature(impl, node, lin, lout))


def enumerate_candidates(
    graph: Graph, registry: Registry, backends: Sequence[str] | None = None
) -> CandidateSet:
    """Every candidate for every node of ``graph`` over ``backends`` (default: every
    available backend), single-node and fused."""
    allowed = [b for b in (backends or registry.available_backends()) if b in registry.available_backends()]
    out = CandidateSet()
    for node in graph.nodes:
        rejected = out.rejected.setdefault(node.name, [])
        if not registry.has_op(node.key_op):
            continue
        for impl in registry.impls_for(node.key_op, allowed):
            got = _candidate(registry, impl, node)
            if isinstance(got, str):
                rejected.append(Rejected(impl.name, impl.backend, f"unsupported: {got}"))
            else:
                out.candidates.append(got)
    consumers = graph.consumers()
    outputs = {v.name for v in graph.outputs}
    patterns = registry.patterns(allowed)
    for node in graph.nodes:
        for impl in patterns:
            chain = match_chain(node, impl.pattern, consumers, outputs)
            if chain is None:
                continue
            fused = fuse(chain)
            got = _candidate(registry, impl, fused)
            if isinstance(got, str):
                out.rejected[node.name].append(Rejected(impl.name, impl.backend, f"unsupported: {got}"))
            else:
                out.candidates.append(got)
    for found in region_proposals(graph, registry, allowed).values():
        for impl, names in found:
            got = _candidate(registry, impl, region_node(graph, names))
            if isinstance(got, str):
                out.rejected[names[0]].append(
                    Rejected(impl.name, impl.backend, f"unsupported region of {len(names)} node(s): {got}"))
            else:
                out.candidates.append(got)
    return out
