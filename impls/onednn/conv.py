"""2-D convolutions on oneDNN's ``convolution_forward`` (float32, inference).

Each implementation asks oneDNN which formats it would use for the node's shapes (a primitive
descriptor is created with ``format_tag::any`` for the weights, and for src/dst per variant)
and declares the matching layouts (see impls/onednn/layouts.py), so a plan reorders tensors
exactly as oneDNN wants them and constant weights once, when it is built:

- ``Conv.onednn.any``: src, weights and dst all ``any`` — oneDNN's own choice (oneDNN 3.x's
  brgemm convolutions: nhwc activations with ``Acdb{32,48,64}a``-style weights on AVX-512 and
  ``Acdb24a`` / ``Abcd16a`` on AVX2; oneDNN 2.6 on AVX2: ``nchw8c``);
- ``Conv.onednn.nhwc`` / ``Conv.onednn.nchw16c``: src and dst pinned to one layout (weights
  still ``any``), offered where oneDNN's own choice differs, so the optimiser can keep a
  tensor in the layout its neighbours (e.g. the native kernels) use. A pinned variant that
  only oneDNN's reference implementation runs is not offered. There is no pinned ``std``
  (nchw) variant: oneDNN runs plain nchw convolutions as im2col + SGEMM (``gemm:jit``), no
  faster than the numpy backend's, and an untuned plan, which prefers the candidate needing
  the fewest conversions, would pick it over the blocked kernels everywhere.

Groups (depthwise included), strides, pads, dilations and ``auto_pad`` (resolved to explicit
pads) are supported. Fused patterns, per variant: Conv+Relu and Conv+Clip (eltwise post-op),
Conv+Add / Conv+Sum (the residual, in the output's layout, is read in place by a binary-add
post-op where oneDNN has an optimised kernel with it — the jit kernels behind nchw16c —, else
added by the sum post-op after a copy into the output: brgconv's nhwc kernels in oneDNN 2.6)
and Conv+Add+Relu / Conv+Sum+Relu. The primitive and any weight reorder are
created in the build function, once per plan; runs wrap the arrays without copying them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from dispatch.graph import Node
from dispatch.registry import STANDARD, Priority
from impls.common import INF, Kernel, clip_bounds, conv_of
from impls.common import as_f32 as _c
from impls.common import conv_base_reason as _base_reason
from impls.numpy.conv import window_attrs
from impls.onednn import layouts as lay
from impls.onednn._module import onednn
from impls.onednn.table import impls

#: variant -> (src tag, dst tag) ("any": oneDNN chooses)
VARIANTS: dict[str, tuple[str, str]] = {
    "any": ("any", "any"),
    "nhwc": ("acdb", "acdb"),
    "nchw16c": ("aBcd16b", "aBcd16b"),
}
PRIORITIES = {"any": Priority.PREFERRED, "nhwc": Priority.DEFAULT, "nchw16c": Priority.DEFAULT}
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


# -- geometry and checks ---------------------------------------------------------------------


def _chain(node: Node) -> list[Node]:
    return list(getattr(node, "nodes", None) or [node])


def conv_params(conv: Node) -> list[int]:
    """[N, C, H, W, M, KH, KW, SH, SW, DH, DW, PT, PL, PB, PR, group] of a 2-D Conv with static
    shapes (auto_pad resolved to explicit pads)."""
    xs, ws = conv.input(0).shape, conv.input(1).shape
    win = window_attrs(conv, 2, ws[2:])
    geom = win.geometry(xs[2:])
    (pt, pl), (pb, pr) = geom.pad_begin, geom.pad_end
    return [int(v) for v in (
        *xs, ws[0], ws[2], ws[3], *win.strides, *win.dilations, pt, pl, pb, pr,
        int(conv.attr("group", 1)),
    )]


def _pattern_reason(node: Node) -> str | None:
    """Why the later nodes of a fused chain cannot run as post-ops, or ``None``."""
    nodes = _chain(node)
    out = nodes[0].outputs[0]
    for later in nodes[1:]:
        if later.op_type == "Clip":
            bounds = clip_bounds(later)
            if bounds is None:
                return "Clip min/max must be constants"
            if not bounds[0] <= bounds[1]:
                return f"Clip bounds must satisfy min <= max, received {bounds[0]}, {bounds[1]}"
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


def post_ops(node: Node) -> tuple[bool, str, float, float]:
    """(sum, eltwise, alpha, beta) of the chain after the conv: the residual first, then one
    eltwise (Relu, or Clip with its bounds) — the order of the ONNX chain."""
    total, kind, lo, hi = False, "", -INF, INF
    for later in _chain(node)[1:]:
        if later.op_type == "Relu":
            kind, lo, hi = ("relu", 0.0, INF) if not kind else ("clip", max(lo, 0.0), max(hi, 0.0))
        elif later.op_type == "Clip":
            clo, chi = clip_bounds(later)  # type: ignore[misc]
            kind, lo, hi = "clip", min(max(lo, clo), chi), min(max(hi, clo), chi)
        elif later.op_type in RESIDUAL_OPS:
            total = True
    if kind == "relu":
        return total, kind, 0.0, 0.0
    return total, kind, lo, hi


@functools.lru_cache(maxsize=2048)
def _formats(params: tuple[int, ...], bias: bool, src: str, dst: str, post: tuple) -> dict[str, str]:
    return dict(onednn().conv_formats(list(params), bias, src, dst, *post))


def formats(node: Node, variant: str) -> dict[str, str]:
    """What oneDNN picks for this (valid) node with the variant's src/dst formats."""
    conv = conv_of(node)
    src, dst = VARIANTS[variant]
    return _formats(tuple(conv_params(conv)), conv.input(2) is not None, src, dst, post_ops(node))


def weight_layout(conv: Node, tag: str) -> str:
    """The layout the weights are declared in for weight format ``tag``: its ``dnnl:`` layout
    when it is a registered one, else the standard layout (reordered when the plan is built)."""
    group = int(conv.attr("group", 1))
    m = int(conv.input(1).shape[0])
    if group == 1 and tag in lay.CONV_WEIGHTS:
        return lay.layout_name(tag)
    if group > 1 and group == m and tag in lay.DEPTHWISE_WEIGHTS:
        return lay.layout_name(tag)
    return STANDARD


def _weights_tag(conv: Node, layout: str) -> str:
    """The oneDNN tag (over the primitive's weight dims) of weights held in ``layout``."""
    if layout == STANDARD:
        return "abcd" if int(conv.attr("group", 1)) == 1 else "abcde"
    return layout.removeprefix(lay.PREFIX)


def _variant_reason(variant: str, node: Node) -> str | None:
    """Why this variant is not offered for this (valid) node, or ``None``."""
    try:
        f = formats(node, variant)
    except (RuntimeError, ValueError) as exc:
        return f"oneDNN cannot create this convolution: {exc}"
    for what in ("src", "dst"):
        if lay.activation_layout(f[what]) is None:
            return (f"oneDNN chose a {what} format with no registered layout: "
                    f"{f[what + '_desc']} (implementation {f['impl']})")
    if variant != "any":
        if f["impl"].startswith("ref"):
            return f"oneDNN has only its reference implementation for {variant} ({f['impl']})"
        own = formats(node, "any")
        if (own["src"], own["dst"]) == (f["src"], f["dst"]):
            return (f"the same formats as oneDNN's own choice ({own['src']} -> {own['dst']}): "
                    f"Conv.onednn.any covers it")
    return None


# -- implementations -------------------------------------------------------------------------


def _supports(variant: str) -> Callable[[Node], str | None]:
    def check(node: Node) -> str | None:
        return _base_reason(conv_of(node)) or _pattern_reason(node) or _variant_reason(variant, node)

    return check


def _layouts_in(variant: str) -> Callable[[Node], tuple[str, ...]]:
    def layouts(node: Node) -> tuple[str, ...]:
        conv = conv_of(node)
        f = formats(node, variant)
        act_in, act_out = lay.activation_layout(f["src"]), lay.activation_layout(f["dst"])
        out = [act_in or STANDARD, weight_layout(conv, f["weights"]), STANDARD][: len(conv.inputs)]
        for later in _chain(node)[1:]:
            if later.op_type in RESIDUAL_OPS:
                out.append(act_out or STANDARD)
            elif later.op_type == "Clip":
                out.extend([STANDARD] * (len(later.inputs) - 1))
        return tuple(out)

    return layouts


def _layouts_out(variant: str) -> Callable[[Node], tuple[str, ...]]:
    def layouts(node: Node) -> tuple[str, ...]:
        return (lay.activation_layout(formats(node, variant)["dst"]) or STANDARD,)

    return layouts


def _build(variant: str, node: Node) -> Kernel:
    conv = conv_of(node)
    params = conv_params(conv)
    ins = _layouts_in(variant)(node)
    (out,) = _layouts_out(variant)(node)
    nconv = len(conv.inputs)
    has_bias = conv.input(2) is not None
    total, kind, alpha, beta = post_ops(node)
    w_layout = ins[1]
    prim = onednn().Conv(params, has_bias, lay.activation_tag(ins[0]), lay.activation_tag(out),
                         _weights_tag(conv, w_layout), total, kind, alpha, beta)
    w_const = conv.const_input(1)
    if w_const is not None and not prim.weights_in_place:
        # reordered once, now, from the standard layout (the plan's copy is then unused)
        prim.set_weights(_c(w_const), _weights_tag(conv, STANDARD))

    def run(*args: np.ndarray | None) -> np.ndarray:
        x, w = args[0], args[1]
        b = args[2] if has_bias else None
        r = args[nconv] if total else None
        return prim(_c(x), w, None if b is None else _c(b), None if r is None else _c(r))

    run.primitive = prim  # type: ignore[attr-defined]  # for tests and reports
    return run


def _register(variant: str, pattern: Sequence[str] | None) -> None:
    what = ("oneDNN convolution, formats chosen by oneDNN (format_tag::any)" if variant == "any"
            else f"oneDNN convolution with {variant} activations (weights: format_tag::any)")
    if pattern:
        what += f", fused {'+'.join(pattern[1:])} post-ops"

    def build(node: Node) -> Kernel:
        return _build(variant, node)

    build.__doc__ = what + "."
    opts = dict(priority=PRIORITIES[variant], supports=_supports(variant),
                layouts_in=_layouts_in(variant), layouts_out=_layouts_out(variant))
    if pattern is None:
        impls.register("Conv", variant, **opts)(build)
    else:
        impls.register_pattern(pattern, variant, **opts)(build)


for _variant in VARIANTS:
    _register(_variant, None)
    for _pattern in PATTERNS:
        _register(_variant, _pattern)
