"""Native pooling (float32) in every activation layout of the backend: ``std`` (nchw),
``nhwc``, ``nchw8c`` and ``nchw16c``.

C++ in native/src/pool.cpp. Implementations, one per layout L (input and output both in L, so a
plan can stay in a blocked or channels-last layout between convolutions):

- ``MaxPool.native.L`` / ``AveragePool.native.L``: 2-D windows with kernel_shape, strides,
  dilations, pads, auto_pad (resolved here to explicit pads), ceil_mode and, for averages,
  count_include_pad. Windows only read cells inside the input; the average divides by the
  cells inside the input (plus the explicit padding with count_include_pad) as ONNX does.
  MaxPool's optional Indices output (and so storage_order) is not produced: ``supports()``
  rejects such nodes (MaxPool.numpy.offsets runs them);
- ``GlobalAveragePool.native.L`` / ``GlobalMaxPool.native.L``: every spatial cell; the
  standard layout takes any rank >= 3, the others rank 4.

Blocked outputs keep their padding channels zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import STANDARD, Priority
from impls.common import Kernel
from impls.common import as_f32 as _c
from impls.native._module import native
from impls.native.layouts import BLOCKS
from impls.native.table import impls
from impls.numpy.conv import Window, window_attrs, window_reason

#: Every layout the pooling kernels run in.
LAYOUTS = (STANDARD, "nhwc", *BLOCKS)
#: ONNX op -> the kernel's pooling kind.
WINDOW_OPS = {"MaxPool": "max", "AveragePool": "avg"}
GLOBAL_OPS = {"GlobalMaxPool": "max", "GlobalAveragePool": "avg"}


def _static(shape: Any) -> bool:
    return shape is not None and all(isinstance(d, int | np.integer) for d in shape)


def _input_reason(node: Node) -> str | None:
    """Why input X of a pooling node is not a float32 tensor with a static shape, or None."""
    x = node.input(0)
    if x is None:
        return f"{node.op_type} needs input X"
    if x.dtype is None or np.dtype(x.dtype) != np.float32:
        return f"needs a float32 input X, received dtype {x.dtype}"
    if not _static(x.shape):
        return f"needs a static input shape, received {x.shape}"
    return None


# -- MaxPool / AveragePool -------------------------------------------------------------------


def _window(node: Node) -> Window:
    return window_attrs(node, 2, [int(k) for k in node.attr("kernel_shape")])


def _window_reason(node: Node) -> str | None:
    """Why a MaxPool / AveragePool node is outside what the native kernels handle, or None."""
    reason = _input_reason(node)
    if reason:
        return reason
    xs = tuple(node.input(0).shape)
    if len(xs) != 4:
        return (f"only 2-D pooling (X of rank 4, N x C x H x W) is implemented, received X of "
                f"shape {xs}")
    kernel = node.attr("kernel_shape")
    if kernel is None:
        return f"{node.op_type} needs the kernel_shape attribute"
    if len(kernel) != 2 or any(int(k) < 1 for k in kernel):
        return f"kernel_shape must be 2 positive values, received {list(kernel)}"
    reason = window_reason(node, 2)
    if reason:
        return reason
    if node.op_type == "MaxPool":
        if len(node.outputs) > 1:
            return ("the Indices output of MaxPool is not produced (MaxPool.numpy.offsets "
                    "produces it)")
        order = int(node.attr("storage_order", 0))
        if order not in (0, 1):
            return f"storage_order must be 0 or 1, received {order}"
    if xs[2] < 1 or xs[3] < 1:
        return f"needs a non-empty spatial extent, received X of shape {xs}"
    out = _window(node).geometry(xs[2:]).out
    if min(out) < 1:
        return f"the window does not fit the padded input {xs}: the output would be {out}"
    return None


def pool_args(node: Node) -> dict[str, Any]:
    """Keyword arguments of the kernel ``pool2d`` for a (supported) MaxPool / AveragePool:
    auto_pad resolved to explicit pads (top, left, bottom, right); ceil_mode applies to
    explicit padding only (auto_pad fixes the output size)."""
    xs = node.input(0).shape
    win = _window(node)
    geom = win.geometry(xs[2:])
    return {
        "kind": WINDOW_OPS[node.op_type],
        "kernel": list(win.kernel),
        "strides": list(win.strides),
        "dilations": list(win.dilations),
        "pads": [int(p) for p in (*geom.pad_begin, *geom.pad_end)],
        "ceil_mode": bool(win.ceil_mode and win.auto_pad == "NOTSET"),
        "count_include_pad": node.op_type == "AveragePool" and bool(node.attr("count_include_pad", 0)),
        "channels": int(xs[1]),
    }


def _register_window(op: str, layout: str) -> None:
    def build(node: Node) -> Kernel:
        mod = native()
        args = pool_args(node)

        def run(x: np.ndarray) -> np.ndarray:
            return mod.pool2d(_c(x), layout, **args)

        return run

    what = "maximum" if op == "MaxPool" else "average"
    build.__doc__ = f"2-D {what} pooling in {layout} (pads, strides, dilations, ceil_mode)."
    impls.register(op, layout, priority=Priority.PREFERRED, supports=_window_reason,
                   layouts_in=(layout,), layouts_out=(layout,))(build)


# -- GlobalMaxPool / GlobalAveragePool -------------------------------------------------------


def _global_supports(layout: str) -> Callable[[Node], str | None]:
    def check(node: Node) -> str | None:
        reason = _input_reason(node)
        if reason:
            return reason
        xs = tuple(node.input(0).shape)
        if layout == STANDARD and len(xs) < 3:
            return f"needs X of rank >= 3 (N, C, spatial...), received shape {xs}"
        if layout != STANDARD and len(xs) != 4:
            return f"layout {layout} holds rank-4 tensors, received X of shape {xs}"
        if 0 in xs[2:]:
            return f"needs a non-empty spatial extent, received X of shape {xs}"
        return None

    return check


def _register_global(op: str, layout: str) -> None:
    kind = GLOBAL_OPS[op]

    def build(node: Node) -> Kernel:
        mod = native()
        channels = int(node.input(0).shape[1])

        def run(x: np.ndarray) -> np.ndarray:
            return mod.global_pool(_c(x), layout, kind, channels)

        return run

    what = "maximum" if kind == "max" else "mean"
    build.__doc__ = f"{op}: {what} over every spatial cell in {layout}."
    impls.register(op, layout, priority=Priority.PREFERRED, supports=_global_supports(layout),
                   layouts_in=(layout,), layouts_out=(layout,))(build)


for _layout in LAYOUTS:
    for _op in WINDOW_OPS:
        _register_window(_op, _layout)
    for _op in GLOBAL_OPS:
        _register_global(_op, _layout)
