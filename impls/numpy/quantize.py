"""numpy reference kernels of ONNX's quantization operators: what quantized models (the QDQ and
QOperator formats of onnxruntime's and NNCF's tools) are made of.

- ``QuantizeLinear`` / ``DequantizeLinear``: per tensor, per axis (opset 13) and blocked
  (opset 21) scales; 8- and 16-bit integers (DequantizeLinear also reads int32 and the 4-bit
  int4 / uint4 weights of QDQ models, unpacked by onnx's ml_dtypes arrays).
- ``DynamicQuantizeLinear``: per-tensor uint8 with the range widened to include 0.
- ``MatMulInteger``: integer products accumulated in int32, zero points per tensor or per row
  of A / column of B.
- ``QLinearMatMul``: dequantized product, requantized to the output's scale and zero point.

The arithmetic is :mod:`layouts.precision`'s, which the ``u8`` layout's converters use too.
float8 types, and 4-bit outputs of QuantizeLinear, are not supported; ``supports()`` says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import TensorProto

from dispatch.graph import Node, Value
from dispatch.registry import Priority
from impls.numpy.table import impls
from layouts.precision import (
    QUANT_RANGES,
    dequantize_linear,
    dynamic_quantize_linear,
    quantize_linear,
)

Kernel = Callable[..., Any]

#: the float types a quantizer reads and a dequantizer writes
_FLOATS = ("float32", "float16")


def _dtype(v: Value | None) -> str | None:
    return None if v is None or v.dtype is None else np.dtype(v.dtype).name


def _output_dtype(node: Node) -> str | None:
    """The ``output_dtype`` attribute (opset 21+) as a numpy name, ``None`` when unset."""
    code = int(node.attr("output_dtype", 0) or 0)
    if not code:
        return None
    from onnx.helper import tensor_dtype_to_np_dtype

    try:
        return np.dtype(tensor_dtype_to_np_dtype(code)).name
    except (KeyError, TypeError, ValueError):
        return TensorProto.DataType.Name(code) if code in TensorProto.DataType.values() else str(code)


def _supports_quantize(node: Node) -> str | None:
    x = _dtype(node.input(0))
    if x is not None and x not in _FLOATS:
        return f"QuantizeLinear reads {'/'.join(_FLOATS)}, received {x}"
    if node.input(1) is None:
        return "QuantizeLinear needs its scale (input 1)"
    out = _dtype(node.input(2)) or _output_dtype(node) or "uint8"
    if out not in QUANT_RANGES:
        return (f"QuantizeLinear to {out} is not supported (float8 and 4-bit types: numpy has none); "
                f"types: {', '.join(QUANT_RANGES)}")
    return None


@impls.register("QuantizeLinear", "rint", priority=Priority.DEFAULT, supports=_supports_quantize)
def quantize_linear_rint(node: Node) -> Kernel:
    """QuantizeLinear: ``saturate(round_half_even(x / scale) + zero_point)``."""
    axis, block = int(node.attr("axis", 1)), int(node.attr("block_size", 0))
    out = _output_dtype(node)

    def run(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None = None) -> np.ndarray:
        return quantize_linear(x, scale, zero_point, axis=axis, block_size=block, dtype=out)

    return run


#: the types DequantizeLinear reads: 4-bit ones as ml_dtypes' arrays (onnx's numpy_helper)
_DEQUANTIZED = (*QUANT_RANGES, "int32", "int4", "uint4")


def _supports_dequantize(node: Node) -> str | None:
    x = _dtype(node.input(0))
    if x is not None and x not in _DEQUANTIZED:
        return (f"DequantizeLinear reads {', '.join(_DEQUANTIZED)}, received {x} "
                "(float8 types: numpy has none)")
    if node.input(1) is None:
        return "DequantizeLinear needs its scale (input 1)"
    scale = _dtype(node.input(1))
    if scale is not None and scale not in _FLOATS:
        return f"DequantizeLinear's scale is {'/'.join(_FLOATS)}, received {scale}"
    out = _output_dtype(node)
    if out is not None and out not in _FLOATS:
        return f"DequantizeLinear writes {'/'.join(_FLOATS)}, output_dtype asks for {out}"
    return None


@impls.register("DequantizeLinear", "affine", priority=Priority.DEFAULT, supports=_supports_dequantize)
def dequantize_linear_affine(node: Node) -> Kernel:
    """DequantizeLinear: ``(x - zero_point) * scale``."""
    axis, block = int(node.attr("axis", 1)), int(node.attr("block_size", 0))
    out = _output_dtype(node)

    def run(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None = None) -> np.ndarray:
        return dequantize_linear(x, scale, zero_point, axis=axis, block_size=block, dtype=out)

    return run


def _supports_dynamic(node: Node) -> str | None:
    x = _dtype(node.input(0))
    if x is not None and x != "float32":
        return f"DynamicQuantizeLinear reads float32, received {x}"
    return None


@impls.register("DynamicQuantizeLinear", "minmax", priority=Priority.DEFAULT, supports=_supports_dynamic)
def dynamic_quantize_linear_minmax(node: Node) -> Kernel:
    """DynamicQuantizeLinear: uint8 over the tensor's [min(0, x), max(0, x)]."""

    def run(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return dynamic_quantize_linear(x)

    return run


def _supports_int_pair(node: Node, op: str, inputs: tuple[int, int]) -> str | None:
    for i in inputs:
        d = _dtype(node.input(i))
        if d is not None and d not in ("uint8", "int8"):
            return f"{op} input {i} is uint8 or int8, received {d}"
    return None


def _zero_point(zp: np.ndarray | None, rank: int, axis_from_end: int) -> np.ndarray | int:
    """A MatMulInteger zero point: a scalar, or one per row of A (``axis_from_end`` 2) / per
    column of B (1), shaped to broadcast."""
    if zp is None:
        return 0
    zp = np.asarray(zp).astype(np.int32)
    if zp.size == 1:
        return zp.reshape(())
    if axis_from_end == 2:  # one per row of A: (..., M, 1)
        return zp.reshape((*zp.shape, 1)) if zp.ndim < rank else zp
    return zp  # one per column of B: (..., N) broadcasts over the rows


@impls.register("MatMulInteger", "int32", priority=Priority.DEFAULT,
                supports=lambda n: _supports_int_pair(n, "MatMulInteger", (0, 1)))
def matmul_integer_int32(node: Node) -> Kernel:
    """MatMulInteger: ``(A - a_zero_point) @ (B - b_zero_point)`` accumulated in int32."""

    def run(a: np.ndarray, b: np.ndarray, a_zp: np.ndarray | None = None,
            b_zp: np.ndarray | None = None) -> np.ndarray:
        aa = a.astype(np.int32) - _zero_point(a_zp, a.ndim, 2)
        bb = b.astype(np.int32) - _zero_point(b_zp, b.ndim, 1)
        return np.matmul(aa, bb).astype(np.int32)

    return run


@impls.register("QLinearMatMul", "dequantized", priority=Priority.DEFAULT,
                supports=lambda n: _supports_int_pair(n, "QLinearMatMul", (0, 3)))
def qlinear_matmul_dequantized(node: Node) -> Kernel:
    """QLinearMatMul: the integer product (exact in int32) times ``a_scale * b_scale /
    y_scale``, plus the output's zero point, rounded half to even and saturated to its type."""

    def run(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp=None) -> np.ndarray:
        aa = a.astype(np.int32) - _zero_point(a_zp, a.ndim, 2)
        bb = b.astype(np.int32) - _zero_point(b_zp, b.ndim, 1)
        sa = np.asarray(a_scale, np.float32)
        sa = sa.reshape((*sa.shape, 1)) if sa.size > 1 else sa.reshape(())  # per row of A
        sb = np.asarray(b_scale, np.float32)
        sb = sb if sb.size > 1 else sb.reshape(())  # per column of B
        d = np.matmul(aa, bb) * (sa * sb / np.asarray(y_scale, np.float32).reshape(()))
        dtype = np.asarray(y_zp).dtype if y_zp is not None else a.dtype
        if y_zp is not None:
            d = d + np.asarray(y_zp).reshape(()).astype(np.float32)
        lo, hi = QUANT_RANGES[np.dtype(dtype).name]
        return np.clip(np.rint(d), lo, hi).astype(dtype)

    return run
