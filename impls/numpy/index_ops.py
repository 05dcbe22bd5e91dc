"""numpy reference kernels for the index-driven operators the exporters emit (issue 14):
CumSum (a scan along an axis), Trilu (triangular masks), Range and OneHot (tensors generated
from scalars and indices), NonZero and Compress (selections whose size the data decides).

Scalars that steer a kernel (CumSum's axis, Trilu's k, Range's start / limit / delta,
OneHot's depth) are run-time inputs, read when the kernel runs; a constant is read the same
way. The output lengths of Range, NonZero and Compress depend on their inputs' values; no
kernel here needs a static shape (a value may carry ``shape=None``): shapes and sizes are
checked on the arrays when the kernel runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.misc import (
    BOOL_TYPES,
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
INDEX_TYPES = frozenset({"int32", "int64"})
INT64 = frozenset({"int64"})


def _needs_input(node: Node, i: int, what: str) -> str | None:
    if node.input(i) is None:
        return f"{node.op_type} needs the {what} input (input {i})"
    return None


def _one_element_reason(node: Node, i: int, what: str) -> str | None:
    v = node.input(i)
    if v is not None and v.shape is not None and math.prod(v.shape) != 1:
        return f"{node.op_type} {what} must hold one element; received shape {list(v.shape)}"
    return None


def _scalar(x: np.ndarray, what: str) -> Any:
    """The single element of ``x`` (a 0-d or one-element tensor) as a numpy scalar."""
    a = np.asarray(x)
    if a.size != 1:
        raise ValueError(f"{what} must hold one element; received shape {a.shape}")
    return a.reshape(())[()]


# -- CumSum ----------------------------------------------------------------------------------

#: CumSum's T (float16 from opset 14)
CUMSUM_TYPES = FLOAT_TYPES | frozenset({"int32", "int64", "uint32", "uint64"})


def _supports_cumsum(node: Node) -> str | None:
    return first_reason(
        _needs_input(node, 1, "axis"),
        check_dtypes(node, CUMSUM_TYPES),
        check_dtypes(node, INDEX_TYPES, (1,)),
        _one_element_reason(node, 1, "axis"),
    )


@impls.register("CumSum", "cumsum", priority=Priority.DEFAULT, supports=_supports_cumsum)
def cumsum_cumsum(node: Node) -> Kernel:
    """CumSum: np.cumsum along axis (input 1, int32 or int64) in the input's dtype;
    ``exclusive`` shifts the sums by one (the first is 0), ``reverse`` sums from the end."""
    exclusive = bool(node.attr("exclusive", 0))
    reverse = bool(node.attr("reverse", 0))

    def run(x: np.ndarray, axis: np.ndarray) -> np.ndarray:
        a = normalize_axis(int(_scalar(axis, "CumSum axis")), x.ndim, "CumSum axis")
        v = np.flip(x, a) if reverse else x
        with np.errstate(all="ignore"):
            if exclusive:
                y = np.zeros(v.shape, dtype=x.dtype)
                dst: list[slice] = [slice(None)] * x.ndim
                src: list[slice] = [slice(None)] * x.ndim
                dst[a], src[a] = slice(1, None), slice(0, -1)
                np.cumsum(v[tuple(src)], axis=a, dtype=x.dtype, out=y[tuple(dst)])
            else:
                y = np.cumsum(v, axis=a, dtype=x.dtype)
        return as_std(np.flip(y, a) if reverse else y, x.dtype)

    return run


# -- Trilu -----------------------------------------------------------------------------------


def _supports_trilu(node: Node) -> str | None:
    v = node.input(0)
    if v is not None and v.shape is not None and len(v.shape) < 2:
        return f"Trilu needs an input of rank 2 or more; received rank {len(v.shape)}"
    return first_reason(
        check_dtypes(node, PLAIN_TYPES),
        check_dtypes(node, INT64, (1,)),
        _one_element_reason(node, 1, "k"),
    )


@impls.register("Trilu", "mask", priority=Priority.DEFAULT, supports=_supports_trilu)
def trilu_mask(node: Node) -> Kernel:
    """Trilu: np.triu (``upper``, the default) or np.tril of the last two axes, every batch
    matrix alike; the diagonal offset k (input 1) defaults to 0."""
    upper = bool(node.attr("upper", 1))

    def run(x: np.ndarray, k: np.ndarray | None = None) -> np.ndarray:
        if x.ndim < 2:
            raise ValueError(f"Trilu needs an input of rank 2 or more; received {x.shape}")
        kk = 0 if k is None else int(_scalar(k, "Trilu k"))
        return as_std(np.triu(x, kk) if upper else np.tril(x, kk), x.dtype)

    return run


# -- Range -----------------------------------------------------------------------------------

RANGE_TYPES = FLOAT_TYPES | frozenset({"int16", "int32", "int64"})
#: where float16 is computed, per stash_type
_STASH = {
    onnx.TensorProto.FLOAT: np.dtype(np.float32),
    onnx.TensorProto.DOUBLE: np.dtype(np.float64),
}


def _supports_range(node: Node) -> str | None:
    reason = first_reason(
        _needs_input(node, 1, "limit"),
        _needs_input(node, 2, "delta"),
        check_dtypes(node, RANGE_TYPES, (0, 1, 2), same=True),
        *(_one_element_reason(node, i, w) for i, w in enumerate(("start", "limit", "delta"))),
    )
    if reason:
        return reason
    stash = int(node.attr("stash_type", onnx.TensorProto.FLOAT))
    if stash not in _STASH:
        return f"Range stash_type must be 1 (FLOAT) or 11 (DOUBLE); received {stash}"
    return None


def range_values(start: Any, limit: Any, delta: Any, dtype: np.dtype,
                 compute: np.dtype | None = None) -> np.ndarray:
    """ONNX Range: ``max(ceil((limit - start) / delta), 0)`` elements ``start + i * delta``.

    Integers are exact (the count in Python integers, the values in int64, then cast); floats
    are computed as np.arange computes them (and onnx's reference with it): the count from the
    float64 quotient, the values as start + i * (start + delta - start) in float64 (float16 in
    ``compute``: its stash type), cast to ``dtype``.
    """
    if dtype.kind in "iu":
        s, lim, d = int(start), int(limit), int(delta)
        if d == 0:
            raise ValueError("Range delta must not be 0")
        n = max(-((s - lim) // d), 0)
        steps = np.arange(n, dtype=np.int64)
        with np.errstate(all="ignore"):
            return as_std((np.int64(s) + steps * np.int64(d)).astype(dtype))
    s, lim, d = float(start), float(limit), float(delta)
    if d == 0:
        raise ValueError("Range delta must not be 0")
    q = (lim - s) / d
    if not math.isfinite(q):
        raise ValueError(f"Range cannot count the elements from {s} to {lim} by {d}")
    n = max(math.ceil(q), 0)
    cdt = np.dtype(np.float64) if compute is None else compute
    c = cdt.type
    step = (c(s) + c(d)) - c(s)
    with np.errstate(all="ignore"):
        return as_std((c(s) + np.arange(n, dtype=cdt) * step).astype(dtype))


@impls.register("Range", "arange", priority=Priority.DEFAULT, supports=_supports_range)
def range_arange(node: Node) -> Kernel:
    """Range: max(ceil((limit - start) / delta), 0) elements start + i * delta of the inputs'
    type (floats through float64 as np.arange; float16 in its stash_type, float32 by default);
    delta 0 is an error."""
    stash = _STASH.get(int(node.attr("stash_type", onnx.TensorProto.FLOAT)), np.dtype(np.float32))

    def run(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> np.ndarray:
        dt = np.asarray(start).dtype
        compute = stash if dt == np.float16 else None
        return range_values(_scalar(start, "Range start"), _scalar(limit, "Range limit"),
                            _scalar(delta, "Range delta"), dt, compute)

    return run


# -- OneHot ----------------------------------------------------------------------------------


def _supports_onehot(node: Node) -> str | None:
    reason = first_reason(
        _needs_input(node, 1, "depth"),
        _needs_input(node, 2, "values"),
        check_dtypes(node, NUMERIC_TYPES, (0,)),
        check_dtypes(node, NUMERIC_TYPES, (1,)),
        check_dtypes(node, PLAIN_TYPES, (2,)),
        _one_element_reason(node, 1, "depth"),
    )
    if reason:
        return reason
    values = node.input(2)
    if values is not None and values.shape is not None and tuple(values.shape) != (2,):
        return ("OneHot values must be [off_value, on_value] (shape [2]); received "
                f"{list(values.shape)}")
    v = node.input(0)
    axis = int(node.attr("axis", -1))
    if v is not None and v.shape is not None:
        r = len(v.shape)
        if not -r - 1 <= axis <= r:
            return f"OneHot axis {axis} is out of range [-{r + 1}, {r}] for indices of rank {r}"
    return None


@impls.register("OneHot", "compare", priority=Priority.DEFAULT, supports=_supports_onehot)
def onehot_compare(node: Node) -> Kernel:
    """OneHot: on_value where the (int64-cast) index equals the position along the new axis
    (default -1, the innermost) of size depth, off_value elsewhere. From opset 11 negative
    indices count from depth and indices outside [-depth, depth - 1] give an all-off row;
    before, every index outside [0, depth) does. A float depth or index is truncated to int64
    first, as ONNX specifies."""
    axis = int(node.attr("axis", -1))
    wrap = node.opset >= 11

    def run(indices: np.ndarray, depth: np.ndarray, values: np.ndarray) -> np.ndarray:
        d = int(_scalar(depth, "OneHot depth"))
        if d < 0:
            raise ValueError(f"OneHot depth must not be negative; received {d}")
        if values.size != 2:
            raise ValueError(
                f"OneHot values must hold [off_value, on_value]; received {values.shape}")
        off, on = values.reshape(-1)
        r = indices.ndim
        a = normalize_axis(axis, r + 1, "OneHot axis")
        with np.errstate(invalid="ignore"):
            idx = np.asarray(indices).astype(np.int64)
        if wrap:
            idx = np.where(idx < 0, idx + d, idx)
        positions = np.arange(d, dtype=np.int64).reshape((1,) * a + (d,) + (1,) * (r - a))
        hit = np.expand_dims(idx, a) == positions
        return as_std(np.where(hit, on, off), values.dtype)

    return run


# -- NonZero ---------------------------------------------------------------------------------


def _supports_nonzero(node: Node) -> str | None:
    return check_dtypes(node, PLAIN_TYPES)


@impls.register("NonZero", "nonzero", priority=Priority.DEFAULT, supports=_supports_nonzero)
def nonzero_nonzero(node: Node) -> Kernel:
    """NonZero: the int64 indices [rank, count] of the non-zero elements in row-major order
    (np.nonzero stacked); a 0-d input gives shape [0, count] as onnx's reference does."""

    def run(x: np.ndarray) -> np.ndarray:
        a = np.asarray(x)
        if a.ndim == 0:
            return np.empty((0, int(np.count_nonzero(a))), dtype=np.int64)
        return as_std(np.stack(np.nonzero(a)).astype(np.int64, copy=False))

    return run


# -- Compress --------------------------------------------------------------------------------


def _supports_compress(node: Node) -> str | None:
    reason = first_reason(
        _needs_input(node, 1, "condition"),
        check_dtypes(node, PLAIN_TYPES | STRING_TYPES),
        check_dtypes(node, BOOL_TYPES, (1,)),
    )
    if reason:
        return reason
    cond, v = node.input(1), node.input(0)
    if cond.shape is not None and len(cond.shape) != 1:
        return f"Compress condition must be 1-D; received shape {list(cond.shape)}"
    axis = node.attr("axis")
    if axis is None:
        return None
    axis = int(axis)
    if node.opset < 11 and axis < 0:
        return f"Compress axis {axis} is negative; negative axes count from opset 11"
    if v.shape is not None and not -len(v.shape) <= axis < len(v.shape):
        return f"Compress axis {axis} is out of range for an input of rank {len(v.shape)}"
    return None


def compress_mask(condition: np.ndarray, n: int) -> np.ndarray:
    """``condition`` (1-D bool) fitted to ``n`` entries: a shorter one is padded with False
    (it selects nothing past its end); a longer one may only hold False past ``n``."""
    c = np.asarray(condition)
    if c.ndim != 1:
        raise ValueError(f"Compress condition must be 1-D; received shape {c.shape}")
    c = c.astype(bool, copy=False)
    if c.size > n:
        if c[n:].any():
            raise IndexError(f"Compress condition of length {c.size} selects index "
                             f"{n + int(np.argmax(c[n:]))}, outside the {n} entries")
        return c[:n]
    return np.concatenate([c, np.zeros(n - c.size, dtype=bool)]) if c.size < n else c


@impls.register("Compress", "mask", priority=Priority.DEFAULT, supports=_supports_compress)
def compress_mask_select(node: Node) -> Kernel:
    """Compress: the slices along axis (the elements of the flattened input without axis)
    where condition is True; a shorter condition selects nothing past its end."""
    axis = node.attr("axis")

    def run(x: np.ndarray, condition: np.ndarray) -> np.ndarray:
        if axis is None:
            flat = np.asarray(x).reshape(-1)
            return as_std(flat[compress_mask(condition, flat.size)])
        a = normalize_axis(int(axis), x.ndim, "Compress axis")
        keep = np.flatnonzero(compress_mask(condition, x.shape[a]))
        return as_std(np.take(x, keep, axis=a))

    return run
