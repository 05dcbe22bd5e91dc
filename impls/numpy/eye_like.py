"""numpy reference kernel for EyeLike (opsets 9 and 22): a 2-D identity of the input's shape
with ones on diagonal ``k``, of the ``dtype`` attribute's type (default: the input's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.misc import PLAIN_TYPES, check_dtypes
from impls.numpy.table import impls

Kernel = Callable[..., Any]


def _out_dtype(node: Node) -> np.dtype | None:
    """The dtype attribute as a numpy dtype (``None`` when absent)."""
    code = node.attr("dtype")
    if code is None:
        return None
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(code)))


def _supports_eye_like(node: Node) -> str | None:
    if node.input(0) is None:
        return "EyeLike needs its input"
    reason = check_dtypes(node, PLAIN_TYPES)
    if reason:
        return reason
    try:
        out = _out_dtype(node)
    except (KeyError, TypeError, ValueError):
        return f"EyeLike dtype {node.attr('dtype')!r} is not a tensor type numpy has"
    if out is not None and out.name not in PLAIN_TYPES:
        return f"EyeLike dtype {out.name} is not supported; numeric and bool types are"
    xs = node.input(0).shape
    if xs is not None and len(xs) != 2:
        return f"EyeLike needs a rank-2 input; received shape {list(xs)}"
    return None


@impls.register("EyeLike", "eye", priority=Priority.DEFAULT, supports=_supports_eye_like)
def eye_like_eye(node: Node) -> Kernel:
    """EyeLike: np.eye of the input's shape on diagonal k."""
    k = int(node.attr("k", 0))
    dtype = _out_dtype(node)

    def run(x: np.ndarray) -> np.ndarray:
        if x.ndim != 2:
            raise ValueError(f"EyeLike needs a rank-2 input; received shape {x.shape}")
        return np.eye(x.shape[0], x.shape[1], k=k, dtype=dtype or x.dtype)

    return run
