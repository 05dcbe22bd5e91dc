"""Plans: which implementation runs each node, in which layouts, with which converters.

A :class:`Plan` is pure data (JSON, never pickle). Each :class:`PlanStep` covers one node (or,
for fused implementations, a connected set of nodes) and names one implementation with its
concrete layouts. Each :class:`Conversion` changes one tensor to one target layout, once,
shared by every consumer that wants that layout.

:func:`heuristic_plan` builds the untuned plan: per node, the first backend in the configured
order that has a supporting implementation wins; within that backend the candidate needing the
cheapest input conversions wins, then the higher priority. A subgraph backend (a region
implementation, e.g. onnxruntime) earlier in the order than the per-node winner takes the
largest region it proposes that starts at the node. Every candidate that lost is recorded with
its reason.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from dispatch.errors import PlanError, UnsupportedOpError, known
from dispatch.fusion import REGION_OP, FusedNode, fuse, match_chain, region_node, step_node
from dispatch.graph import Graph, Node
from dispatch.registry import STANDARD, Implementation, Registry

if TYPE_CHECKING:
    import pandas as pd

PLAN_FORMAT_VERSION = 1


@dataclass
class Rejected:
    """A candidate that did not win, and why."""

    impl: str
    backend: str
    reason: str


@dataclass
class PlanStep:
    """One implementation bound to one node (or a fused set of nodes)."""

    nodes: list[str]
    op: str
    impl: str
    backend: str
    layouts_in: list[str]
    layouts_out: list[str]
    why: str = ""
    rejected: list[Rejected] = field(default_factory=list)
    cost_ms: float | None = None


@dataclass
class Conversion:
    """Convert tensor ``value`` from layout ``src`` to ``dst`` through ``chain`` (converter
    names), once for all of ``consumers``. ``at_build`` conversions apply to constants and run
    once when the executor is built, never per inference."""

    value: str
    src: str
    dst: str
    chain: list[str]
    consumers: list[str]
    cost_bytes: float = 0.0
    at_build: bool = False


@dataclass
class Plan:
    """A complete assignment for a graph."""

    graph: str
    steps: list[PlanStep]
    conversions: list[Conversion]
    provenance: dict[str, Any] = field(default_factory=dict)
    version: int = PLAN_FORMAT_VERSION

    # -- lookup ------------------------------------------------------------------------
    def step_for(self, node: str) -> PlanStep:
        for s in self.steps:
            if node in s.nodes:
                return s
        raise PlanError(
            f"the plan assigns no implementation to node {node!r}; planned nodes: "
            f"{known(n for s in self.steps for n in s.nodes)}"
        )

    def backends_used(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for s in self.steps:
            counts[s.backend] = counts.get(s.backend, 0) + len(s.nodes)
        return counts

    def report(self, graph: Graph | None = None, *, store: Any = None,
               registry: Registry | None = None) -> pd.DataFrame:
        """A pandas DataFrame, one row per node in execution order (name, op, shapes,
        implementation, backend, layouts, measured median and spread, share of the total,
        runner-up and its time, every rejected candidate with its reason) and one per
        converter. Pass the ``graph`` (shapes, candidates) and the plan ``store`` (a path or
        ``tuner.store.PlanStore``: the measurements) for the full report; the summary, the
        renderings and the rest are in :func:`tuner.report.build_report`."""
        from tuner.report import report  # lazily: pandas and the tuner stay off the core path

        return report(self, graph, store=store, registry=registry)

    # -- serialisation -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """A plan from its JSON data; anything but the plan's own structure of plain JSON
        values (unknown or missing fields, wrong types) raises :class:`PlanError`."""
        if not isinstance(data, Mapping):
            raise PlanError(f"a plan must be a JSON object, received {type(data).__name__}")
        try:
            version = int(data.get("version", -1))
            if version != PLAN_FORMAT_VERSION:
                raise PlanError(
                    f"plan format version {version} is not supported; expected {PLAN_FORMAT_VERSION}"
                )
            _data_fields(data, cls, "plan")
            if not isinstance(data["graph"], str):
                raise PlanError(f"plan: graph must be a string, received {type(data['graph']).__name__}")
            provenance = data.get("provenance", {})
            if not isinstance(provenance, dict):
                raise PlanError(f"plan: provenance must be a JSON object, received {type(provenance).__name__}")
            steps = []
            for k, s in enumerate(_data_list(data["steps"], "plan: steps")):
                _data_fields(s, PlanStep, f"plan step {k}")
                rejected = [
                    Rejected(**_data_fields(r, Rejected, f"plan step {k}, rejected {j}"))
                    for j, r in enumerate(_data_list(s.get("rejected", []), f"plan step {k}: rejected"))
                ]
                steps.append(PlanStep(**{**s, "rejected": rejected}))
            convs = [
                Conversion(**_data_fields(c, Conversion, f"plan conversion {k}"))
                for k, c in enumerate(_data_list(data["conversions"], "plan: conversions"))
            ]
            return cls(data["graph"], steps, convs, dict(provenance), version)
        except PlanError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"malformed plan: {type(exc).__name__}: {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError(f"a plan must be JSON: {exc}") from None
        if not isinstance(data, dict):
            raise PlanError(f"a plan must be a JSON object, received {type(data).__name__}")
        return cls.from_dict(data)

    def describe(self) -> str:
        """A compact text table: node, op, implementation, backend, layouts."""
        rows = [("node", "op", "implementation", "backend", "layouts in -> out")]
        for s in self.steps:
            rows.append(
                (
                    step_label(s.nodes),
                    s.op,
                    s.impl,
                    s.backend,
                    f"{','.join(s.layouts_in) or '-'} -> {','.join(s.layouts_out)}",
                )
            )
        for c in self.conversions:
            rows.append(
                (
                    f"[convert {c.value}]",
                    "Converter",
                    " > ".join(c.chain),
                    "build time" if c.at_build else "run time",
                    f"{c.src} -> {c.dst}",
                )
            )
        widths = [min(48, max(len(r[k]) for r in rows)) for k in range(5)]
        return "\n".join(
            "  ".join(col[: widths[k]].ljust(widths[k]) for k, col in enumerate(r)).rstrip()
            for r in rows
        )


#: JSON types allowed per field of the plan's dataclasses (anything else is rejected)
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "nodes": (list,), "op": (str,), "impl": (str,), "backend": (str,), "layouts_in": (list,),
    "layouts_out": (list,), "why": (str,), "rejected": (list,), "cost_ms": (int, float, type(None)),
    "value": (str,), "src": (str,), "dst": (str,), "chain": (list,), "consumers": (list,),
    "cost_bytes": (int, float), "at_build": (bool,), "reason": (str,), "graph": (str,),
    "steps": (list,), "conversions": (list,), "provenance": (dict,), "version": (int,),
}
#: list fields whose items must be strings
_STRING_LISTS = {"nodes", "layouts_in", "layouts_out", "chain", "consumers"}


def _data_list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise PlanError(f"{where} must be a JSON list, received {type(value).__name__}")
    return value


def _data_fields(data: Any, kind: type, where: str) -> Any:
    """Check that ``data`` is a JSON object holding exactly the fields of dataclass ``kind``
    (the optional ones may be absent) with plain JSON values of the expected types."""
    from dataclasses import MISSING, fields

    if not isinstance(data, dict):
        raise PlanError(f"{where} must be a JSON object, received {type(data).__name__}")
    names = {f.name for f in fields(kind)}
    required = {f.name for f in fields(kind) if f.default is MISSING and f.default_factory is MISSING}
    unknown = sorted(set(data) - names)
    missing = sorted(required - set(data))
    if unknown or missing:
        raise PlanError(
            f"{where}: unknown field(s) {unknown}, missing field(s) {missing}; expected the "
            f"fields {sorted(names)}"
        )
    for key, value in data.items():
        allowed = _FIELD_TYPES.get(key)
        if allowed is None:
            continue
        bad = not isinstance(value, allowed) or (bool not in allowed and isinstance(value, bool))
        if not bad and key in _STRING_LISTS:
            bad = not all(isinstance(x, str) for x in value)
        if bad:
            want = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
            what = "a list of strings" if key in _STRING_LISTS else want
            raise PlanError(f"{where}: field {key!r} must be {what}, received {value!r:.80}")
    return data


def step_label(nodes: Sequence[str]) -> str:
    """How a step's nodes are shown: ``a+b+c`` for a few, ``a..z (N nodes)`` for a region."""
    if len(nodes) <= 3:
        return "+".join(nodes)
    return f"{nodes[0]}..{nodes[-1]} ({len(nodes)} nodes)"


# ------------------------------------------------------------------------------------------
# candidate checks
# ------------------------------------------------------------------------------------------


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
            reason = registry.layouts.layout(lay).applies(v.shape, v.dtype)
            if reason:
                return f"{v.name}: {reason}"
    return None


def candidate_reason(registry: Registry, impl: Implementation, node: Node) -> str | None:
    """``None`` when ``impl`` can run ``node`` (supports() and layouts), else why not."""
    return impl.supports(node) or layout_reason(registry, impl, node)


# ------------------------------------------------------------------------------------------
# heuristic planner
# ------------------------------------------------------------------------------------------


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
            region = _choose_region(graph, node, step, order, covered, proposals)
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
    region implementations of the backends in ``order`` propose for ``graph``, largest first.
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
        found.sort(key=lambda t: -len(t[1]))
    return out


def _choose_region(
    graph: Graph,
    node: Node,
    single: PlanStep | None,
    order: Sequence[str],
    covered: set[str],
    proposals: Mapping[str, list[tuple[Implementation, list[str]]]],
) -> PlanStep | None:
    """The largest supported region starting at ``node`` (no node of it covered yet) of a
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
            lost = [] if single is None else [Rejected(single.impl, single.backend, f"lost: region of backend {backend!r} comes first in the order")]
            return PlanStep(
                nodes=list(names), op=REGION_OP, impl=impl.name, backend=impl.backend,
                layouts_in=[STANDARD] * len(rnode.inputs), layouts_out=[STANDARD] * len(rnode.outputs),
                why=f"largest region ({len(names)} node(s)) of backend {backend!r}, first in order {list(order)}",
                rejected=lost,
            )
    return None


def check_supported_ops(graph: Graph, registry: Registry, order: Sequence[str]) -> None:
    """Raise one error listing every operator of ``graph`` that no allowed backend implements
    (per node, or in a region that a subgraph backend proposes)."""
    missing: dict[str, list[str]] = {}
    in_regions = {n for found in region_proposals(graph, registry, order).values() for _, names in found for n in names}
    for node in graph.nodes:
        ok = node.name in in_regions or (registry.has_op(node.key_op) and any(
            i.backend in order for i in registry.impls_for(node.key_op)
        ))
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
                    Rejected(impl.name, impl.backend, f"not tried: backend {backend!r} comes first in the order")
                )
        for b, why in skipped_backends.items():
            for impl in _impls_of_backend(registry, node.key_op, b):
                rejected.append(Rejected(impl.name, impl.backend, f"backend unavailable: {why}"))
        conv_note = f", {cost:,.0f} bytes of input conversion" if cost else ""
        why = f"first backend in order {list(order)} with a supporting implementation; priority {best.priority}{conv_note}"
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
        step = _pattern_of_backend(registry, node, single, backend, produced, consumers, graph_outputs, pinned)
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
    others.append(Rejected(single.impl, single.backend, f"lost: fused {impl.name} covers {len(fused.nodes)} nodes"))
    step = _step(fused, impl, f"fused pattern {'+'.join(impl.pattern)} of backend {impl.backend!r}", others)
    step.nodes = [n.name for n in fused.nodes]
    return step


def _impls_of_backend(registry: Registry, op: str, backend: str) -> list[Implementation]:
    return [i for i in registry.implementations if i.op == op and i.backend == backend]


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
