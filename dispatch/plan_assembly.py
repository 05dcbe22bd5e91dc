"""Assembling plan steps into a plan: which candidates fit a node, step order, converters.

Shared by the untuned planner (:mod:`dispatch.heuristic`) and the tuner: :func:`candidate_reason`
says whether an implementation can run a node in the layouts it declares, :func:`order_steps`
orders the chosen steps so that every producer runs before its consumers (fused steps
included), and :func:`plan_conversions` inserts one converter per tensor and target layout,
shared by every consumer that wants that layout.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from dispatch.errors import PlanError, known
from dispatch.fusion import step_node
from dispatch.graph import Graph, Node
from dispatch.plan import Conversion, PlanStep
from dispatch.registry import STANDARD, Implementation, Registry


def layout_reason(registry: Registry, impl: Implementation, node: Node) -> str | None:
    """``None`` when every tensor of ``node`` can be held in the layouts ``impl`` declares."""
    for values, layouts in (
        (node.inputs, impl.input_layouts(node)),
        (node.outputs, impl.output_layouts(node)),
    ):
        for v, lay in zip(values, layouts):
            if v is None or lay == STANDARD:
                continue
            if lay not in registry.layouts.layouts:
                return f"layout {lay!r} is not registered (known: {known(registry.layouts.layouts)})"
            if v.shape is None:
                return f"{v.name} has no static shape"
            layout = registry.layouts.layout(lay)
            reason = layout.applies(v.shape, v.dtype)
            if reason:
                return f"{v.name}: {reason}"
            if layout.precision is not None and impl.precision == "float32":
                # precision is lost only where accuracy tuning measured it
                return (f"{v.name}: {impl.name} computes in float32 but declares layout {lay!r}, "
                        f"which holds {layout.precision}; only a reduced-precision "
                        f"implementation may read or write it")
    return None


def candidate_reason(registry: Registry, impl: Implementation, node: Node) -> str | None:
    """``None`` when ``impl`` can run ``node`` (supports() and layouts), else why not.
    A node with dynamic values (shapes the data decides: :mod:`dispatch.subgraph`) runs only
    on implementations that size their outputs when they run
    (:attr:`Implementation.dynamic_shapes`)."""
    if not impl.dynamic_shapes:
        dyn = next((v for v in [*node.inputs, *node.outputs]
                    if v is not None and v.shape is None), None)
        if dyn is not None:
            return (f"{dyn.name!r} has a shape known only at run time, and {impl.name} "
                    f"needs static shapes")
    return impl.supports(node) or layout_reason(registry, impl, node)


def order_steps(graph: Graph, steps: Sequence[PlanStep]) -> list[PlanStep]:
    """Steps in an execution order: a topological order of the steps (a step runs once every
    value its nodes read from other steps exists), ties going to the step whose first node
    comes first in the graph. A fused step's later nodes may read values produced after its
    first node (the residual input of Conv+Add), and a region's outputs may be read by nodes
    placed between its nodes in the graph's order, so positions alone are not enough."""
    index = {n.name: k for k, n in enumerate(graph.nodes)}
    by_name = {n.name: n for n in graph.nodes}
    owner: dict[str, int] = {}
    for k, step in enumerate(steps):
        for name in step.nodes:
            for v in by_name[name].outputs:
                owner[v.name] = k
    deps: list[set[int]] = []
    for k, step in enumerate(steps):
        d = {owner[v.name] for name in step.nodes for v in by_name[name].inputs
             if v is not None and v.name in owner}
        d.discard(k)
        deps.append(d)
    users: dict[int, list[int]] = {}
    for k, d in enumerate(deps):
        for j in d:
            users.setdefault(j, []).append(k)
    waiting = [len(d) for d in deps]
    ready = [(min(index[n] for n in s.nodes), k) for k, s in enumerate(steps) if not deps[k]]
    heapq.heapify(ready)
    out: list[PlanStep] = []
    while ready:
        _, k = heapq.heappop(ready)
        out.append(steps[k])
        for u in users.get(k, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (min(index[n] for n in steps[u].nodes), u))
    if len(out) != len(steps):
        stuck = [" + ".join(s.nodes) for k, s in enumerate(steps) if waiting[k] > 0]
        raise PlanError(f"the plan's steps depend on each other in a cycle (a non-convex fused "
                        f"step or region?): {stuck[:5]}")
    return out


def plan_conversions(graph: Graph, registry: Registry, steps: Sequence[PlanStep]) -> list[Conversion]:
    """One conversion per (tensor, target layout), shared by every consumer wanting it;
    graph outputs are always delivered in the standard layout."""
    produced: dict[str, str] = {v.name: STANDARD for v in graph.inputs}
    for v in graph.values.values():
        if v.is_const:
            produced[v.name] = STANDARD
    wanted: dict[tuple[str, str], list[str]] = {}
    for step in steps:
        node = step_node(graph, step.nodes, step.op)
        for v, lay in zip(node.inputs, step.layouts_in):
            if v is None:
                continue
            src = produced.get(v.name, STANDARD)
            if src != lay:
                wanted.setdefault((v.name, lay), []).append("+".join(step.nodes))
        for v, lay in zip(node.outputs, step.layouts_out):
            produced[v.name] = lay
    for v in graph.outputs:
        if produced.get(v.name, STANDARD) != STANDARD:
            wanted.setdefault((v.name, STANDARD), []).append("<graph output>")
    conversions = []
    for (name, dst), consumers in wanted.items():
        v = graph.value(name)
        src = produced.get(name, STANDARD)
        assert v.shape is not None and v.dtype is not None
        cost, chain = registry.layouts.path_and_cost(src, dst, v.shape, v.dtype)
        conversions.append(
            Conversion(
                value=name,
                src=src,
                dst=dst,
                chain=[c.name for c in chain],
                consumers=consumers,
                cost_bytes=cost,
                at_build=v.is_const,
            )
        )
    return conversions
