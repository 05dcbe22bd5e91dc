"""numpy references of onnxruntime's QOperator-format quantized operators (domain
``com.microsoft``, issue 52), what ``quantize_static`` / ``quantize_dynamic`` write with
``quant_format=QuantFormat.QOperator`` (schemas: :mod:`dispatch.contrib_schemas_quantized`).

Tensors are uint8 or int8 with per-tensor float32 scales and zero points (a zero point omitted
is 0). Every result is computed in float32 in the order onnxruntime's MLAS kernels compute it,
rounded half to even and saturated to the output type:

- ``QLinearAdd``: ``rint(fma(A, ra, fma(B, rb, C_zero - (ra * A_zero + rb * B_zero))))`` with
  ``ra = A_scale / C_scale`` and ``rb = B_scale / C_scale``, fused multiply-adds as MLAS's AVX2
  kernel computes them (a one-element operand folded into the constant part first): equal to
  onnxruntime for operands of one shape. Where A and B broadcast otherwise, onnxruntime goes by
  spans in another order (measured with onnxruntime 1.32: 17 of 24000 int8 sums and 51 of
  24000 uint8 ones one step apart), and MLAS's SSE2 kernel (a CPU without AVX2) rounds the
  products apart: one step, allowed (dispatch.compare.QUANTIZED_STEPS).
- ``QLinearMul``: ``rint((A - A_zero) (B - B_zero) * (A_scale * B_scale / C_scale)) + C_zero``.
- ``QLinearSigmoid`` / ``QLinearLeakyRelu``: a 256-entry table of every input value: dequantized
  (``(q - zero) * scale``), the function in float32, quantized (``rint(y / Y_scale) + Y_zero``).
  onnxruntime's sigmoid is MLAS's polynomial logistic, within a few float32 ulps of the exact
  one: where ``y / Y_scale`` falls that close to a half, onnxruntime may round the other way
  (a difference of 1 quantization step; dispatch.compare.QUANTIZED_STEPS allows it).
- ``QLinearConcat``: each input requantized to Y's scale and zero point by such a table (copied
  where its scale and zero point are Y's), then concatenated along ``axis``.
- ``QLinearAveragePool``: ONNX's AveragePool (the same window attributes; channels first or,
  ``channels_last``, last) of ``(X - x_zero) * x_scale`` in float32, then ``rint(y / y_scale) +
  y_zero``: onnxruntime sums in another order, a value may fall on the other side of a half (one
  step; measured with onnxruntime 1.32: up to 9 of 252 outputs with pads or ceil_mode).
- ``QGemm``: ``C + (A - a_zero) (B - b_zero)`` (transposed as transA / transB say) in exact
  integers times ``a_scale * b_scale * alpha`` in float32 (b_scale / b_zero_point per tensor or
  per column): the float result, or ``rint(that / y_scale) + y_zero`` with y_scale.
- ``QLinearGlobalAveragePool``: the integer sum over the spatial axes (channels first, or last
  with ``channels_last``), ``rint((sum - x_zero * size) * (x_scale / (y_scale * size))) + y_zero``.
- ``QLinearSoftmax``: softmax of the dequantized X along the fused Softmax opset's axes, in
  float64, times onnxruntime's ``floor(1 / y_scale)``, rounded and saturated. onnxruntime's int8
  kernel wraps a value of 128 to -128 (its check is against 255); this reference saturates.

Forms not covered (per-channel scales, QLinearConcat's float inputs...) are refused by the
kernel's ``supports`` with what was received and what is covered: such a node runs on
onnxruntime. ``QAttention``
is in :mod:`impls.numpy.contrib_qattention`, ``DynamicQuantizeLSTM`` in
:mod:`impls.numpy.contrib_qrecurrent`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.contrib_activations import MS_DOMAIN
from impls.numpy.conv import window_reason
from impls.numpy.misc import check_dtypes, first_reason
from impls.numpy.pool import avgpool_reduce
from impls.numpy.table import impls

Kernel = Callable[..., Any]

#: the quantized types of the QOperator format
QTYPES = frozenset({"uint8", "int8"})


# -- the math ------------------------------------------------------------------------------------


def qrange(dtype: np.dtype) -> tuple[int, int]:
    """The saturation bounds of a quantized type."""
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def scalar(x: np.ndarray | None, default: float = 0.0) -> np.float32:
    """A per-tensor scale or zero point as a float32 scalar (``default`` when omitted)."""
    return np.float32(default) if x is None else np.float32(np.asarray(x).reshape(-1)[0])


def saturate(v: np.ndarray, zero: np.float32 | float, dtype: np.dtype) -> np.ndarray:
    """``rint(v) + zero`` saturated to ``dtype`` (``v`` float32: onnxruntime rounds before it
    adds the zero point, half to even)."""
    lo, hi = qrange(dtype)
    with np.errstate(invalid="ignore"):
        r = np.rint(np.asarray(v, np.float32)).astype(np.float64) + float(zero)
    return np.clip(np.nan_to_num(r, nan=float(zero)), lo, hi).astype(dtype)


def fma32(x: np.ndarray, y: np.float32, z: np.ndarray | np.float32) -> np.ndarray:
    """``x * y + z`` rounded once to float32 (a fused multiply-add: ``x`` small integers, so
    the float64 sum is exact), broadcast."""
    return (np.asarray(x, np.float64) * np.float64(y) + np.asarray(z, np.float64)).astype(np.float32)


def quantize(y: np.ndarray, scale: np.float32, zero: np.float32 | float, dtype: np.dtype) -> np.ndarray:
    """MLAS's QuantizeLinear of float32 ``y``: ``rint(y / scale) + zero``, saturated."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return saturate(np.asarray(y, np.float32) / np.float32(scale), zero, dtype)


def lookup_table(dtype: np.dtype, x_scale: np.float32, x_zero: np.float32, y_scale: np.float32,
                 y_zero: np.float32, out_dtype: np.dtype,
                 fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """onnxruntime's table of a quantized unary function: for every value q of ``dtype`` (in
    order from its minimum), ``quantize(fn((q - x_zero) * x_scale))``."""
    lo, hi = qrange(dtype)
    q = np.arange(lo, hi + 1, dtype=np.float32)
    x = (q - np.float32(x_zero)) * np.float32(x_scale)
    with np.errstate(all="ignore"):
        return quantize(fn(x.astype(np.float32)), y_scale, y_zero, out_dtype)


def apply_table(table: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``table`` looked up at every element of the quantized ``x``."""
    lo, _ = qrange(x.dtype)
    return table[x.astype(np.int64) - lo]


def sigmoid32(x: np.ndarray) -> np.ndarray:
    """The logistic function in float32 (computed in float64 and rounded once)."""
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32)


def leaky_relu32(alpha: float) -> Callable[[np.ndarray], np.ndarray]:
    """LeakyRelu of float32 values: ``x`` where ``x >= 0``, else ``x * alpha`` (in float32)."""
    a = np.float32(alpha)
    return lambda x: np.where(x >= 0, x, x * a).astype(np.float32)


# -- the supports() of per-tensor quantization ------------------------------------------------------


def per_tensor_reason(node: Node, indices: tuple[int, ...], names: dict[int, str]) -> str | None:
    """Why one of ``node``'s scales or zero points (``indices``) is not per tensor, or ``None``."""
    for k in indices:
        v = node.input(k)
        if v is not None and v.shape is not None and math.prod(int(d) if isinstance(d, int) else 2
                                                               for d in v.shape) != 1:
            return (f"{node.op_type} with {names.get(k, f'input {k}')} of shape {list(v.shape)}: supported "
                    f"are per-tensor scales and zero points (one value)")
    return None


def _binary_reason(node: Node) -> str | None:
    names = {1: "A_scale", 2: "A_zero_point", 4: "B_scale", 5: "B_zero_point", 6: "C_scale",
             7: "C_zero_point"}
    return first_reason(check_dtypes(node, QTYPES, (0, 2, 3, 5, 7), same=True),
                        check_dtypes(node, frozenset({"float32"}), (1, 4, 6)),
                        per_tensor_reason(node, (1, 2, 4, 5, 6, 7), names))


@impls.register("QLinearAdd", "ms_float32", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_binary_reason)
def ms_qlinear_add(node: Node) -> Kernel:
    """com.microsoft QLinearAdd: the sum of the dequantized A and B, requantized."""

    def run(a: np.ndarray, a_scale: np.ndarray, a_zero: np.ndarray | None, b: np.ndarray,
            b_scale: np.ndarray, b_zero: np.ndarray | None, c_scale: np.ndarray,
            c_zero: np.ndarray | None = None) -> np.ndarray:
        sc = scalar(c_scale)
        ra, rb = scalar(a_scale) / sc, scalar(b_scale) / sc
        fixed = scalar(c_zero) - (ra * scalar(a_zero) + rb * scalar(b_zero))
        if b.size == 1 and a.size != 1:  # B a scalar: folded into the fixed part
            v = fma32(a, ra, fixed + np.float32(b.reshape(-1)[0]) * rb)
        elif a.size == 1 and b.size != 1:  # A a scalar: onnxruntime swaps the operands
            v = fma32(b, rb, fixed + np.float32(a.reshape(-1)[0]) * ra)
        else:
            v = fma32(a, ra, fma32(b, rb, fixed))
        return np.ascontiguousarray(saturate(v, 0.0, a.dtype))

    return run


@impls.register("QLinearMul", "ms_float32", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_binary_reason)
def ms_qlinear_mul(node: Node) -> Kernel:
    """com.microsoft QLinearMul: the product of the dequantized A and B, requantized."""

    def run(a: np.ndarray, a_scale: np.ndarray, a_zero: np.ndarray | None, b: np.ndarray,
            b_scale: np.ndarray, b_zero: np.ndarray | None, c_scale: np.ndarray,
            c_zero: np.ndarray | None = None) -> np.ndarray:
        multiplier = scalar(a_scale) * scalar(b_scale) / scalar(c_scale)
        product = (a.astype(np.float32) - scalar(a_zero)) * (b.astype(np.float32) - scalar(b_zero))
        return np.ascontiguousarray(saturate(product * multiplier, scalar(c_zero), a.dtype))

    return run


def one_input_reason(node: Node, names: dict[int, str]) -> str | None:
    """Why ``node`` of the form (X, x scale, x zero point, y scale, y zero point), its input
    names ``names``, is not covered: X and the zero points one quantized type, float32
    scales, one value each."""
    return first_reason(check_dtypes(node, QTYPES, (0, 2, 4), same=True),
                        check_dtypes(node, frozenset({"float32"}), (1, 3)),
                        per_tensor_reason(node, (1, 2, 3, 4), names))


#: the input names of the quantized pools
POOL_INPUTS = {1: "x_scale", 2: "x_zero_point", 3: "y_scale", 4: "y_zero_point"}


def _unary_reason(node: Node) -> str | None:
    return one_input_reason(node, {1: "X_scale", 2: "X_zero_point", 3: "Y_scale", 4: "Y_zero_point"})


def _unary_kernel(fn: Callable[[np.ndarray], np.ndarray]) -> Kernel:
    def run(x: np.ndarray, x_scale: np.ndarray, x_zero: np.ndarray | None, y_scale: np.ndarray,
            y_zero: np.ndarray | None = None) -> np.ndarray:
        table = lookup_table(x.dtype, scalar(x_scale), scalar(x_zero), scalar(y_scale), scalar(y_zero),
                             x.dtype, fn)
        return np.ascontiguousarray(apply_table(table, x))

    return run


@impls.register("QLinearSigmoid", "ms_table", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_unary_reason)
def ms_qlinear_sigmoid(node: Node) -> Kernel:
    """com.microsoft QLinearSigmoid: a table of the sigmoid of every quantized value."""
    return _unary_kernel(sigmoid32)


@impls.register("QLinearLeakyRelu", "ms_table", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_unary_reason)
def ms_qlinear_leaky_relu(node: Node) -> Kernel:
    """com.microsoft QLinearLeakyRelu: a table of the LeakyRelu of every quantized value."""
    return _unary_kernel(leaky_relu32(float(node.attr("alpha", np.float32(0.01)))))


# -- QLinearConcat -----------------------------------------------------------------------------------


def _concat_reason(node: Node) -> str | None:
    n = len(node.inputs)
    if n < 5 or (n - 2) % 3:
        return (f"QLinearConcat with {n} inputs: supported are Y_scale, Y_zero_point and then (tensor, "
                f"scale, zero point) triples")
    tensors = tuple(range(2, n, 3))
    if any(node.input(k) is None for k in range(n)):
        return "QLinearConcat with an omitted input: supported are every tensor, scale and zero point given"
    names = {k: f"the scale or zero point of input {k}" for k in range(n)}
    return first_reason(check_dtypes(node, QTYPES, (1, *tensors, *(k + 2 for k in tensors)), same=True),
                        check_dtypes(node, frozenset({"float32"}), (0, *(k + 1 for k in tensors))),
                        per_tensor_reason(node, (0, 1, *(k + j for k in tensors for j in (1, 2))), names))


@impls.register("QLinearConcat", "ms_table", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_concat_reason)
def ms_qlinear_concat(node: Node) -> Kernel:
    """com.microsoft QLinearConcat: every input requantized to Y's parameters, concatenated."""
    axis = int(node.attr("axis"))

    def run(y_scale: np.ndarray, y_zero: np.ndarray, *triples: np.ndarray) -> np.ndarray:
        ys, yz = scalar(y_scale), scalar(y_zero)
        parts = []
        for k in range(0, len(triples), 3):
            x, xs, xz = triples[k], scalar(triples[k + 1]), scalar(triples[k + 2])
            if xs == ys and xz == yz:
                parts.append(x)
            else:
                table = lookup_table(x.dtype, xs, xz, ys, yz, y_zero.dtype, lambda v: v)
                parts.append(apply_table(table, x))
        return np.ascontiguousarray(np.concatenate(parts, axis=axis % parts[0].ndim).astype(y_zero.dtype))

    return run


# -- QLinearGlobalAveragePool ---------------------------------------------------------------------


def _pool_reason(node: Node) -> str | None:
    x = node.input(0)
    if x is not None and x.shape is not None and len(x.shape) < 3:
        return (f"QLinearGlobalAveragePool with X of shape {list(x.shape)}: supported are 3-D and more "
                f"(N, C, spatial...) or, channels_last, (N, spatial..., C)")
    return one_input_reason(node, POOL_INPUTS)


@impls.register("QLinearGlobalAveragePool", "ms_int_sum", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_pool_reason)
def ms_qlinear_global_average_pool(node: Node) -> Kernel:
    """com.microsoft QLinearGlobalAveragePool: the integer sum over the spatial axes, requantized."""
    last = bool(int(node.attr("channels_last", 0)))

    def run(x: np.ndarray, x_scale: np.ndarray, x_zero: np.ndarray, y_scale: np.ndarray,
            y_zero: np.ndarray) -> np.ndarray:
        axes = tuple(range(1, x.ndim - 1)) if last else tuple(range(2, x.ndim))
        size = math.prod(x.shape[a] for a in axes)
        total = x.astype(np.int64).sum(axis=axes, keepdims=True) - int(scalar(x_zero)) * size
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = scalar(x_scale) / (scalar(y_scale) * np.float32(size))
            v = total.astype(np.float32) * scale
        return np.ascontiguousarray(saturate(v, scalar(y_zero), x.dtype))

    return run


# -- QGemm -------------------------------------------------------------------------------------------


def _qgemm_reason(node: Node) -> str | None:
    for k, name in ((0, "A"), (3, "B")):
        v = node.input(k)
        if v is not None and v.shape is not None and len(v.shape) != 2:
            return f"QGemm with {name} of shape {list(v.shape)}: supported is 2-D"
    b = node.input(3)
    n = None
    if b is not None and b.shape is not None and isinstance(b.shape[0], int):
        n = b.shape[0] if int(node.attr("transB", 0)) else b.shape[1]
    for k, name in ((4, "b_scale"), (5, "b_zero_point")):
        v = node.input(k)
        if v is not None and v.shape is not None and math.prod(int(d) if isinstance(d, int) else 2
                                                               for d in v.shape) not in (1, n):
            return (f"QGemm with {name} of shape {list(v.shape)}: supported are one value or one per column "
                    f"of B ({n})")
    names = {1: "a_scale", 2: "a_zero_point", 7: "y_scale", 8: "y_zero_point"}
    return first_reason(check_dtypes(node, QTYPES, (0, 2), same=True),
                        check_dtypes(node, QTYPES, (3, 5), same=True),
                        check_dtypes(node, frozenset({"int32"}), (6,)),
                        per_tensor_reason(node, (1, 2, 7, 8), names))


@impls.register("QGemm", "ms_int32", domain=MS_DOMAIN, priority=Priority.DEFAULT, supports=_qgemm_reason)
def ms_qgemm(node: Node) -> Kernel:
    """com.microsoft QGemm: ``C + (A - a_zero) (B - b_zero)`` in exact integers, times ``alpha *
    a_scale * b_scale`` (float32): the float result, or it requantized by y_scale / y_zero_point."""
    alpha = np.float32(node.attr("alpha", 1.0))
    trans_a, trans_b = bool(int(node.attr("transA", 0))), bool(int(node.attr("transB", 0)))

    def run(a: np.ndarray, a_scale: np.ndarray, a_zero: np.ndarray, b: np.ndarray, b_scale: np.ndarray,
            b_zero: np.ndarray, c: np.ndarray | None = None, y_scale: np.ndarray | None = None,
            y_zero: np.ndarray | None = None) -> np.ndarray:
        a2 = a.T if trans_a else a
        b2 = b.T if trans_b else b
        acc = np.matmul(a2.astype(np.int64) - int(scalar(a_zero)),
                        b2.astype(np.int64) - b_zero.astype(np.int64).reshape(-1))
        if c is not None:
            acc = acc + c.astype(np.int64)
        scale = (scalar(a_scale) * b_scale.astype(np.float32).reshape(-1)) * alpha
        if y_scale is None:
            return np.ascontiguousarray((acc.astype(np.float32) * scale).astype(np.float32))
        with np.errstate(divide="ignore", invalid="ignore"):
            multiplier = (scale / scalar(y_scale)).astype(np.float32)
        dtype = y_zero.dtype if y_zero is not None else a.dtype
        return np.ascontiguousarray(saturate(acc.astype(np.float32) * multiplier, scalar(y_zero), dtype))

    return run


# -- QLinearAveragePool --------------------------------------------------------------------------------


def _average_pool_reason(node: Node) -> str | None:
    x = node.input(0)
    if x is not None and x.shape is not None and len(x.shape) < 3:
        return (f"QLinearAveragePool with X of shape {list(x.shape)}: supported are 3-D and more (N, C, "
                f"spatial...) or, channels_last, (N, spatial..., C)")
    kernel = node.attr("kernel_shape")
    if kernel is None or any(int(k) < 1 for k in kernel):
        return f"QLinearAveragePool with kernel_shape={kernel}: supported are positive sizes"
    return first_reason(one_input_reason(node, POOL_INPUTS),
                        window_reason(node, len(kernel)))


@impls.register("QLinearAveragePool", "ms_float32", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_average_pool_reason)
def ms_qlinear_average_pool(node: Node) -> Kernel:
    """com.microsoft QLinearAveragePool: AveragePool (:mod:`impls.numpy.pool`, the same window
    attributes) of the dequantized X in float32, requantized."""
    pool = avgpool_reduce(node)
    last = bool(int(node.attr("channels_last", 0)))

    def run(x: np.ndarray, x_scale: np.ndarray, x_zero: np.ndarray | None, y_scale: np.ndarray,
            y_zero: np.ndarray | None = None) -> np.ndarray:
        xf = (x.astype(np.float32) - scalar(x_zero)) * scalar(x_scale)
        if last:
            xf = np.moveaxis(xf, -1, 1)
        y = pool(np.ascontiguousarray(xf))
        if last:
            y = np.moveaxis(y, 1, -1)
        zero_dtype = y_zero.dtype if y_zero is not None else x.dtype
        return np.ascontiguousarray(quantize(y, scalar(y_scale), scalar(y_zero), zero_dtype))

    return run


# -- QLinearSoftmax ------------------------------------------------------------------------------------


def _softmax_reason(node: Node) -> str | None:
    # (its required 'opset' attribute is checked when the model is imported)
    return one_input_reason(node, {1: "X_scale", 2: "x_zero_point", 3: "y_scale", 4: "y_zero_point"})


@impls.register("QLinearSoftmax", "ms_float64", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_softmax_reason)
def ms_qlinear_softmax(node: Node) -> Kernel:
    """com.microsoft QLinearSoftmax: softmax of ``X_scale * X`` (the zero point cancels; onnxruntime
    ignores it) in float64, times ``floor(1 / y_scale)`` (onnxruntime's multiplier: ``1 / y_scale``
    for the quantizer's 1/256), rounded half to even, plus ``y_zero_point``, saturated. The Softmax
    opset it fused decides the axes: before 13, every axis from ``axis`` on; from 13, ``axis``
    alone (-1 by default either way: the schema's default, which onnxruntime applies).
    onnxruntime sums a float32 table: a value at a half may round the other way (one step;
    dispatch.compare.QUANTIZED_STEPS)."""
    opset = int(node.attr("opset"))
    axis = int(node.attr("axis", -1))

    def run(x: np.ndarray, x_scale: np.ndarray, x_zero: np.ndarray | None, y_scale: np.ndarray,
            y_zero: np.ndarray | None = None) -> np.ndarray:
        if x.size == 0:
            return np.empty(x.shape, x.dtype)
        a = axis + x.ndim if axis < 0 else axis
        if not 0 <= a < x.ndim:
            raise ValueError(f"QLinearSoftmax: axis {axis} is outside X's dimensions {list(x.shape)}")
        rows = x.reshape(math.prod(x.shape[:a]), -1) if opset < 13 else np.moveaxis(x, a, -1)
        v = rows.astype(np.float64) * float(scalar(x_scale))
        e = np.exp(v - v.max(axis=-1, keepdims=True))
        with np.errstate(divide="ignore"):
            multiplier = np.floor(1.0 / float(scalar(y_scale)))
        y = saturate(e * multiplier / e.sum(axis=-1, keepdims=True), scalar(y_zero), x.dtype)
        y = y.reshape(x.shape) if opset < 13 else np.moveaxis(y, -1, a)
        return np.ascontiguousarray(y)

    return run
