"""numpy reference kernels for DepthToSpace and SpaceToDepth (rank-4 NCHW rearrangements).

DepthToSpace takes ``mode`` DCR (depth-column-row, the default) or CRD from opset 11;
SpaceToDepth only DCR before opset 28, which adds ``mode`` (DCR or CRD). Each is a reshape,
one transpose copied into a contiguous array and a reshape; any dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.misc import as_std
from impls.numpy.table import impls

Kernel = Callable[..., Any]

MODES = ("DCR", "CRD")


def _mode(node: Node) -> str:
    since = 11 if node.op_type == "DepthToSpace" else 28
    return str(node.attr("mode", "DCR")) if node.opset >= since else "DCR"


def _supports(node: Node) -> str | None:
    if node.input(0) is None:
        return f"{node.op_type} needs its input"
    b = node.attr("blocksize")
    if b is None or int(b) < 1:
        return f"{node.op_type} needs a blocksize attribute >= 1; received {b!r}"
    mode = _mode(node)
    if mode not in MODES:
        return f"{node.op_type} mode {mode!r} is not one of {', '.join(MODES)}"
    xs = node.input(0).shape
    if xs is None:
        return None
    if len(xs) != 4:
        return f"{node.op_type} needs a rank-4 (N, C, H, W) input; received shape {list(xs)}"
    b = int(b)
    if node.op_type == "DepthToSpace" and xs[1] % (b * b):
        return f"DepthToSpace channels {xs[1]} are not divisible by blocksize^2 = {b * b}"
    if node.op_type == "SpaceToDepth" and (xs[2] % b or xs[3] % b):
        return f"SpaceToDepth H, W = {xs[2]}, {xs[3]} are not divisible by blocksize {b}"
    return None


@impls.register("DepthToSpace", "transpose", priority=Priority.DEFAULT, supports=_supports)
def depth_to_space_transpose(node: Node) -> Kernel:
    """DepthToSpace: reshape, transpose (DCR or CRD order), reshape."""
    b = int(node.attr("blocksize"))
    crd = _mode(node) == "CRD"

    def run(x: np.ndarray) -> np.ndarray:
        n, c, h, w = x.shape
        if c % (b * b):
            raise ValueError(f"DepthToSpace channels {c} are not divisible by blocksize^2 = {b * b}")
        cb = c // (b * b)
        if crd:
            t = x.reshape(n, cb, b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
        else:
            t = x.reshape(n, b, b, cb, h, w).transpose(0, 3, 4, 1, 5, 2)
        return as_std(np.ascontiguousarray(t).reshape(n, cb, h * b, w * b))

    return run


@impls.register("SpaceToDepth", "transpose", priority=Priority.DEFAULT, supports=_supports)
def space_to_depth_transpose(node: Node) -> Kernel:
    """SpaceToDepth: reshape, transpose (DCR, or CRD from opset 28), reshape."""
    b = int(node.attr("blocksize"))
    crd = _mode(node) == "CRD"

    def run(x: np.ndarray) -> np.ndarray:
        n, c, h, w = x.shape
        if h % b or w % b:
            raise ValueError(f"SpaceToDepth H, W = {h}, {w} are not divisible by blocksize {b}")
        t = x.reshape(n, c, h // b, b, w // b, b)
        t = t.transpose(0, 1, 3, 5, 2, 4) if crd else t.transpose(0, 3, 5, 1, 2, 4)
        return as_std(np.ascontiguousarray(t).reshape(n, c * b * b, h // b, w // b))

    return run
