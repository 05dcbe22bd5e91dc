"""numpy reference kernels for the operators that order elements along an axis (issue 14):
ArgMax, ArgMin, TopK, Hardmax and Unique.

NaN orders as onnx's reference evaluator (numpy) orders it: above every number. ArgMax and
ArgMin (like np.argmax / np.argmin) return the first NaN of a slice that holds one, Hardmax
marks it, TopK with ``largest`` ranks NaN first and with ``largest=0`` last. Ties go to the
lower index (TopK: the lower index comes first, as ONNX specifies; ArgMax / ArgMin: the first
occurrence unless ``select_last_index``).

No kernel needs a static shape (a value may carry ``shape=None``, as downstream of a
data-dependent operator): axes, K and sizes are checked on the arrays when the kernel runs.
TopK's K may be any run-time input; Unique's output length is the data's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.misc import (
    FLOAT_TYPES,
    NUMERIC_TYPES,
    PLAIN_TYPES,
    STRING_TYPES,
    as_std,
    check_dtypes,
    first_reason,
    normalize_axis,
)
from impls.numpy.table import impls

Kernel = Callable[..., Any]
INT64 = frozenset({"int64"})


def _rank(node: Node) -> int | None:
    v = node.input(0)
    return None if v is None or v.shape is None else len(v.shape)


def _axis_reason(node: Node, axis: int) -> str | None:
    rank = _rank(node)
    if rank is not None and not -rank <= axis < rank:
        return f"{node.op_type} axis {axis} is out of range for an input of rank {rank}"
    return None


def _empty_axis_reason(node: Node, axis: int) -> str | None:
    v, rank = node.input(0), _rank(node)
    if v is None or rank is None or not -rank <= axis < rank:
        return None
    if v.shape[axis] == 0:
        return f"{node.op_type} along axis {axis} of size 0 has no element to select"
    return None


# -- ArgMax / ArgMin -------------------------------------------------------------------------


def _supports_arg(node: Node) -> str | None:
    axis = int(node.attr("axis", 0))
    return first_reason(
        check_dtypes(node, NUMERIC_TYPES),
        _axis_reason(node, axis),
        _empty_axis_reason(node, axis),
    )


def _arg_kernel(node: Node, fn: Callable[..., np.ndarray]) -> Kernel:
    axis = int(node.attr("axis", 0))
    keepdims = bool(node.attr("keepdims", 1))
    last = node.opset >= 12 and bool(node.attr("select_last_index", 0))
    op = node.op_type

    def run(x: np.ndarray) -> np.ndarray:
        a = normalize_axis(axis, x.ndim, f"{op} axis")
        n = x.shape[a]
        if n == 0:
            raise ValueError(f"{op} along axis {axis} of size 0 has no element to select")
        idx = np.asarray(n - 1 - fn(np.flip(x, a), axis=a) if last else fn(x, axis=a), np.int64)
        return as_std(np.expand_dims(idx, a) if keepdims else idx)

    return run


@impls.register("ArgMax", "numpy", priority=Priority.DEFAULT, supports=_supports_arg)
def argmax_numpy(node: Node) -> Kernel:
    """ArgMax: np.argmax along axis (default 0) as int64, keepdims (default 1) and
    select_last_index (opset 12, default 0); a NaN is the maximum (its first occurrence)."""
    return _arg_kernel(node, np.argmax)


@impls.register("ArgMin", "numpy", priority=Priority.DEFAULT, supports=_supports_arg)
def argmin_numpy(node: Node) -> Kernel:
    """ArgMin: np.argmin along axis (default 0) as int64, keepdims (default 1) and
    select_last_index (opset 12, default 0); a NaN is selected (its first occurrence), as
    np.argmin and onnx's reference do."""
    return _arg_kernel(node, np.argmin)


# -- TopK ------------------------------------------------------------------------------------


def _supports_topk(node: Node) -> str | None:
    axis = int(node.attr("axis", -1))
    reason = first_reason(check_dtypes(node, NUMERIC_TYPES), _axis_reason(node, axis))
    if reason:
        return reason
    if node.opset < 10:
        if node.attr("k") is None:
            return f"TopK at opset {node.opset} needs the k attribute"
        return None
    if node.input(1) is None:
        return f"TopK at opset {node.opset} needs the K input (input 1)"
    k = node.input(1)
    if k.shape is not None and math.prod(k.shape) != 1:
        return f"TopK K must hold one element; received shape {list(k.shape)}"
    return check_dtypes(node, INT64, (1,))


def topk_indices(x: np.ndarray, k: int, axis: int, largest: bool) -> np.ndarray:
    """Indices of the ``k`` largest (smallest) elements of ``x`` along ``axis`` in order,
    ties by the lower index, NaN above every number (a stable sort; for ``largest`` a stable
    sort of the reversed axis, reversed back)."""
    n = x.shape[axis]
    if largest:
        order = np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
        order = (n - 1) - order
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    index: list[slice] = [slice(None)] * x.ndim
    index[axis] = slice(0, k)
    return order[tuple(index)].astype(np.int64, copy=False)


@impls.register("TopK", "stable_sort", priority=Priority.DEFAULT, supports=_supports_topk)
def topk_stable_sort(node: Node) -> Kernel:
    """TopK: values and int64 indices of the K largest (``largest=1``) or smallest elements
    along axis (default -1), sorted (also for ``sorted=0``, whose order ONNX leaves open);
    equal values in index order. K is the k attribute before opset 10, else input 1."""
    axis = int(node.attr("axis", -1))
    largest = node.opset < 11 or bool(node.attr("largest", 1))
    attr_k = node.attr("k") if node.opset < 10 else None

    def run(x: np.ndarray, k: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        if attr_k is not None:
            kk = int(attr_k)
        else:
            karr = np.asarray(k)
            if karr.size != 1:
                raise ValueError(f"TopK K must hold one element; received shape {karr.shape}")
            kk = int(karr.reshape(()))
        a = normalize_axis(axis, x.ndim, "TopK axis")
        if not 0 <= kk <= x.shape[a]:
            raise ValueError(f"TopK K={kk} is outside [0, {x.shape[a]}] (axis {axis} of "
                             f"shape {x.shape})")
        idx = topk_indices(x, kk, a, largest)
        return as_std(np.take_along_axis(x, idx, axis=a)), as_std(idx)

    return run


# -- Hardmax ---------------------------------------------------------------------------------


def _hardmax_axis(node: Node) -> int:
    return int(node.attr("axis", -1 if node.opset >= 13 else 1))


def _supports_hardmax(node: Node) -> str | None:
    axis = _hardmax_axis(node)
    reason = check_dtypes(node, FLOAT_TYPES)
    if reason:
        return reason
    rank = _rank(node)
    if node.opset < 13 and rank is not None and not -rank <= axis <= rank:
        return f"Hardmax axis {axis} is out of range [-{rank}, {rank}] at opset {node.opset}"
    if node.opset >= 13:
        return _axis_reason(node, axis)
    return None


def _hardmax_along(x: np.ndarray, axis: int) -> np.ndarray:
    y = np.zeros_like(x)
    if x.size:
        np.put_along_axis(y, np.argmax(x, axis=axis, keepdims=True), x.dtype.type(1), axis=axis)
    return y


@impls.register("Hardmax", "argmax", priority=Priority.DEFAULT, supports=_supports_hardmax)
def hardmax_argmax(node: Node) -> Kernel:
    """Hardmax: 1 at the first maximum along axis (default -1; before opset 13 over the input
    coerced to 2-D at axis, default 1), 0 elsewhere; a NaN counts as the maximum."""
    axis = _hardmax_axis(node)
    coerce = node.opset < 13

    def run(x: np.ndarray) -> np.ndarray:
        if coerce:
            a = axis + x.ndim if axis < 0 else axis
            if not 0 <= a <= x.ndim:
                raise ValueError(f"Hardmax axis {axis} is out of range for rank {x.ndim}")
            flat = x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:]))
            return as_std(_hardmax_along(flat, 1).reshape(x.shape))
        return as_std(_hardmax_along(x, normalize_axis(axis, x.ndim, "Hardmax axis")))

    return run


# -- Unique ----------------------------------------------------------------------------------


def _supports_unique(node: Node) -> str | None:
    if node.opset < 11:
        return f"Unique exists from opset 11; the node has opset {node.opset}"
    reason = check_dtypes(node, PLAIN_TYPES | STRING_TYPES)
    if reason:
        return reason
    order = int(node.attr("sorted", 1))
    if order not in (0, 1):
        return f"Unique sorted must be 0 or 1; received {order}"
    axis = node.attr("axis")
    if axis is None:
        return None
    v = node.input(0)
    if v.dtype is not None and np.dtype(v.dtype).name in STRING_TYPES:
        return "Unique along an axis of a string tensor is not supported (np.unique cannot)"
    return _axis_reason(node, int(axis))


def unique_parts(
    x: np.ndarray, axis: int | None, in_order: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """ONNX Unique of ``x``: (unique elements or slices along ``axis``, index of the first
    occurrence of each, index into them of every element or slice, count of each), the
    indices int64. Sorted ascending unless ``in_order``: then in order of first occurrence."""
    source = x.reshape(-1) if axis is None else x
    y, first, inverse, counts = np.unique(source, True, True, True, axis=axis)
    first = first.astype(np.int64, copy=False)
    inverse = inverse.astype(np.int64, copy=False).reshape(-1)
    counts = counts.astype(np.int64, copy=False)
    if in_order:
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size, dtype=order.dtype)
        first, counts, inverse = first[order], counts[order], rank[inverse]
        y = np.take(source, first, axis=0 if axis is None else axis)
    return as_std(y, x.dtype), as_std(first), as_std(inverse), as_std(counts)


@impls.register("Unique", "numpy", priority=Priority.DEFAULT, supports=_supports_unique)
def unique_numpy(node: Node) -> Kernel:
    """Unique: np.unique of the flattened input (or of the slices along axis) with the first
    occurrences, inverse indices and counts (int64); ``sorted=0`` orders all four by first
    occurrence. Returns as many outputs as the node has."""
    axis_attr = node.attr("axis")
    in_order = not bool(int(node.attr("sorted", 1)))
    n_out = max(len(node.outputs), 1)

    def run(x: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
        a = np.asarray(x)
        axis = None if axis_attr is None else normalize_axis(int(axis_attr), a.ndim, "Unique axis")
        parts = unique_parts(a, axis, in_order)
        return parts[0] if n_out == 1 else parts[:n_out]

    return run
