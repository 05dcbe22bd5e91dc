"""2-D pooling on oneDNN (float32), in every rank-4 activation layout oneDNN shares with the
native backend: ``std`` (nchw), ``nhwc``, ``nchw8c`` and ``nchw16c``.

- ``MaxPool.onednn.L``: kernel, strides, pads (explicit or ``auto_pad``), dilations,
  ``ceil_mode`` (the end pads grown to reach the last window); the Indices output is not
  produced, so a MaxPool that has it is not supported;
- ``AveragePool.onednn.L``: ``count_include_pad`` 0 or 1 (1 only where no ceil-mode window
  reaches past the padding, since ONNX never counts those cells);
- ``GlobalAveragePool.onednn.L`` / ``GlobalMaxPool.onednn.L``: one window over H x W.

The primitive is created once per plan, in the build function.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from dispatch.graph import Node
from dispatch.registry import STANDARD, Priority
from impls.common import as_f32
from impls.numpy.conv import window_attrs, window_reason
from impls.onednn import layouts as lay
from impls.onednn._module import onednn
from impls.onednn.table import impls

#: The layouts every pooling runs in.
LAYOUTS = (STANDARD, "nhwc", "nchw8c", "nchw16c")
OPS = ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool")

Kernel = Callable[[np.ndarray], np.ndarray]


_c = as_f32


def pool_params(node: Node) -> tuple[list[int], str] | str:
    """([N, C, H, W, KH, KW, SH, SW, DH, DW, PT, PL, PB, PR], kind) of a 2-D pooling node, or
    the reason it is not one oneDNN runs."""
    x = node.input(0)
    if x is None or x.dtype is None or np.dtype(x.dtype) != np.float32:
        return f"needs a float32 input, received {None if x is None else x.dtype}"
    if x.shape is None or len(x.shape) != 4:
        return f"needs a rank-4 (N, C, H, W) input, received shape {None if x is None else x.shape}"
    n, c, h, w = (int(d) for d in x.shape)
    if 0 in (n, c, h, w):
        return f"the input is empty (shape {tuple(x.shape)}): nothing for oneDNN to run"
    if node.op_type.startswith("Global"):
        kind = "max" if node.op_type == "GlobalMaxPool" else "avg_exclude"
        return [n, c, h, w, h, w, 1, 1, 1, 1, 0, 0, 0, 0], kind
    if len(node.outputs) > 1:
        return "the Indices output of MaxPool is not produced"
    reason = window_reason(node, 2)
    if reason:
        return reason
    kernel = node.attr("kernel_shape")
    if kernel is None or len(kernel) != 2:
        return f"needs a 2-D kernel_shape, received {kernel}"
    if (node.op_type == "AveragePool" and node.attr("dilations")
            and any(int(d) != 1 for d in node.attr("dilations"))):
        return "AveragePool with dilations is not supported"
    win = window_attrs(node, 2, kernel)
    geom = win.geometry((h, w))
    if any(o < 1 for o in geom.out):
        return f"empty output {geom.out}"
    (pt, pl), (pb, pr) = geom.pad_begin, geom.pad_end
    xb, xr = geom.extra_end
    if node.op_type == "MaxPool":
        kind = "max"
        for i, n_in in enumerate((h, w)):
            coords = geom.coords(win, i)
            if not ((coords >= 0) & (coords < n_in)).any(axis=0).all():
                return ("a window lies entirely in the padding: oneDNN gives -FLT_MAX there, "
                        "ONNX -inf")
    elif int(node.attr("count_include_pad", 0)):
        if xb or xr:
            return ("count_include_pad=1 with ceil-mode windows past the padding (ONNX does not "
                    "count those cells; oneDNN would)")
        kind = "avg_include"
    else:
        kind = "avg_exclude"
    return [n, c, h, w, *win.kernel, *win.strides, *win.dilations, pt, pl, pb + xb, pr + xr], kind


@functools.lru_cache(maxsize=1024)
def _probe(params: tuple[int, ...], kind: str, tag: str) -> str | None:
    """Why oneDNN cannot create this pooling (or has only its reference one), else None."""
    try:
        impl = onednn().Pool(list(params), kind, tag).impl
    except (RuntimeError, ValueError) as exc:
        return f"oneDNN cannot create this pooling: {exc}"
    if impl.startswith("ref") and tag != "abcd":
        return f"oneDNN has only its reference implementation in this layout ({impl})"
    return None


def _supports(layout: str) -> Callable[[Node], str | None]:
    def check(node: Node) -> str | None:
        found = pool_params(node)
        if isinstance(found, str):
            return found
        return _probe(tuple(found[0]), found[1], lay.activation_tag(layout))

    return check


def _register(op: str, layout: str) -> None:
    def build(node: Node) -> Kernel:
        found = pool_params(node)
        assert not isinstance(found, str), found  # supports() said yes
        prim = onednn().Pool(found[0], found[1], lay.activation_tag(layout))

        def run(x: np.ndarray) -> np.ndarray:
            return prim(_c(x))

        run.primitive = prim  # type: ignore[attr-defined]
        return run

    build.__doc__ = f"{op} on oneDNN's pooling in {layout}."
    impls.register(op, layout, priority=Priority.PREFERRED, supports=_supports(layout),
                   layouts_in=(layout,), layouts_out=(layout,))(build)


for _op in OPS:
    for _layout in LAYOUTS:
        _register(_op, _layout)
