"""Plan integrity: a plan is checked against the current registry and graph before it runs.

A plan may come from the plan store, a bundle, or a caller (``Session(model, plan=...)``); it
is data that may have been edited, truncated or written by another version. Before any
executor is built, :func:`validate_plan` checks that

* the plan names this graph, and every graph node is covered by exactly one step (no node
  missing, none unknown, none twice);
* every step's implementation exists in the registry, belongs to the backend the step names,
  and matches the step's nodes: a single node's op, a fused implementation's pattern (the
  nodes must form that chain), a region implementation only on ``"Region"`` steps and only
  there;
* every step's implementation still supports its nodes as the graph has them (a plan
  edited to another model's shapes, or a graph whose shapes changed, is refused with the
  implementation's own reason);
* every step's layouts equal what the implementation declares for those nodes
  (``impl.input_layouts(node)`` / ``impl.output_layouts(node)``);
* every conversion names an existing value and registered layouts, and its chain names
  existing converters that lead from its ``src`` to its ``dst``;
* every backend the plan's steps and converters use is available in this process (an
  uninstalled plugin, a missing library: the error says which and why), at the version the
  plan was tuned with when its provenance records one;
* a non-finite guard's fallback plan (``nonfinite_fallback``, run on NaN/Inf inputs) has no
  fallback of its own and passes :func:`check_outline` (coverage, names, backends) with the
  plan; the rest of the above when its executor is built, on the first NaN/Inf request (its
  backends are registered only then).

The first problem found raises :class:`~dispatch.errors.PlanError` naming the step (or
conversion) and what was expected; a rejected plan is never executed.
"""

from __future__ import annotations

from collections import Counter

from dispatch.errors import OpDispatchError, PlanError, known
from dispatch.fusion import REGION_OP, step_node
from dispatch.graph import Graph, Node
from dispatch.plan import Conversion, Plan, PlanStep, step_label
from dispatch.registry import Implementation, Registry
from layouts.registry import CORE


def validate_plan(plan: Plan, graph: Graph, registry: Registry) -> None:
    """Raise :class:`PlanError` unless ``plan`` can run ``graph`` with ``registry`` (see the
    module docstring for every check)."""
    if not isinstance(plan, Plan):
        raise PlanError(f"expected a dispatch.plan.Plan, received {type(plan).__name__}")
    if plan.graph != graph.name:
        raise PlanError(f"the plan is for graph {plan.graph!r}; expected graph {graph.name!r}")
    _check_shape_and_backends(plan, graph, registry)
    for k, step in enumerate(plan.steps):
        _check_step(k, step, graph, registry)
    for k, conv in enumerate(plan.conversions):
        _check_conversion(k, conv, graph, registry)
    fallback = getattr(plan, "nonfinite_fallback", None)
    if fallback is not None:
        if not isinstance(fallback, Plan):
            raise PlanError(f"nonfinite_fallback: expected a dispatch.plan.Plan or None, "
                            f"received {type(fallback).__name__}")
        if fallback.nonfinite_fallback is not None:
            raise PlanError("nonfinite_fallback: a fallback plan cannot have a fallback of its own")
        try:
            check_outline(fallback, graph, registry)
        except PlanError as exc:
            raise PlanError(f"{FALLBACK_WHERE}: {exc}") from None


#: how errors name a guarded plan's fallback
FALLBACK_WHERE = "nonfinite_fallback (the plan run on NaN/Inf inputs)"


def check_outline(plan: Plan, graph: Graph, registry: Registry) -> None:
    """The checks of :func:`validate_plan` that register no backend: the plan covers
    ``graph`` exactly once, every implementation and converter it names exists (registered
    or deferred, :mod:`dispatch.backend_manifest`) on the backend the step names, and every
    backend it uses is available at the version it was tuned with.

    A guarded plan's fallback is checked this far when the plan is (at start-up, so that a
    stored plan whose fallback names something gone is refused then); the rest of
    :func:`validate_plan` runs when the fallback's executor is built, on the first NaN/Inf
    request, so that a process never registers the backends of a fallback it does not run.
    """
    _check_shape_and_backends(plan, graph, registry)
    for k, step in enumerate(plan.steps):
        backend = registry.backend_of("impl", step.impl)
        if backend is None:
            raise PlanError(f"{_where(k, step)}: unknown implementation {step.impl!r}; expected "
                            f"one registered for backend {step.backend!r}")
        if backend != step.backend:
            raise PlanError(f"{_where(k, step)}: the step names backend {step.backend!r}, but "
                            f"{step.impl} belongs to backend {backend!r}")
    for k, conv in enumerate(plan.conversions):
        if not isinstance(conv, Conversion):
            raise PlanError(f"conversion {k}: expected a Conversion, received {type(conv).__name__}")
        for name in conv.chain if isinstance(conv.chain, list) else [conv.chain]:
            if not isinstance(name, str) or registry.backend_of("converter", name) is None:
                raise PlanError(f"conversion {k} ({conv.value!r} {conv.src}->{conv.dst}): "
                                f"unknown converter {name!r}")


def _check_shape_and_backends(plan: Plan, graph: Graph, registry: Registry) -> None:
    if not isinstance(plan.steps, list) or not isinstance(plan.conversions, list):
        raise PlanError(
            f"plan steps and conversions must be lists, received {type(plan.steps).__name__} "
            f"and {type(plan.conversions).__name__}"
        )
    _check_coverage(plan, graph)
    _check_backends(plan, registry)


def _where(k: int, step: PlanStep) -> str:
    return f"step {k} ({step_label(step.nodes)}, {step.impl})"


def _check_coverage(plan: Plan, graph: Graph) -> None:
    for k, step in enumerate(plan.steps):
        if not isinstance(step, PlanStep):
            raise PlanError(f"step {k}: expected a PlanStep, received {type(step).__name__}")
        if (not isinstance(step.nodes, list) or not step.nodes
                or not all(isinstance(n, str) for n in step.nodes)):
            raise PlanError(
                f"step {k}: nodes must be a non-empty list of node names, received {step.nodes!r}"
            )
        for name, value in (("op", step.op), ("impl", step.impl), ("backend", step.backend)):
            if not isinstance(value, str):
                raise PlanError(f"step {k}: {name} must be a string, received {type(value).__name__}")
        for name, value in (("layouts_in", step.layouts_in), ("layouts_out", step.layouts_out)):
            if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
                raise PlanError(
                    f"{_where(k, step)}: {name} must be a list of layout names, received {value!r}"
                )
    counts = Counter(n for s in plan.steps for n in s.nodes)
    names = {n.name for n in graph.nodes}
    missing = [n.name for n in graph.nodes if n.name not in counts]
    unknown = sorted(set(counts) - names)
    twice = sorted(n for n, c in counts.items() if c > 1 and n in names)
    problems = []
    if missing:
        problems.append(f"nodes without a step: {missing[:10]}")
    if unknown:
        problems.append(f"steps name nodes not in the graph: {unknown[:10]}")
    if twice:
        problems.append(f"nodes covered by more than one step: {twice[:10]}")
    if problems:
        raise PlanError(
            f"the plan does not cover graph {graph.name!r} exactly once ({'; '.join(problems)}); "
            f"expected every one of its {len(names)} node(s) in exactly one step"
        )


def backends_of(plan: Plan, registry: Registry) -> dict[str, int]:
    """backend -> how many steps and conversions of ``plan`` it runs (a conversion counts for
    the backend of each converter of its chain that the registry knows)."""
    used: Counter[str] = Counter(s.backend for s in plan.steps if isinstance(s.backend, str))
    for conv in plan.conversions:
        for name in conv.chain if isinstance(conv.chain, list) else ():
            backend = registry.backend_of("converter", name) if isinstance(name, str) else None
            if backend is not None and backend != CORE:  # (the core's are always there)
                used[backend] += 1
    return dict(used)


def _check_backends(plan: Plan, registry: Registry) -> None:
    """Every backend the plan uses is available in this process, at the version the plan was
    tuned with (when its provenance records one: tuned plans do; heuristic plans are made
    by the process that runs them)."""
    tuned_with = (plan.provenance.get("software") or {}).get("backends") or {}
    if not isinstance(tuned_with, dict):
        raise PlanError(
            f"plan provenance: software.backends must be an object of backend -> version, "
            f"received {type(tuned_with).__name__}"
        )
    for name, count in sorted(backends_of(plan, registry).items()):
        status = registry.backends.get(name)
        if status is None and name not in {i.backend for i in registry.implementations}:
            raise PlanError(
                f"the plan runs {count} step(s) or conversion(s) on backend {name!r}, which is "
                f"not installed here (no entry point, plugin folder module or registered "
                f"implementation provides it); available backends: "
                f"{known(registry.available_backends())}; re-tune the model or install {name!r}"
            )
        if status is not None and not status.available:
            raise PlanError(
                f"the plan runs {count} step(s) or conversion(s) on backend {name!r}, which is "
                f"not available here: {status.reason or 'unavailable'}; re-tune the model or "
                f"fix the backend"
            )
        want = tuned_with.get(name)
        if status is not None and want is not None and str(want) != status.version:
            raise PlanError(
                f"the plan was tuned with backend {name!r} version {want!r}; this process has "
                f"version {status.version!r}: its measurements no longer hold, re-tune the model"
            )


def _check_step(k: int, step: PlanStep, graph: Graph, registry: Registry) -> None:
    where = _where(k, step)
    try:
        impl = registry.impl(step.impl)
    except OpDispatchError:
        op = step.impl.split(".", 1)[0]
        mine = [i.name for i in registry.implementations if i.backend == step.backend]
        same_op = [n for n in mine if n.split(".", 1)[0] == op]
        raise PlanError(
            f"{where}: unknown implementation {step.impl!r}; expected one registered for backend "
            f"{step.backend!r}: "
            + (f"for {op}: {known(same_op)}" if same_op else known(mine, limit=20))
        ) from None
    if impl.backend != step.backend:
        raise PlanError(
            f"{where}: the step names backend {step.backend!r}, but {impl.name} belongs to "
            f"backend {impl.backend!r}"
        )
    if impl.is_region != (step.op == REGION_OP):
        raise PlanError(
            f"{where}: op {step.op!r} with {'a region' if impl.is_region else 'a non-region'} "
            f"implementation; expected op {REGION_OP!r} exactly for region implementations"
        )
    node = _node_of(where, step, graph, impl)
    if not impl.is_region:
        if impl.op != node.key_op or step.op != node.key_op:
            raise PlanError(
                f"{where}: the nodes are {node.key_op!r}, the step says op {step.op!r} and "
                f"{impl.name} implements {impl.op!r}; expected all three to agree"
            )
        if (len(step.nodes) > 1
                and impl.pattern != tuple(n.key_op for n in node.nodes)):  # type: ignore[attr-defined]
            raise PlanError(
                f"{where}: the nodes are not a chain of the pattern "
                f"{'+'.join(impl.pattern) or '(single node)'}"
            )
    refused = impl.supports(node)
    if refused is not None:
        raise PlanError(
            f"{where}: {impl.name} does not support these nodes as the graph has them "
            f"(shapes, dtypes, attributes): {refused}"
        )
    for name, have, want in (
        ("layouts_in", step.layouts_in, impl.input_layouts(node)),
        ("layouts_out", step.layouts_out, impl.output_layouts(node)),
    ):
        if tuple(have) != tuple(want):
            raise PlanError(
                f"{where}: {name} {list(have)}; {impl.name} declares {list(want)} for these nodes"
            )


def _node_of(where: str, step: PlanStep, graph: Graph, impl: Implementation) -> Node:
    try:
        return step_node(graph, step.nodes, step.op)
    except OpDispatchError as exc:
        raise PlanError(f"{where}: the nodes {step.nodes} cannot form one step: {exc}") from None


def _check_conversion(k: int, conv: Conversion, graph: Graph, registry: Registry) -> None:
    if not isinstance(conv, Conversion):
        raise PlanError(f"conversion {k}: expected a Conversion, received {type(conv).__name__}")
    where = f"conversion {k} ({conv.value!r} {conv.src}->{conv.dst})"
    if not isinstance(conv.value, str) or conv.value not in graph.values:
        raise PlanError(f"{where}: {conv.value!r} is not a value of graph {graph.name!r}")
    for lay in (conv.src, conv.dst):
        if not isinstance(lay, str) or not registry.layouts.has_layout(lay):
            raise PlanError(
                f"{where}: unknown layout {lay!r}; expected one of {known(registry.layouts.layouts)}"
            )
    if (not isinstance(conv.chain, list) or not conv.chain
            or not all(isinstance(c, str) for c in conv.chain)):
        raise PlanError(
            f"{where}: chain must be a non-empty list of converter names, received {conv.chain!r}"
        )
    at = conv.src
    for name in conv.chain:
        try:
            c = registry.layouts.converter(name)
        except OpDispatchError as exc:
            raise PlanError(f"{where}: {exc}") from None
        if c.src != at:
            raise PlanError(
                f"{where}: converter {name} goes {c.src}->{c.dst}; expected one from {at!r}"
            )
        at = c.dst
    if at != conv.dst:
        raise PlanError(f"{where}: the chain {conv.chain} ends in layout {at!r}; expected {conv.dst!r}")
