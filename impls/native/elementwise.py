"""Native elementwise implementations: Relu, Clip, Sum and binary arithmetic.

The kernels work on physical buffers, so one kernel serves every layout of the backend; a
registration per layout lets a plan keep a tensor in ``nchw16c`` (say) across a residual Add
instead of converting it back to ``std``. Blocked layouts keep their zero padding: Relu, Add,
Sub, Mul, Max and Min map zeros to zeros; Clip re-zeroes the padding when 0 is outside
[min, max]. Broadcasting (other than equal shapes) runs in the standard layout only.
"""

from __future__ import annotations

import numpy as np

from dispatch.graph import Node
from dispatch.registry import STANDARD, Priority
from impls.common import as_f32 as _c
from impls.common import clip_bounds as _clip_bounds
from impls.native._module import native
from impls.native.layouts import BLOCKS
from impls.native.table import impls

LAYOUTS = (STANDARD, "nhwc", *BLOCKS)
#: Binary ops whose f(0, 0) == 0, so blocked padding stays zero.
ZERO_PRESERVING = {"Add": "add", "Sub": "sub", "Mul": "mul", "Max": "max", "Min": "min"}
BINARY = {**ZERO_PRESERVING, "Div": "div"}


def _f32(v) -> bool:
    return v is not None and v.dtype is not None and np.dtype(v.dtype) == np.float32


def _unary_supports(layout: str):
    def check(node: Node) -> str | None:
        x = node.input(0)
        if not _f32(x):
            return f"needs a float32 input, received {None if x is None else x.dtype}"
        if layout != STANDARD and (x.shape is None or len(x.shape) != 4):
            return f"layout {layout} holds rank-4 tensors, received shape {x.shape}"
        return None

    return check


for _lay in LAYOUTS:

    @impls.register("Relu", _lay, priority=Priority.PREFERRED, supports=_unary_supports(_lay),
                    layouts_in=(_lay,), layouts_out=(_lay,))
    def _relu(node: Node):
        """Relu on the physical buffer (any layout)."""
        mod = native()
        return lambda x: mod.relu(_c(x))

    def _clip_supports(node: Node, _lay: str = _lay) -> str | None:
        reason = _unary_supports(_lay)(node)
        if reason:
            return reason
        if _clip_bounds(node) is None:
            return "min/max must be constant inputs"
        return None

    @impls.register("Clip", _lay, priority=Priority.PREFERRED, supports=_clip_supports,
                    layouts_in=(_lay,), layouts_out=(_lay,))
    def _clip(node: Node, _lay: str = _lay):
        """Clip with constant bounds on the physical buffer (any layout)."""
        mod = native()
        lo, hi = _clip_bounds(node)
        block = BLOCKS.get(_lay)
        shape = list(node.outputs[0].shape or ())
        rezero = block is not None and not (lo <= 0.0 <= hi) and shape[1] % block != 0

        def run(x, *_bounds):
            y = mod.clip(_c(x), lo, hi)
            if rezero:
                mod.zero_block_tail(y, shape, block)
            return y

        return run

    def _sum_supports(node: Node, _lay: str = _lay) -> str | None:
        shapes = {tuple(v.shape) if v is not None and v.shape is not None else None for v in node.inputs}
        if not all(_f32(v) for v in node.inputs):
            return "needs float32 inputs"
        if len(shapes) != 1 or None in shapes:
            return f"needs inputs of one static shape, received {sorted(map(str, shapes))}"
        if _lay != STANDARD and len(next(iter(shapes))) != 4:
            return f"layout {_lay} holds rank-4 tensors"
        return None

    @impls.register("Sum", _lay, priority=Priority.PREFERRED, supports=_sum_supports,
                    layouts_in=lambda n, _lay=_lay: (_lay,) * len(n.inputs), layouts_out=(_lay,))
    def _sum(node: Node):
        """Sum of same-shape inputs on physical buffers (any layout)."""
        mod = native()
        return lambda *xs: mod.sum_n([_c(x) for x in xs])

    for _op, _code in BINARY.items():
        if _lay in BLOCKS and _op not in ZERO_PRESERVING:
            continue

        def _same_supports(node: Node, _lay: str = _lay) -> str | None:
            if len(node.inputs) != 2:
                return f"needs exactly two inputs, received {len(node.inputs)}"
            a, b = node.input(0), node.input(1)
            if not (_f32(a) and _f32(b)):
                return "needs float32 inputs"
            if a.shape is None or a.shape != b.shape:
                return f"needs inputs of one shape, received {a.shape} and {b.shape}"
            if _lay != STANDARD and len(a.shape) != 4:
                return f"layout {_lay} holds rank-4 tensors, received shape {a.shape}"
            return None

        @impls.register(_op, f"{_lay}_same", priority=Priority.PREFERRED, supports=_same_supports,
                        layouts_in=(_lay, _lay), layouts_out=(_lay,))
        def _binary_same(node: Node, _code: str = _code):
            """Binary op of two same-shape tensors on physical buffers (any layout)."""
            mod = native()
            return lambda a, b: mod.binary_same(_code, _c(a), _c(b))

    if _lay == STANDARD:
        for _op, _code in BINARY.items():

            def _bcast_supports(node: Node) -> str | None:
                if len(node.inputs) != 2:
                    return f"needs exactly two inputs, received {len(node.inputs)}"
                a, b = node.input(0), node.input(1)
                if not (_f32(a) and _f32(b)):
                    return "needs float32 inputs"
                return None

            @impls.register(_op, "broadcast", priority=Priority.DEFAULT, supports=_bcast_supports)
            def _binary_bcast(node: Node, _code: str = _code):
                """Binary op with numpy broadcasting (standard layout)."""
                mod = native()
                return lambda a, b: mod.binary_broadcast(_code, _c(a), _c(b))
