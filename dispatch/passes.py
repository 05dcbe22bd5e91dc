"""Simplification passes run at load time.

- :func:`fold_constants`: evaluate nodes whose inputs are all constant (and ``Shape``/``Size``
  of statically shaped values) with the reference implementation, e.g. the
  ConstantOfShape / Shape / Unsqueeze chains that generate weights.
- :func:`remove_noops`: drop inference no-ops (Identity, Dropout without a used mask).
- :func:`fold_batchnorm`: fold an inference BatchNormalization into the Conv before it.
- :func:`fill_shapes` (:mod:`dispatch.shape_folding`): give a static shape to values that
  onnx's inference left unknown, by evaluating the reference implementation on placeholders.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from dispatch.errors import (
    ModelLoadError,
    OpDispatchError,
    ShapeInferenceError,
    TensorTooLargeError,
)
from dispatch.graph import Graph, Node, Value, check_tensor_sizes, max_tensor_bytes
from dispatch.registry import Registry
from dispatch.shape_folding import evaluate, evaluation_impl, fill_node, fill_shapes

__all__ = [  # evaluate, evaluation_impl and fill_shapes live in dispatch.shape_folding
    "check_nodes", "evaluate", "evaluation_impl", "fill_shapes", "fold_batchnorm",
    "fold_constants", "is_weight_dequantize", "remove_noops", "replace_uses", "simplify",
]

#: operators never folded: their result differs from run to run
NONDETERMINISTIC = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
)
#: largest tensor (bytes) that constant folding materialises
FOLD_LIMIT_BYTES = 1 << 30


def replace_uses(graph: Graph, old: Value, new: Value) -> None:
    """Make every reader of ``old`` (nodes and graph outputs) read ``new`` instead."""
    for n in graph.nodes:
        n.inputs = [new if v is old else v for v in n.inputs]
    graph.outputs = [new if v is old else v for v in graph.outputs]


def _bypass(graph: Graph, node: Node, src: Value, dst: Value) -> bool:
    """Remove ``node`` whose output ``dst`` equals its input ``src``. Keeps graph output names.
    Returns False when the node must stay (it copies a graph input or constant to an output)."""
    output_names = {v.name for v in graph.outputs}
    if dst.name not in output_names:
        replace_uses(graph, dst, src)
    else:
        producer = next((n for n in graph.nodes if any(o is src for o in n.outputs)), None)
        if producer is None or src.name in output_names:
            return False
        producer.outputs = [dst if o is src else o for o in producer.outputs]
        replace_uses(graph, src, dst)
    graph.nodes.remove(node)
    return True


def is_weight_dequantize(node: Node) -> bool:
    """Whether ``node`` dequantizes a constant quantized tensor (a QDQ model's weight,
    ``weight_q -> DequantizeLinear -> consumer``). Constant folding keeps it, as onnxruntime's
    own does: folded to float, the weight would hide the QDQ pattern from the regions (no
    QLinearConv / QGemm / MatMulNBits in onnxruntime) and change their results by a
    quantization step. The numpy reference dequantizes it at run time."""
    return (node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx", "com.microsoft")
            and all(v is None or v.is_const for v in node.inputs)
            and node.input(0) is not None)


def fold_constants(graph: Graph, registry: Registry, *, fill: bool = True) -> int:
    """Replace nodes computable at load time by constants; returns how many were folded.

    With ``fill``, the same topological walk gives static shapes to the outputs of nodes that
    cannot be folded and that onnx's inference left unknown (so that a later ``Shape`` of them
    folds too)."""
    folded = 0
    output_names = {v.name for v in graph.outputs}
    #: node name -> why a node with constant inputs was left (named by shape errors)
    unfolded: dict[str, str] = {}
    for node in list(graph.nodes):
        if node.op_type in NONDETERMINISTIC:
            continue
        result: list[np.ndarray] | None = None
        if node.op_type in ("Shape", "Size") and node.domain == "":
            src = node.input(0)
            if src is not None and src.shape is not None:
                result = [_shape_or_size(node, src.shape)]
        elif is_weight_dequantize(node):
            pass  # a QDQ weight stays quantized: the regions see the pattern the tool wrote
        elif all(v is None or v.is_const for v in node.inputs):
            sizes = [o.nbytes for o in node.outputs]
            predicted = _predicted_bytes(node)
            if predicted is not None and predicted > max_tensor_bytes():
                out = node.outputs[0]
                check_tensor_sizes([Value(out.name, _predicted_shape(node), out.dtype or
                                          np.dtype(np.float32))],
                                   f" (output of node {node.name!r}, {node.op_type})")
            if sum(sizes) > FOLD_LIMIT_BYTES or (predicted or 0) > FOLD_LIMIT_BYTES:
                unfolded[node.name] = (f"its output would take more than {FOLD_LIMIT_BYTES:,} "
                                       f"bytes, the constant folding limit")
                continue
            try:
                result = evaluate(registry, node, [v.const if v else None for v in node.inputs])
            except OpDispatchError as exc:  # left for the planner, which reports unsupported ops
                why = str(exc) if len(str(exc)) <= 500 else f"{str(exc)[:300]} ... {str(exc)[-200:]}"
                unfolded[node.name] = f"it could not be evaluated ({type(exc).__name__}: {why})"
                continue
            except MemoryError:
                raise TensorTooLargeError(
                    f"node {node.name!r} ({node.op_type}) ran out of memory computing its "
                    f"constant output(s) {[o.name for o in node.outputs]} at load time"
                ) from None
            except Exception as exc:  # its inputs are constants: it would fail at every run
                consts = ", ".join(
                    f"{v.name}={_short(v.const)}" for v in node.inputs if v is not None)
                raise ModelLoadError(
                    f"node {node.name!r} ({node.op_type}) fails on its constant inputs "
                    f"({consts}): {type(exc).__name__}: {exc}"
                ) from None
        if result is None or any(o.name in output_names for o in node.outputs):
            # not foldable (graph outputs stay computed by a node, so the model runs something)
            if fill and any(o.shape is None or o.dtype is None for o in node.outputs):
                fill_node(registry, node, graph, unfolded)
            continue
        for value, arr in zip(node.outputs, result):
            arr = np.asarray(arr)
            value.const = arr
            value.shape = tuple(arr.shape)
            value.dtype = arr.dtype
        graph.nodes.remove(node)
        folded += 1
    return folded


def _short(a: np.ndarray | None, limit: int = 8) -> str:
    if a is None:
        return "?"
    flat = np.asarray(a).ravel()
    shown = ", ".join(str(x) for x in flat[:limit]) + (", ..." if flat.size > limit else "")
    return f"[{shown}]" if np.ndim(a) else shown


def _predicted_shape(node: Node) -> tuple[int, ...] | None:
    """The output shape of a shape-generating node (ConstantOfShape, Expand, Tile) from its
    constant inputs, without computing it; ``None`` when not one of them or not known."""
    try:
        if node.op_type == "ConstantOfShape":
            dims = node.const_input(0)
            return None if dims is None else tuple(int(d) for d in np.asarray(dims).ravel())
        if node.op_type == "Expand":
            x, dims = node.input(0), node.const_input(1)
            if x is None or x.shape is None or dims is None:
                return None
            want = [int(d) for d in np.asarray(dims).ravel()]
            have = list(x.shape)
            rank = max(len(want), len(have))
            want = [1] * (rank - len(want)) + want
            have = [1] * (rank - len(have)) + have
            return tuple(max(a, b) if 1 in (a, b) else a for a, b in zip(have, want))
        if node.op_type == "Tile":
            x, reps = node.input(0), node.const_input(1)
            if x is None or x.shape is None or reps is None:
                return None
            r = [int(d) for d in np.asarray(reps).ravel()]
            return tuple(a * b for a, b in zip(x.shape, r)) if len(r) == len(x.shape) else None
    except (TypeError, ValueError, OverflowError):
        return None
    return None


def _predicted_bytes(node: Node) -> int | None:
    shape = _predicted_shape(node)
    if shape is None or any(d < 0 for d in shape):
        return None
    out = node.outputs[0] if node.outputs else None
    itemsize = out.dtype.itemsize if out is not None and out.dtype is not None else 4
    return math.prod(shape) * itemsize


def _shape_or_size(node: Node, shape: tuple[int, ...]) -> np.ndarray:
    if node.op_type == "Size":
        return np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    rank = len(shape)
    start = node.attr("start", 0)
    end = node.attr("end", rank)
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = max(0, min(rank, end + rank if end < 0 else end))
    return np.array(shape[start:end], dtype=np.int64)


def _is_dropout_noop(node: Node, used: set[str]) -> bool:
    if len(node.outputs) > 1 and node.outputs[1].name in used:
        return False
    mode = node.input(2)
    if mode is not None:
        return mode.is_const and not bool(np.asarray(mode.const).item())
    return node.attr("is_test", 1) != 0 or node.opset >= 7


def remove_noops(graph: Graph) -> int:
    """Drop Identity and inference-mode Dropout nodes; returns how many were removed."""
    removed = 0
    for node in list(graph.nodes):
        if node.domain != "" or node.op_type not in ("Identity", "Dropout"):
            continue
        used = {v.name for n in graph.nodes for v in n.inputs if v is not None}
        used |= {v.name for v in graph.outputs}
        if node.op_type == "Dropout" and not _is_dropout_noop(node, used):
            continue
        src = node.input(0)
        if src is None:
            continue
        if _bypass(graph, node, src, node.outputs[0]):
            removed += 1
    return removed


def fold_batchnorm(graph: Graph) -> int:
    """Fold ``Conv -> BatchNormalization`` (constant weights and statistics, inference mode,
    the Conv output read by nothing else) into one Conv; returns how many were folded."""
    folded = 0
    consumers = graph.consumers()
    output_names = {v.name for v in graph.outputs}
    for bn in list(graph.nodes):
        if bn.op_type != "BatchNormalization" or bn.domain != "":
            continue
        x = bn.input(0)
        if x is None or x.name in output_names or len(consumers.get(x.name, [])) != 1:
            continue
        conv = next((n for n in graph.nodes if n.op_type == "Conv" and n.outputs[0] is x), None)
        if conv is None or conv.domain != "":
            continue
        if bn.attr("training_mode", 0) or bn.attr("spatial", 1) != 1:
            continue
        if any(o.name in consumers or o.name in output_names for o in bn.outputs[1:]):
            continue
        params = [bn.const_input(i) for i in range(1, 5)]
        w = conv.const_input(1)
        bias_in = conv.input(2)
        if w is None or any(p is None for p in params) or (bias_in is not None and not bias_in.is_const):
            continue
        scale, beta, mean, var = (np.asarray(p, dtype=np.float64) for p in params)  # type: ignore[arg-type]
        eps = float(bn.attr("epsilon", 1e-5))
        m = w.shape[0]
        if any(p.shape != (m,) for p in (scale, beta, mean, var)):
            continue
        factor = scale / np.sqrt(var + eps)
        b = np.zeros(m) if bias_in is None else np.asarray(bias_in.const, dtype=np.float64)
        new_w = (w.astype(np.float64) * factor.reshape((m,) + (1,) * (w.ndim - 1))).astype(w.dtype)
        new_b = ((b - mean) * factor + beta).astype(w.dtype)
        wv = Value(f"{conv.name}__bnfolded_W", tuple(new_w.shape), new_w.dtype, new_w)
        bv = Value(f"{conv.name}__bnfolded_B", (m,), new_b.dtype, new_b)
        graph.values[wv.name] = wv
        graph.values[bv.name] = bv
        conv.inputs = [conv.inputs[0], wv, bv]
        conv.outputs = [bn.outputs[0]]
        graph.nodes.remove(bn)
        folded += 1
    return folded


Pass = Callable[[Graph], int]


def check_nodes(graph: Graph) -> None:
    """Structural checks the ONNX checker and shape inference leave out, so that a malformed
    node is refused when the model is loaded (with what was received and expected) rather
    than by whichever backend first runs it. Conv: weight rank, channels and groups,
    ``kernel_shape``, ``auto_pad`` and bias; Reshape: the number of elements; Gemm: the bias
    shape; Transpose: ``perm``; MaxPool/AveragePool: ``ceil_mode`` windows that start in
    the padding; Conv and pools: ``pads`` next to ``auto_pad``, windows larger than the
    padded input."""
    for node in graph.nodes:
        if node.domain != "":
            continue
        reason = None
        if node.op_type == "Conv":
            reason = _conv_reason(node) or _window_reason(node)
        elif node.op_type == "Reshape":
            reason = _reshape_reason(node)
        elif node.op_type == "Gemm":
            reason = _gemm_reason(node)
        elif node.op_type == "Transpose":
            reason = _transpose_reason(node)
        elif node.op_type in ("MaxPool", "AveragePool"):
            reason = (_pool_rank_reason(node) or _window_reason(node)
                      or _ceil_pool_reason(node))
        elif node.op_type in ("GlobalAveragePool", "GlobalMaxPool"):
            reason = _pool_rank_reason(node)
        if reason:
            raise ModelLoadError(f"node {node.name!r} ({node.op_type}): {reason}")


def _pool_rank_reason(node: Node) -> str | None:
    x = node.input(0)
    if x is not None and x.shape is not None and len(x.shape) < 3:
        return (f"X must have rank >= 3 (N, C, spatial...), received {x.name!r} of shape "
                f"{list(x.shape)}")
    return None


def _transpose_reason(node: Node) -> str | None:
    """A ``perm`` that is no permutation of the input's axes (onnx's inference lets some
    through)."""
    x, perm = node.input(0), node.attr("perm")
    if x is None or x.shape is None or perm is None:
        return None
    if sorted(int(p) for p in perm) != list(range(len(x.shape))):
        return (f"perm {list(perm)} is not a permutation of the {len(x.shape)} axes of "
                f"{x.name!r} (shape {list(x.shape)}); expected a reordering of "
                f"{list(range(len(x.shape)))}")
    return None


def _gemm_reason(node: Node) -> str | None:
    """A Gemm bias C that does not broadcast to the output (M, N): onnx's inference does not
    check it."""
    a, b, c, y = node.input(0), node.input(1), node.input(2), node.outputs[0]
    if (a is not None and b is not None and a.shape is not None and b.shape is not None
            and len(a.shape) == 2 and len(b.shape) == 2):
        ka = a.shape[0] if node.attr("transA", 0) else a.shape[1]
        kb = b.shape[1] if node.attr("transB", 0) else b.shape[0]
        if ka != kb:
            return (f"inner dimensions differ: A {list(a.shape)} (transA={node.attr('transA', 0)}"
                    f") has K={ka}, B {list(b.shape)} (transB={node.attr('transB', 0)}) has "
                    f"K={kb}; expected equal K")
    if c is None or c.shape is None or y.shape is None or len(y.shape) != 2:
        return None
    cs = tuple(c.shape)
    if len(cs) > 2 or any(d not in (1, o) for d, o in zip(cs[::-1], y.shape[::-1])):
        return (f"bias C {c.name!r} of shape {list(cs)} does not broadcast to the output shape "
                f"{list(y.shape)} (M, N); expected a shape such as [{y.shape[1]}], "
                f"[{y.shape[0]}, 1] or {list(y.shape)}")
    return None


def _window_reason(node: Node) -> str | None:
    """Window attributes on which onnx's inference and the implementations disagree: explicit
    ``pads`` together with an ``auto_pad`` (ONNX forbids it), and a (dilated) kernel larger
    than the padded input (onnx's inference rounds the negative size toward zero, giving
    one output, the implementations none)."""
    auto_pad = node.attr("auto_pad", "NOTSET") or "NOTSET"
    pads = node.attr("pads")
    if auto_pad != "NOTSET":
        # onnx's inference then uses the pads, the implementations auto_pad (VALID with zero
        # pads, which some exporters write, means the same either way)
        if pads is not None and (auto_pad != "VALID" or any(int(p) for p in pads)):
            return (f"auto_pad={auto_pad} and pads={list(pads)} are both set; ONNX allows pads "
                    f"only with auto_pad=NOTSET")
        return None
    x = node.input(0)
    if x is None or x.shape is None or len(x.shape) < 3:
        return None
    nd = len(x.shape) - 2
    if node.op_type == "Conv":
        w = node.input(1)
        kernel = list(w.shape[2:]) if w is not None and w.shape is not None else None
    else:
        kernel = node.attr("kernel_shape")
    dilations = list(node.attr("dilations") or [1] * nd)
    pads = list(pads or [0] * (2 * nd))
    strides = list(node.attr("strides") or [1] * nd)
    if kernel is None or len(kernel) != nd or len(dilations) != nd or len(pads) != 2 * nd:
        return None
    # a pool with ceil_mode=1 has one window (clipped to the input) while the window overruns
    # the padded input by less than a stride: nn.AvgPool2d(k, ceil_mode=True) on a map
    # smaller than k, as EfficientNet's pooler
    ceil = node.op_type != "Conv" and bool(node.attr("ceil_mode", 0)) and len(strides) == nd
    for k in range(nd):
        span = (int(kernel[k]) - 1) * int(dilations[k]) + 1
        padded = int(x.shape[2 + k]) + int(pads[k]) + int(pads[k + nd])
        if span > padded and not (ceil and span - padded < int(strides[k])):
            return (f"its window spans {span} elements along spatial axis {k} (kernel "
                    f"{list(kernel)}, dilations {dilations}) but the padded input has "
                    f"{padded} there (input {list(x.shape)}, pads {pads}); expected a window "
                    f"no larger than the padded input")
    return None


def _ceil_pool_reason(node: Node) -> str | None:
    """A pool with ``ceil_mode=1`` whose last window would start in the end padding: onnx's
    inference counts that window, the implementations drop it (as PyTorch and the ONNX
    reference do), so the plan would fail at run time on the shape."""
    x, y = node.input(0), node.outputs[0]
    if not node.attr("ceil_mode", 0) or (node.attr("auto_pad", "NOTSET") or "NOTSET") != "NOTSET":
        return None
    if x is None or y is None or x.shape is None or y.shape is None or len(x.shape) != len(y.shape):
        return None
    nd = len(x.shape) - 2
    strides = list(node.attr("strides") or [1] * nd)
    pads = list(node.attr("pads") or [0] * (2 * nd))
    if len(strides) != nd or len(pads) != 2 * nd:
        return None
    for k in range(nd):
        out, size = int(y.shape[2 + k]), int(x.shape[2 + k])
        if out > 0 and (out - 1) * int(strides[k]) >= size + int(pads[k]):
            return (f"with ceil_mode=1 the last window along spatial axis {k} would start in the "
                    f"end padding (input {list(x.shape)}, pads {pads}, strides {strides}, output "
                    f"{list(y.shape)} by onnx's inference); the implementations drop that "
                    f"window, so the output shape is ambiguous; expected pads smaller than the "
                    f"kernel")
    return None


def _reshape_reason(node: Node) -> str | None:
    """A Reshape whose (inferred) output holds another number of elements than its input:
    onnx's inference takes the target shape as given."""
    x, out, target = node.input(0), node.outputs[0], node.const_input(1)
    if x is None or x.shape is None or out.shape is None:
        return None
    have, want = math.prod(x.shape), math.prod(out.shape)
    if have == want:
        return None
    shown = f" (shape input {_short(target)})" if target is not None else ""
    return (f"cannot turn {x.name!r} of shape {list(x.shape)} ({have} elements) into shape "
            f"{list(out.shape)} ({want} elements){shown}; expected a shape with {have} elements")


AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def _conv_reason(node: Node) -> str | None:
    x, w, b = node.input(0), node.input(1), node.input(2)
    group = node.attr("group", 1)
    if not isinstance(group, int) or group < 1:
        return f"group must be an integer >= 1, received {group!r}"
    auto_pad = node.attr("auto_pad", "NOTSET") or "NOTSET"
    if auto_pad not in AUTO_PADS:
        return f"auto_pad must be one of {', '.join(AUTO_PADS)}, received {auto_pad!r}"
    if x is None or w is None or x.shape is None or w.shape is None:
        return None
    xs, ws = x.shape, w.shape
    if len(xs) < 3:
        return f"X must have rank >= 3 (N, C, spatial...), received {x.name!r} of shape {list(xs)}"
    if len(ws) != len(xs):
        return (f"W must have the rank of X ({len(xs)}: M, C/group, kernel...), received "
                f"{w.name!r} of shape {list(ws)} for X of shape {list(xs)}")
    if ws[0] % group:
        return f"W {list(ws)} has {ws[0]} output channels, not divisible by group={group}"
    if xs[1] != ws[1] * group:
        return (f"X {list(xs)} has {xs[1]} channels, W {list(ws)} expects {ws[1]} per group "
                f"x group={group} = {ws[1] * group}")
    kernel = node.attr("kernel_shape")
    if kernel is not None and [int(k) for k in kernel] != list(ws[2:]):
        return f"kernel_shape {list(kernel)} does not match W's spatial shape {list(ws[2:])}"
    nd = len(xs) - 2
    for name, per in (("strides", 1), ("dilations", 1), ("pads", 2)):
        values = node.attr(name)
        if values is not None and len(values) != per * nd:
            return (f"{name} needs {per * nd} values for {nd} spatial axes, received "
                    f"{list(values)}")
    if b is not None and b.shape is not None and tuple(b.shape) != (ws[0],):
        return f"bias B must have shape [{ws[0]}] (W's output channels), received {list(b.shape)}"
    return None


def simplify(graph: Graph, registry: Registry) -> dict[str, int]:
    """Run every load-time pass; returns how much each one changed."""
    check_nodes(graph)
    stats = {
        "folded_constants": fold_constants(graph, registry),
        "removed_noops": remove_noops(graph),
        "folded_batchnorm": fold_batchnorm(graph),
    }
    graph.remove_unused()
    for v in graph.values.values():
        if v.dtype is None or (v.shape is None and v.name not in graph.dynamic):
            raise ShapeInferenceError(f"value {v.name!r} has no static shape or dtype after import")
    graph.dynamic = {k: why for k, why in graph.dynamic.items()
                     if k in graph.values and graph.values[k].shape is None}
    check_tensor_sizes(graph.values.values())
    return stats
