"""numpy reference of onnxruntime's contrib ``com.microsoft`` FusedMatMul (issue 52): ``Y =
alpha * MatMul(op(A), op(B))`` (schema: :mod:`dispatch.contrib_schemas`).

``op`` first moves an operand's first dimension just before its last when ``transBatchA`` /
``transBatchB`` is set (rank >= 3: (d0, d1, .., dn-2, dn-1) -> (d1, .., dn-2, d0, dn-1)), then
swaps its last two dimensions when ``transA`` / ``transB`` is set; the product follows
MatMul's broadcasting (a 1-D operand is a row or a column). float16 is multiplied in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.contrib_activations import MS_DOMAIN
from impls.numpy.misc import FLOAT_TYPES, check_dtypes
from impls.numpy.table import impls

Kernel = Callable[..., Any]


def operand(x: np.ndarray, trans: bool, trans_batch: bool) -> np.ndarray:
    """``x`` as FusedMatMul multiplies it (see the module's docstring)."""
    if trans_batch and x.ndim >= 3:
        x = np.moveaxis(x, 0, -2)
    if trans and x.ndim >= 2:
        x = np.swapaxes(x, -1, -2)
    return x


def _shapes(node: Node) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    a, b = node.input(0), node.input(1)
    if a is None or b is None or a.shape is None or b.shape is None:
        return None
    flags = [bool(int(node.attr(n, 0))) for n in ("transA", "transBatchA", "transB", "transBatchB")]
    sa = operand(np.empty(a.shape, np.int8), flags[0], flags[1]).shape
    sb = operand(np.empty(b.shape, np.int8), flags[2], flags[3]).shape
    return sa, sb


def _supports(node: Node) -> str | None:
    reason = check_dtypes(node, FLOAT_TYPES, (0, 1), same=True)
    if reason:
        return reason
    shapes = _shapes(node)
    if shapes is None:
        return None
    sa, sb = shapes
    if not sa or not sb:
        return "FusedMatMul needs A and B of rank >= 1"
    k_b = sb[-2] if len(sb) >= 2 else sb[0]
    if sa[-1] != k_b:
        return f"A as multiplied {list(sa)} and B as multiplied {list(sb)} disagree on the inner dimension"
    try:
        np.broadcast_shapes(sa[:-2], sb[:-2])
    except ValueError:
        return f"the batch dimensions of {list(sa)} and {list(sb)} do not broadcast"
    return None


@impls.register("FusedMatMul", "ms_matmul", domain=MS_DOMAIN, priority=Priority.DEFAULT, supports=_supports)
def ms_fused_matmul(node: Node) -> Kernel:
    """com.microsoft FusedMatMul: alpha * (A, B transposed as asked) multiplied by np.matmul."""
    alpha = float(node.attr("alpha", 1.0))
    ta, tba = bool(int(node.attr("transA", 0))), bool(int(node.attr("transBatchA", 0)))
    tb, tbb = bool(int(node.attr("transB", 0))), bool(int(node.attr("transBatchB", 0)))

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        ct = np.dtype(np.float32) if a.dtype == np.float16 else a.dtype
        y = np.matmul(operand(a, ta, tba).astype(ct, copy=False), operand(b, tb, tbb).astype(ct, copy=False))
        if alpha != 1.0:
            y = y * ct.type(alpha)
        return np.ascontiguousarray(y.astype(a.dtype, copy=False))

    return run
