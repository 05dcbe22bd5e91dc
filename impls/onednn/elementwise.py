"""Elementwise ops on oneDNN's eltwise and binary primitives (float32).

Unary (``{Op}.onednn.{layout}``): Relu, LeakyRelu, Clip (constant bounds), Sigmoid, Tanh,
Elu, Exp, Abs, Sqrt, HardSwish, Neg, Gelu (opset 20). Not Log or Softplus: oneDNN's
approximations miss ONNX's conformance tolerances (log(1) = -1.4e-6; softplus(-7.7) off by
2 % relative). Binary
(``{Op}.onednn.{layout}_same`` for equal shapes, ``{Op}.onednn.broadcast`` in the standard
layout): Add, Sub, Mul, Div, Max, Min of two inputs; fused ``Add+Relu``.

Layouts: ``std`` (any rank), and ``nhwc``, ``nchw8c``, ``nchw16c`` (rank 4). An op with
f(0) = 0 (or f(0, 0) = 0) runs on the physical buffer as one dense vector, which keeps the
zero padding of blocked layouts; any other op runs over the blocked memory descriptor (oneDNN
keeps the padding zero) and, in a blocked layout, only where the channels fill whole blocks
(oneDNN has only a slow reference kernel for padded blocks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dispatch.graph import Node
from dispatch.registry import STANDARD, Priority
from impls.common import as_f32, clip_bounds
from impls.onednn import layouts as lay
from impls.onednn._module import onednn
from impls.onednn.table import impls

LAYOUTS = (STANDARD, "nhwc", "nchw8c", "nchw16c")
BLOCKS = {"nchw8c": 8, "nchw16c": 16}

Kernel = Callable[..., np.ndarray]


_c = as_f32


@dataclass(frozen=True)
class Unary:
    """An ONNX unary op as a oneDNN eltwise algorithm: ``params(node)`` gives (alpha, beta),
    or the reason the node cannot run; ``zero`` says whether f(0) == 0."""

    kind: str
    params: Callable[[Node], tuple[float, float] | str]
    zero: Callable[[tuple[float, float]], bool]


def _none(node: Node) -> tuple[float, float]:
    return 0.0, 0.0


def _attr(name: str, default: float) -> Callable[[Node], tuple[float, float]]:
    return lambda node: (float(node.attr(name, default)), 0.0)


def _clip(node: Node) -> tuple[float, float] | str:
    bounds = clip_bounds(node)
    if bounds is None:
        return "min/max must be constants"
    # an omitted bound stays infinite: oneDNN's clip takes +-inf (clamping it to +-FLT_MAX
    # turned +-inf inputs of a Clip without that bound into +-3.4e38)
    lo, hi = bounds
    if not lo <= hi:
        return f"Clip bounds must satisfy min <= max, received {bounds}"
    return lo, hi


def _gelu(node: Node) -> tuple[float, float] | str:
    approx = node.attr("approximate", "none")
    approx = approx.decode() if isinstance(approx, bytes) else str(approx)
    if approx not in ("none", "tanh"):
        return f"Gelu approximate must be 'none' or 'tanh', received {approx!r}"
    return (0.0, 0.0) if approx == "none" else (1.0, 0.0)


def _always(_: tuple[float, float]) -> bool:
    return True


def _never(_: tuple[float, float]) -> bool:
    return False


UNARY: dict[str, Unary] = {
    "Relu": Unary("relu", _none, _always),
    "LeakyRelu": Unary("relu", _attr("alpha", 0.01), _always),
    "Clip": Unary("clip", _clip, lambda p: p[0] <= 0.0 <= p[1]),
    "Sigmoid": Unary("logistic", _none, _never),
    "Tanh": Unary("tanh", _none, _always),
    "Elu": Unary("elu", _attr("alpha", 1.0), _always),
    "Exp": Unary("exp", _none, _never),
    "Abs": Unary("abs", _none, _always),
    "Sqrt": Unary("sqrt", _none, _always),
    "HardSwish": Unary("hardswish", _none, _always),
    "Neg": Unary("linear", lambda node: (-1.0, 0.0), _always),
    "Gelu": Unary("gelu_erf", _gelu, _always),
}
#: Binary ops -> (oneDNN algorithm, commutative, f(0, 0) == 0).
BINARY: dict[str, tuple[str, bool, bool]] = {
    "Add": ("add", True, True),
    "Sub": ("sub", False, True),
    "Mul": ("mul", True, True),
    "Div": ("div", False, False),
    "Max": ("max", True, True),
    "Min": ("min", True, True),
}


def _f32_reason(node: Node, count: int) -> str | None:
    for i in range(count):
        v = node.input(i)
        if v is None or v.dtype is None or np.dtype(v.dtype) != np.float32:
            return f"needs float32 inputs, input {i} has dtype {None if v is None else v.dtype}"
        if v.shape is None:
            return f"needs static shapes, input {i} has none"
        if 0 in tuple(v.shape):
            return f"input {i} is empty (shape {tuple(v.shape)}): nothing for oneDNN to run"
    return None


def _layout_reason(layout: str, shape: tuple[int, ...], zero: bool) -> str | None:
    if layout == STANDARD:
        return None if len(shape) >= 1 else "needs a tensor of rank >= 1"
    if len(shape) != 4:
        return f"layout {layout} holds rank-4 tensors, received shape {shape}"
    block = BLOCKS.get(layout)
    if block and not zero and shape[1] % block:
        return (f"f(0) != 0 in {layout} needs whole channel blocks (C % {block} == 0), received "
                f"C={shape[1]}: oneDNN has only its reference kernel for padded blocks")
    return None


def _dense_md(layout: str, shape: tuple[int, ...], zero: bool) -> tuple[list[int], str]:
    """(dims, tag) the primitive sees: the physical buffer as one vector when padding (if
    any) stays zero or there is none, else the blocked descriptor."""
    if layout == STANDARD or zero or layout == "nhwc" or shape[1] % BLOCKS[layout] == 0:
        count = int(np.prod(lay.physical_shape(lay.activation_tag(layout), shape) if layout != STANDARD
                            else shape, dtype=np.int64))
        return [count], "a"
    return list(shape), lay.activation_tag(layout)


# -- unary -----------------------------------------------------------------------------------


def _register_unary(op: str, spec: Unary, layout: str) -> None:
    def supports(node: Node) -> str | None:
        reason = _f32_reason(node, 1)
        if reason:
            return reason
        params = spec.params(node)
        if isinstance(params, str):
            return params
        if op == "Gelu" and node.opset < 20:
            return f"Gelu needs opset >= 20, received {node.opset}"
        return _layout_reason(layout, tuple(node.input(0).shape), spec.zero(params))

    def build(node: Node) -> Kernel:
        params = spec.params(node)
        assert not isinstance(params, str), params
        shape = tuple(int(d) for d in node.input(0).shape)
        kind = "gelu_tanh" if op == "Gelu" and params[0] == 1.0 else spec.kind
        alpha, beta = (0.0, 0.0) if op == "Gelu" else params
        dims, tag = _dense_md(layout, shape, spec.zero(params))
        prim = onednn().Eltwise(kind, alpha, beta, dims, tag)

        def run(x: np.ndarray, *_: np.ndarray | None) -> np.ndarray:
            return prim(_c(x))

        run.primitive = prim  # type: ignore[attr-defined]
        return run

    build.__doc__ = f"{op} on oneDNN's eltwise ({spec.kind}) in {layout}."
    n_extra = 2 if op == "Clip" else 0
    impls.register(op, layout, priority=Priority.PREFERRED, supports=supports,
                   layouts_in=(layout,) + (STANDARD,) * n_extra, layouts_out=(layout,))(build)


# -- binary ----------------------------------------------------------------------------------


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    rank = max(len(a), len(b))
    ra, rb = (1,) * (rank - len(a)) + a, (1,) * (rank - len(b)) + b
    out = []
    for x, y in zip(ra, rb):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(out)


def _binary_operands(node: Node,
                     commutative: bool) -> tuple[int, int, tuple[int, ...], tuple[int, ...]] | str:
    """(index of the full operand, index of the broadcast one, full dims, broadcast dims) of
    a broadcasting binary node (oneDNN broadcasts its second source only)."""
    a, b = tuple(node.input(0).shape), tuple(node.input(1).shape)
    out = _broadcast(a, b)
    if out is None:
        return f"shapes {a} and {b} do not broadcast"
    rank = len(out)
    if rank > 5:
        return f"needs ranks <= 5, received {a} and {b}"
    if rank == 0:
        return "needs tensors of rank >= 1"
    ra, rb = (1,) * (rank - len(a)) + a, (1,) * (rank - len(b)) + b
    if ra == out:
        return 0, 1, ra, rb
    if rb == out and commutative:
        return 1, 0, rb, ra
    return (f"the first operand {a} broadcasts to {out}; oneDNN broadcasts only its second "
            f"source and {node.op_type} is not commutative")


def _register_binary(op: str, layout: str | None, relu: bool) -> None:
    kind, commutative, zero = BINARY[op]
    same = layout is not None

    def supports(node: Node) -> str | None:
        if len([v for v in node.inputs if v is not None]) != 2:
            return f"needs exactly two inputs, received {len(node.inputs)}"
        reason = _f32_reason(node, 2)
        if reason:
            return reason
        a, b = tuple(node.input(0).shape), tuple(node.input(1).shape)
        if same:
            if a != b:
                return f"needs equal shapes, received {a} and {b} (the broadcast variant takes them)"
            return _layout_reason(layout, a, zero)
        if a == b:
            return "equal shapes: the std_same variant covers them"
        found = _binary_operands(node, commutative)
        return found if isinstance(found, str) else None

    def build(node: Node) -> Kernel:
        post = "relu" if relu else ""
        if same:
            shape = tuple(int(d) for d in node.input(0).shape)
            dims, tag = _dense_md(layout, shape, zero)
            prim = onednn().Binary(kind, dims, tag, dims, tag, post)

            def run_same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
                return prim(_c(a), _c(b))

            run_same.primitive = prim  # type: ignore[attr-defined]
            return run_same
        found = _binary_operands(node, commutative)
        assert not isinstance(found, str), found
        first, second, da, db = found
        prim = onednn().Binary(kind, list(da), lay.PLAIN[len(da)], list(db), lay.PLAIN[len(db)], post)
        out_shape = tuple(node.outputs[0].shape) if node.outputs[0].shape is not None else da

        def run(*args: np.ndarray) -> np.ndarray:
            return prim(_c(args[first]), _c(args[second])).reshape(out_shape)

        run.primitive = prim  # type: ignore[attr-defined]
        return run

    where = f"equal shapes in {layout}" if same else "numpy broadcasting in std"
    build.__doc__ = f"{op}{'+Relu' if relu else ''} on oneDNN's binary ({kind}), {where}."
    variant = f"{layout}_same" if same else "broadcast"
    opts = dict(priority=Priority.PREFERRED, supports=supports,
                layouts_in=(layout, layout) if same else None,
                layouts_out=(layout,) if same else None)
    if relu:
        impls.register_pattern((op, "Relu"), variant, **opts)(build)
    else:
        impls.register(op, variant, **opts)(build)


for _op, _spec in UNARY.items():
    for _layout in LAYOUTS:
        _register_unary(_op, _spec, _layout)
for _op in BINARY:
    for _layout in (*LAYOUTS, None):
        _register_binary(_op, _layout, False)
for _layout in (*LAYOUTS, None):
    _register_binary("Add", _layout, True)
