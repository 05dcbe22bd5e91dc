"""What the subgraph backends (onnxruntime, OpenVINO) share: the regions they offer the tuner
(:func:`propose`: contiguous ranges of the topological order at several granularities, from
single nodes through blocks and stages to the maximal supported ranges), a region as a
standalone ONNX model (:func:`region_model`: its nodes, the constants they read as
initializers, its inputs and outputs with static shapes, which each backend compiles its own
way) and the checks every such backend makes (:func:`static_node_reason`,
:func:`region_reason`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.fusion import FusedNode
from dispatch.graph import Graph, Node
from dispatch.subgraph import CONTROL_FLOW_OPS, Subgraph

#: ``node_reason(node)``: ``None`` when a backend can run ``node``, else why not
NodeReason = Callable[[Node], str | None]


#: the domains every region backend takes: ONNX's own
STANDARD_DOMAINS: tuple[str, ...] = ("", "ai.onnx")


def static_node_reason(node: Node, *, dynamic_ok: bool = False,
                       extra_ops: frozenset[str] = frozenset()) -> str | None:
    """``None`` when ``node`` is of a standard ONNX domain (or one of ``extra_ops``, keys
    ``domain::op_type`` of other domains' operators the backend runs) and every value it reads
    or writes has a dtype and a static shape (a region model needs both), else why not. With
    ``dynamic_ok`` (a library that sizes tensors when it runs), shapes known only at run
    time are accepted: the region model declares them open."""
    if node.domain not in STANDARD_DOMAINS and node.key_op not in extra_ops:
        return f"domain {node.domain!r} is not a standard ONNX domain"
    for v in node.inputs:
        if v is not None and (v.dtype is None or (v.shape is None and not dynamic_ok)):
            return f"{v.name} has no static shape or dtype"
    for v in node.outputs:  # (before the load-time passes, unknown is not yet dynamic)
        if v.dynamic and not dynamic_ok:
            return f"{v.name} has a shape known only at run time"
    return None


def region_reason(region: FusedNode, node_reason: NodeReason) -> str | None:
    """``None`` when every node of ``region`` passes ``node_reason`` and the region produces
    something, else why not (the ``supports`` of a region implementation)."""
    for n in region.nodes:
        why = node_reason(n)
        if why is not None:
            return f"node {n.name!r} ({n.op_type}): {why}"
    if not region.outputs:
        return "the region produces nothing that is read outside it"
    return None


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# ------------------------------------------------------------------------------------------
# proposals
# ------------------------------------------------------------------------------------------


def live_counts(graph: Graph) -> list[int]:
    """Per node of the topological order: how many non-constant tensors are live right after
    it (computed and still to be read; graph inputs count as live from the start)."""
    last_use: dict[str, int] = {}
    for k, n in enumerate(graph.nodes):
        for v in n.inputs:
            if v is not None and not v.is_const:
                last_use[v.name] = k
    end = len(graph.nodes)
    for v in graph.outputs:
        last_use[v.name] = end
    live: set[str] = {v.name for v in graph.inputs if last_use.get(v.name, -1) >= 0}
    counts = []
    for k, n in enumerate(graph.nodes):
        live = {name for name in live if last_use.get(name, -1) > k}
        live |= {v.name for v in n.outputs if last_use.get(v.name, -1) > k}
        counts.append(len(live))
    return counts


def _cut_points(graph: Graph) -> list[int]:
    """Positions ``k`` such that exactly one non-constant tensor is live between node ``k``
    and node ``k + 1`` of the topological order (:func:`live_counts`)."""
    end = len(graph.nodes)
    return [k for k, count in enumerate(live_counts(graph)) if count == 1 and k < end - 1]


def _cut_value(graph: Graph, k: int) -> tuple[int, ...] | None:
    """Shape of the one tensor live after node ``k`` (see :func:`_cut_points`)."""
    consumers_after = {v.name for n in graph.nodes[k + 1:] for v in n.inputs if v is not None}
    for n in graph.nodes[: k + 1]:
        for v in n.outputs:
            if v.name in consumers_after:
                return v.shape
    return None


def _maximal_runs(ok: list[bool]) -> list[tuple[int, int]]:
    """The maximal ranges ``[a, b]`` of consecutive ``True`` in ``ok``."""
    runs: list[tuple[int, int]] = []
    start = None
    for k, good in enumerate([*ok, False]):
        if good and start is None:
            start = k
        elif not good and start is not None:
            runs.append((start, k - 1))
            start = None
    return runs


def propose(graph: Graph, node_reason: NodeReason, *, refused_alone: bool = False) -> list[list[str]]:
    """Regions of the nodes that ``node_reason`` accepts, each once, all contiguous ranges of
    the graph's topological order (so convex: no path leaves a range and comes back):

    - every supported node alone (so the backend competes per op, call overhead included);
    - *blocks*: the ranges between cut points, where exactly one non-constant tensor is live
      (a residual block, an inception module, a fire module);
    - *stages*: runs of consecutive blocks whose cut tensors keep one shape (a ResNet stage);
    - the maximal ranges of supported nodes (the whole graph when the backend runs every op).

    With ``refused_alone`` every refused node alone too, so that the region's ``supports``
    refuses it with its reason where the tuner lists why each candidate was rejected."""
    nodes = graph.nodes
    ok = [node_reason(n) is None for n in nodes]
    runs = _maximal_runs(ok)
    cuts = _cut_points(graph)
    bounds = [-1, *cuts, len(nodes) - 1]
    blocks = [(bounds[i] + 1, bounds[i + 1]) for i in range(len(bounds) - 1)
              if bounds[i] + 1 <= bounds[i + 1]]
    stages: list[tuple[int, int]] = []
    for a, b in blocks:
        if stages and _cut_value(graph, stages[-1][1]) == _cut_value(graph, b) and b < len(nodes) - 1:
            stages[-1] = (stages[-1][0], b)
        else:
            stages.append((a, b))
    ranges: list[tuple[int, int]] = [(k, k) for k, good in enumerate(ok) if good or refused_alone]
    for a, b in [*blocks, *stages, *runs]:
        for ra, rb in runs:  # keep the supported part of each range
            lo, hi = max(a, ra), min(b, rb)
            if lo <= hi:
                ranges.append((lo, hi))
    seen: set[tuple[int, int]] = set()
    out = []
    for a, b in ranges:
        if (a, b) not in seen:
            seen.add((a, b))
            out.append([n.name for n in nodes[a: b + 1]])
    return out


#: the fewest nodes of a region on which library settings are tuned (see :func:`large_regions`)
SETTINGS_MIN_NODES = 8


def large_regions(graph: Graph, node_reason: NodeReason,
                  min_nodes: int = SETTINGS_MIN_NODES) -> list[list[str]]:
    """The regions of :func:`propose` with at least ``min_nodes`` nodes (stages, large
    blocks), and the maximal ranges of supported nodes whatever their size (the whole graph
    when the library runs every op): where a library's settings are worth measuring. Settings
    variants are offered on these only, which bounds the tuning they cost: the regions that
    can dominate a model's time, not every node and small block."""
    nodes = graph.nodes
    maximal = {(a, b) for a, b in _maximal_runs([node_reason(n) is None for n in nodes])}
    index = {n.name: k for k, n in enumerate(nodes)}
    return [r for r in propose(graph, node_reason)
            if len(r) >= min_nodes or (index[r[0]], index[r[-1]]) in maximal]


# ------------------------------------------------------------------------------------------
# the region as an ONNX model
# ------------------------------------------------------------------------------------------


def _attribute(name: str, value: Any):
    from onnx import helper, numpy_helper

    if isinstance(value, Subgraph):
        return helper.make_attribute(name, value.proto)
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, list | tuple):
        value = [v.item() if isinstance(v, np.generic) else v for v in value]
    return helper.make_attribute(name, value)


#: constants of more elements than this stay out of a region's serialised model when its
#: library can take them from memory (:func:`region_model` with ``external``)
WEIGHT_ELEMENTS = 4096


def region_model(region: FusedNode, external: dict[str, np.ndarray] | None = None):
    """The ONNX model of ``region``: its nodes, the constants they read (initializers), its
    inputs and outputs with their static shapes and dtypes.

    With ``external`` (a dict, filled here), constants of more than :data:`WEIGHT_ELEMENTS`
    elements are not copied into the model: their initializers are external-data references
    and ``external`` maps their names to the arrays, for a library that takes initializers
    from memory (onnxruntime's ``add_external_initializers``): a BERT-base region then starts
    without serialising 440 MB of weights twice. The model is checked with those constants as
    typed graph inputs (onnx's checker wants external data in a file, and serialises whatever
    it checks), with or without ``external``."""
    import onnx
    from onnx import helper, numpy_helper

    from dispatch.contrib_schemas import register_for_ops

    # a graph from the graph cache was imported by another process: onnx's checker needs the
    # contrib schemas registered in this one too
    register_for_ops((n.domain, n.op_type) for n in region.nodes)

    inits: dict[str, Any] = {}
    stand_ins: list[Any] = []  # the large constants as graph inputs, for the checker
    protos = []
    for n in region.nodes:
        for v in n.inputs:
            if v is None or not v.is_const or v.name in inits:
                continue
            arr = np.asarray(v.const)
            if arr.size > WEIGHT_ELEMENTS:
                stand_ins.append(helper.make_tensor_value_info(
                    v.name, helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)))
            # 4-bit weights (two a byte) go in the model: onnxruntime makes no OrtValue of them
            if external is not None and arr.size > WEIGHT_ELEMENTS and not _packed_4bit(arr.dtype):
                external[v.name] = np.ascontiguousarray(arr)
                inits[v.name] = _external_initializer(v.name, arr)
            else:
                inits[v.name] = numpy_helper.from_array(arr, v.name)
        attrs = [_attribute(k, a) for k, a in n.attrs.items() if not (isinstance(a, list) and not a)]
        for want, v in zip(n.captures, n.inputs[len(n.explicit_inputs):]):
            if v is not None and v.name != want:  # the outer value was renamed by a pass
                protos.append(helper.make_node("Identity", [v.name], [want],
                                               name=f"{n.name}__capture_{want}"))
        proto = helper.make_node(n.op_type, [v.name if v is not None else "" for v in n.explicit_inputs],
                                 [v.name for v in n.outputs], name=n.name, domain=n.domain)
        proto.attribute.extend(attrs)
        protos.append(proto)

    # a region with control flow declares its boundary with open dimensions (rank only):
    # exporters' bodies carry shape annotations that hold for symbolic inputs only (silero-vad's
    # If branches disagree on an LSTM input's rank once its sizes are fixed, and onnxruntime
    # then refuses the model: "First input tensor must have rank 3")
    open_dims = any(n.op_type in CONTROL_FLOW_OPS and n.domain == "" for n in region.nodes)

    def info(v):
        dims = list(v.shape) if v.shape is not None else None  # dynamic: declared open
        if open_dims and dims is not None:
            dims = [None] * len(dims)
        return helper.make_tensor_value_info(v.name, helper.np_dtype_to_tensor_dtype(np.dtype(v.dtype)), dims)

    opsets: dict[str, int] = {}
    for n in region.nodes:
        opsets[n.domain] = max(opsets.get(n.domain, 0), n.opset)
    imports = [helper.make_opsetid(d, v) for d, v in opsets.items()]

    def model(inputs: list[Any], initializers: list[Any]):
        graph = helper.make_graph(protos, "region", inputs, [info(v) for v in region.outputs], initializers)
        made = helper.make_model(graph, opset_imports=imports, producer_name="opdispatch")
        # onnx knows the IR versions of its own domains' opsets only (not com.microsoft's)
        standard = [i for i in imports if i.domain in STANDARD_DOMAINS]
        made.ir_version = max(helper.find_min_ir_version_for(standard) if standard else 7, 7)
        return made

    inputs = [info(v) for v in region.inputs]
    large = {vi.name for vi in stand_ins}
    # checked without its large constants (typed inputs instead): the checker serialises the
    # model, weights and all, which took longer than building the library's session
    if all(v.shape is not None for v in [*region.inputs, *region.outputs]):
        # (a value of unknown rank, declared without a shape, is refused by the checker,
        # not by the libraries: such a region is checked by the library that loads it)
        onnx.checker.check_model(model(inputs + stand_ins,
                                       [t for name, t in inits.items() if name not in large]))
    return model(inputs, list(inits.values()))


def _packed_4bit(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is one of ONNX's 4-bit types (ml_dtypes' int4, uint4, float4_e2m1fn)."""
    from onnx import helper

    from dispatch.onnx_weights import PACKED_4BIT

    try:
        return helper.np_dtype_to_tensor_dtype(np.dtype(dtype)) in PACKED_4BIT
    except (KeyError, ValueError, TypeError):
        return False


def _external_initializer(name: str, arr: np.ndarray):
    """An initializer of ``arr``'s name, type and shape whose data is external (given to the
    library from memory: see :func:`region_model`)."""
    import onnx
    from onnx import helper

    t = onnx.TensorProto()
    t.name = name
    t.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
    t.dims.extend(arr.shape)
    t.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", "opdispatch-memory"), ("offset", "0"), ("length", str(arr.nbytes))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t
