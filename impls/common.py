"""Backend-neutral helpers the C++-backed backends (native, onednn) share: array preparation,
the Conv checks every 2-D float32 Conv kernel needs, and Clip bounds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from impls.numpy.conv import window_attrs, window_reason

INF = float("inf")

Kernel = Callable[..., np.ndarray]


def as_f32(x: np.ndarray) -> np.ndarray:
    """``x`` as a C-contiguous float32 array (a copy only when needed; a 0-d array stays
    0-d, where ``np.ascontiguousarray`` would make it 1-d)."""
    return np.require(x, dtype=np.float32, requirements="C")


def cdiv(a: int, b: int) -> int:
    """Ceiling division."""
    return -(-a // b)


def conv_of(node: Node) -> Node:
    """The Conv node of a single Conv or of a fused chain starting with a Conv."""
    nodes = getattr(node, "nodes", None)
    return nodes[0] if nodes else node


def static4(shape: Any) -> bool:
    """Whether ``shape`` is a rank-4 shape of known integers."""
    return shape is not None and len(shape) == 4 and all(isinstance(d, int | np.integer) for d in shape)


def conv_base_reason(conv: Node) -> str | None:
    """Why a Conv node is outside what every compiled 2-D Conv kernel handles (float32, 2-D,
    static shapes, consistent weights, groups and bias, a non-empty output), or ``None``."""
    x, w = conv.input(0), conv.input(1)
    if x is None or w is None:
        return "Conv needs inputs X and W"
    for i in (0, 1, 2):
        v = conv.input(i)
        if v is not None and (v.dtype is None or np.dtype(v.dtype) != np.float32):
            return f"needs float32 inputs, input {i} has dtype {None if v.dtype is None else v.dtype}"
    if not (static4(x.shape) and static4(w.shape)):
        return f"only 2-D convolutions with static shapes (X {x.shape}, W {w.shape})"
    reason = window_reason(conv, 2)
    if reason:
        return reason
    group = int(conv.attr("group", 1))
    m, cg, kh, kw = w.shape
    if group < 1 or m % group or x.shape[1] != cg * group:
        return f"W {w.shape} does not match X {x.shape} with group={group}"
    kernel = conv.attr("kernel_shape")
    if kernel is not None and tuple(int(k) for k in kernel) != (kh, kw):
        return f"kernel_shape {list(kernel)} does not match W {w.shape}"
    b = conv.input(2)
    if b is not None and tuple(b.shape or ()) != (m,):
        return f"bias B must have shape ({m},), received {b.shape}"
    oh, ow = (int(o) for o in window_attrs(conv, 2, w.shape[2:]).geometry(x.shape[2:]).out)
    if oh < 1 or ow < 1 or x.shape[0] < 1:
        return f"empty output ({x.shape[0]}, {m}, {oh}, {ow})"
    return None


def clip_bounds(clip: Node) -> tuple[float, float] | None:
    """(lo, hi) of a Clip from its attributes (opset < 11) or constant inputs, else None."""
    if clip.opset < 11:
        return float(clip.attr("min", -INF)), float(clip.attr("max", INF))
    bounds = []
    for i, default in ((1, -INF), (2, INF)):
        v = clip.input(i)
        if v is None:
            bounds.append(default)
        elif v.const is None:
            return None
        else:
            bounds.append(float(np.asarray(v.const).reshape(())))
    return bounds[0], bounds[1]
