"""numpy reference kernels for LpNormalization and MeanVarianceNormalization.

- LpNormalization (opsets 1 and 22): ``x / ||x||_p`` along ``axis`` (default -1) with ``p``
  1 (sum of absolute values) or 2 (Euclidean); where the norm is 0 the output is 0, as opset 22
  defines it (opset 1 leaves 0 / 0 undefined; the same 0 is given there).
- MeanVarianceNormalization (opsets 9 and 13): ``(x - mean) / (sqrt(variance) + 1e-9)`` over
  ``axes`` (default [0, 2, 3]), the epsilon of ONNX's function body; the variance is the mean of
  the squared deviations (two passes) where the function body takes E[x^2] - E[x]^2, which
  cancels (a constant channel can give sqrt of a negative rounding error, NaN).

float16 computes in float32 and is rounded back once; float32 and float64 stay in their type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.conv import compute_dtype
from impls.numpy.misc import FLOAT_TYPES, check_dtypes, first_reason, normalize_axes, normalize_axis
from impls.numpy.table import impls

Kernel = Callable[..., Any]

#: MeanVarianceNormalization's epsilon, added to the standard deviation (ONNX's function body)
MVN_EPSILON = 1e-9


def _rank(node: Node) -> int | None:
    v = node.input(0)
    return None if v is None or v.shape is None else len(v.shape)


def _needs_x(node: Node) -> str | None:
    return None if node.input(0) is not None else f"{node.op_type} needs its input"


# -- LpNormalization -------------------------------------------------------------------------


def _supports_lp(node: Node) -> str | None:
    reason = first_reason(_needs_x(node), check_dtypes(node, FLOAT_TYPES))
    if reason:
        return reason
    p = int(node.attr("p", 2))
    if p not in (1, 2):
        return f"LpNormalization p must be 1 or 2; received {p}"
    rank, axis = _rank(node), int(node.attr("axis", -1))
    if rank is not None and not -rank <= axis < max(rank, 1):
        return f"LpNormalization axis {axis} is out of range for an input of rank {rank}"
    return None


@impls.register("LpNormalization", "norm", priority=Priority.DEFAULT, supports=_supports_lp)
def lp_normalization_norm(node: Node) -> Kernel:
    """LpNormalization: x / ||x||_p along axis (0 where the norm is 0)."""
    p = int(node.attr("p", 2))
    axis_attr = int(node.attr("axis", -1))

    def run(x: np.ndarray) -> np.ndarray:
        ct = compute_dtype(x.dtype)
        axis = normalize_axis(axis_attr, x.ndim)
        xc = x.astype(ct, copy=False)
        with np.errstate(all="ignore"):  # IEEE: squares overflow to inf, inf / inf = NaN
            if p == 1:
                norm = np.sum(np.abs(xc), axis=axis, keepdims=True)
            else:
                norm = np.sqrt(np.sum(np.square(xc), axis=axis, keepdims=True))
            y = np.where(norm == 0, ct.type(0), xc / np.where(norm == 0, ct.type(1), norm))
        return np.asarray(y, dtype=x.dtype, order="C")

    return run


# -- MeanVarianceNormalization ---------------------------------------------------------------


def _mvn_axes(node: Node) -> list[int]:
    axes = node.attr("axes")
    return [0, 2, 3] if axes is None else [int(a) for a in axes]


def _supports_mvn(node: Node) -> str | None:
    reason = first_reason(_needs_x(node), check_dtypes(node, FLOAT_TYPES))
    if reason:
        return reason
    rank = _rank(node)
    if rank is not None:
        try:
            normalize_axes(_mvn_axes(node), rank)
        except ValueError as exc:
            return f"MeanVarianceNormalization {exc}"
    return None


@impls.register(
    "MeanVarianceNormalization", "twopass", priority=Priority.DEFAULT, supports=_supports_mvn
)
def mvn_twopass(node: Node) -> Kernel:
    """MeanVarianceNormalization: (x - mean) / (sqrt(two-pass variance) + 1e-9) over axes."""
    axes_attr = _mvn_axes(node)

    def run(x: np.ndarray) -> np.ndarray:
        ct = compute_dtype(x.dtype)
        axes = normalize_axes(axes_attr, x.ndim)
        d = x.astype(ct, copy=True)
        if d.size == 0:
            return np.asarray(d, dtype=x.dtype, order="C")
        with np.errstate(all="ignore"):  # IEEE: squares overflow to inf, inf - inf = NaN
            d -= d.mean(axis=axes, keepdims=True)
            std = np.sqrt(np.mean(np.square(d), axis=axes, keepdims=True))
            d /= std + ct.type(MVN_EPSILON)
        return np.asarray(d, dtype=x.dtype, order="C")

    return run
