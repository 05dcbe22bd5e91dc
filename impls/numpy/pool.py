"""numpy pooling kernels: MaxPool (with ONNX Indices), AveragePool, GlobalAveragePool and
GlobalMaxPool, N-d, with strides, pads, dilations, ``auto_pad`` and ``ceil_mode``.

Two algorithms for MaxPool and AveragePool:

- ``offsets``: one vectorised maximum / sum over the whole output per kernel offset (the only
  one that produces MaxPool's Indices);
- ``reduce``: a strided view of every window reduced with one ``max`` / ``sum`` call.

Large windows (more than :data:`LARGE_WINDOW` cells, no dilation: a global pool spelled as an
AveragePool, e.g. EfficientNet's pooler, a 1280x1280 kernel over a 7x7 map) go axis by axis
instead, since a box is separable: sums as differences of prefix sums (float64) between each
window's ends clipped to the input, maxima over a sliding view padded along one axis at a time.
Their cost is independent of the kernel size and nothing of the padded size is allocated
(offsets would loop over 1.6 million offsets of an 8 GB padded input).

Windows that ceil_mode lets run past the end padding only see real (or padded) cells; the
divisor of AveragePool counts the cells inside the input, plus the explicit padding when
``count_include_pad`` is set. float16 averages accumulate in float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.conv import (
    Geometry,
    Window,
    compute_dtype,
    offset_view,
    pad_input,
    patch_view,
    window_attrs,
    window_reason,
)
from impls.numpy.misc import FLOAT_TYPES, check_dtypes
from impls.numpy.table import impls

Kernel = Callable[..., Any]

#: windows of more cells than this (and no dilation) are pooled axis by axis (see the module
#: docstring); smaller ones are faster per offset
LARGE_WINDOW = 64

#: MaxPool accepts 8-bit integers from opset 12.
MAXPOOL_INT_TYPES = frozenset({"int8", "uint8"})


# -- supports --------------------------------------------------------------------------------


def _pool_reason(node: Node, allowed: frozenset[str]) -> str | None:
    if node.input(0) is None:
        return f"{node.op_type} needs input X"
    reason = check_dtypes(node, allowed)
    if reason:
        return reason
    xs = node.input(0).shape
    kernel = node.attr("kernel_shape")
    if kernel is None:
        return f"{node.op_type} needs the kernel_shape attribute"
    if any(int(k) < 1 for k in kernel):
        return f"{node.op_type} kernel_shape must be positive; received {list(kernel)}"
    if xs is not None and len(xs) < 3:
        return f"{node.op_type} needs X of rank >= 3 (N, C, spatial...); received shape {xs}"
    nd = len(xs) - 2 if xs is not None else len(kernel)
    return window_reason(node, nd)


def _supports_maxpool(node: Node) -> str | None:
    allowed = FLOAT_TYPES | MAXPOOL_INT_TYPES if node.opset >= 12 else FLOAT_TYPES
    reason = _pool_reason(node, allowed)
    if reason:
        return reason
    order = int(node.attr("storage_order", 0))
    if order not in (0, 1):
        return f"MaxPool storage_order must be 0 (row major) or 1 (column major); received {order}"
    return None


def _supports_maxpool_reduce(node: Node) -> str | None:
    reason = _supports_maxpool(node)
    if reason is None and len(node.outputs) > 1:
        return "MaxPool.numpy.reduce does not produce the Indices output; use MaxPool.numpy.offsets"
    return reason


def _supports_avgpool(node: Node) -> str | None:
    return _pool_reason(node, FLOAT_TYPES)


# -- shared machinery ------------------------------------------------------------------------


def _window(node: Node) -> Window:
    kernel = [int(k) for k in node.attr("kernel_shape")]
    return window_attrs(node, len(kernel), kernel)


class _GeometryCache:
    """Geometry of ``win`` per input shape (plus any static tables derived from it)."""

    def __init__(self, win: Window, derive: Callable[[Geometry], Any] | None = None) -> None:
        self.win = win
        self.derive = derive
        self._cache: dict[tuple[int, ...], tuple[Geometry, Any]] = {}

    def __call__(self, shape: tuple[int, ...]) -> tuple[Geometry, Any]:
        hit = self._cache.get(shape)
        if hit is None:
            geom = self.win.geometry(shape[2:])
            hit = self._cache[shape] = (geom, self.derive(geom) if self.derive else None)
        return hit


def _lowest(dtype: np.dtype) -> Any:
    """The padding value that never wins a maximum."""
    dtype = np.dtype(dtype)
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


# -- MaxPool ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _IndexTable:
    """Flat spatial index (row- or column-major) of each (kernel offset, output position); an
    offset landing in padding maps to the first in-input cell of its window, the one ONNX
    reports when nothing in the window beats the padding value."""

    flat: np.ndarray  # (K, P) int64
    spatial_size: int


def _index_table(win: Window, geom: Geometry, storage_order: int) -> _IndexTable:
    nd = win.rank
    sizes = geom.spatial
    if storage_order == 0:
        mult = [math.prod(sizes[i + 1 :]) for i in range(nd)]
    else:
        mult = [math.prod(sizes[:i]) for i in range(nd)]
    shape = win.kernel + geom.out
    flat = np.zeros(shape, dtype=np.int64)
    valid = np.ones(shape, dtype=bool)
    for i in range(nd):
        c = geom.coords(win, i)  # (k_i, out_i)
        expand = [1] * (2 * nd)
        expand[i], expand[nd + i] = c.shape
        c = c.reshape(expand)
        flat = flat + c * mult[i]
        valid = valid & (c >= 0) & (c < sizes[i])
    k, p = math.prod(win.kernel), math.prod(geom.out)
    flat, valid = flat.reshape(k, p), valid.reshape(k, p)
    first = flat[valid.argmax(axis=0), np.arange(p)]
    return _IndexTable(np.where(valid, flat, first[None, :]), math.prod(sizes))


def _max_with_argmax(xp: np.ndarray, win: Window, geom: Geometry) -> tuple[np.ndarray, np.ndarray]:
    """Window maxima and the kernel offset of the first maximum (strictly greater wins)."""
    offsets = win.offsets
    y = offset_view(xp, win, geom, offsets[0]).copy()
    best = np.zeros(y.shape, dtype=np.int32 if len(offsets) < 2**31 else np.int64)
    for k, offset in enumerate(offsets[1:], start=1):
        xs = offset_view(xp, win, geom, offset)
        better = xs > y
        np.copyto(y, xs, where=better)
        np.copyto(best, k, where=better)
    return y, best


def _indices(best: np.ndarray, table: _IndexTable) -> np.ndarray:
    n, c = best.shape[:2]
    p = table.flat.shape[1]
    spatial = table.flat[best.reshape(n, c, p), np.arange(p)]
    base = (np.arange(n * c, dtype=np.int64) * table.spatial_size).reshape(n, c, 1)
    return (spatial + base).reshape(best.shape)


@impls.register("MaxPool", "offsets", priority=Priority.PREFERRED, supports=_supports_maxpool)
def maxpool_offsets(node: Node) -> Kernel:
    """MaxPool as one vectorised maximum per kernel offset (also produces Indices)."""
    win = _window(node)
    want_indices = len(node.outputs) > 1
    order = int(node.attr("storage_order", 0))
    geoms = _GeometryCache(win, (lambda g: _index_table(win, g, order)) if want_indices else None)

    def run(x: np.ndarray) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        geom, table = geoms(tuple(x.shape))
        if 0 in geom.out or x.size == 0:
            y = np.zeros(x.shape[:2] + geom.out, dtype=x.dtype)
            return (y, np.zeros(y.shape, dtype=np.int64)) if want_indices else y
        if not want_indices and _separable(win):
            return _max_separable(x, win, geom)
        xp = pad_input(x, geom, _lowest(x.dtype))
        if want_indices:
            y, best = _max_with_argmax(xp, win, geom)
            return y, _indices(best, table)
        y = None
        for offset in win.offsets:
            xs = offset_view(xp, win, geom, offset)
            y = xs.copy() if y is None else np.maximum(y, xs, out=y)
        return y

    return run


@impls.register("MaxPool", "reduce", priority=Priority.DEFAULT, supports=_supports_maxpool_reduce)
def maxpool_reduce(node: Node) -> Kernel:
    """MaxPool as one max-reduction over a strided view of every window (no Indices)."""
    win = _window(node)
    geoms = _GeometryCache(win)
    axes = tuple(range(2, 2 + win.rank))

    def run(x: np.ndarray) -> np.ndarray:
        geom, _ = geoms(tuple(x.shape))
        if 0 in geom.out or x.size == 0:
            return np.zeros(x.shape[:2] + geom.out, dtype=x.dtype)
        if _separable(win):
            return _max_separable(x, win, geom)
        xp = pad_input(x, geom, _lowest(x.dtype))
        return np.asarray(patch_view(xp, win, geom).max(axis=axes), order="C")

    return run


# -- AveragePool -----------------------------------------------------------------------------


def _divisor(win: Window, geom: Geometry, include_pad: bool) -> np.ndarray:
    """Cells each window averages over, shape ``geom.out``."""
    total = np.ones((), dtype=np.int64)
    for i in range(win.rank):
        c = geom.coords(win, i)
        lo = -geom.pad_begin[i] if include_pad else 0
        hi = geom.spatial[i] + geom.pad_end[i] if include_pad else geom.spatial[i]
        count = ((c >= lo) & (c < hi)).sum(axis=0)
        total = np.multiply.outer(total, count)
    return total


def _avgpool_kernel(node: Node, window_sum: Callable[[np.ndarray, Window, Geometry], np.ndarray]) -> Kernel:
    win = _window(node)
    include_pad = bool(node.attr("count_include_pad", 0))
    geoms = _GeometryCache(win, lambda g: _divisor(win, g, include_pad))

    def run(x: np.ndarray) -> np.ndarray:
        geom, divisor = geoms(tuple(x.shape))
        if 0 in geom.out or x.size == 0:
            return np.zeros(x.shape[:2] + geom.out, dtype=x.dtype)
        ct = compute_dtype(x.dtype)
        if _separable(win):
            acc = _sum_separable(x, win, geom).astype(ct)
        else:
            acc = window_sum(pad_input(x.astype(ct, copy=False), geom, 0), win, geom)
        with np.errstate(divide="ignore", invalid="ignore"):
            acc /= divisor.astype(ct)
        return np.asarray(acc, dtype=x.dtype, order="C")

    return run


def _separable(win: Window) -> bool:
    """Whether ``win`` is pooled axis by axis: a large window without dilation."""
    return math.prod(win.kernel) > LARGE_WINDOW and all(d == 1 for d in win.dilations)


def _window_bounds(win: Window, geom: Geometry, i: int) -> tuple[np.ndarray, np.ndarray]:
    """[start, end) of every output position's window on axis ``i``, clipped to the input."""
    start = np.arange(geom.out[i]) * win.strides[i] - geom.pad_begin[i]
    n = geom.spatial[i]
    return np.clip(start, 0, n), np.clip(start + win.kernel[i], 0, n)


def _sum_separable(x: np.ndarray, win: Window, geom: Geometry) -> np.ndarray:
    """Window sums of unpadded ``x`` (padding adds nothing to a sum): along each axis, the
    difference of float64 prefix sums at the window's clipped ends."""
    acc = x.astype(np.float64)
    for i in range(win.rank):
        axis = 2 + i
        lo, hi = _window_bounds(win, geom, i)
        shape = list(acc.shape)
        shape[axis] = 1
        prefix = np.concatenate([np.zeros(shape), np.cumsum(acc, axis=axis)], axis=axis)
        acc = np.take(prefix, hi, axis=axis) - np.take(prefix, lo, axis=axis)
    return acc


def _max_separable(x: np.ndarray, win: Window, geom: Geometry) -> np.ndarray:
    """Window maxima of unpadded ``x``, axis by axis: each axis padded with the lowest value
    (its own padding only) and reduced over a sliding view. A window entirely in the padding
    yields the padding value, as the offsets algorithm does."""
    acc = x
    low = _lowest(x.dtype)
    for i in range(win.rank):
        axis = 2 + i
        k, s, out = win.kernel[i], win.strides[i], geom.out[i]
        widths = [(0, 0)] * acc.ndim
        widths[axis] = (geom.pad_begin[i], geom.pad_end[i] + geom.extra_end[i])
        padded = np.pad(acc, widths, constant_values=low)
        windows = np.lib.stride_tricks.sliding_window_view(padded, k, axis=axis)
        index = [slice(None)] * windows.ndim
        index[axis] = slice(0, (out - 1) * s + 1, s)
        acc = windows[tuple(index)].max(axis=-1)
    return np.ascontiguousarray(acc)


def _sum_offsets(xp: np.ndarray, win: Window, geom: Geometry) -> np.ndarray:
    acc = None
    for offset in win.offsets:
        xs = offset_view(xp, win, geom, offset)
        acc = xs.copy() if acc is None else np.add(acc, xs, out=acc)
    return acc


def _sum_reduce(xp: np.ndarray, win: Window, geom: Geometry) -> np.ndarray:
    return patch_view(xp, win, geom).sum(axis=tuple(range(2, 2 + win.rank)))


@impls.register("AveragePool", "offsets", priority=Priority.PREFERRED, supports=_supports_avgpool)
def avgpool_offsets(node: Node) -> Kernel:
    """AveragePool as one vectorised add per kernel offset, then a static divisor."""
    return _avgpool_kernel(node, _sum_offsets)


@impls.register("AveragePool", "reduce", priority=Priority.DEFAULT, supports=_supports_avgpool)
def avgpool_reduce(node: Node) -> Kernel:
    """AveragePool as one sum-reduction over a strided view of every window."""
    return _avgpool_kernel(node, _sum_reduce)


# -- global pooling --------------------------------------------------------------------------


def _supports_global(node: Node) -> str | None:
    if node.input(0) is None:
        return f"{node.op_type} needs input X"
    reason = check_dtypes(node, FLOAT_TYPES)
    if reason:
        return reason
    xs = node.input(0).shape
    if xs is not None and len(xs) < 3:
        return f"{node.op_type} needs X of rank >= 3 (N, C, spatial...); received shape {xs}"
    return None


@impls.register("GlobalAveragePool", "mean", priority=Priority.DEFAULT, supports=_supports_global)
def global_avgpool(node: Node) -> Kernel:
    """GlobalAveragePool: mean over every spatial axis (float16 accumulates in float32)."""

    def run(x: np.ndarray) -> np.ndarray:
        axes = tuple(range(2, x.ndim))
        y = x.mean(axis=axes, keepdims=True, dtype=compute_dtype(x.dtype))
        return np.asarray(y, dtype=x.dtype, order="C")

    return run


@impls.register("GlobalMaxPool", "max", priority=Priority.DEFAULT, supports=_supports_global)
def global_maxpool(node: Node) -> Kernel:
    """GlobalMaxPool: maximum over every spatial axis."""

    def run(x: np.ndarray) -> np.ndarray:
        return np.asarray(x.max(axis=tuple(range(2, x.ndim)), keepdims=True), order="C")

    return run
