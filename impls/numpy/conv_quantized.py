"""numpy reference kernels of ONNX's quantized convolutions, as onnxruntime's quantizers write
them (QOperator format):

- ``ConvInteger`` (dynamic quantization): ``conv(x - x_zero_point, w - w_zero_point)`` in
  int32; the padding is the zero point (zero once it is subtracted), as in onnxruntime.
- ``QLinearConv`` (static quantization): the same integer convolution plus the int32 bias,
  times ``x_scale * w_scale / y_scale`` (float32, per output channel with per-channel weights),
  rounded half to even, plus ``y_zero_point``, saturated: MLAS's requantization.

The integer sums are exact: they run in float64 (products of 8-bit values over any realistic
window stay far below 2**53) through the im2col of :mod:`impls.numpy.conv`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node, Value
from dispatch.registry import Priority
from impls.numpy.conv import (
    _apply_im2col,
    _pack_im2col,
    pad_input,
    window_attrs,
    window_reason,
)
from impls.numpy.table import impls
from layouts.precision import QUANT_RANGES

Kernel = Callable[..., Any]

_INT8 = ("uint8", "int8")


def _dtype(v: Value | None) -> str | None:
    return None if v is None or v.dtype is None else np.dtype(v.dtype).name


def _shape_reason(op: str, xs: tuple[int, ...] | None, ws: tuple[int, ...] | None, group: int,
                  bias: Value | None) -> str | None:
    """Why X, W and the bias' shapes do not make a convolution of ``group`` groups, or ``None``."""
    if xs is not None and len(xs) < 3:
        return f"{op} needs X of rank >= 3 (N, C, spatial...); received shape {xs}"
    if xs is not None and ws is not None and len(ws) != len(xs):
        return f"{op} needs W of the rank of X ({len(xs)}); received W shape {ws}"
    if ws is not None and ws[0] % group:
        return f"{op} W has {ws[0]} output channels, not divisible by group={group}"
    if xs is not None and ws is not None and xs[1] != ws[1] * group:
        return f"{op} X has {xs[1]} channels but W expects {ws[1]} per group x group={group}"
    if bias is not None and bias.shape is not None and ws is not None and tuple(bias.shape) != (ws[0],):
        return f"{op} bias B must have shape ({ws[0]},); received {bias.shape}"
    return None


def _supports(node: Node, x_at: int, w_at: int, zero_points: tuple[int, ...],
              bias_at: int | None = None) -> str | None:
    """Why the numpy reference cannot run quantized convolution ``node``, or ``None``."""
    op = node.op_type
    x, w = node.input(x_at), node.input(w_at)
    if x is None or w is None:
        return f"{op} needs inputs X and W"
    for i in (x_at, w_at, *zero_points):
        d = _dtype(node.input(i))
        if d is not None and d not in _INT8:
            return f"{op} input {i} is uint8 or int8, received {d}"
    xs, ws = x.shape, w.shape
    rank = len(xs) if xs is not None else len(ws) if ws is not None else None
    reason = window_reason(node, rank - 2 if rank is not None else None)
    if reason:
        return reason
    group = int(node.attr("group", 1))
    if group < 1:
        return f"{op} group must be >= 1; received {group}"
    xz = node.input(zero_points[0])
    if xz is not None and xz.shape is not None and int(np.prod(xz.shape)) != 1:
        return f"{op} takes one x_zero_point (per tensor); received shape {xz.shape}"
    if bias_at is not None and _dtype(node.input(bias_at)) not in (None, "int32"):
        return f"{op} bias B is int32, received {_dtype(node.input(bias_at))}"
    return _shape_reason(op, xs, ws, group, node.input(bias_at) if bias_at is not None else None)


def _centered(a: np.ndarray, zp: np.ndarray | None, channels_axis: bool) -> np.ndarray:
    """``a - zp`` in float64; ``zp`` a scalar, or one per output channel (axis 0 of W)."""
    out = np.asarray(a).astype(np.float64)
    if zp is None:
        return out
    z = np.asarray(zp).astype(np.float64)
    if z.size == 1:
        return out - z.reshape(())
    if not channels_axis:
        raise ValueError(f"a zero point per channel of X is not supported (shape {z.shape})")
    return out - z.reshape((-1,) + (1,) * (out.ndim - 1))


def _integer_conv(node: Node) -> Callable[..., np.ndarray]:
    """``(x, x_zp, w, w_zp) -> the exact int32 convolution`` with ``node``'s window."""
    group = int(node.attr("group", 1))

    def conv(x: np.ndarray, x_zp: np.ndarray | None, w: np.ndarray,
             w_zp: np.ndarray | None) -> np.ndarray:
        kernel = tuple(w.shape[2:])
        win = window_attrs(node, len(kernel), kernel)
        geom = win.geometry(x.shape[2:])
        n, m = x.shape[0], w.shape[0]
        if 0 in geom.out or n == 0 or 0 in x.shape[1:]:
            return np.zeros((n, m, *geom.out), dtype=np.int32)
        xp = pad_input(_centered(x, x_zp, False), geom, 0.0)
        packed = _pack_im2col(_centered(w, w_zp, True), group)
        y = _apply_im2col(xp, packed, win, geom, group).reshape((n, m, *geom.out))
        return np.rint(y).astype(np.int32)

    return conv


@impls.register("ConvInteger", "im2col", priority=Priority.DEFAULT,
                supports=lambda n: _supports(n, 0, 1, (2, 3)))
def conv_integer_im2col(node: Node) -> Kernel:
    """ConvInteger: ``conv(x - x_zero_point, w - w_zero_point)`` accumulated exactly, int32."""
    conv = _integer_conv(node)

    def run(x: np.ndarray, w: np.ndarray, x_zp: np.ndarray | None = None,
            w_zp: np.ndarray | None = None) -> np.ndarray:
        return conv(x, x_zp, w, w_zp)

    return run


@impls.register("QLinearConv", "requantized", priority=Priority.DEFAULT,
                supports=lambda n: _supports(n, 0, 3, (2, 5, 7), bias_at=8))
def qlinear_conv_requantized(node: Node) -> Kernel:
    """QLinearConv: the integer convolution plus B (int32), times ``x_scale * w_scale /
    y_scale`` in float32, rounded half to even, plus ``y_zero_point``, saturated."""
    conv = _integer_conv(node)

    def run(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp=None, b=None) -> np.ndarray:
        acc = conv(x, x_zp, w, w_zp)
        if b is not None:
            acc = acc + np.asarray(b, np.int32).reshape((1, -1) + (1,) * (acc.ndim - 2))
        ws = np.asarray(w_scale, np.float32).ravel()
        scale = (np.float32(np.asarray(x_scale, np.float32).reshape(())) * ws
                 / np.float32(np.asarray(y_scale, np.float32).reshape(()))).astype(np.float32)
        scale = scale.reshape((1, -1) + (1,) * (acc.ndim - 2)) if scale.size > 1 else scale.reshape(())
        dtype = np.asarray(y_zp).dtype if y_zp is not None else np.asarray(x).dtype
        lo, hi = QUANT_RANGES[np.dtype(dtype).name]
        y = np.rint(acc.astype(np.float32) * scale)
        if y_zp is not None:
            y = y + np.float32(np.asarray(y_zp).reshape(()))
        return np.clip(y, lo, hi).astype(dtype)

    return run
