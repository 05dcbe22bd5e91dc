"""numpy reference kernels for the Reduce* family.

Axes come from the ``axes`` attribute in older opsets and from the optional second input from
opset 13 (ReduceSum) or 18 (every other reduction). A missing or empty axes list reduces every
axis, unless ``noop_with_empty_axes`` is set: then the reduction runs over no axis at all (the
composite reductions still square / take logs elementwise). Reductions over an empty set of
values yield the identity of the reduction (0, 1, -inf or the type's minimum, ...).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.misc import (
    BOOL_TYPES,
    FLOAT_TYPES,
    NUMERIC_TYPES,
    as_std,
    check_dtypes,
    int_list,
    normalize_axes,
)
from impls.numpy.table import impls

Kernel = Callable[..., Any]
Axes = tuple[int, ...]
#: reduce(x, axes, keepdims) -> array (the dtype is restored by the caller)
ReduceFn = Callable[[np.ndarray, Axes, bool], np.ndarray]


def _acc_dtype(dt: np.dtype) -> np.dtype:
    """Accumulation dtype: float32 for float16 (accuracy), the input dtype otherwise."""
    return np.dtype(np.float32) if dt == np.float16 else dt


def _count(x: np.ndarray, axes: Axes) -> int:
    return math.prod(x.shape[a] for a in axes)


def _sum(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    return np.sum(x, axis=axes, keepdims=keep, dtype=_acc_dtype(x.dtype))


def _mean(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    s = _sum(x, axes, keep)
    n = _count(x, axes)
    if x.dtype.kind in "iu":  # numpy's (and ONNX's reference) integer mean: truncated quotient
        return np.true_divide(s, n) if n else np.zeros_like(s)
    return s / s.dtype.type(n) if n else np.full_like(s, np.nan)


def _lowest(dt: np.dtype) -> Any:
    if dt.kind == "b":
        return False
    if dt.kind in "iu":
        return np.iinfo(dt).min
    return -np.inf


def _highest(dt: np.dtype) -> Any:
    if dt.kind == "b":
        return True
    if dt.kind in "iu":
        return np.iinfo(dt).max
    return np.inf


def _max(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    return np.max(x, axis=axes, keepdims=keep, initial=_lowest(x.dtype))


def _min(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    return np.min(x, axis=axes, keepdims=keep, initial=_highest(x.dtype))


def _prod(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    return np.prod(x, axis=axes, keepdims=keep, dtype=_acc_dtype(x.dtype))


def _sum_square(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    xa = x.astype(_acc_dtype(x.dtype), copy=False)
    return np.sum(xa * xa, axis=axes, keepdims=keep)


def _l1(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    return np.sum(np.abs(x), axis=axes, keepdims=keep, dtype=_acc_dtype(x.dtype))


def _l2(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    wide = np.float64 if x.dtype.kind in "iu" else _acc_dtype(x.dtype)
    xa = x.astype(wide, copy=False)
    return np.sqrt(np.sum(xa * xa, axis=axes, keepdims=keep))


def _log_sum(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    return np.log(_sum(x, axes, keep))


def _log_sum_exp(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    """log(sum(exp(x))) shifted by the finite maximum so that exp cannot overflow."""
    xa = x.astype(_acc_dtype(x.dtype), copy=False)
    finite = np.where(np.isfinite(xa), xa, -np.inf)
    m = np.max(finite, axis=axes, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0).astype(xa.dtype)
    s = np.sum(np.exp(xa - m), axis=axes, keepdims=True)
    y = np.log(s) + m
    if not keep:
        y = np.squeeze(y, axis=axes)
    return y


@dataclass(frozen=True)
class _Reduction:
    op: str
    fn: ReduceFn
    types: frozenset[str]
    axes_input_opset: int
    doc: str


_REDUCTIONS = (
    _Reduction("ReduceSum", _sum, NUMERIC_TYPES, 13, "ReduceSum: np.sum in the input dtype."),
    _Reduction("ReduceMean", _mean, NUMERIC_TYPES, 18, "ReduceMean: sum / count (NaN if empty)."),
    _Reduction(
        "ReduceMax", _max, NUMERIC_TYPES | BOOL_TYPES, 18, "ReduceMax: np.max, -inf/min if empty."
    ),
    _Reduction(
        "ReduceMin", _min, NUMERIC_TYPES | BOOL_TYPES, 18, "ReduceMin: np.min, +inf/max if empty."
    ),
    _Reduction("ReduceProd", _prod, NUMERIC_TYPES, 18, "ReduceProd: np.prod (1 if empty)."),
    _Reduction("ReduceSumSquare", _sum_square, NUMERIC_TYPES, 18, "ReduceSumSquare: sum(x*x)."),
    _Reduction("ReduceL1", _l1, NUMERIC_TYPES, 18, "ReduceL1: sum(|x|)."),
    _Reduction("ReduceL2", _l2, NUMERIC_TYPES, 18, "ReduceL2: sqrt(sum(x*x))."),
    _Reduction("ReduceLogSum", _log_sum, FLOAT_TYPES, 18, "ReduceLogSum: log(sum(x))."),
    _Reduction(
        "ReduceLogSumExp", _log_sum_exp, FLOAT_TYPES, 18, "ReduceLogSumExp: max-shifted, stable."
    ),
)


def resolve_axes(axes: Any, rank: int, noop_with_empty_axes: bool) -> Axes:
    """The axes to reduce: all of them for a missing / empty list, none with the noop flag."""
    listed = [] if axes is None else int_list(axes)
    if not listed:
        return () if noop_with_empty_axes else tuple(range(rank))
    return normalize_axes(listed, rank)


def _supports_for(r: _Reduction) -> Callable[[Node], str | None]:
    def supports(node: Node) -> str | None:
        reason = check_dtypes(node, r.types)
        if reason:
            return reason
        if node.opset >= r.axes_input_opset:
            return check_dtypes(node, frozenset({"int64", "int32"}), (1,))
        if node.input(1) is not None:
            return (
                f"{r.op} at opset {node.opset} takes axes as an attribute; received a second "
                f"input (axes inputs start at opset {r.axes_input_opset})"
            )
        return None

    return supports


def _register(r: _Reduction) -> None:
    def build(node: Node) -> Kernel:
        keep = bool(node.attr("keepdims", 1))
        noop = bool(node.attr("noop_with_empty_axes", 0))
        from_input = node.opset >= r.axes_input_opset
        attr_axes = None if from_input else node.attr("axes")

        def run(x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
            ax = resolve_axes(axes if from_input else attr_axes, x.ndim, noop)
            with np.errstate(all="ignore"):
                return as_std(r.fn(x, ax, keep), x.dtype)

        return run

    build.__doc__ = r.doc
    build.__name__ = f"{r.op.lower()}_reduce"
    impls.register(r.op, "reduce", priority=Priority.DEFAULT, supports=_supports_for(r))(build)


for _r in _REDUCTIONS:
    _register(_r)
