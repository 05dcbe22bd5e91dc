"""Native Concat: pure data movement in C++ (native/src/concat.cpp).

- ``Concat.native.std``: the standard (row-major) layout, any axis, any fixed-size dtype (one
  memcpy per contiguous chunk; string tensors are rejected);
- ``Concat.native.nhwc``, ``Concat.native.nchw8c``, ``Concat.native.nchw16c``: along the
  channel axis of rank-4 float32 tensors, every input and the output in that layout, so that a
  plan keeps blocked / channels-last tensors across the channel Concat of Inception, SqueezeNet
  or DenseNet blocks. In the blocked layouts any channel counts work: when every input but the
  last fills whole blocks the kernel copies whole images of blocks, otherwise it re-packs the
  channels across blocks; the output's padding channels are zero.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dispatch.graph import Node
from dispatch.registry import STANDARD, Priority
from impls.common import Kernel
from impls.native._module import native
from impls.native.layouts import BLOCKS
from impls.native.table import impls

#: Layouts of the channel Concat (the standard layout takes every axis).
CHANNEL_LAYOUTS = ("nhwc", *BLOCKS)


def _inputs_reason(node: Node) -> str | None:
    if not node.inputs or any(v is None for v in node.inputs):
        return "Concat needs one or more (non-omitted) inputs"
    if node.attr("axis") is None:
        return "Concat needs the axis attribute"
    return None


def _supports_std(node: Node) -> str | None:
    reason = _inputs_reason(node)
    if reason:
        return reason
    dtypes = {None if v.dtype is None else np.dtype(v.dtype) for v in node.inputs}
    if None in dtypes:
        return "needs inputs of known dtypes"
    if len(dtypes) != 1:
        return f"needs inputs of one dtype, received {sorted(str(d) for d in dtypes)}"
    dtype = next(iter(dtypes))
    if dtype.hasobject:
        return f"copies fixed-size elements only, received dtype {dtype} (e.g. strings)"
    ranks = {len(v.shape) for v in node.inputs if v.shape is not None}
    if len(ranks) > 1:
        return f"needs inputs of one rank, received ranks {sorted(ranks)}"
    if ranks:
        rank = ranks.pop()
        axis = int(node.attr("axis"))
        if rank == 0:
            return "Concat needs inputs of rank >= 1, received scalars"
        if not -rank <= axis < rank:
            return f"axis {axis} is out of range for inputs of rank {rank}"
    return None


def _supports_channels(layout: str) -> Callable[[Node], str | None]:
    def check(node: Node) -> str | None:
        reason = _inputs_reason(node)
        if reason:
            return reason
        for i, v in enumerate(node.inputs):
            if v.dtype is None or np.dtype(v.dtype) != np.float32:
                return f"needs float32 inputs, input {i} has dtype {v.dtype}"
            if v.shape is None or len(v.shape) != 4:
                return f"layout {layout} holds rank-4 tensors, input {i} has shape {v.shape}"
        axis = int(node.attr("axis"))
        if axis not in (1, -3):
            return f"concatenates along the channel axis (1) only in {layout}, received axis {axis}"
        first = tuple(node.inputs[0].shape)
        for i, v in enumerate(node.inputs):
            s = tuple(v.shape)
            if (s[0], s[2], s[3]) != (first[0], first[2], first[3]):
                return (f"inputs must agree on N, H and W, received {first} (input 0) and {s} "
                        f"(input {i})")
        return None

    return check


@impls.register("Concat", STANDARD, priority=Priority.PREFERRED, supports=_supports_std)
def concat_std(node: Node) -> Kernel:
    """Concat in the standard layout along any axis, any fixed-size dtype."""
    mod = native()
    axis = int(node.attr("axis"))

    def run(*xs: np.ndarray) -> np.ndarray:
        return mod.concat([np.asarray(x, order="C") for x in xs], axis)

    return run


def _register_channels(layout: str) -> None:
    def build(node: Node) -> Kernel:
        mod = native()
        channels = [int(v.shape[1]) for v in node.inputs]

        def run(*xs: np.ndarray) -> np.ndarray:
            return mod.concat_channels([np.ascontiguousarray(x, dtype=np.float32) for x in xs],
                                       layout, channels)

        return run

    build.__doc__ = f"Channel Concat of rank-4 float32 tensors in {layout}."
    impls.register("Concat", layout, priority=Priority.PREFERRED, supports=_supports_channels(layout),
                   layouts_in=lambda n: (layout,) * len(n.inputs), layouts_out=(layout,))(build)


for _layout in CHANNEL_LAYOUTS:
    _register_channels(_layout)
