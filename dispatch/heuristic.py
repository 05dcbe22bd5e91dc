"""The untuned (heuristic) plan: the plan a Session runs before the model is tuned.

:func:`heuristic_plan` follows the configured backend order: per node, the first backend in the
order that has a supporting implementation wins; within that backend the candidate needing the
cheapest input conversions wins, then the higher priority. A subgraph backend (a region
implementation, e.g. onnxruntime) earlier in the order than the per-node winner takes the
largest region it proposes that starts at the node. Every candidate that lost is recorded with
its reason. :func:`check_supported_ops` refuses, at load, a model with an operator that none of
the allowed backends implements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dispatch.errors import PlanError, UnsupportedOpError, known
from dispatch.fusion import REGION_OP, FusedNode, fuse, match_chain, region_node, step_node
from dispatch.graph import Graph, Node
from dispatch.plan import Plan, PlanStep, Rejected
from dispatch.plan_assembly import candidate_reason, order_steps, plan_conversions
from dispatch.registry import STANDARD, Implementation, Registry


def heuristic_plan(
    graph: Graph,
    registry: Registry,
    backend_order: Sequence[str],
    *,
    overrides: Mapping[str, str] | None = None,
) -> Plan:
    """The untuned plan for ``graph`` over ``backend_order`` (see the module docstring).

    ``overrides`` maps node names to implementation names that must be used (tests and the
    tuner use it); an override that does not support its node raises :class:`PlanError`.
    """
    overrides = dict(overrides or {})
    unknown_nodes = set(overrides) - {n.name for n in graph.nodes}
    if unknown_nodes:
        raise PlanError(
            f"overrides name nodes not in the graph: {sorted(unknown_nodes)}; known nodes: "
            f"{known(n.name for n in graph.nodes)}"
        )
    available = set(registry.available_backends())
    order = [b for b in backend_order if b in available]
    skipped_backends = {
        b: (registry.backends[b].reason or "unavailable") if b in registry.backends else "not installed"
        for b in backend_order
        if b not in available
    }
    check_supported_ops(graph, registry, order)
    proposals = region_proposals(graph, registry, order)

    produced: dict[str, str] = {v.name: STANDARD for v in graph.inputs}
    steps: list[PlanStep] = []
    unsupported: list[str] = []
    covered: set[str] = set()
    consumers = graph.consumers()
    graph_outputs = {v.name for v in graph.outputs}
    for node in graph.nodes:
        if node.name in covered:
            continue
        if node.name in overrides:
            step = _forced_step(registry, node, overrides[node.name])
        else:
            step = _choose(registry, node, order, produced, skipped_backends)
            # a region never swallows a node whose implementation was forced
            region = _choose_region(graph, node, step, order, set(overrides) | covered, proposals)
            if region is not None:
                step = region
            elif step is not None:
                fused = _choose_pattern(
                    registry, node, step, order, produced, consumers, graph_outputs,
                    set(overrides) | covered,
                )
                step = fused or step
        if step is None:
            impls = registry.impls_for(node.key_op, order)
            reasons = "; ".join(f"{i.name}: {candidate_reason(registry, i, node)}" for i in impls)
            unsupported.append(f"{node.name} ({node.op_type}): {reasons or 'no implementation'}")
            continue
        steps.append(step)
        covered.update(step.nodes)
        outs = step_node(graph, step.nodes, step.op).outputs
        for v, lay in zip(outs, step.layouts_out):
            produced[v.name] = lay
    if unsupported:
        raise UnsupportedOpError(
            f"{len(unsupported)} node(s) have no implementation that supports them in backends "
            f"{order}:\n  " + "\n  ".join(unsupported)
        )
    steps = order_steps(graph, steps)
    conversions = plan_conversions(graph, registry, steps)
    return Plan(
        graph=graph.name,
        steps=steps,
        conversions=conversions,
        provenance={
            "source": "heuristic",
            "backend_order": list(order),
            "skipped_backends": skipped_backends,
            "overrides": overrides,
        },
    )


def region_proposals(
    graph: Graph, registry: Registry, order: Sequence[str]
) -> dict[str, list[tuple[Implementation, list[str]]]]:
    """backend -> (region implementation, node names in graph order) for every region the
    region implementations of the backends in ``order`` propose for ``graph``, largest first
    (of two implementations proposing the same region, the higher priority first: a settings
    variant registered at a lower priority is the tuner's to choose, never the untuned plan's).
    A proposer that raises proposes nothing (its backend stays usable per node)."""
    index = {n.name: k for k, n in enumerate(graph.nodes)}
    out: dict[str, list[tuple[Implementation, list[str]]]] = {}
    for impl in registry.regions(order):
        try:
            sets = impl.propose(graph) if impl.propose is not None else []
        except Exception:
            sets = []
        found = out.setdefault(impl.backend, [])
        for names in sets:
            if names and all(n in index for n in names):
                found.append((impl, sorted(set(names), key=index.__getitem__)))
        found.sort(key=lambda t: (-len(t[1]), -t[0].priority))  # larger, then the default variant
    return out


def _choose_region(
    graph: Graph,
    node: Node,
    single: PlanStep | None,
    order: Sequence[str],
    covered: set[str],
    proposals: Mapping[str, list[tuple[Implementation, list[str]]]],
) -> PlanStep | None:
    """The largest supported region starting at ``node`` (no node of it in ``covered``) of a
    backend before the single-node winner's backend in ``order`` (any backend when no
    single-node implementation supports the node)."""
    last = order.index(single.backend) if single is not None and single.backend in order else len(order) - 1
    for backend in order[: last + 1]:
        for impl, names in proposals.get(backend, ()):
            if names[0] != node.name or covered.intersection(names):
                continue
            rnode = region_node(graph, names)
            if impl.supports(rnode) is not None:
                continue
            lost = [] if single is None else [
                Rejected(single.impl, single.backend,
                         f"lost: region of backend {backend!r} comes first in the order")]
            return PlanStep(
                nodes=list(names), op=REGION_OP, impl=impl.name, backend=impl.backend,
                layouts_in=[STANDARD] * len(rnode.inputs), layouts_out=[STANDARD] * len(rnode.outputs),
                why=f"largest region ({len(names)} node(s)) of backend {backend!r}, "
                    f"first in order {list(order)}",
                rejected=lost,
            )
    return None


def check_supported_ops(graph: Graph, registry: Registry, order: Sequence[str]) -> None:
    """Raise one error listing every operator of ``graph`` that no allowed backend implements
    (per node, or in a region that a subgraph backend proposes)."""
    missing: dict[str, list[str]] = {}
    in_regions: set[str] = set()
    singles: dict[str, list[Implementation]] = {}
    allowed = set(order)
    if all(registry.op_backends(n.key_op) & allowed for n in graph.nodes):
        return  # every node has a kernel: the regions (~60 ms on a 240-node graph) can only add
    for found in region_proposals(graph, registry, order).values():
        for impl, names in found:
            if len(names) > 1:
                in_regions.update(names)
            else:  # a backend may propose a node alone only to say why it refuses it
                singles.setdefault(names[0], []).append(impl)
    for name, impls in singles.items():
        if name not in in_regions and any(
                i.supports(region_node(graph, [name])) is None for i in impls):
            in_regions.add(name)
    for node in graph.nodes:
        ok = node.name in in_regions or bool(registry.op_backends(node.key_op) & allowed)
        if not ok:
            missing.setdefault(node.key_op, []).append(node.name)
    if missing:
        lines = [
            f"{op} (nodes: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
            for op, names in sorted(missing.items())
        ]
        backends = ", ".join(
            f"{n} ({'available' if s.available else 'unavailable: ' + str(s.reason)})"
            for n, s in registry.backends.items()
        )
        raise UnsupportedOpError(
            f"the model uses {len(missing)} operator(s) that no allowed backend implements: "
            f"{'; '.join(lines)}. Allowed backends: {list(order)}; backends found: {backends}"
        )


def _forced_step(registry: Registry, node: Node, impl_name: str) -> PlanStep:
    impl = registry.impl(impl_name)
    if impl.op != node.key_op:
        raise PlanError(
            f"override for node {node.name!r} ({node.key_op}) names {impl_name!r}, an "
            f"implementation of {impl.op!r}"
        )
    reason = candidate_reason(registry, impl, node)
    if reason:
        raise PlanError(f"override {impl_name!r} cannot run node {node.name!r}: {reason}")
    return _step(node, impl, why="forced by override")


def _step(node: Node, impl: Implementation, why: str, rejected: list[Rejected] | None = None) -> PlanStep:
    return PlanStep(
        nodes=[node.name],
        op=node.key_op,
        impl=impl.name,
        backend=impl.backend,
        layouts_in=list(impl.input_layouts(node)),
        layouts_out=list(impl.output_layouts(node)),
        why=why,
        rejected=rejected or [],
    )


def _conversion_bytes(
    registry: Registry, node: Node, impl: Implementation, produced: Mapping[str, str]
) -> float:
    total = 0.0
    for v, want in zip(node.inputs, impl.input_layouts(node)):
        if v is None or v.is_const:
            continue
        have = produced.get(v.name, STANDARD)
        if have != want:
            assert v.shape is not None and v.dtype is not None
            total += registry.layouts.path_and_cost(have, want, v.shape, v.dtype)[0]
    return total


def _choose(
    registry: Registry,
    node: Node,
    order: Sequence[str],
    produced: Mapping[str, str],
    skipped_backends: Mapping[str, str],
) -> PlanStep | None:
    rejected: list[Rejected] = []
    for backend in order:
        impls = [i for i in registry.impls_for(node.key_op, [backend])]
        ok: list[tuple[float, int, Implementation]] = []
        for impl in impls:
            reason = candidate_reason(registry, impl, node)
            if reason is not None:
                rejected.append(Rejected(impl.name, impl.backend, f"unsupported: {reason}"))
                continue
            try:
                cost = _conversion_bytes(registry, node, impl, produced)
            except Exception as exc:  # no conversion path for these layouts
                rejected.append(Rejected(impl.name, impl.backend, f"unsupported: {exc}"))
                continue
            ok.append((cost, -impl.priority, impl))
        if not ok:
            continue
        ok.sort(key=lambda t: (t[0], t[1]))
        cost, _, best = ok[0]
        for c, _, other in ok[1:]:
            if c > cost:
                why = f"needs {c - cost:,.0f} more bytes of layout conversion"
            else:
                why = f"lower priority ({other.priority} < {best.priority})"
            rejected.append(Rejected(other.name, other.backend, f"lost: {why}"))
        # the candidates of later backends are never considered by the heuristic
        for later in order[order.index(backend) + 1 :]:
            for impl in registry.impls_for(node.key_op, [later]):
                rejected.append(
                    Rejected(impl.name, impl.backend,
                             f"not tried: backend {backend!r} comes first in the order")
                )
        for b, why in skipped_backends.items():
            for impl in _impls_of_backend(registry, node.key_op, b):
                rejected.append(Rejected(impl.name, impl.backend, f"backend unavailable: {why}"))
        conv_note = f", {cost:,.0f} bytes of input conversion" if cost else ""
        why = (f"first backend in order {list(order)} with a supporting implementation; "
               f"priority {best.priority}{conv_note}")
        return _step(node, best, why, rejected)
    return None


def _choose_pattern(
    registry: Registry,
    node: Node,
    single: PlanStep,
    order: Sequence[str],
    produced: Mapping[str, str],
    consumers: Mapping[str, list[Node]],
    graph_outputs: set[str],
    pinned: set[str],
) -> PlanStep | None:
    """A fused step starting at ``node`` from the first backend in ``order`` (up to the one
    the single-node choice came from) with a supporting pattern: the longest, then the least
    conversion, then the highest priority."""
    for backend in order[: order.index(single.backend) + 1]:
        step = _pattern_of_backend(registry, node, single, backend, produced, consumers,
                                   graph_outputs, pinned)
        if step is not None:
            return step
    return None


def _pattern_of_backend(
    registry: Registry,
    node: Node,
    single: PlanStep,
    backend: str,
    produced: Mapping[str, str],
    consumers: Mapping[str, list[Node]],
    graph_outputs: set[str],
    pinned: set[str],
) -> PlanStep | None:
    best: tuple[tuple, Implementation, FusedNode] | None = None
    rejected: list[Rejected] = []
    for impl in registry.patterns([backend]):
        if impl.pattern[0] != node.key_op:
            continue
        chain = match_chain(node, impl.pattern, consumers, graph_outputs)
        if chain is None or any(n.name in pinned for n in chain):
            continue
        fused = fuse(chain)
        reason = candidate_reason(registry, impl, fused)
        if reason is not None:
            rejected.append(Rejected(impl.name, impl.backend, f"unsupported: {reason}"))
            continue
        try:
            cost = _conversion_bytes(registry, fused, impl, produced)
        except Exception as exc:
            rejected.append(Rejected(impl.name, impl.backend, f"unsupported: {exc}"))
            continue
        key = (-len(chain), cost, -impl.priority)
        if best is None or key < best[0]:
            best = (key, impl, fused)
    if best is None:
        return None
    _, impl, fused = best
    others = [r for r in single.rejected] + rejected
    others.append(Rejected(single.impl, single.backend,
                           f"lost: fused {impl.name} covers {len(fused.nodes)} nodes"))
    step = _step(fused, impl, f"fused pattern {'+'.join(impl.pattern)} of backend {impl.backend!r}", others)
    step.nodes = [n.name for n in fused.nodes]
    return step


def _impls_of_backend(registry: Registry, op: str, backend: str) -> list[Implementation]:
    return [i for i in registry.implementations if i.op == op and i.backend == backend]
