"""Native 2-D convolutions in the channels-last layout ``nhwc`` on the packed SGEMM (float32),
and 1x1 convolutions in the standard layout through the same GEMM.

C++ in native/src/gemm.cpp, native/src/isa/gemm_packed.cpp and native/src/isa/conv_nhwc.cpp.
Every ONNX attribute is handled (pads, auto_pad, strides, dilations, group, kernel_shape):

- ``nhwc_gemm``: one GEMM per group, Y (N*OH*OW, M) = im2col(X) . W, where the im2col matrix is
  never built: the GEMM packs its A panels straight from the nhwc image (a 1x1 stride-1
  unpadded conv reads X as the matrix itself). Group 1 takes the weight in the packed layout
  ``HWIO16o`` (converted once when the plan is built); grouped convs pack the weight per group
  in the build function (constant W) or per call;
- ``nhwc_depthwise``: group == C == M, vectorised over the contiguous channels;
- ``std_1x1``: a 1x1, stride-1, unpadded, group-1 conv in nchw: Y[b] (M, H*W) = W (M, C) .
  X[b] (C, H*W) per image.

Every variant also runs the fused patterns Conv+Relu, Conv+Clip (constant bounds), Conv+Add
(the other input: a tensor of the output's shape, in the output's layout), Conv+Add+Relu and
the same two with a two-input Sum, with bias, residual and clamp in the GEMM write-back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import STANDARD, Priority
from impls.common import INF, Kernel
from impls.common import as_f32 as _c
from impls.common import cdiv as _cdiv
from impls.common import clip_bounds as _clip_bounds
from impls.common import conv_base_reason as _base_reason
from impls.common import conv_of as _conv_of
from impls.native._module import native
from impls.native.layouts import BACKEND
from impls.native.table import impls
from impls.numpy.conv import window_attrs
from layouts.registry import Layout, LayoutRegistry

NHWC = "nhwc"
#: Packed weight layout of group-1 nhwc convs: (M, C, KH, KW) as (ceil(M/16), KH*KW*C, 16).
HWIO16O = "HWIO16o"
NR = 16
PATTERNS: tuple[tuple[str, ...], ...] = (
    ("Conv", "Relu"),
    ("Conv", "Clip"),
    ("Conv", "Add"),
    ("Conv", "Add", "Relu"),
    ("Conv", "Sum"),
    ("Conv", "Sum", "Relu"),
)
RESIDUAL_OPS = ("Add", "Sum")


# -- packed weight layout --------------------------------------------------------------------


def _hwio_shape(s: tuple[int, ...]) -> tuple[int, ...]:
    m, c, kh, kw = s
    return (_cdiv(m, NR), kh * kw * c, NR)


def _pack_hwio(w: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    p = native().conv_pack_weight(_c(w), 1)
    return p.reshape(p.shape[1:])


def _unpack_hwio(p: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    p = _c(p)
    return native().conv_unpack_weight(p.reshape(1, *p.shape), list(shape), 1)


def register_layouts(layouts: LayoutRegistry) -> None:
    """Add HWIO16o, the packed weight of group-1 nhwc convs."""
    layouts.add_layout(
        Layout(HWIO16O, "cpu", BACKEND, rank=4, dtypes=("float32",), physical_shape=_hwio_shape,
               doc="conv weight (M, C, KH, KW) as GEMM panels (ceil(M/16), KH*KW*C, 16o), "
                   "zero-padded"),
        to_standard=_unpack_hwio,
        from_standard=_pack_hwio,
    )


# -- geometry and checks ---------------------------------------------------------------------


def conv_geometry(conv: Node) -> dict[str, Any]:
    """Kernel, strides, dilations, pads (top, left, bottom, right) and group of a 2-D Conv
    with static shapes, auto_pad resolved."""
    xs, ws = conv.input(0).shape, conv.input(1).shape
    win = window_attrs(conv, 2, ws[2:])
    geom = win.geometry(xs[2:])
    (pt, pl), (pb, pr) = geom.pad_begin, geom.pad_end
    return {
        "kernel": [int(ws[2]), int(ws[3])],
        "strides": [int(s) for s in win.strides],
        "dilations": [int(d) for d in win.dilations],
        "pads": [int(pt), int(pl), int(pb), int(pr)],
        "group": int(conv.attr("group", 1)),
        "out": tuple(int(o) for o in geom.out),
    }


def _variant_reason(kind: str, conv: Node) -> str | None:
    xs, ws = conv.input(0).shape, conv.input(1).shape
    g = conv_geometry(conv)
    group, c, m = g["group"], xs[1], ws[0]
    depthwise = group == c == m
    if kind == "gemm" and depthwise and c > 1:
        return "depthwise (group == C == M): the nhwc_depthwise variant takes it"
    if kind == "depthwise" and not depthwise:
        return f"needs group == C == M (depthwise), received group={group}, C={c}, M={m}"
    pointwise = g["kernel"] == [1, 1] and g["strides"] == [1, 1] and not any(g["pads"])
    if kind == "1x1" and not (pointwise and group == 1):
        return (f"needs a 1x1 kernel, stride 1, no padding and group 1, received kernel "
                f"{g['kernel']}, strides {g['strides']}, pads {g['pads']}, group {group}")
    return None


def _pattern_reason(node: Node) -> str | None:
    """Why the later nodes of a fused chain cannot run as the conv's epilogue, or ``None``."""
    nodes = getattr(node, "nodes", None) or [node]
    out = nodes[0].outputs[0]
    for later in nodes[1:]:
        if later.op_type == "Clip":
            bounds = _clip_bounds(later)
            if bounds is None:
                return "Clip min/max must be constants"
            if not bounds[0] <= bounds[1]:
                return f"Clip bounds must satisfy min <= max, received {bounds}"
        elif later.op_type in RESIDUAL_OPS:
            other = [v for v in later.inputs if v is not None and v.name != out.name]
            if len(other) != 1:
                return f"{later.op_type} must take the conv output and one other tensor"
            r = other[0]
            if r.dtype is None or np.dtype(r.dtype) != np.float32:
                return f"the residual must be float32, received {r.dtype}"
            if r.shape is None or tuple(r.shape) != tuple(out.shape or ()):
                return (f"the residual must have the conv output's shape {out.shape} (no "
                        f"broadcasting), received {r.shape}")
    return None


def _epilogue(node: Node) -> tuple[str, float, float, bool]:
    """(act, lo, hi, has_residual) of the chain after the conv."""
    lo, hi, residual = -INF, INF, False
    for later in (getattr(node, "nodes", None) or [node])[1:]:
        if later.op_type == "Relu":
            lo, hi = max(lo, 0.0), max(hi, 0.0)
        elif later.op_type == "Clip":
            clo, chi = _clip_bounds(later)
            lo, hi = min(max(lo, clo), chi), min(max(hi, clo), chi)
        elif later.op_type in RESIDUAL_OPS:
            residual = True
    if lo == -INF and hi == INF:
        return "none", 0.0, 0.0, residual
    if lo == 0.0 and hi == INF:
        return "relu", 0.0, 0.0, residual
    return "clip", lo, hi, residual


# -- kernels ---------------------------------------------------------------------------------


def _build(kind: str, node: Node) -> Kernel:
    conv = _conv_of(node)
    g = conv_geometry(conv)
    m = int(conv.input(1).shape[0])
    group = g["group"]
    nconv = len(conv.inputs)
    act, lo, hi, has_residual = _epilogue(node)
    mod = native()
    w_const = conv.const_input(1)

    def extras(args: Sequence[np.ndarray | None]) -> tuple[np.ndarray | None, np.ndarray | None]:
        b = args[2] if nconv > 2 else None
        r = _c(args[nconv]) if has_residual else None
        return (_c(b) if b is not None else None), r

    if kind == "gemm":
        packed_const = None
        if group > 1 and w_const is not None:
            packed_const = mod.conv_pack_weight(_c(w_const), group)

        def run_gemm(*args: np.ndarray | None) -> np.ndarray:
            b, r = extras(args)
            if group == 1:
                w = _c(args[1])
                w = w.reshape(1, *w.shape)
            else:
                w = packed_const if packed_const is not None else mod.conv_pack_weight(_c(args[1]), group)
            return mod.conv_nhwc(_c(args[0]), w, m, g["kernel"], g["strides"], g["dilations"],
                                 g["pads"], group, b, r, act, lo, hi)

        return run_gemm

    if kind == "depthwise":
        kh, kw = g["kernel"]

        def to_hwc(w: np.ndarray) -> np.ndarray:
            return _c(np.asarray(w, np.float32).reshape(m, kh * kw).T.reshape(kh, kw, m))

        w_hwc = to_hwc(w_const) if w_const is not None else None

        def run_dw(*args: np.ndarray | None) -> np.ndarray:
            b, r = extras(args)
            w = w_hwc if w_hwc is not None else to_hwc(args[1])
            return mod.conv_nhwc_depthwise(_c(args[0]), w, g["strides"], g["dilations"],
                                           g["pads"], b, r, act, lo, hi)

        return run_dw

    def run_1x1(*args: np.ndarray | None) -> np.ndarray:
        b, r = extras(args)
        w = _c(args[1])
        return mod.conv_nchw_1x1(_c(args[0]), w.reshape(w.shape[0], w.shape[1]), b, r, act, lo, hi)

    return run_1x1


def _layouts_in(kind: str) -> Callable[[Node], tuple[str, ...]]:
    act_layout = STANDARD if kind == "1x1" else NHWC

    def layouts(node: Node) -> tuple[str, ...]:
        conv = _conv_of(node)
        w_lay = HWIO16O if kind == "gemm" and int(conv.attr("group", 1)) == 1 else STANDARD
        lay = [act_layout, w_lay, STANDARD][: len(conv.inputs)]
        for later in (getattr(node, "nodes", None) or [node])[1:]:
            if later.op_type in RESIDUAL_OPS:
                lay.append(act_layout)
            elif later.op_type == "Clip":
                lay.extend([STANDARD] * (len(later.inputs) - 1))
        return tuple(lay)

    return layouts


def _supports(kind: str) -> Callable[[Node], str | None]:
    def check(node: Node) -> str | None:
        conv = _conv_of(node)
        return _base_reason(conv) or _variant_reason(kind, conv) or _pattern_reason(node)

    return check


#: kind -> (variant name, output layout, priority, description)
VARIANTS: dict[str, tuple[str, str, int, str]] = {
    "gemm": ("nhwc_gemm", NHWC, Priority.DEFAULT,
             "conv as an implicit-im2col packed GEMM per group, nhwc"),
    "depthwise": ("nhwc_depthwise", NHWC, Priority.DEFAULT,
                  "depthwise conv (group == C == M) vectorised over nhwc channels"),
    "1x1": ("std_1x1", STANDARD, Priority.DEFAULT,
            "1x1 stride-1 conv in nchw as one packed GEMM per image"),
}


def _register(kind: str, pattern: Sequence[str] | None) -> None:
    variant, out_layout, priority, what = VARIANTS[kind]
    doc = what + (f", fused {'+'.join(pattern[1:])} epilogue" if pattern else "")

    def build(node: Node) -> Kernel:
        return _build(kind, node)

    build.__doc__ = doc[0].upper() + doc[1:] + "."
    opts = dict(priority=priority, supports=_supports(kind), layouts_in=_layouts_in(kind),
                layouts_out=(out_layout,))
    if pattern is None:
        impls.register("Conv", variant, **opts)(build)
    else:
        impls.register_pattern(pattern, variant, **opts)(build)


for _kind in VARIANTS:
    _register(_kind, None)
    for _pattern in PATTERNS:
        _register(_kind, _pattern)
