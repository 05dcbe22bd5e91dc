"""Native Gemm and MatMul on the packed SGEMM (float32, standard layout).

C++ in native/src/gemm.cpp and native/src/isa/gemm_packed.cpp: B is packed into 16-column
panels, A per call into MR-row panels, a register-blocked micro-kernel (6x16 on AVX2, 14x16 on
AVX-512) runs over cache blocks, threads split the blocks of C; alpha, beta * C (broadcast),
a residual and Relu / Clip are applied in the write-back.

Weight layouts (registered here, so a plan packs a constant B once when it is built):

- ``KN16_packed``: a rank-2 B of logical shape (K, N) as (ceil(N/16), K, 16);
- ``NK16_packed``: a rank-2 B of logical shape (N, K) — Gemm's B with ``transB=1`` — as the
  same (ceil(N/16), K, 16) panels of its transpose.

Implementations:

- ``Gemm.native.packed``: every attribute (alpha, beta, transA, transB), C broadcast to
  (M, N) from any shape of rank <= 2; B in a packed layout;
- ``MatMul.native.packed``: A of any rank >= 1 (its leading axes flattened into M) times a 2-D
  B in ``KN16_packed``;
- ``MatMul.native.batched``: numpy matmul semantics with batch broadcasting (ranks >= 1), B at
  run time (packed per call) or constant (packed per batch matrix when the plan is built);
- fused ``Gemm+Relu``, ``Gemm+Clip``, ``MatMul+Add`` (a bias over the last axis, or a residual
  of the output's shape) and ``MatMul+Add+Relu``, with the epilogue in the write-back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import STANDARD, Priority
from impls.common import INF, Kernel
from impls.common import as_f32 as _c
from impls.common import cdiv as _cdiv
from impls.common import clip_bounds as _clip_bounds
from impls.native._module import native
from impls.native.layouts import BACKEND
from impls.native.table import impls
from layouts.registry import Layout, LayoutRegistry

NR = 16
KN = "KN16_packed"
NK = "NK16_packed"


# -- packed B layouts ------------------------------------------------------------------------


def _kn_shape(s: tuple[int, ...]) -> tuple[int, ...]:
    k, n = s
    return (_cdiv(n, NR), k, NR)


def _nk_shape(s: tuple[int, ...]) -> tuple[int, ...]:
    n, k = s
    return (_cdiv(n, NR), k, NR)


def _pack(trans: bool):
    def fn(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return native().gemm_pack_b(_c(b), trans)

    return fn


def _unpack(trans: bool):
    def fn(p: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        n = shape[0] if trans else shape[1]
        return native().gemm_unpack_b(_c(p), int(n), trans)

    return fn


def register_layouts(layouts: LayoutRegistry) -> None:
    """Add the packed GEMM weight layouts KN16_packed and NK16_packed."""
    f32 = ("float32",)
    layouts.add_layout(
        Layout(KN, "cpu", BACKEND, rank=2, dtypes=f32, physical_shape=_kn_shape,
               doc="GEMM B (K, N) packed as (ceil(N/16), K, 16) column panels, zero-padded"),
        to_standard=_unpack(False),
        from_standard=_pack(False),
    )
    layouts.add_layout(
        Layout(NK, "cpu", BACKEND, rank=2, dtypes=f32, physical_shape=_nk_shape,
               doc="GEMM B given as (N, K) (transB) packed as (ceil(N/16), K, 16) panels"),
        to_standard=_unpack(True),
        from_standard=_pack(True),
    )


# -- shared checks ---------------------------------------------------------------------------


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
    return None


def _activation(node: Node) -> tuple[str, float, float]:
    """(act, lo, hi) of the Relu / Clip that ends a fused chain."""
    act, lo, hi = "none", -INF, INF
    for later in _later(node):
        if later.op_type == "Relu":
            act, lo, hi = ("relu", 0.0, INF) if act == "none" else ("clip", max(lo, 0.0), max(hi, 0.0))
        elif later.op_type == "Clip":
            clo, chi = _clip_bounds(later)
            act, lo, hi = "clip", min(max(lo, clo), chi), min(max(hi, clo), chi)
    return act, lo, hi


def _activation_reason(node: Node) -> str | None:
    for later in _later(node):
        if later.op_type == "Clip":
            bounds = _clip_bounds(later)
            if bounds is None:
                return "Clip min/max must be constants"
            if not bounds[0] <= bounds[1]:
                return f"Clip bounds must satisfy min <= max, received {bounds}"
    return None


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
    m, k, n = _gemm_dims(g)
    kb = b[1] if g.attr("transB", 0) else b[0]
    if k != kb:
        return f"Gemm inner dimensions differ: A' has K={k}, B' has K={kb}"
    c = g.input(2)
    if c is not None:
        cs = tuple(c.shape)
        d0 = cs[0] if len(cs) == 2 else 1
        d1 = cs[-1] if cs else 1
        if len(cs) > 2 or d0 not in (1, m) or d1 not in (1, n):
            return f"Gemm C of shape {cs} does not broadcast to ({m}, {n})"
    return _activation_reason(node)


def _gemm_layouts(node: Node) -> tuple[str, ...]:
    g = _first(node)
    lay = [STANDARD, NK if g.attr("transB", 0) else KN, STANDARD][: len(g.inputs)]
    for later in _later(node):
        lay.extend([STANDARD] * (len(later.inputs) - 1))
    return tuple(lay)


def _build_gemm(node: Node) -> Kernel:
    g = _first(node)
    mod = native()
    _, _, n = _gemm_dims(g)
    trans_a = bool(g.attr("transA", 0))
    alpha = float(g.attr("alpha", 1.0))
    beta = float(g.attr("beta", 1.0))
    has_c = g.input(2) is not None
    act, lo, hi = _activation(node)
    c_const = g.const_input(2)
    c_fixed = _c(c_const) if c_const is not None else None

    def run(a: np.ndarray, b: np.ndarray, *rest: np.ndarray | None) -> np.ndarray:
        bias = None
        if has_c and beta != 0.0 and rest[0] is not None:
            bias = c_fixed if c_fixed is not None else _c(rest[0])
        return mod.gemm_packed(_c(a), _c(b), n, trans_a, alpha, bias, beta, None, act, lo, hi)

    return run


def _register_gemm(pattern: tuple[str, ...] | None) -> None:
    what = "Gemm on the packed SGEMM (B in KN16_packed / NK16_packed)"
    if pattern:
        what += f", fused {'+'.join(pattern[1:])} epilogue"

    def build(node: Node) -> Kernel:
        return _build_gemm(node)

    build.__doc__ = what + "."
    opts = dict(priority=Priority.PREFERRED, supports=_gemm_reason, layouts_in=_gemm_layouts)
    if pattern is None:
        impls.register("Gemm", "packed", **opts)(build)
    else:
        impls.register_pattern(pattern, "packed", **opts)(build)


for _p in (None, ("Gemm", "Relu"), ("Gemm", "Clip")):
    _register_gemm(_p)


# -- MatMul ----------------------------------------------------------------------------------


def _matmul_out_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | str:
    """numpy matmul's output shape, or the reason the shapes do not multiply."""
    if not a or not b:
        return "MatMul does not accept scalars (rank-0 inputs)"
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        return f"MatMul inner dimensions differ: A {a} has K={a2[-1]}, B {b} has K={b2[-2]}"
    batch = []
    ba, bb = a2[:-2], b2[:-2]
    for i in range(max(len(ba), len(bb))):
        x = ba[len(ba) - 1 - i] if i < len(ba) else 1
        y = bb[len(bb) - 1 - i] if i < len(bb) else 1
        if x != y and 1 not in (x, y):
            return f"MatMul batch dimensions of A {a} and B {b} do not broadcast"
        batch.append(max(x, y) if 0 not in (x, y) else 0)
    out = [*reversed(batch), a2[-2], b2[-1]]
    if len(a) == 1:
        out.pop(-2)
    if len(b) == 1:
        out.pop(-1)
    return tuple(out)


def _residual_kind(node: Node) -> tuple[str, int] | str | None:
    """How the Add of a MatMul+Add joins: ("bias" | "residual", input index), None without
    an Add, or the reason it cannot be fused."""
    mm = _first(node)
    for later in _later(node):
        if later.op_type != "Add":
            continue
        out = mm.outputs[0].shape
        other = [v for v in later.inputs if v is not None and v.name != mm.outputs[0].name]
        if len(other) != 1:
            return "Add must take the MatMul output and one other tensor"
        r = other[0]
        if r.dtype is None or np.dtype(r.dtype) != np.float32 or r.shape is None:
            return f"the Add operand must be float32 with a static shape, received {r.dtype}"
        rs = tuple(r.shape)
        if later.outputs[0].shape is not None and tuple(later.outputs[0].shape) != tuple(out):
            return f"the Add broadcasts the MatMul output {out} to {later.outputs[0].shape}"
        if rs == tuple(out):
            return ("residual", len(mm.inputs))
        if out and len(rs) <= len(out) and rs and rs[-1] == out[-1] and all(d == 1 for d in rs[:-1]):
            return ("bias", len(mm.inputs))
        return f"the Add operand {rs} is neither a bias over the last axis nor of shape {out}"
    return None


def _matmul_reason(node: Node, packed: bool) -> str | None:
    mm = _first(node)
    if mm.input(0) is None or mm.input(1) is None:
        return "MatMul needs inputs A and B"
    reason = _f32_reason(mm, (0, 1))
    if reason:
        return reason
    a, b = tuple(mm.input(0).shape), tuple(mm.input(1).shape)
    out = _matmul_out_shape(a, b)
    if isinstance(out, str):
        return out
    if packed and len(b) != 2:
        return f"MatMul.native.packed needs a 2-D B, received B of shape {b} (batched takes it)"
    kind = _residual_kind(node)
    if isinstance(kind, str):
        return kind
    return _activation_reason(node)


def _matmul_layouts(packed: bool) -> Callable[[Node], tuple[str, ...]]:
    def layouts(node: Node) -> tuple[str, ...]:
        lay = [STANDARD, KN if packed else STANDARD]
        for later in _later(node):
            lay.extend([STANDARD] * (len(later.inputs) - 1))
        return tuple(lay)

    return layouts


def _epilogue_arg(node: Node, kind: tuple[str, int] | None, n: int):
    """A function of the kernel's arguments returning (bias, residual) as 2-D arrays."""
    if kind is None:
        return lambda args, rows: (None, None)
    which, idx = kind

    def get(args: tuple, rows: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        r = _c(args[idx])
        if which == "bias":
            return r.reshape(n), None
        return None, r.reshape(rows, n)

    return get


def _build_matmul(node: Node, packed: bool) -> Kernel:
    mm = _first(node)
    mod = native()
    a_shape, b_shape = tuple(mm.input(0).shape), tuple(mm.input(1).shape)
    out_shape = _matmul_out_shape(a_shape, b_shape)
    act, lo, hi = _activation(node)
    kind = _residual_kind(node)
    b_vec = len(b_shape) == 1
    n = 1 if b_vec else int(b_shape[-1])
    extra = _epilogue_arg(node, kind, n)
    k = int(a_shape[-1])
    simple = not b_vec and len(b_shape) == 2  # one GEMM over A's rows

    if simple:
        rows = int(np.prod(a_shape[:-1], dtype=np.int64))
        b_const = None if packed or mm.const_input(1) is None else mod.gemm_pack_b(_c(mm.const_input(1)))

        def run2(a: np.ndarray, b: np.ndarray, *rest: np.ndarray) -> np.ndarray:
            bias, res = extra((a, b, *rest), rows)
            bp = _c(b) if packed else (b_const if b_const is not None else mod.gemm_pack_b(_c(b)))
            y = mod.gemm_packed(_c(a).reshape(rows, k), bp, n, False, 1.0, bias, 1.0, res, act, lo, hi)
            return y.reshape(out_shape)

        return run2

    # batched: promote 1-D operands, broadcast batches in C++
    b_const = mm.const_input(1)
    b_packed = None
    if b_const is not None:
        b3 = _c(b_const)[:, None] if b_vec else _c(b_const)
        flat = b3.reshape(-1, *b3.shape[-2:])
        b_packed = np.stack([mod.gemm_pack_b(m) for m in flat]).reshape(
            *b3.shape[:-2], _cdiv(n, NR), b3.shape[-2], NR)

    def run(a: np.ndarray, b: np.ndarray, *rest: np.ndarray) -> np.ndarray:
        a2 = _c(a)
        a2 = a2[None, :] if a2.ndim == 1 else a2
        if b_packed is not None:
            y = mod.matmul(a2, b_packed, True, n)
        else:
            b2 = _c(b)
            y = mod.matmul(a2, b2[:, None] if b_vec else b2)
        if kind is not None or act != "none":
            y = _apply_epilogue(mod, y, (a, b, *rest), kind, act, lo, hi)
        return y.reshape(out_shape)

    return run


def _apply_epilogue(mod: Any, y: np.ndarray, args: tuple, kind: tuple[str, int] | None,
                    act: str, lo: float, hi: float) -> np.ndarray:
    """The fused Add / activation after a batched MatMul (not in the GEMM write-back)."""
    if kind is not None:
        r = _c(args[kind[1]])
        y = mod.binary_broadcast("add", y,
                                 r.reshape(r.shape[-1]) if kind[0] == "bias" else r.reshape(y.shape))
    if act == "relu":
        y = mod.relu(y)
    elif act == "clip":
        y = mod.clip(y, lo, hi)
    return y


def _register_matmul(packed: bool, pattern: tuple[str, ...] | None) -> None:
    variant = "packed" if packed else "batched"
    what = (
        "MatMul with a 2-D B in KN16_packed (A's leading axes flattened into one GEMM)"
        if packed else
        "MatMul with batch broadcasting on the packed SGEMM (B packed per call or at build)"
    )
    if pattern:
        what += f", fused {'+'.join(pattern[1:])}"

    def build(node: Node) -> Kernel:
        return _build_matmul(node, packed)

    build.__doc__ = what + "."
    opts = dict(
        priority=Priority.PREFERRED if packed else Priority.DEFAULT,
        supports=lambda node: _matmul_reason(node, packed),
        layouts_in=_matmul_layouts(packed),
    )
    if pattern is None:
        impls.register("MatMul", variant, **opts)(build)
    else:
        impls.register_pattern(pattern, variant, **opts)(build)


for _packed in (True, False):
    for _p in (None, ("MatMul", "Add"), ("MatMul", "Add", "Relu")):
        _register_matmul(_packed, _p)
