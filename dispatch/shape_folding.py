"""Evaluation at load time: what constant folding and shape filling run a node with, static
shapes for the values onnx's inference left unknown, and the error that names the chain of
nodes when a shape needs a value that cannot be known before the model runs.

Exporters compute shapes, pads, masks and indices from the static shapes of the graph
(``Shape -> Gather -> Cast -> Mod/Sub/Div -> Concat -> Pad/Reshape/Slice/Expand/Range``),
each spelling it its own way. With static input shapes every such value is a constant:
onnx's data propagation computes some of them on import, :func:`dispatch.passes.fold_constants`
the rest, node by node, with the reference backend's implementation — and, for an operator of
ONNX's own domain that the reference backend cannot evaluate, with onnx's own reference
implementation (:func:`onnx_reference_evaluate`), so that folding reaches through every
standard operator. What is left unknown then truly depends on the model's input data, and
:func:`fill_node` says which node needs it and through which chain of nodes.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np
from onnx import helper, numpy_helper

from dispatch.errors import OpDispatchError, ShapeInferenceError, UnsupportedOpError
from dispatch.graph import Graph, Node, Value
from dispatch.registry import STANDARD, Implementation, Registry
from dispatch.subgraph import DATA_DEPENDENT_OPS

#: how many nodes of a chain an error shows (the ends are kept)
CHAIN_SHOWN = 12


def evaluation_impl(registry: Registry, node: Node) -> Implementation:
    """The implementation folding and shape filling evaluate ``node`` with: its reference
    implementation (:meth:`Registry.reference_impl`), else — for an operator the reference
    backend lacks, such as a plugin's custom op — any standard-layout implementation that
    supports it. Raises :class:`UnsupportedOpError` saying why none can."""
    if not registry.has_op(node.key_op):
        raise UnsupportedOpError(
            f"node {node.name!r}: operator {node.key_op!r} has no implementation; known "
            f"operators: {', '.join(registry.ops)}"
        )
    found = registry.reference_impl(node)
    if found is not None:
        return found
    reasons = []
    for impl in registry.impls_for(node.key_op):  # the reference backend's say why they refuse
        if any(lay != STANDARD for lay in impl.input_layouts(node) + impl.output_layouts(node)):
            continue
        reason = impl.supports(node)
        if reason is None:
            return impl
        reasons.append(f"{impl.name}: {reason}")
    raise UnsupportedOpError(
        f"node {node.name!r} ({node.op_type}) is supported by no standard-layout implementation: "
        + "; ".join(reasons)
    )


def evaluate(registry: Registry, node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """Run ``node`` once on ``inputs`` with its reference implementation; an operator of
    ONNX's own domain that no implementation of ``registry`` evaluates runs on onnx's
    reference implementation instead (the :class:`UnsupportedOpError` is raised when that
    cannot run it either)."""
    try:
        impl = evaluation_impl(registry, node)
    except UnsupportedOpError as exc:
        if node.domain != "":
            raise
        try:
            return onnx_reference_evaluate(node, inputs)
        except OpDispatchError:
            raise
        except Exception as ref_exc:
            raise UnsupportedOpError(
                f"{exc}; onnx's reference implementation failed too ({type(ref_exc).__name__}: "
                f"{_first_line(ref_exc)})") from None
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        out = impl.build(node)(*inputs)
    return list(out) if isinstance(out, tuple | list) else [out]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def onnx_reference_evaluate(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """Run ``node`` (of ONNX's own domain) once with ``onnx.reference`` at the node's opset."""
    from onnx.reference import ReferenceEvaluator

    names = [f"in{k}" if v is not None else "" for k, v in enumerate(inputs)]
    attrs = {k: numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v
             for k, v in node.attrs.items()}
    proto = helper.make_node(node.op_type, names, [f"out{k}" for k in range(len(node.outputs))],
                             **attrs)
    feeds = {n: np.asarray(v) for n, v in zip(names, inputs) if v is not None}
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        out = ReferenceEvaluator(proto, opsets={"": node.opset}).run(None, feeds)
    return [np.asarray(o) for o in out]


#: operators whose output shape may follow the values of a float input (Range's bounds,
#: Resize's and Upsample's scales, OneHot's depth): tested like integer inputs
FLOAT_SHAPE_DATA = frozenset({"Range", "Resize", "Upsample", "OneHot"})


def fill_shapes(graph: Graph, registry: Registry) -> int:
    """Give static shapes to values that onnx's inference left unknown; returns how many."""
    filled = 0
    for node in graph.nodes:
        if any(o.shape is None or o.dtype is None for o in node.outputs):
            filled += fill_node(registry, node, graph)
    return filled


def fill_node(registry: Registry, node: Node, graph: Graph | None = None,
              unfolded: Mapping[str, str] | None = None) -> int:
    """Give static shapes to ``node``'s outputs by evaluating it on placeholders (zeros of its
    inputs' shapes, the constants as they are); returns how many it filled.

    Outputs whose shape only the data decides stay *dynamic* (``shape=None``, their dtype
    known; :mod:`dispatch.subgraph`): those of a data-dependent or control-flow operator, of
    a node reading a dynamic value, and of a node whose output shape changes with the values
    of its non-constant inputs. ``graph`` records why in :attr:`Graph.dynamic`; ``unfolded``
    (node name -> why constant folding left it) names the chain of nodes that computes such
    a value."""
    unknown = [v for v in node.inputs if v is not None and not v.is_const
               and (v.shape is None or v.dtype is None)]
    if unknown or (node.op_type in DATA_DEPENDENT_OPS and node.domain == ""):
        why = (f"{node.op_type} decides its output shapes from the data" if not unknown else
               f"it reads {unknown[0].name!r}, whose shape is known only at run time")
        return _mark_dynamic(node, graph, why)
    placeholders: list[np.ndarray | None] = []
    for v in node.inputs:
        if v is None:
            placeholders.append(None)
        elif v.is_const:
            placeholders.append(v.const)
        else:
            placeholders.append(np.zeros(v.shape, v.dtype))  # type: ignore[arg-type]
    try:
        results = _evaluate_for_shapes(registry, node, placeholders, graph, unfolded or {})
    except _ValueDependent as dep:
        return _mark_dynamic(node, graph, str(dep), dep.dtypes)
    filled = 0
    for value, arr in zip(node.outputs, results):
        if value.shape is None or value.dtype is None:
            value.shape = tuple(np.shape(arr))
            value.dtype = np.asarray(arr).dtype
            filled += 1
    return filled


def _evaluate_for_shapes(registry: Registry, node: Node, placeholders: list[np.ndarray | None],
                         graph: Graph | None, unfolded: Mapping[str, str]) -> list[np.ndarray]:
    """Evaluate ``node`` on placeholders. Non-constant integer inputs may carry shape data
    (axes, pads, sizes): the node is evaluated with zeros and with ones there, and a raise or
    a difference between the two means its output shape depends on their values."""
    kinds = "iubf" if node.op_type in FLOAT_SHAPE_DATA else "iub"
    runtime_ints = [
        k for k, v in enumerate(node.inputs)
        if v is not None and not v.is_const and v.dtype is not None and v.dtype.kind in kinds
    ]
    fills = [placeholders]
    if runtime_ints:
        ones = list(placeholders)
        for k in runtime_ints:
            ones[k] = np.ones_like(placeholders[k])
        fills.append(ones)
    shapes = []
    results: list[np.ndarray] = []
    for fill in fills:
        try:
            results = evaluate(registry, node, fill)
        except UnsupportedOpError:
            raise
        except Exception as exc:
            if runtime_ints:
                results = []
                break
            # zeros are not data it can run on (a gather whose indices come from the data):
            # its shape is left to the run
            raise _ValueDependent(
                f"its output shape could not be inferred on placeholder inputs "
                f"({type(exc).__name__}: {_first_line(exc)})", []) from None
        shapes.append([np.shape(r) for r in results])
    if runtime_ints and (not results or shapes[0] != shapes[-1]):
        values = [node.inputs[k] for k in runtime_ints]
        raise _ValueDependent(value_dependence_message(node, values, graph, unfolded),
                              [np.asarray(r).dtype for r in results])
    return results


class _ValueDependent(Exception):
    """A node's output shape follows the values of its non-constant inputs."""

    def __init__(self, why: str, dtypes: list[np.dtype]) -> None:
        super().__init__(why)
        self.dtypes = dtypes


def _mark_dynamic(node: Node, graph: Graph | None, why: str,
                  dtypes: list[np.dtype] | None = None) -> int:
    """Leave ``node``'s unknown output shapes dynamic (see :func:`fill_node`); their dtypes
    come from onnx's inference or ``dtypes``. Returns 0 (no shape filled)."""
    for k, out in enumerate(node.outputs):
        if out.dtype is None and dtypes and k < len(dtypes):
            out.dtype = dtypes[k]
        if out.dtype is None:
            raise ShapeInferenceError(
                f"neither the shape nor the element type of {out.name!r} (output {k} of node "
                f"{node.name!r}, {node.op_type}) could be inferred; its shape is known only at "
                f"run time ({why}), but its element type must be known when the model loads")
        if out.shape is None:
            out.dynamic = True
            if graph is not None:
                graph.dynamic[out.name] = f"node {node.name!r} ({node.op_type}): {why}"
    return 0


def value_dependence_message(node: Node, values: list[Value | None], graph: Graph | None,
                             unfolded: Mapping[str, str]) -> str:
    """Why ``node``'s output shape cannot be known at load time: the values it needs, and for
    each the chain of nodes that computes it — from a graph input (the value depends on the
    input data), or from a node whose inputs are all constant but that folding could not
    evaluate (the reason folding gave)."""
    names = ", ".join(repr(v.name) for v in values if v is not None)
    chains = [_chain(graph, v, unfolded) for v in values if v is not None] if graph else []
    data = [c for c in chains if c[0] == "input"]
    stuck = [c for c in chains if c[0] == "stuck"]
    if data or not stuck:
        text = (f"the output shape of node {node.name!r} ({node.op_type}) depends on the runtime "
                f"values of {names}")
        for _, path, _ in data:
            text += f"; the chain that needs the input data: {path} -> {node.name} ({node.op_type})"
        return text + ("; plans are built for static shapes, so these values must be constants "
                       "(initializers) of the model")
    text = (f"the output shape of node {node.name!r} ({node.op_type}) depends on the values of "
            f"{names}, which are computed from constants and static shapes only but could not "
            f"be folded at load time")
    for _, path, why in stuck:
        text += f"; the chain: {path} -> {node.name} ({node.op_type}); {why}"
    return text


def _chain(graph: Graph, value: Value, unfolded: Mapping[str, str]) -> tuple[str, str, str]:
    """The chain of nodes upstream of ``value`` that keeps it from being a constant:
    ``("input", "graph input 'x' -> A (Op) -> B (Op)", "")`` when it leads to a graph input,
    ``("stuck", "A (Op) -> B (Op)", why)`` when it leads to a node with constant inputs that
    was not folded, ``("unknown", ...)`` when neither is found."""
    producer = {o.name: n for n in graph.nodes for o in n.outputs}
    input_names = {v.name for v in graph.inputs}
    parent: dict[str, str | None] = {value.name: None}
    queue = [value.name]
    found: tuple[str, str] | None = None  # (kind, value name or node name)
    stuck: str | None = None
    while queue:
        name = queue.pop(0)
        node = producer.get(name)
        if node is None:
            if name in input_names:
                found = ("input", name)
                break
            continue
        runtime = [v for v in node.inputs if v is not None and not v.is_const]
        if node.op_type in ("Shape", "Size") and node.domain == "":
            runtime = []  # reads its input's shape only: it stays only if that was unknown
        if not runtime and stuck is None:
            stuck = name
        for v in runtime:
            if v.name not in parent:
                parent[v.name] = name
                queue.append(v.name)
    if found is None and stuck is None:
        return "unknown", _path(producer, parent, value.name), ""
    start = found[1] if found else stuck
    path = _path(producer, parent, start)  # type: ignore[arg-type]
    if found:
        return "input", f"graph input {start!r} -> {path}", ""
    node = producer[start]  # type: ignore[index]
    if node.op_type in ("Shape", "Size") and node.name not in unfolded:
        return "stuck", path, (f"node {node.name!r} ({node.op_type}) was not folded: the shape of "
                               f"its input was not known when folding reached it")
    why = unfolded.get(node.name, "it was not folded")
    return "stuck", path, f"node {node.name!r} ({node.op_type}) has constant inputs only: {why}"


def _path(producer: Mapping[str, Node], parent: Mapping[str, str | None], start: str) -> str:
    """``A (Op) -> B (Op) -> ...``: the producers of the values from ``start`` down the
    ``parent`` links (consumer order), the middle left out past :data:`CHAIN_SHOWN`."""
    steps = []
    name: str | None = start if start in producer else parent.get(start)
    while name is not None:
        node = producer.get(name)
        if node is not None:
            steps.append(f"{node.name} ({node.op_type})")
        name = parent.get(name)
    if len(steps) > CHAIN_SHOWN:
        half = CHAIN_SHOWN // 2
        steps = [*steps[:half], f"... {len(steps) - CHAIN_SHOWN} more ...", *steps[-half:]]
    return " -> ".join(steps)
