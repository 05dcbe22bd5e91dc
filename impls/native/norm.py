"""Native per-channel affine ops (float32) in every activation layout of the backend: ``std``
(nchw, any rank >= 2), ``nhwc``, ``nchw8c`` and ``nchw16c``; C++ in native/src/norm.cpp
(``channel_affine``: y = x * a[c] + b[c], one pass). Blocked outputs keep their padding
channels zero. Implementations, per layout L (X and Y in L, the constants in std):

- ``BatchNormalization.native.L``: inference mode; the constant scale, B, mean and var are
  folded into ``a = scale / sqrt(var + epsilon)`` and ``b = B - mean * a`` once, when the plan
  is built (C++ ``fold_batchnorm``, in double), never per run. ``supports()`` rejects training
  mode (batch statistics), the optional running mean / var outputs, opset 7-8's
  per-activation parameters (``spatial=0``) and parameters that are not constants;
- ``Mul.native.L_channel`` / ``Add.native.L_channel``: X times / plus a constant that
  broadcasts per channel (shape (C, 1, 1), (1, C, 1, 1) or a single value), either operand
  order: how older exporters (Caffe2's DenseNet, Inception v2) write an inference
  BatchNormalization. Without them such a network leaves the blocked layouts at every one;
- ``Mul+Add.native.L_channel``: the fused chain of the two, one pass with scale and shift.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dispatch.graph import Node
from dispatch.registry import STANDARD, Priority
from impls.common import Kernel
from impls.common import as_f32 as _c
from impls.native._module import native
from impls.native.layouts import BLOCKS
from impls.native.table import impls

#: Every layout the affine kernel runs in.
LAYOUTS = (STANDARD, "nhwc", *BLOCKS)
#: Elementwise ops with a per-channel constant operand (the kernel's scale or its shift).
CHANNEL_OPS = {"Mul": "scale", "Add": "bias"}
#: Inputs 1-4 of BatchNormalization, folded when the plan is built.
PARAMS = ("scale", "B", "input_mean", "input_var")
DEFAULT_EPSILON = 1e-5


def _training_reason(node: Node) -> str | None:
    """Why ``node`` runs in training mode (batch statistics), or ``None`` in inference."""
    if node.opset >= 14:
        if int(node.attr("training_mode", 0)):
            return "training_mode=1 (batch statistics) is not supported; only inference is"
        if len(node.outputs) > 1:
            return (f"produces Y only; received {len(node.outputs)} outputs (running mean / var "
                    f"are training-mode outputs)")
        return None
    if len(node.outputs) > 1:
        return (f"BatchNormalization (opset {node.opset}) with {len(node.outputs)} outputs runs "
                f"in training mode; only inference (output Y alone) is supported")
    if node.opset < 7 and not int(node.attr("is_test", 0)):
        return "BatchNormalization before opset 7 with is_test=0 runs in training mode"
    return None


def _supports(layout: str) -> Callable[[Node], str | None]:
    def check(node: Node) -> str | None:
        missing = [PARAMS[i - 1] if i else "X" for i in range(5) if node.input(i) is None]
        if missing:
            return f"BatchNormalization needs inputs X, scale, B, mean and var; missing {missing}"
        for i in range(5):
            v = node.input(i)
            if v.dtype is None or np.dtype(v.dtype) != np.float32:
                return f"needs float32 inputs, input {i} has dtype {v.dtype}"
        reason = _training_reason(node)
        if reason:
            return reason
        xs = node.input(0).shape
        if xs is None:
            return "needs a static input shape, X has none"
        if layout == STANDARD and len(xs) < 2:
            return f"needs X of rank >= 2 (N, C, ...), received shape {tuple(xs)}"
        if layout != STANDARD and len(xs) != 4:
            return f"layout {layout} holds rank-4 tensors, received X of shape {tuple(xs)}"
        if node.opset < 9 and int(node.attr("spatial", 1)) == 0:
            return "spatial=0 (per-activation parameters) is not supported, only per-channel ones"
        c = int(xs[1])
        for i, name in enumerate(PARAMS, start=1):
            v = node.input(i)
            if v.const is None:
                return (f"needs constant scale, B, mean and var (folded once when the plan is "
                        f"built); {name} is computed at run time")
            if tuple(np.shape(v.const)) != (c,):
                return (f"{name} must have shape ({c},) for X of shape {tuple(xs)}, "
                        f"received {np.shape(v.const)}")
        return None

    return check


def fold(node: Node) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) with ``y = x * a[c] + b[c]`` from the constant parameters of ``node``."""
    scale, bias, mean, var = (_c(node.const_input(i)) for i in range(1, 5))
    eps = float(node.attr("epsilon", DEFAULT_EPSILON))
    return native().fold_batchnorm(scale, bias, mean, var, eps)


def _register(layout: str) -> None:
    def build(node: Node) -> Kernel:
        mod = native()
        a, b = fold(node)
        channels = int(node.input(0).shape[1])

        def run(x: np.ndarray, *_params: np.ndarray) -> np.ndarray:
            return mod.channel_affine(_c(x), layout, a, b, channels)

        return run

    build.__doc__ = (f"BatchNormalization (inference) in {layout}: parameters folded at plan "
                     f"build, one multiply-add per element.")
    impls.register("BatchNormalization", layout, priority=Priority.PREFERRED,
                   supports=_supports(layout), layouts_in=(layout,), layouts_out=(layout,))(build)


# -- Mul / Add by a per-channel constant ---------------------------------------------------


def channel_operand(node: Node, layout: str) -> tuple[int, np.ndarray] | str:
    """(index of the activation input, the constant as C float32 values) of a Mul / Add of
    ``node`` by a per-channel constant, else the reason it is not one."""
    if len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return f"{node.op_type} needs exactly two inputs, received {len(node.inputs)}"
    for i, v in enumerate(node.inputs):
        if v.dtype is None or np.dtype(v.dtype) != np.float32:
            return f"needs float32 inputs, input {i} has dtype {v.dtype}"
    consts = [i for i, v in enumerate(node.inputs) if v.const is not None]
    if len(consts) != 1:
        return (f"needs one constant operand (the per-channel factor or term) and one tensor, "
                f"received {len(consts)} constants")
    xi = 1 - consts[0]
    xs, const = node.inputs[xi].shape, np.asarray(node.inputs[consts[0]].const)
    if xs is None:
        return "needs a static shape of the tensor operand"
    xs = tuple(xs)
    if layout == STANDARD and len(xs) < 2:
        return f"needs a tensor of rank >= 2 (N, C, ...), received shape {xs}"
    if layout != STANDARD and len(xs) != 4:
        return f"layout {layout} holds rank-4 tensors, received shape {xs}"
    cs = const.shape
    full = (1,) * (len(xs) - len(cs)) + cs
    if (len(cs) > len(xs) or full[1] not in (1, xs[1])
            or any(d != 1 for i, d in enumerate(full) if i != 1)):
        return (f"the constant of shape {cs} does not broadcast per channel over {xs}; "
                f"expected ({xs[1]}, 1, ...), (1, {xs[1]}, 1, ...) or a single value")
    values = np.broadcast_to(const.astype(np.float32).reshape(full[1]), (int(xs[1]),))
    return xi, np.ascontiguousarray(values)


def _chain(node: Node) -> list[Node]:
    return list(getattr(node, "nodes", None) or [node])


def _channel_supports(layout: str) -> Callable[[Node], str | None]:
    def check(node: Node) -> str | None:
        for n in _chain(node):
            found = channel_operand(n, layout)
            if isinstance(found, str):
                return found if len(_chain(node)) == 1 else f"{n.op_type}: {found}"
        return None

    return check


def _channel_layouts(layout: str) -> Callable[[Node], tuple[str, ...]]:
    """The activation in ``layout``, the constants in std (the activation is the first
    node's non-constant input; a fused chain's later constants follow)."""

    def layouts(node: Node) -> tuple[str, ...]:
        first = _chain(node)[0]
        xi = 1 if first.input(0) is not None and first.input(0).const is not None else 0
        lay = [STANDARD] * len(node.inputs)
        lay[xi] = layout
        return tuple(lay)

    return layouts


def _register_channel(layout: str, ops: tuple[str, ...]) -> None:
    def build(node: Node) -> Kernel:
        mod = native()
        args: dict[str, np.ndarray | None] = {"scale": None, "bias": None}
        xi = 0
        for k, n in enumerate(_chain(node)):
            found = channel_operand(n, layout)
            assert not isinstance(found, str), found  # supports() said yes
            if k == 0:
                xi = found[0]
            args[CHANNEL_OPS[n.op_type]] = found[1]
        channels = int(node.inputs[xi].shape[1])
        scale, bias = args["scale"], args["bias"]

        def run(*inputs: np.ndarray) -> np.ndarray:
            return mod.channel_affine(_c(inputs[xi]), layout, scale, bias, channels)

        return run

    what = " then ".join(f"{op} by a per-channel constant" for op in ops)
    build.__doc__ = f"{what} in {layout} (one channel_affine pass)."
    opts = dict(priority=Priority.PREFERRED, supports=_channel_supports(layout),
                layouts_in=_channel_layouts(layout), layouts_out=(layout,))
    if len(ops) == 1:
        impls.register(ops[0], f"{layout}_channel", **opts)(build)
    else:
        impls.register_pattern(ops, f"{layout}_channel", **opts)(build)


for _layout in LAYOUTS:
    _register(_layout)
    for _ops in (("Mul",), ("Add",), ("Mul", "Add")):
        _register_channel(_layout, _ops)
