"""Regions of the graph as onnxruntime InferenceSessions.

``propose(graph)`` offers the tuner regions at several granularities, all contiguous ranges of
the graph's topological order (so convex: no path leaves a range and comes back):

- every supported node alone (so onnxruntime competes per op, call overhead included);
- *blocks*: the ranges between cut points, where exactly one non-constant tensor is live
  (a residual block, an inception module, a fire module);
- *stages*: runs of consecutive blocks whose cut tensors keep one shape (a ResNet stage);
- the maximal ranges of supported nodes (the whole graph when onnxruntime runs every op).

A region is built into an ONNX model of its own — its nodes, the constants they read as
initializers, its inputs and outputs with static shapes — and an InferenceSession with every
graph optimisation, run with IO binding (inputs bound in place, outputs allocated by
onnxruntime and handed over without a copy).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from dispatch.fusion import FusedNode
from dispatch.graph import Graph, Node
from dispatch.registry import ImplTable, Priority

impls = ImplTable("onnxruntime")

#: set by OnnxRuntimeBackend.configure; 0: every core this process may use (as the native
#: backend; onnxruntime's own default is the physical cores)
SETTINGS: dict[str, int] = {"intra_op_threads": 0}

#: default-domain ops never offered (none today; onnxruntime implements the standard set)
UNSUPPORTED_OPS: frozenset[str] = frozenset()


def node_reason(node: Node) -> str | None:
    """``None`` when onnxruntime can run ``node``, else why not."""
    if node.domain not in ("", "ai.onnx"):
        return f"domain {node.domain!r} is not a standard ONNX domain"
    if node.op_type in UNSUPPORTED_OPS:
        return f"{node.op_type} is not offered to onnxruntime"
    for v in node.inputs:
        if v is not None and (v.shape is None or v.dtype is None):
            return f"{v.name} has no static shape or dtype"
    return None


# ------------------------------------------------------------------------------------------
# proposals
# ------------------------------------------------------------------------------------------


def _cut_points(graph: Graph) -> list[int]:
    """Positions ``k`` such that exactly one non-constant tensor is live between node ``k``
    and node ``k + 1`` of the topological order (graph inputs count as live from the start)."""
    last_use: dict[str, int] = {}
    for k, n in enumerate(graph.nodes):
        for v in n.inputs:
            if v is not None and not v.is_const:
                last_use[v.name] = k
    end = len(graph.nodes)
    for v in graph.outputs:
        last_use[v.name] = end
    live: set[str] = {v.name for v in graph.inputs if last_use.get(v.name, -1) >= 0}
    cuts = []
    for k, n in enumerate(graph.nodes):
        live = {name for name in live if last_use.get(name, -1) > k}
        live |= {v.name for v in n.outputs if last_use.get(v.name, -1) > k}
        if len(live) == 1 and k < end - 1:
            cuts.append(k)
    return cuts


def _cut_value(graph: Graph, k: int) -> tuple[int, ...] | None:
    """Shape of the one tensor live after node ``k`` (see :func:`_cut_points`)."""
    consumers_after = {v.name for n in graph.nodes[k + 1:] for v in n.inputs if v is not None}
    for n in graph.nodes[: k + 1]:
        for v in n.outputs:
            if v.name in consumers_after:
                return v.shape
    return None


def propose(graph: Graph) -> list[list[str]]:
    """Regions at several granularities (see the module docstring), each once."""
    nodes = graph.nodes
    ok = [node_reason(n) is None for n in nodes]
    runs: list[tuple[int, int]] = []  # maximal ranges [a, b] of supported nodes
    start = None
    for k, good in enumerate([*ok, False]):
        if good and start is None:
            start = k
        elif not good and start is not None:
            runs.append((start, k - 1))
            start = None
    cuts = _cut_points(graph)
    bounds = [-1, *cuts, len(nodes) - 1]
    blocks = [(bounds[i] + 1, bounds[i + 1]) for i in range(len(bounds) - 1) if bounds[i] + 1 <= bounds[i + 1]]
    stages: list[tuple[int, int]] = []
    for a, b in blocks:
        if stages and _cut_value(graph, stages[-1][1]) == _cut_value(graph, b) and b < len(nodes) - 1:
            stages[-1] = (stages[-1][0], b)
        else:
            stages.append((a, b))
    ranges: list[tuple[int, int]] = [(k, k) for k, good in enumerate(ok) if good]
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


# ------------------------------------------------------------------------------------------
# building
# ------------------------------------------------------------------------------------------


def _attribute(name: str, value: Any):
    from onnx import helper, numpy_helper

    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, list | tuple):
        value = [v.item() if isinstance(v, np.generic) else v for v in value]
    return helper.make_attribute(name, value)


def region_model(region: FusedNode):
    """The ONNX model of ``region``: its nodes, the constants they read (initializers), its
    inputs and outputs with their static shapes and dtypes."""
    import onnx
    from onnx import helper, numpy_helper

    inits: dict[str, Any] = {}
    protos = []
    for n in region.nodes:
        for v in n.inputs:
            if v is not None and v.is_const and v.name not in inits:
                inits[v.name] = numpy_helper.from_array(np.asarray(v.const), v.name)
        attrs = [_attribute(k, a) for k, a in n.attrs.items() if not (isinstance(a, list) and not a)]
        proto = helper.make_node(n.op_type, [v.name if v is not None else "" for v in n.inputs],
                                 [v.name for v in n.outputs], name=n.name, domain=n.domain)
        proto.attribute.extend(attrs)
        protos.append(proto)

    def info(v):
        return helper.make_tensor_value_info(v.name, helper.np_dtype_to_tensor_dtype(np.dtype(v.dtype)), list(v.shape))

    graph = helper.make_graph(protos, "region", [info(v) for v in region.inputs],
                              [info(v) for v in region.outputs], list(inits.values()))
    opsets: dict[str, int] = {}
    for n in region.nodes:
        opsets[n.domain] = max(opsets.get(n.domain, 0), n.opset)
    imports = [helper.make_opsetid(d, v) for d, v in opsets.items()]
    model = helper.make_model(graph, opset_imports=imports, producer_name="opdispatch")
    model.ir_version = max(helper.find_min_ir_version_for(imports), 7)
    onnx.checker.check_model(model)
    return model


def session(region: FusedNode):
    """An InferenceSession for ``region`` (every graph optimisation, the configured threads)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    so.intra_op_num_threads = SETTINGS["intra_op_threads"] or _usable_cores()
    so.inter_op_num_threads = 1
    if not region.attrs.get("whole_graph"):
        # onnxruntime's workers spin after each run; between regions other backends' kernels
        # run, and spinning workers hold the cores they need (measured on squeezenet,
        # alternating an onnxruntime and a native run: 16.0 ms with spinning, 13.6 without,
        # for 4.7 + 6.4 ms alone). Only a region that is the whole graph keeps spinning.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(region_model(region).SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _supports(region: FusedNode) -> str | None:
    for n in region.nodes:
        why = node_reason(n)
        if why is not None:
            return f"node {n.name!r} ({n.op_type}): {why}"
    if not region.outputs:
        return "the region produces nothing that is read outside it"
    return None


@impls.register_region("session", propose=propose, priority=Priority.DEFAULT, supports=_supports)
def build_region(region: FusedNode):
    """A region as one onnxruntime InferenceSession, run with IO binding.

    ``InferenceSession.run_with_iobinding`` may be called from several threads at once, an
    IO binding may not (it holds one run's inputs and outputs), so each thread binds through
    its own."""
    sess = session(region)
    in_names = [v.name for v in region.inputs]
    out_names = [v.name for v in region.outputs]
    local = threading.local()

    def run(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        binding = getattr(local, "binding", None)
        if binding is None:
            binding = local.binding = sess.io_binding()
        for name, a in zip(in_names, arrays):
            binding.bind_cpu_input(name, np.require(a, requirements="C"))  # keeps 0-d arrays 0-d
        for name in out_names:
            binding.bind_output(name, "cpu")
        sess.run_with_iobinding(binding)
        return tuple(o.numpy() for o in binding.get_outputs())

    return run


