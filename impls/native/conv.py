"""Native 2-D convolutions in the blocked layouts ``nchw8c`` / ``nchw16c`` (float32).

Implementations of ``Conv``, per block size B (C++ in native/src/conv.cpp and
native/src/isa/conv_blocked.cpp):

- ``nchw{B}c_direct``: register-blocked direct convolution, any kernel size, strides, pads
  (explicit and auto_pad), dilations, group 1 or groups whose channel counts are multiples of B;
  weight in the packed layout ``OIhw{B}i{B}o``;
- ``nchw{B}c_1x1``: 1x1 kernels as a GEMM over the blocked channels (stride 1 flattens the
  spatial axes; stride 2 walks the strided pixels); same weight layout;
- ``nchw{B}c_depthwise``: group == C == M, weight layout ``Goihw{B}g``;
- ``nchw{B}c_grouped``: any group count; the constant weight is packed at plan build so each
  output block reads only the input blocks of its groups;
- ``nchw{B}c_first``: reads the standard (nchw) input with few channels (a network's first
  layer, e.g. RGB) and writes nchw{B}c; weight layout ``Oihw{B}o``.

Every variant also runs the fused patterns Conv+Relu, Conv+Clip (constant bounds),
Conv+Add (the other Add input: a same-shape tensor in the output's blocked layout),
Conv+Add+Relu, and the same two with a two-input Sum in place of Add, with bias, residual and
clamp applied in the kernel's epilogue. Packed weight layouts are registered here, so a plan
packs constant weights once when it is built.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
from impls.native.layouts import BACKEND, BLOCKS
from impls.native.table import impls
from impls.numpy.conv import window_attrs
from layouts.registry import Layout, LayoutRegistry

#: Input channels up to which the first-layer variant (standard nchw input) applies.
FIRST_MAX_CHANNELS = 8
#: Weight format name (C++ pack_conv_weight) -> layout name pattern.
WEIGHT_LAYOUTS = {"blocked": "OIhw{b}i{b}o", "depthwise": "Goihw{b}g", "first": "Oihw{b}o"}
#: The fused chains, each registered for every variant.
PATTERNS: tuple[tuple[str, ...], ...] = (
    ("Conv", "Relu"),
    ("Conv", "Clip"),
    ("Conv", "Add"),
    ("Conv", "Add", "Relu"),
    ("Conv", "Sum"),
    ("Conv", "Sum", "Relu"),
)
#: Ops joining a residual (a two-input Sum is an Add).
RESIDUAL_OPS = ("Add", "Sum")


def weight_layout(fmt: str, block: int) -> str:
    """Name of the packed weight layout of format ``fmt`` for ``block``."""
    return WEIGHT_LAYOUTS[fmt].format(b=block)


# -- packed weight layouts -------------------------------------------------------------------


def _packed_shape(fmt: str, block: int) -> Callable[[tuple[int, ...]], tuple[int, ...]]:
    def shape(s: tuple[int, ...]) -> tuple[int, ...]:
        m, cg, kh, kw = s
        ob = _cdiv(m, block)
        if fmt == "blocked":
            return (ob, _cdiv(cg, block), kh, kw, block, block)
        if fmt == "depthwise":
            return (ob, kh, kw, block)
        return (ob, cg, kh, kw, block)

    return shape


def _pack(fmt: str, block: int):
    def fn(w: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return native().pack_conv_weight(_c(w), fmt, block)

    return fn


def _unpack(fmt: str, block: int):
    def fn(w: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return native().unpack_conv_weight(_c(w), list(shape), fmt, block)

    return fn


def register_layouts(layouts: LayoutRegistry) -> None:
    """Add the packed conv weight layouts (OIhw{B}i{B}o, Goihw{B}g, Oihw{B}o; B = 8, 16)."""
    docs = {
        "blocked": "conv weight (M, C/g, KH, KW) as (M/{b}, C/g/{b}, KH, KW, {b}i, {b}o), zero-padded",
        "depthwise": "depthwise conv weight (M, 1, KH, KW) as (M/{b}, KH, KW, {b}), zero-padded",
        "first": "first-layer conv weight (M, C, KH, KW) as (M/{b}, C, KH, KW, {b}o), zero-padded",
    }
    for block in sorted(set(BLOCKS.values())):
        for fmt in WEIGHT_LAYOUTS:
            layouts.add_layout(
                Layout(weight_layout(fmt, block), "cpu", BACKEND, rank=4, dtypes=("float32",),
                       physical_shape=_packed_shape(fmt, block), doc=docs[fmt].format(b=block)),
                to_standard=_unpack(fmt, block),
                from_standard=_pack(fmt, block),
            )


# -- geometry and checks ---------------------------------------------------------------------


def conv_params(conv: Node) -> list[int]:
    """[C, M, KH, KW, SH, SW, DH, DW, PT, PL, PB, PR, group] of a 2-D Conv with static shapes
    (auto_pad resolved to explicit pads)."""
    xs, ws = conv.input(0).shape, conv.input(1).shape
    win = window_attrs(conv, 2, ws[2:])
    geom = win.geometry(xs[2:])
    (pt, pl), (pb, pr) = geom.pad_begin, geom.pad_end
    return [int(v) for v in (
        xs[1], ws[0], ws[2], ws[3], *win.strides, *win.dilations, pt, pl, pb, pr,
        int(conv.attr("group", 1)),
    )]


def _variant_reason(kind: str, block: int, conv: Node) -> str | None:
    """Why variant ``kind`` does not handle this (valid) Conv, or ``None``."""
    xs, ws = conv.input(0).shape, conv.input(1).shape
    group = int(conv.attr("group", 1))
    c, m, cg, mg = xs[1], ws[0], ws[1], ws[0] // group
    if kind == "direct" and group > 1 and (cg % block or mg % block):
        return (f"groups of {cg} input / {mg} output channels are not multiples of the "
                f"block {block} (the grouped and depthwise variants take them)")
    if kind == "1x1" and (tuple(ws[2:]) != (1, 1) or group != 1):
        return f"needs a 1x1 kernel and group 1, received kernel {tuple(ws[2:])}, group {group}"
    if kind == "depthwise" and not (group == c == m):
        return f"needs group == C == M (depthwise), received group={group}, C={c}, M={m}"
    if kind == "grouped" and group == 1:
        return "needs group > 1 (the direct variant runs group 1)"
    if kind == "grouped" and conv.const_input(1) is None:
        return "needs a constant weight W (packed when the plan is built)"
    if kind == "first" and (group != 1 or c > FIRST_MAX_CHANNELS):
        return (f"needs group 1 and at most {FIRST_MAX_CHANNELS} input channels (a first "
                f"layer), received group={group}, C={c}")
    return None


def _pattern_reason(node: Node) -> str | None:
    """Why the later nodes of a fused chain cannot run as the conv's epilogue, or ``None``."""
    nodes = getattr(node, "nodes", None) or [node]
    conv = nodes[0]
    out = conv.outputs[0]
    for later in nodes[1:]:
        if later.op_type == "Clip":
            if _clip_bounds(later) is None:
                return "Clip min/max must be constants"
            lo, hi = _clip_bounds(later)
            if not lo <= hi:
                return f"Clip bounds must satisfy min <= max, received {lo}, {hi}"
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


# -- kernels ---------------------------------------------------------------------------------


def _epilogue(node: Node) -> tuple[float, float, bool]:
    """(lo, hi, has_residual) of the chain after the conv."""
    lo, hi, residual = -INF, INF, False
    for later in (getattr(node, "nodes", None) or [node])[1:]:
        if later.op_type == "Relu":
            lo, hi = max(lo, 0.0), max(hi, 0.0)
        elif later.op_type == "Clip":
            clo, chi = _clip_bounds(later)
            lo, hi = min(max(lo, clo), chi), min(max(hi, clo), chi)
        elif later.op_type in RESIDUAL_OPS:
            residual = True
    return lo, hi, residual


def _build(kind: str, block: int, node: Node) -> Kernel:
    conv = _conv_of(node)
    params = conv_params(conv)
    nconv = len(conv.inputs)
    lo, hi, has_residual = _epilogue(node)
    mod = native()
    if kind == "grouped":
        w_packed, starts = mod.pack_conv_weight_grouped(
            _c(conv.const_input(1)), params[0], params[12], block)
    fn = {
        "direct": mod.conv2d_blocked,
        "1x1": mod.conv2d_blocked,
        "grouped": mod.conv2d_blocked,
        "depthwise": mod.conv2d_depthwise_blocked,
        "first": mod.conv2d_first_blocked,
    }[kind]

    def run(*args: np.ndarray | None) -> np.ndarray:
        x, w = args[0], args[1]
        b = args[2] if nconv > 2 else None
        r = _c(args[nconv]) if has_residual else None
        b = _c(b) if b is not None else None
        if kind == "grouped":
            return fn(_c(x), w_packed, b, r, params, block, lo, hi, starts)
        return fn(_c(x), _c(w), b, r, params, block, lo, hi)

    return run


def _layouts_in(kind: str, block: int) -> Callable[[Node], tuple[str, ...]]:
    act = f"nchw{block}c"
    x_lay = STANDARD if kind == "first" else act
    w_lay = {
        "direct": weight_layout("blocked", block),
        "1x1": weight_layout("blocked", block),
        "depthwise": weight_layout("depthwise", block),
        "first": weight_layout("first", block),
        "grouped": STANDARD,
    }[kind]

    def layouts(node: Node) -> tuple[str, ...]:
        conv = _conv_of(node)
        lay = [x_lay, w_lay, STANDARD][: len(conv.inputs)]
        for later in (getattr(node, "nodes", None) or [node])[1:]:
            if later.op_type in RESIDUAL_OPS:
                lay.append(act)
            elif later.op_type == "Clip":
                lay.extend([STANDARD] * (len(later.inputs) - 1))
        return tuple(lay)

    return layouts


def _supports(kind: str, block: int) -> Callable[[Node], str | None]:
    def check(node: Node) -> str | None:
        conv = _conv_of(node)
        return _base_reason(conv) or _variant_reason(kind, block, conv) or _pattern_reason(node)

    return check


VARIANTS: dict[str, tuple[int, str]] = {
    "direct": (Priority.PREFERRED, "direct register-blocked conv"),
    "1x1": (Priority.SPECIALISED, "1x1 conv as a blocked GEMM"),
    "depthwise": (Priority.SPECIALISED, "depthwise conv (group == C == M)"),
    "grouped": (Priority.DEFAULT, "grouped conv, weight packed per group at plan build"),
    "first": (Priority.PREFERRED, "first-layer conv reading nchw with few channels"),
}


def _register(kind: str, block: int, pattern: Sequence[str] | None) -> None:
    priority, what = VARIANTS[kind]
    layout = f"nchw{block}c"
    variant = f"{layout}_{kind}"
    doc = f"{what}, output {layout}" + (f", fused {'+'.join(pattern[1:])} epilogue" if pattern else "")

    def build(node: Node) -> Kernel:
        return _build(kind, block, node)

    build.__doc__ = doc[0].upper() + doc[1:] + "."
    opts = dict(priority=priority, supports=_supports(kind, block),
                layouts_in=_layouts_in(kind, block), layouts_out=(layout,))
    if pattern is None:
        impls.register("Conv", variant, **opts)(build)
    else:
        impls.register_pattern(pattern, variant, **opts)(build)


for _block in sorted(set(BLOCKS.values())):
    for _kind in VARIANTS:
        _register(_kind, _block, None)
        for _pattern in PATTERNS:
            _register(_kind, _block, _pattern)
