"""numpy reference kernels for the index-tuple and element-wise gathers and scatters:
GatherND, ScatterND, GatherElements and ScatterElements.

Every kernel is one numpy advanced-indexing operation (no Python loop over indices). Negative
indices count from the end of their axis; an index outside ``[-n, n-1]`` raises ``IndexError``
(ONNX calls it an error). Scatters copy ``data`` first and never write into their inputs.

Scatter reductions (``reduction`` attribute, opset 16: add / mul, opset 18: max / min) use the
unbuffered ufunc ``at`` methods, so duplicate indices accumulate every update in index order;
with ``reduction="none"`` duplicates are undefined in ONNX and the last update wins here (as
in onnx's reference). ``max`` / ``min`` propagate NaN (``np.maximum`` / ``np.minimum``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.misc import (
    ANY_TYPE,
    NUMERIC_TYPES,
    as_std,
    check_dtypes,
    first_reason,
    normalize_axis,
)
from impls.numpy.table import impls

Kernel = Callable[..., Any]
INDEX_TYPES = frozenset({"int32", "int64"})
INT64 = frozenset({"int64"})

#: reduction attribute -> (the ufunc whose ``at`` applies it, the first opset that has it)
REDUCTIONS: dict[str, tuple[np.ufunc | None, int]] = {
    "none": (None, 11),
    "add": (np.add, 16),
    "mul": (np.multiply, 16),
    "max": (np.maximum, 18),
    "min": (np.minimum, 18),
}


def _shape(node: Node, i: int) -> tuple[int, ...] | None:
    v = node.input(i)
    return None if v is None or v.shape is None else tuple(v.shape)


def _needs_inputs(node: Node, count: int) -> str | None:
    missing = [i for i in range(count) if node.input(i) is None]
    if missing:
        return f"{node.op_type} needs {count} inputs; input {missing[0]} is absent"
    return None


def wrap_indices(idx: np.ndarray, size: int | np.ndarray, what: str) -> np.ndarray:
    """``idx`` (int64) with negative entries counted from the end of an axis of ``size``;
    raises ``IndexError`` for an entry outside ``[-size, size - 1]``. ``size`` may be an array
    that broadcasts against ``idx`` (one size per index column)."""
    idx = np.asarray(idx, dtype=np.int64)
    if idx.size == 0:
        return idx
    size = np.asarray(size, dtype=np.int64)
    bad = (idx < -size) | (idx >= size)
    if bad.any():
        first = np.argwhere(bad)[0]
        value = int(idx[tuple(first)])
        limit = int(np.broadcast_to(size, idx.shape)[tuple(first)])
        raise IndexError(
            f"{what} index {value} (at position {tuple(int(i) for i in first)}) is outside "
            f"[-{limit}, {limit - 1}]"
        )
    return np.where(idx < 0, idx + size, idx)


def _reduction_reason(node: Node) -> str | None:
    """Why the ``reduction`` attribute (and the dtype it needs) is not handled, or ``None``."""
    reduction = str(node.attr("reduction", "none"))
    known = REDUCTIONS.get(reduction)
    if known is None or node.opset < known[1]:
        allowed = [r for r, (_, since) in REDUCTIONS.items() if node.opset >= since]
        return (
            f"{node.op_type} reduction {reduction!r} is not defined at opset {node.opset}; "
            f"allowed: {', '.join(allowed)}"
        )
    if reduction != "none":
        return check_dtypes(node, NUMERIC_TYPES, (0, 2))
    return None


def _scatter(out: np.ndarray, index: tuple[Any, ...], updates: np.ndarray, reduction: str) -> None:
    """Apply ``updates`` at ``out[index]`` in place with ``reduction``."""
    ufunc = REDUCTIONS[reduction][0]
    if ufunc is None:
        out[index] = updates
    else:
        with np.errstate(all="ignore"):  # IEEE: overflow to inf, NaN operands
            ufunc.at(out, index, updates)


# -- GatherND --------------------------------------------------------------------------------


def _supports_gather_nd(node: Node) -> str | None:
    reason = first_reason(_needs_inputs(node, 2), check_dtypes(node, INT64, (1,)))
    if reason:
        return reason
    b = int(node.attr("batch_dims", 0)) if node.opset >= 12 else 0
    ds, ixs = _shape(node, 0), _shape(node, 1)
    if b < 0:
        return f"GatherND batch_dims must be >= 0; received {b}"
    if ds is not None and ixs is not None:
        return _nd_shape_reason(node, ds, ixs, b)
    return None


def _nd_shape_reason(node: Node, ds: tuple[int, ...], ixs: tuple[int, ...], b: int) -> str | None:
    """Why ``data`` of shape ``ds`` and ``indices`` of shape ``ixs`` do not fit (GatherND /
    ScatterND with ``b`` batch dims), or ``None``."""
    if len(ds) < 1 or len(ixs) < 1:
        return f"{node.op_type} needs data and indices of rank >= 1; received {ds} and {ixs}"
    if b >= min(len(ds), len(ixs)):
        return f"{node.op_type} batch_dims={b} must be < min(rank(data), rank(indices)) for {ds}, {ixs}"
    if ds[:b] != ixs[:b]:
        return f"{node.op_type} batch dims differ: data {ds[:b]}, indices {ixs[:b]}"
    if not 1 <= ixs[-1] <= len(ds) - b:
        return (
            f"{node.op_type} indices.shape[-1]={ixs[-1]} must be in [1, {len(ds) - b}] for data "
            f"of shape {ds} (batch_dims={b})"
        )
    return None


def gather_nd(data: np.ndarray, indices: np.ndarray, batch_dims: int) -> np.ndarray:
    """ONNX GatherND: slices of ``data`` at the index tuples of ``indices`` (last axis)."""
    b = batch_dims
    if indices.ndim < 1 or data.ndim < 1 or b >= min(data.ndim, indices.ndim):
        raise ValueError(
            f"GatherND batch_dims={b} needs data and indices of higher rank; received "
            f"{data.shape} and {indices.shape}"
        )
    if data.shape[:b] != indices.shape[:b]:
        raise ValueError(f"GatherND batch dims differ: data {data.shape}, indices {indices.shape}")
    k = indices.shape[-1]
    if not 1 <= k <= data.ndim - b:
        raise ValueError(f"GatherND indices.shape[-1]={k} must be in [1, {data.ndim - b}]")
    batch = math.prod(data.shape[:b])
    tail = data.shape[b + k :]
    idx = indices.reshape(batch, math.prod(indices.shape[b:-1]), k)
    idx = wrap_indices(idx, np.array(data.shape[b : b + k]), "GatherND")
    flat = data.reshape(batch, *data.shape[b:])
    rows = np.arange(batch).reshape(batch, 1)
    got = flat[(rows, *(idx[..., j] for j in range(k)))]  # (batch, M, *tail)
    return as_std(got.reshape(*indices.shape[:-1], *tail))


@impls.register("GatherND", "index", priority=Priority.DEFAULT, supports=_supports_gather_nd)
def gather_nd_index(node: Node) -> Kernel:
    """GatherND: one advanced-indexing gather (batch_dims, negative indices)."""
    b = int(node.attr("batch_dims", 0)) if node.opset >= 12 else 0

    def run(data: np.ndarray, indices: np.ndarray) -> np.ndarray:
        return gather_nd(data, indices, b)

    return run


# -- ScatterND -------------------------------------------------------------------------------


def _supports_scatter_nd(node: Node) -> str | None:
    reason = first_reason(
        _needs_inputs(node, 3),
        check_dtypes(node, INT64, (1,)),
        check_dtypes(node, ANY_TYPE, (0, 2), same=True),
        _reduction_reason(node),
    )
    if reason:
        return reason
    ds, ixs, us = _shape(node, 0), _shape(node, 1), _shape(node, 2)
    if ds is not None and ixs is not None:
        reason = _nd_shape_reason(node, ds, ixs, 0)
        if reason is None and us is not None and us != ixs[:-1] + ds[ixs[-1] :]:
            reason = (
                f"ScatterND updates must have shape indices.shape[:-1] + data.shape[k:] = "
                f"{ixs[:-1] + ds[ixs[-1]:]}; received {us}"
            )
    return reason


def scatter_nd(data: np.ndarray, indices: np.ndarray, updates: np.ndarray, reduction: str) -> np.ndarray:
    """ONNX ScatterND: a copy of ``data`` with ``updates`` applied at the index tuples."""
    k = indices.shape[-1] if indices.ndim else 0
    if not 1 <= k <= data.ndim:
        raise ValueError(f"ScatterND indices.shape[-1]={k} must be in [1, {data.ndim}]")
    want = indices.shape[:-1] + data.shape[k:]
    if updates.shape != want:
        raise ValueError(f"ScatterND updates have shape {updates.shape}; expected {want}")
    idx = wrap_indices(indices, np.array(data.shape[:k]), "ScatterND")
    out = np.array(data, order="C", copy=True)
    _scatter(out, tuple(idx[..., j] for j in range(k)), updates, reduction)
    return out


@impls.register("ScatterND", "index", priority=Priority.DEFAULT, supports=_supports_scatter_nd)
def scatter_nd_index(node: Node) -> Kernel:
    """ScatterND: a copy of data updated by advanced indexing (reduction via ufunc.at)."""
    reduction = str(node.attr("reduction", "none"))

    def run(data: np.ndarray, indices: np.ndarray, updates: np.ndarray) -> np.ndarray:
        return scatter_nd(data, indices, updates, reduction)

    return run


# -- GatherElements / ScatterElements --------------------------------------------------------


def _elements_reason(node: Node, n_inputs: int) -> str | None:
    """Shared checks of GatherElements / ScatterElements: inputs, axis, ranks and extents."""
    reason = first_reason(_needs_inputs(node, n_inputs), check_dtypes(node, INDEX_TYPES, (1,)))
    if reason:
        return reason
    ds, ixs = _shape(node, 0), _shape(node, 1)
    axis = int(node.attr("axis", 0))
    if ds is None:
        return None
    if not -len(ds) <= axis < max(len(ds), 1):
        return f"{node.op_type} axis {axis} is out of range for data of rank {len(ds)}"
    if ixs is not None:
        if len(ixs) != len(ds):
            return f"{node.op_type} needs indices of the rank of data; received {ixs} and {ds}"
        a = axis % len(ds)
        if any(i > d for k, (i, d) in enumerate(zip(ixs, ds)) if k != a):
            return (
                f"{node.op_type} indices {ixs} exceed data {ds} on an axis other than "
                f"axis {axis}"
            )
    return None


def element_index(data_shape: tuple[int, ...], indices: np.ndarray, axis: int, op: str) -> tuple[Any, ...]:
    """The advanced index of ``data`` that GatherElements / ScatterElements address: the
    (wrapped) ``indices`` on ``axis``, the position of each index entry on every other axis."""
    if indices.ndim != len(data_shape):
        raise ValueError(f"{op} needs indices of rank {len(data_shape)}; received {indices.shape}")
    a = normalize_axis(axis, len(data_shape))
    for k, (i, d) in enumerate(zip(indices.shape, data_shape)):
        if k != a and i > d:
            raise ValueError(f"{op} indices {indices.shape} exceed data {data_shape} on axis {k}")
    idx = wrap_indices(indices, data_shape[a], op)
    grid = np.ogrid[tuple(slice(0, n) for n in indices.shape)]
    return tuple(idx if k == a else g for k, g in enumerate(grid))


def _supports_gather_elements(node: Node) -> str | None:
    return _elements_reason(node, 2)


@impls.register(
    "GatherElements", "index", priority=Priority.DEFAULT, supports=_supports_gather_elements
)
def gather_elements_index(node: Node) -> Kernel:
    """GatherElements: out[i][j][k] = data[index[i][j][k]][j][k] (axis 0) by advanced indexing."""
    axis = int(node.attr("axis", 0))

    def run(data: np.ndarray, indices: np.ndarray) -> np.ndarray:
        if indices.size == 0:
            return np.empty(indices.shape, dtype=data.dtype)
        return as_std(data[element_index(data.shape, indices, axis, "GatherElements")])

    return run


def _supports_scatter_elements(node: Node) -> str | None:
    reason = first_reason(
        _elements_reason(node, 3),
        check_dtypes(node, ANY_TYPE, (0, 2), same=True),
        _reduction_reason(node),
    )
    if reason:
        return reason
    ixs, us = _shape(node, 1), _shape(node, 2)
    if ixs is not None and us is not None and ixs != us:
        return f"ScatterElements needs updates of the shape of indices; received {us} and {ixs}"
    return None


@impls.register(
    "ScatterElements", "index", priority=Priority.DEFAULT, supports=_supports_scatter_elements
)
def scatter_elements_index(node: Node) -> Kernel:
    """ScatterElements: a copy of data updated at (index on axis, position elsewhere)."""
    axis = int(node.attr("axis", 0))
    reduction = str(node.attr("reduction", "none"))

    def run(data: np.ndarray, indices: np.ndarray, updates: np.ndarray) -> np.ndarray:
        if updates.shape != indices.shape:
            raise ValueError(
                f"ScatterElements updates {updates.shape} must have the shape of indices "
                f"{indices.shape}"
            )
        out = np.array(data, order="C", copy=True)
        if indices.size:
            index = element_index(data.shape, indices, axis, "ScatterElements")
            _scatter(out, index, updates, reduction)
        return out

    return run


__all__ = ["REDUCTIONS", "element_index", "gather_nd", "scatter_nd", "wrap_indices"]
