"""Gemm and MatMul on oneDNN's ``matmul`` primitive (float32).

- ``Gemm.onednn.matmul``: 2-D A (``transA`` read in place) times B (``transB`` read in place),
  plus C as a bias over N (shape (N,) or (1, N)); alpha = 1 and beta = 1 (or no C). B's
  format is oneDNN's choice (``format_tag::any``: ``BA16a64b`` on AVX-512), declared as a
  ``dnnl:`` layout of the ONNX tensor (for ``transB=1`` the same memory is named with the two
  dims swapped: ``AB16b64a`` over (N, K)), so a constant B is reordered once, when the plan
  is built;
- ``MatMul.onednn.matmul``: A of any rank >= 2 (its leading axes flattened into M) times a
  2-D B, B declared like Gemm's;
- ``MatMul.onednn.batched``: A and B of ranks 2 to 5 with numpy's batch broadcasting, in the
  standard layout (not both 2-D: the variant above covers that);
- fused ``Gemm+Relu``, ``Gemm+Clip`` and ``MatMul+Relu`` as eltwise post-ops.
"""

from __future__ import annotations

import functools

import numpy as np

from dispatch.graph import Node
from dispatch.registry import STANDARD, Priority
from impls.common import INF, Kernel, clip_bounds
from impls.common import as_f32 as _c
from impls.onednn import layouts as lay
from impls.onednn._module import onednn
from impls.onednn.table import impls

MAX_RANK = 5


def swap_dims(tag: str) -> str:
    """The name of a 2-D format over the transposed dims (``BA16a64b`` -> ``AB16b64a``)."""
    return tag.translate(str.maketrans("abAB", "baBA"))


def _first(node: Node) -> Node:
    nodes = getattr(node, "nodes", None)
    return nodes[0] if nodes else node


def _later(node: Node) -> list[Node]:
    return list(getattr(node, "nodes", None) or [node])[1:]


def _f32_reason(node: Node, idx: tuple[int, ...]) -> str | None:
    for i in idx:
        v = node.input(i)
        if v is not None and (v.dtype is None or np.dtype(v.dtype) != np.float32):
            return f"needs float32 inputs, input {i} has dtype {v.dtype}"
        if v is not None and v.shape is None:
            return f"needs static shapes, input {i} has none"
        if v is not None and 0 in tuple(v.shape):
            return f"input {i} is empty (shape {tuple(v.shape)}): nothing for oneDNN to run"
    return None


def eltwise_of(node: Node) -> tuple[str, float, float] | str:
    """(eltwise, alpha, beta) of the Relu / Clip ending a fused chain, or the reason it is
    not a post-op."""
    kind, lo, hi = "", -INF, INF
    for later in _later(node):
        if later.op_type == "Relu":
            kind, lo, hi = ("relu", 0.0, 0.0) if not kind else ("clip", max(lo, 0.0), max(hi, 0.0))
        elif later.op_type == "Clip":
            bounds = clip_bounds(later)
            if bounds is None:
                return "Clip min/max must be constants"
            if not bounds[0] <= bounds[1]:
                return f"Clip bounds must satisfy min <= max, received {bounds}"
            kind, lo, hi = "clip", bounds[0], bounds[1]
    return kind, lo, hi


@functools.lru_cache(maxsize=2048)
def _formats(src: tuple[int, ...], weights: tuple[int, ...], bias: bool, src_tag: str,
             eltwise: str) -> dict[str, str]:
    return dict(onednn().matmul_formats(list(src), list(weights), bias, src_tag, eltwise))


def _weight_layout(kn_tag: str, trans_b: bool) -> str:
    """The layout of the ONNX B tensor holding oneDNN's chosen (K, N) format ``kn_tag``."""
    tag = swap_dims(kn_tag) if trans_b else kn_tag
    if tag == "ab" or not kn_tag:
        return STANDARD
    return lay.layout_name(tag) if tag in lay.MATMUL_WEIGHTS else STANDARD


def _kn_tag(layout: str, trans_b: bool) -> str:
    """The (K, N) tag of an ONNX B tensor held in ``layout``."""
    tag = "ab" if layout == STANDARD else layout.removeprefix(lay.PREFIX)
    return swap_dims(tag) if trans_b else tag


# -- Gemm ------------------------------------------------------------------------------------


def _gemm_dims(g: Node) -> tuple[int, int, int]:
    a, b = g.input(0).shape, g.input(1).shape
    m, k = (a[1], a[0]) if g.attr("transA", 0) else a
    n = b[0] if g.attr("transB", 0) else b[1]
    return int(m), int(k), int(n)


def _gemm_reason(node: Node) -> str | None:
    g = _first(node)
    if g.input(0) is None or g.input(1) is None:
        return "Gemm needs inputs A and B"
    reason = _f32_reason(g, (0, 1, 2))
    if reason:
        return reason
    a, b = g.input(0).shape, g.input(1).shape
    if len(a) != 2 or len(b) != 2:
        return f"Gemm needs 2-D A and B, received {a} and {b}"
    _, k, n = _gemm_dims(g)
    kb = b[1] if g.attr("transB", 0) else b[0]
    if k != kb:
        return f"Gemm inner dimensions differ: A' has K={k}, B' has K={kb}"
    if float(g.attr("alpha", 1.0)) != 1.0:
        return f"needs alpha == 1 (oneDNN's matmul has no scale here), received {g.attr('alpha')}"
    c = g.input(2)
    if c is not None:
        if float(g.attr("beta", 1.0)) != 1.0:
            return f"needs beta == 1 with C, received {g.attr('beta')}"
        if tuple(c.shape) not in ((n,), (1, n)):
            return f"C must be a bias of shape ({n},) or (1, {n}), received {tuple(c.shape)}"
    post = eltwise_of(node)
    return post if isinstance(post, str) else None


def _gemm_spec(node: Node) -> tuple[tuple[int, ...], tuple[int, ...], bool, str, tuple]:
    g = _first(node)
    m, k, n = _gemm_dims(g)
    post = eltwise_of(node)
    assert not isinstance(post, str)
    return (m, k), (k, n), g.input(2) is not None, "ba" if g.attr("transA", 0) else "ab", post


def _gemm_layouts(node: Node) -> tuple[str, ...]:
    g = _first(node)
    src, wei, bias, src_tag, post = _gemm_spec(node)
    f = _formats(src, wei, bias, src_tag, post[0])
    out = [STANDARD, _weight_layout(f["weights"], bool(g.attr("transB", 0))), STANDARD][: len(g.inputs)]
    for later in _later(node):
        out.extend([STANDARD] * (len(later.inputs) - 1))
    return tuple(out)


def _build_gemm(node: Node) -> Kernel:
    g = _first(node)
    src, wei, bias, src_tag, (kind, alpha, beta) = _gemm_spec(node)
    trans_b = bool(g.attr("transB", 0))
    w_layout = _gemm_layouts(node)[1]
    prim = onednn().MatMul(list(src), list(wei), bias, src_tag, _kn_tag(w_layout, trans_b),
                           False, kind, alpha, beta)
    w_const = g.const_input(1)
    if w_const is not None and not prim.weights_in_place:
        prim.set_weights(_c(w_const), _kn_tag(STANDARD, trans_b))
    n = wei[1]

    def run(a: np.ndarray, b: np.ndarray, *rest: np.ndarray | None) -> np.ndarray:
        c = rest[0] if bias and rest else None
        return prim(_c(a), b, None if c is None else _c(c).reshape(n), None)

    run.primitive = prim  # type: ignore[attr-defined]
    return run


# -- MatMul ----------------------------------------------------------------------------------


def _matmul_reason(node: Node, batched: bool) -> str | None:
    mm = _first(node)
    if mm.input(0) is None or mm.input(1) is None:
        return "MatMul needs inputs A and B"
    reason = _f32_reason(mm, (0, 1))
    if reason:
        return reason
    a, b = tuple(mm.input(0).shape), tuple(mm.input(1).shape)
    if len(a) < 2 or len(b) < 2:
        return f"needs A and B of rank >= 2 (1-D operands run elsewhere), received {a} and {b}"
    if a[-1] != b[-2]:
        return f"MatMul inner dimensions differ: A {a} has K={a[-1]}, B {b} has K={b[-2]}"
    if not batched and len(b) != 2:
        return f"needs a 2-D B, received B of shape {b} (MatMul.onednn.batched takes it)"
    if batched:
        if len(a) == 2 and len(b) == 2:
            return "both operands are 2-D: MatMul.onednn.matmul covers it"
        if max(len(a), len(b)) > MAX_RANK:
            return f"needs ranks <= {MAX_RANK}, received {a} and {b}"
        ra, rb = (1,) * (len(b) - len(a)) + a, (1,) * (len(a) - len(b)) + b
        for x, y in zip(ra[:-2], rb[:-2]):
            if x != y and 1 not in (x, y):
                return f"batch dimensions of A {a} and B {b} do not broadcast"
    post = eltwise_of(node)
    return post if isinstance(post, str) else None


def _matmul_spec(node: Node) -> tuple[tuple[int, ...], tuple[int, ...], tuple]:
    mm = _first(node)
    a, b = tuple(int(d) for d in mm.input(0).shape), tuple(int(d) for d in mm.input(1).shape)
    post = eltwise_of(node)
    assert not isinstance(post, str)
    rows = int(np.prod(a[:-1], dtype=np.int64))
    return (rows, a[-1]), b, post


def _matmul_layouts(node: Node) -> tuple[str, ...]:
    src, wei, post = _matmul_spec(node)
    f = _formats(src, wei, False, "ab", post[0])
    return (STANDARD, _weight_layout(f["weights"], False))


def _build_matmul(node: Node) -> Kernel:
    mm = _first(node)
    src, wei, (kind, alpha, beta) = _matmul_spec(node)
    w_layout = _matmul_layouts(node)[1]
    prim = onednn().MatMul(list(src), list(wei), False, "ab", _kn_tag(w_layout, False),
                           False, kind, alpha, beta)
    w_const = mm.const_input(1)
    if w_const is not None and not prim.weights_in_place:
        prim.set_weights(_c(w_const), "ab")
    out_shape = (*mm.input(0).shape[:-1], wei[1])

    def run(a: np.ndarray, b: np.ndarray, *_: np.ndarray | None) -> np.ndarray:
        return prim(_c(a), b, None, None).reshape(out_shape)

    run.primitive = prim  # type: ignore[attr-defined]
    return run


def _build_batched(node: Node) -> Kernel:
    mm = _first(node)
    a, b = tuple(int(d) for d in mm.input(0).shape), tuple(int(d) for d in mm.input(1).shape)
    rank = max(len(a), len(b))
    ra, rb = (1,) * (rank - len(a)) + a, (1,) * (rank - len(b)) + b
    post = eltwise_of(node)
    assert not isinstance(post, str)
    kind, alpha, beta = post
    tag = lay.PLAIN[rank]
    prim = onednn().MatMul(list(ra), list(rb), False, tag, tag, False, kind, alpha, beta)
    out_shape = tuple(mm.outputs[0].shape) if mm.outputs[0].shape is not None else None

    def run(x: np.ndarray, w: np.ndarray, *_: np.ndarray | None) -> np.ndarray:
        y = prim(_c(x), _c(w), None, None)
        return y.reshape(out_shape) if out_shape is not None else y

    run.primitive = prim  # type: ignore[attr-defined]
    return run


# -- registration ----------------------------------------------------------------------------


def _register_gemm(pattern: tuple[str, ...] | None) -> None:
    what = "Gemm on oneDNN's matmul (B in the format oneDNN picks)"
    if pattern:
        what += f", fused {'+'.join(pattern[1:])} post-op"

    def build(node: Node) -> Kernel:
        return _build_gemm(node)

    build.__doc__ = what + "."
    opts = dict(priority=Priority.PREFERRED, supports=_gemm_reason, layouts_in=_gemm_layouts)
    if pattern is None:
        impls.register("Gemm", "matmul", **opts)(build)
    else:
        impls.register_pattern(pattern, "matmul", **opts)(build)


def _register_matmul(pattern: tuple[str, ...] | None, batched: bool) -> None:
    variant = "batched" if batched else "matmul"
    what = ("MatMul on oneDNN's matmul with batch broadcasting (standard layout)" if batched
            else "MatMul of A (any rank) by a 2-D B in the format oneDNN picks")
    if pattern:
        what += f", fused {'+'.join(pattern[1:])} post-op"

    def build(node: Node) -> Kernel:
        return _build_batched(node) if batched else _build_matmul(node)

    build.__doc__ = what + "."

    def supports(node: Node) -> str | None:
        return _matmul_reason(node, batched)

    opts = dict(priority=Priority.PREFERRED, supports=supports,
                layouts_in=None if batched else _matmul_layouts)
    if pattern is None:
        impls.register("MatMul", variant, **opts)(build)
    else:
        impls.register_pattern(pattern, variant, **opts)(build)


for _p in (None, ("Gemm", "Relu"), ("Gemm", "Clip")):
    _register_gemm(_p)
for _batched in (False, True):
    for _p in (None, ("MatMul", "Relu")):
        _register_matmul(_p, _batched)
