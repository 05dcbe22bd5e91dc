"""Batch normalization (inference) on oneDNN, float32, in ``std`` (ranks 2 to 5), ``nhwc``,
``nchw8c`` and ``nchw16c`` (rank 4).

``BatchNormalization.onednn.L`` uses the constant mean and variance (``use_global_stats``) with
the constant scale and B (``use_scale | use_shift``), copied into the primitive's own buffers
when the plan is built; ``BatchNormalization+Relu.onednn.L`` adds ``fuse_norm_relu``.
Training mode (batch statistics, the running mean / var outputs), opset 7-8's
per-activation parameters (``spatial=0``) and parameters computed at run time are not
supported.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dispatch.graph import Node
from dispatch.registry import STANDARD, Priority
from impls.common import as_f32
from impls.onednn import layouts as lay
from impls.onednn._module import onednn
from impls.onednn.table import impls

LAYOUTS = (STANDARD, "nhwc", "nchw8c", "nchw16c")
PARAMS = ("scale", "B", "input_mean", "input_var")
DEFAULT_EPSILON = 1e-5

Kernel = Callable[..., np.ndarray]


_c = as_f32


def _bn(node: Node) -> Node:
    nodes = getattr(node, "nodes", None)
    return nodes[0] if nodes else node


def _training_reason(node: Node) -> str | None:
    """Why ``node`` runs in training mode, or ``None`` in inference."""
    if node.opset >= 14 and int(node.attr("training_mode", 0)):
        return "training_mode=1 (batch statistics) is not supported; only inference is"
    if len(node.outputs) > 1:
        return (f"produces Y only; received {len(node.outputs)} outputs (running mean / var are "
                f"training-mode outputs)")
    if node.opset < 7 and not int(node.attr("is_test", 0)):
        return "BatchNormalization before opset 7 with is_test=0 runs in training mode"
    if node.opset < 9 and int(node.attr("spatial", 1)) == 0:
        return "spatial=0 (per-activation parameters) is not supported, only per-channel ones"
    return None


def _supports(layout: str) -> Callable[[Node], str | None]:
    def check(node: Node) -> str | None:
        bn = _bn(node)
        missing = [PARAMS[i - 1] if i else "X" for i in range(5) if bn.input(i) is None]
        if missing:
            return f"BatchNormalization needs inputs X, scale, B, mean and var; missing {missing}"
        for i in range(5):
            v = bn.input(i)
            if v.dtype is None or np.dtype(v.dtype) != np.float32:
                return f"needs float32 inputs, input {i} has dtype {v.dtype}"
        reason = _training_reason(bn)
        if reason:
            return reason
        xs = bn.input(0).shape
        if xs is None:
            return "needs a static input shape, X has none"
        if layout == STANDARD and not 2 <= len(xs) <= 5:
            return f"needs X of rank 2 to 5 (N, C, ...), received shape {tuple(xs)}"
        if layout != STANDARD and len(xs) != 4:
            return f"layout {layout} holds rank-4 tensors, received X of shape {tuple(xs)}"
        if 0 in tuple(xs):
            return f"X is empty (shape {tuple(xs)}): nothing for oneDNN to run"
        c = int(xs[1])
        for i, name in enumerate(PARAMS, start=1):
            v = bn.input(i)
            if v.const is None:
                return (f"needs constant scale, B, mean and var (copied once when the plan is "
                        f"built); {name} is computed at run time")
            if tuple(np.shape(v.const)) != (c,):
                return (f"{name} must have shape ({c},) for X of shape {tuple(xs)}, "
                        f"received {np.shape(v.const)}")
        return None

    return check


def _register(layout: str, relu: bool) -> None:
    def build(node: Node) -> Kernel:
        bn = _bn(node)
        xs = tuple(int(d) for d in bn.input(0).shape)
        tag = lay.PLAIN[len(xs)] if layout == STANDARD else lay.activation_tag(layout)
        scale, shift, mean, var = (_c(bn.const_input(i)) for i in range(1, 5))
        eps = float(bn.attr("epsilon", DEFAULT_EPSILON))
        prim = onednn().BatchNorm(list(xs), tag, eps, relu, scale, shift, mean, var)

        def run(x: np.ndarray, *_params: np.ndarray | None) -> np.ndarray:
            return prim(_c(x))

        run.primitive = prim  # type: ignore[attr-defined]
        return run

    build.__doc__ = (f"BatchNormalization{'+Relu' if relu else ''} (inference) on oneDNN in "
                     f"{layout}, parameters copied once at plan build.")
    opts = dict(priority=Priority.PREFERRED, supports=_supports(layout),
                layouts_in=(layout,), layouts_out=(layout,))
    if relu:
        impls.register_pattern(("BatchNormalization", "Relu"), layout, **opts)(build)
    else:
        impls.register("BatchNormalization", layout, **opts)(build)


for _layout in LAYOUTS:
    _register(_layout, False)
    _register(_layout, True)
