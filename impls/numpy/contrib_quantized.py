"""numpy references of onnxruntime's contrib quantized matmuls (domain ``com.microsoft``, issue
52): MatMulNBits, DynamicQuantizeMatMul and MatMulIntegerToFloat (schemas:
:mod:`dispatch.contrib_schemas_attention`).

- ``MatMulNBits(A, B, scales, zero_points?, g_idx?, bias?)``: ``Y = A @ W^T (+ bias)`` with W
  (N, K) dequantized from B (N, blocks, block_size * bits / 8) uint8, ``bits`` (2, 4 or 8) per
  value, the low bits of each byte first; block ``j`` of row ``n`` is ``(q - zero) *
  scales[n, j]``. Zero points: absent, ``2^(bits - 1)``; uint8, packed like B, each row's
  blocks padded to whole bytes; or floats of the scales' type. ``g_idx`` (K,) names the block
  of each column instead of ``k // block_size``. W is dequantized in float64 and A multiplied
  in float64: ``accuracy_level`` (which lets onnxruntime quantize A to int8 on the fly, level
  4) changes onnxruntime's rounding, not the reference (the tests' tolerance says by how much).
- ``DynamicQuantizeMatMul(A, B, b_scale, b_zero_point?, bias?)``: A quantized to uint8 per
  tensor as onnxruntime's DynamicQuantizeLinear does (scale ``(max(A, 0) - min(A, 0)) / 255``,
  zero point rounded half to even), then ``(A_q - a_zero) @ (B - b_zero) * a_scale * b_scale``
  (per-tensor or per-column b_scale / b_zero_point) ``(+ bias)``.
- ``MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zero_point?, b_zero_point?, bias?)``:
  ``(A - a_zero) @ (B - b_zero) * a_scale * b_scale (+ bias)``, in a_scale's type.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.contrib_activations import MS_DOMAIN
from impls.numpy.misc import check_dtypes, first_reason
from impls.numpy.table import impls

Kernel = Callable[..., Any]

NBITS_TYPES = frozenset({"float16", "float32"})
#: the bit widths MatMulNBits' reference unpacks
NBITS = (2, 4, 8)


def unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first ``count`` ``bits``-bit values of each row of ``packed`` (uint8, the low bits of
    each byte first), as int64 (..., count)."""
    per_byte = 8 // bits
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    values = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return values.reshape(*packed.shape[:-1], -1)[..., :count].astype(np.int64)


def block_of_columns(k: int, block_size: int, g_idx: np.ndarray | None) -> np.ndarray:
    """The block (scale / zero point column) of each of the K columns."""
    return np.arange(k) // block_size if g_idx is None else g_idx.astype(np.int64)


def dequantize_nbits(b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, n: int, k: int,
                     bits: int, block_size: int, g_idx: np.ndarray | None = None) -> np.ndarray:
    """W (N, K) in float64 from MatMulNBits' B, scales and zero points (module docstring)."""
    blocks = math.ceil(k / block_size)
    q = unpack_bits(b.reshape(n, blocks, -1), bits, block_size).reshape(n, -1)[:, :k]
    scale = scales.astype(np.float64).reshape(n, blocks)
    if zero_points is None:
        zero = np.full((n, blocks), float(1 << (bits - 1)))
    elif zero_points.dtype == np.uint8:
        zero = unpack_bits(zero_points.reshape(n, -1), bits, blocks).astype(np.float64)
    else:
        zero = zero_points.astype(np.float64).reshape(n, blocks)
    col = block_of_columns(k, block_size, g_idx)
    return (q - zero[:, col]) * scale[:, col]


def _nbits_reason(node: Node) -> str | None:
    bits, block = int(node.attr("bits", 4)), int(node.attr("block_size", 0))
    if bits not in NBITS:
        return f"MatMulNBits with bits={bits}: supported are {', '.join(map(str, NBITS))}"
    if block < 16 or block & (block - 1):
        return f"MatMulNBits with block_size={block}: supported are powers of 2 from 16"
    if int(node.attr("weight_prepacked", 0)):
        return "MatMulNBits with weight_prepacked=1: supported is 0 (B in its plain packed layout)"
    zp = node.input(3)
    if zp is not None and node.input(4) is not None and (zp.dtype is None or np.dtype(zp.dtype) == np.uint8):
        return ("MatMulNBits with g_idx and uint8 zero_points: supported are g_idx with float zero points or "
                "none (onnxruntime 1.32 ignores packed zero points when g_idx is given)")
    if zp is not None and zp.dtype is not None and np.dtype(zp.dtype) != np.uint8:
        scales = node.input(2)
        if scales is not None and scales.dtype is not None and np.dtype(scales.dtype) != np.dtype(zp.dtype):
            return "MatMulNBits with float zero_points of a type other than the scales': not supported"
    return None


def _supports_nbits(node: Node) -> str | None:
    return first_reason(check_dtypes(node, NBITS_TYPES, (0, 2, 5), same=True), _nbits_reason(node))


@impls.register("MatMulNBits", "ms_dequantized", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_supports_nbits)
def ms_matmul_nbits(node: Node) -> Kernel:
    """com.microsoft MatMulNBits: A times the dequantized W (N, K) transposed, plus bias."""
    n, k = int(node.attr("N")), int(node.attr("K"))
    bits, block = int(node.attr("bits", 4)), int(node.attr("block_size"))

    def run(a: np.ndarray, b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None = None,
            g_idx: np.ndarray | None = None, bias: np.ndarray | None = None) -> np.ndarray:
        w = dequantize_nbits(b, scales, zero_points, n, k, bits, block, g_idx)
        y = np.matmul(a.astype(np.float64), w.T)
        if bias is not None:
            y = y + bias.astype(np.float64)
        return np.ascontiguousarray(y.astype(a.dtype))

    return run


# -- DynamicQuantizeMatMul and MatMulIntegerToFloat ------------------------------------------------


def dynamic_quantize(a: np.ndarray) -> tuple[np.ndarray, float, int]:
    """A (float32) as onnxruntime's DynamicQuantizeLinear quantizes it to uint8 per tensor:
    (A_q, scale, zero point), the range widened to hold 0, the zero point and the values
    rounded half to even in float32; a scale of NaN where A holds NaN or +-inf or its range
    overflows float32 (the result is then undefined: NaN)."""
    lo = min(float(a.min(initial=0.0)), 0.0)
    hi = max(float(a.max(initial=0.0)), 0.0)
    with np.errstate(all="ignore"):
        scale = np.float32((hi - lo) / 255.0)
    if scale == 0:
        return np.zeros(a.shape, np.int64), 0.0, 0
    if not np.isfinite(scale):  # NaN or +-inf in A (or a range past float32): no range to quantize over
        return np.zeros(a.shape, np.int64), math.nan, 0
    zero = int(np.clip(np.round(np.float32(0.0) - np.float32(lo) / scale), 0, 255))
    q = np.clip(np.round(a.astype(np.float32) / scale) + zero, 0, 255).astype(np.int64)
    return q, float(scale), zero


def integer_matmul(a: np.ndarray, a_zero: np.ndarray | int, b: np.ndarray,
                   b_zero: np.ndarray | None) -> np.ndarray:
    """``(A - a_zero) @ (B - b_zero)`` in exact integers (float64 holds them), b_zero a scalar
    or one per column of B."""
    bz = 0 if b_zero is None else b_zero.astype(np.int64)
    return np.matmul(a.astype(np.int64) - a_zero, b.astype(np.int64) - bz).astype(np.float64)


def _quantized_matmul_reason(node: Node, b_scale: int, b_zero: int) -> str | None:
    b, n = node.input(1), None
    if b is not None and b.shape is not None:
        if len(b.shape) != 2:
            return f"{node.op_type} with B of shape {list(b.shape)}: supported is 2-D (K, N)"
        n = b.shape[1]
    for k, name in ((b_scale, "b_scale"), (b_zero, "b_zero_point")):
        v = node.input(k)
        if v is not None and v.shape is not None and not (
                math.prod(v.shape) == 1 or (len(v.shape) == 1 and v.shape[0] == n)):
            return (f"{node.op_type} with {name} of shape {list(v.shape)}: supported are one value or one "
                    f"per column of B ({n})")
    return None


def _supports_dq_matmul(node: Node) -> str | None:
    return first_reason(check_dtypes(node, frozenset({"float32"}), (0, 2, 4), same=True),
                        _quantized_matmul_reason(node, 2, 3))


@impls.register("DynamicQuantizeMatMul", "ms_integer", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_supports_dq_matmul)
def ms_dynamic_quantize_matmul(node: Node) -> Kernel:
    """com.microsoft DynamicQuantizeMatMul: A quantized to uint8 as it runs, times B, rescaled."""

    def run(a: np.ndarray, b: np.ndarray, b_scale: np.ndarray, b_zero: np.ndarray | None = None,
            bias: np.ndarray | None = None) -> np.ndarray:
        q, scale, zero = dynamic_quantize(a)
        with np.errstate(all="ignore"):
            y = integer_matmul(q, zero, b, b_zero) * (scale * b_scale.astype(np.float64).reshape(-1))
        if bias is not None:
            y = y + bias.astype(np.float64)
        return np.ascontiguousarray(y.astype(np.float32))

    return run


def _supports_int_to_float(node: Node) -> str | None:
    a_scale, a_zero = node.input(2), node.input(4)
    reason = None
    for v, name in ((a_scale, "a_scale"), (a_zero, "a_zero_point")):
        if v is not None and v.shape is not None and math.prod(v.shape) != 1:
            reason = reason or (f"MatMulIntegerToFloat with {name} of shape {list(v.shape)}: supported is "
                                f"one value (per tensor)")
    return first_reason(check_dtypes(node, NBITS_TYPES, (2, 3, 6), same=True), reason,
                        _quantized_matmul_reason(node, 3, 5))


@impls.register("MatMulIntegerToFloat", "ms_integer", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_supports_int_to_float)
def ms_matmul_integer_to_float(node: Node) -> Kernel:
    """com.microsoft MatMulIntegerToFloat: MatMulInteger rescaled by a_scale * b_scale (+ bias)."""

    def run(a: np.ndarray, b: np.ndarray, a_scale: np.ndarray, b_scale: np.ndarray,
            a_zero: np.ndarray | None = None, b_zero: np.ndarray | None = None,
            bias: np.ndarray | None = None) -> np.ndarray:
        az = 0 if a_zero is None else int(a_zero.reshape(-1)[0])
        scale = float(a_scale.reshape(-1)[0]) * b_scale.astype(np.float64).reshape(-1)
        y = integer_matmul(a, az, b, b_zero) * scale
        if bias is not None:
            y = y + bias.astype(np.float64)
        return np.ascontiguousarray(y.astype(a_scale.dtype))

    return run
