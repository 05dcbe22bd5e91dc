"""numpy normalisation kernels: BatchNormalization (inference), LRN, LayerNormalization,
Softmax and LogSoftmax.

- BatchNormalization folds scale, bias, mean and variance into one multiply-add (at build time
  when they are constant); opset 7's ``spatial=0`` takes per-activation parameters. Training
  mode is rejected by ``supports()``.
- LRN sums squares over a channel window of ``size`` with one shifted add per window offset.
- LayerNormalization computes in ``stash_type`` (float32 by default; float64 inputs stay in
  float64) and can return Mean and InvStdDev.
- Softmax / LogSoftmax subtract the maximum first; before opset 13 they coerce the input to
  2-D at ``axis`` (default 1), from opset 13 they work along ``axis`` (default -1).

float16 inputs compute in float32 and are rounded back once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.misc import FLOAT_TYPES, check_dtypes, first_reason
from impls.numpy.table import impls

Kernel = Callable[..., Any]


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(dtype)


def _needs_input(node: Node, count: int) -> str | None:
    missing = [i for i in range(count) if node.input(i) is None]
    if missing:
        return f"{node.op_type} needs input {missing[0]}; it is absent"
    return None


def _rank_reason(node: Node, minimum: int) -> str | None:
    xs = node.input(0).shape
    if xs is not None and len(xs) < minimum:
        return f"{node.op_type} needs X of rank >= {minimum}; received shape {xs}"
    return None


# -- BatchNormalization ----------------------------------------------------------------------


def _bn_training_reason(node: Node) -> str | None:
    if node.opset >= 14:
        if int(node.attr("training_mode", 0)):
            return (
                "BatchNormalization with training_mode=1 (batch statistics) is not supported; "
                "only inference (training_mode=0) is"
            )
        return None
    if len(node.outputs) > 1:
        return (
            f"BatchNormalization (opset {node.opset}) with {len(node.outputs)} outputs runs in "
            f"training mode (batch statistics); only inference (output Y alone) is supported"
        )
    if node.opset < 7 and not int(node.attr("is_test", 0)):
        return "BatchNormalization before opset 7 with is_test=0 runs in training mode"
    return None


def _supports_batchnorm(node: Node) -> str | None:
    return first_reason(
        _needs_input(node, 5),
        check_dtypes(node, FLOAT_TYPES, (0, 1, 2, 3, 4)),
        _bn_training_reason(node),
        None if node.input(0) is None else _rank_reason(node, 2),
    )


def _bn_shape(p: np.ndarray, rank: int) -> tuple[int, ...]:
    """Broadcast shape of a parameter over (N, C, ...): (C,) -> (1, C, 1...); opset 7's
    per-activation (C, D1, ...) -> (1, C, D1, ...)."""
    return (1, *p.shape) + (1,) * (rank - 1 - p.ndim)


def _bn_affine(
    scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) in float64 with ``y = x * a + b``."""
    a = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    b = bias.astype(np.float64) - mean.astype(np.float64) * a
    return a, b


@impls.register(
    "BatchNormalization", "affine", priority=Priority.DEFAULT, supports=_supports_batchnorm
)
def batchnorm_affine(node: Node) -> Kernel:
    """BatchNormalization (inference) as one multiply-add with folded scale and shift."""
    eps = float(node.attr("epsilon", 1e-5))
    consts = [node.const_input(i) for i in range(1, 5)]
    folded = _bn_affine(*consts, eps) if all(c is not None for c in consts) else None
    n_out = len(node.outputs)

    def run(
        x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray
    ) -> np.ndarray | tuple[np.ndarray, ...]:
        ct = _compute_dtype(x.dtype)
        a, b = folded if folded is not None else _bn_affine(scale, bias, mean, var, eps)
        shape = _bn_shape(a, x.ndim)
        y = x.astype(ct, copy=False) * a.astype(ct).reshape(shape)
        y += b.astype(ct).reshape(shape)
        y = np.asarray(y, dtype=x.dtype, order="C")
        if n_out == 1:
            return y
        # inference mode: the running statistics pass through unchanged
        return (y, np.array(mean, order="C"), np.array(var, order="C"))[:n_out]

    return run


# -- LRN -------------------------------------------------------------------------------------


def _supports_lrn(node: Node) -> str | None:
    reason = first_reason(_needs_input(node, 1), check_dtypes(node, FLOAT_TYPES))
    if reason:
        return reason
    size = node.attr("size")
    if size is None or int(size) < 1:
        return f"LRN needs a positive size attribute; received {size!r}"
    return _rank_reason(node, 3)


@impls.register("LRN", "window", priority=Priority.DEFAULT, supports=_supports_lrn)
def lrn_window(node: Node) -> Kernel:
    """LRN: squares summed over a channel window with one shifted add per window offset."""
    size = int(node.attr("size"))
    alpha = float(node.attr("alpha", 1e-4))
    beta = float(node.attr("beta", 0.75))
    bias = float(node.attr("bias", 1.0))
    before = (size - 1) // 2
    after = size - 1 - before

    def run(x: np.ndarray) -> np.ndarray:
        # float64 for float16/float32: x**2 of |x| > 1.8e19 overflows float32, which turned
        # a representable result (x / (bias + alpha/size * sum x**2)**beta, tiny) into 0
        ct = np.dtype(np.float64)
        xc = x.astype(ct)
        c = x.shape[1]
        sq = np.zeros((x.shape[0], c + size - 1, *x.shape[2:]), dtype=ct)
        np.square(xc, out=sq[:, before : before + c])
        total = sq[:, 0:c].copy()
        for k in range(1, before + after + 1):
            total += sq[:, k : k + c]
        total *= alpha / size
        total += bias
        y = xc / total**beta
        return np.asarray(y, dtype=x.dtype, order="C")

    return run


# -- LayerNormalization ----------------------------------------------------------------------


def _stash_dtype(node: Node) -> np.dtype | None:
    code = int(node.attr("stash_type", 1))
    try:
        dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code))
    except (KeyError, TypeError, ValueError):
        return None
    return dt if dt.kind == "f" else None


def _supports_layernorm(node: Node) -> str | None:
    reason = first_reason(_needs_input(node, 2), check_dtypes(node, FLOAT_TYPES, (0, 1, 2)))
    if reason:
        return reason
    if _stash_dtype(node) is None:
        return (
            f"LayerNormalization stash_type={node.attr('stash_type')} is not a floating-point "
            f"type numpy has"
        )
    xs = node.input(0).shape
    if xs is not None:
        axis = int(node.attr("axis", -1))
        if not -len(xs) <= axis < len(xs):
            return f"LayerNormalization axis {axis} is out of range for X of shape {xs}"
    return None


def _layernorm_out_dtype(node: Node, i: int, stash: np.dtype) -> np.dtype:
    """dtype of Mean / InvStdDev: the declared one, else ONNX's U (the stash type)."""
    if i < len(node.outputs) and node.outputs[i].dtype is not None:
        return np.dtype(node.outputs[i].dtype)
    return stash


@impls.register(
    "LayerNormalization", "twopass", priority=Priority.DEFAULT, supports=_supports_layernorm
)
def layernorm_twopass(node: Node) -> Kernel:
    """LayerNormalization: mean, then variance of the centred values, in the stash type."""
    axis_attr = int(node.attr("axis", -1))
    eps = float(node.attr("epsilon", 1e-5))
    stash = _stash_dtype(node) or np.dtype(np.float32)
    n_out = len(node.outputs)

    def run(
        x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None
    ) -> np.ndarray | tuple[np.ndarray, ...]:
        ct = np.dtype(np.float64) if np.float64 in (x.dtype, stash) else stash
        axis = axis_attr + x.ndim if axis_attr < 0 else axis_attr
        axes = tuple(range(axis, x.ndim))
        xc = x.astype(ct, copy=False)
        mean = xc.mean(axis=axes, keepdims=True)
        d = xc - mean
        var = np.mean(np.square(d), axis=axes, keepdims=True)
        inv = 1.0 / np.sqrt(var + eps)
        d *= inv
        d *= scale.astype(ct, copy=False)
        if bias is not None:
            d += bias.astype(ct, copy=False)
        y = np.asarray(d, dtype=x.dtype, order="C")
        if n_out == 1:
            return y
        extras = [
            np.asarray(v, dtype=_layernorm_out_dtype(node, i, stash), order="C")
            for i, v in ((1, mean), (2, inv))
        ]
        return (y, *extras)[:n_out]

    return run


# -- Softmax / LogSoftmax --------------------------------------------------------------------


def _supports_softmax(node: Node) -> str | None:
    reason = first_reason(_needs_input(node, 1), check_dtypes(node, FLOAT_TYPES))
    if reason:
        return reason
    xs = node.input(0).shape
    axis = int(node.attr("axis", -1 if node.opset >= 13 else 1))
    if xs is not None and not -len(xs) <= axis < max(len(xs), 1):
        return f"{node.op_type} axis {axis} is out of range for X of shape {xs}"
    return None


def _softmax_axes(node: Node) -> Callable[[tuple[int, ...]], tuple[tuple[int, ...], int]]:
    """A function of the input shape giving (working shape, reduction axis) per ONNX opset."""
    coerce = node.opset < 13
    axis = int(node.attr("axis", 1 if coerce else -1))

    def plan(shape: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
        ax = axis + len(shape) if axis < 0 else axis
        if coerce:
            return (math.prod(shape[:ax]), math.prod(shape[ax:])), 1
        return shape, ax

    return plan


def _check_softmax_axis(node: Node, shape: tuple[int, ...]) -> None:
    """Raise when the axis does not fit X of ``shape``: :func:`_supports_softmax`'s check,
    made when the kernel runs for an X without a static shape."""
    axis = int(node.attr("axis", -1 if node.opset >= 13 else 1))
    if not -len(shape) <= axis < max(len(shape), 1):
        raise ValueError(
            f"{node.op_type} axis {axis} is out of range for X of shape {tuple(shape)}; "
            f"expected an axis in [-{len(shape)}, {max(len(shape), 1) - 1}]")


def _softmax_kernel(node: Node, log: bool) -> Kernel:
    plan = _softmax_axes(node)
    check_axis = node.input(0) is None or node.input(0).shape is None

    def run(x: np.ndarray) -> np.ndarray:
        if check_axis:
            _check_softmax_axis(node, x.shape)
        if x.ndim == 0 or x.size == 0:
            return np.asarray(np.zeros_like(x) if log else np.ones_like(x), order="C")
        ct = _compute_dtype(x.dtype)
        shape, ax = plan(x.shape)
        z = x.astype(ct, copy=True).reshape(shape)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            z -= z.max(axis=ax, keepdims=True)
            if log:
                z -= np.log(np.exp(z).sum(axis=ax, keepdims=True))
            else:
                np.exp(z, out=z)
                z /= z.sum(axis=ax, keepdims=True)
        return np.asarray(z.reshape(x.shape), dtype=x.dtype, order="C")

    return run


@impls.register("Softmax", "stable", priority=Priority.DEFAULT, supports=_supports_softmax)
def softmax_stable(node: Node) -> Kernel:
    """Softmax with the maximum subtracted first (2-D coercion before opset 13)."""
    return _softmax_kernel(node, log=False)


@impls.register("LogSoftmax", "stable", priority=Priority.DEFAULT, supports=_supports_softmax)
def logsoftmax_stable(node: Node) -> Kernel:
    """LogSoftmax as x - max - log(sum(exp(x - max))) (2-D coercion before opset 13)."""
    return _softmax_kernel(node, log=True)
