"""Native Gemm / MatMul (packed SGEMM) and their fused patterns against the ONNX reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch.fusion import fuse
from dispatch.graph import Node, Value
from impls.native._module import native
from tests.native.support import case, native_impls, registry, run_in_layouts

F32 = np.dtype(np.float32)
GEMM_IMPLS = native_impls("Gemm")
MATMUL_IMPLS = native_impls("MatMul")


def _tol(k: int, *arrays: np.ndarray) -> float:
    scale = math.prod(float(np.abs(a).max(initial=1.0)) for a in arrays)
    return 4e-6 * math.sqrt(max(k, 1)) * scale + 1e-5


def _rand(rng: np.random.Generator, shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _supporting(impls, node):
    ok = [i for i in impls if i.supports(node) is None]
    assert ok, f"no native implementation supports {node}"
    return ok


# -- Gemm ------------------------------------------------------------------------------------

C_SHAPES = ["none", "scalar", "1", "n", "1n", "m1", "mn", "11"]


def _c_shape(kind: str, m: int, n: int):
    return {"none": None, "scalar": (), "1": (1,), "n": (n,), "1n": (1, n), "m1": (m, 1),
            "mn": (m, n), "11": (1, 1)}[kind]


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 40), k=st.integers(1, 40), n=st.integers(1, 40),
    trans_a=st.booleans(), trans_b=st.booleans(),
    alpha=st.sampled_from([1.0, 0.5, -2.0]), beta=st.sampled_from([1.0, 0.0, 0.25]),
    c_kind=st.sampled_from(C_SHAPES), const_b=st.booleans(), const_c=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_gemm_matches_reference(m, k, n, trans_a, trans_b, alpha, beta, c_kind, const_b,
                                const_c, seed):
    rng = np.random.default_rng(seed)
    a = _rand(rng, (k, m) if trans_a else (m, k))
    b = _rand(rng, (n, k) if trans_b else (k, n))
    cs = _c_shape(c_kind, m, n)
    inputs = [a, b] if cs is None else [a, b, _rand(rng, cs)]
    attrs = {"transA": int(trans_a), "transB": int(trans_b), "alpha": alpha, "beta": beta}
    consts = tuple(i for i, on in ((1, const_b), (2, const_c)) if on)
    node, ref = case("Gemm", inputs, attrs, const_inputs=consts)
    for impl in _supporting(GEMM_IMPLS, node):
        (y,) = run_in_layouts(impl, node, inputs)
        np.testing.assert_allclose(y, ref[0], rtol=1e-4, atol=_tol(k, a, b) * abs(alpha) + 1e-5,
                                   err_msg=impl.name)


@pytest.mark.parametrize(("m", "k", "n"), [(300, 700, 45), (1, 2048, 1000), (129, 33, 257),
                                           (7, 1, 3), (2, 0, 5)])
def test_gemm_block_edges(m, k, n):
    """Sizes that cross the K blocks, several M blocks, partial panels, GEMV, K = 0."""
    rng = np.random.default_rng(0)
    a, b, c = _rand(rng, (m, k)), _rand(rng, (k, n)), _rand(rng, (n,))
    node, ref = case("Gemm", [a, b, c], {"alpha": 0.75}, const_inputs=(1,))
    for impl in _supporting(GEMM_IMPLS, node):
        (y,) = run_in_layouts(impl, node, [a, b, c])
        np.testing.assert_allclose(y, ref[0], rtol=1e-4, atol=_tol(k, a, b), err_msg=impl.name)


# -- MatMul ----------------------------------------------------------------------------------


@st.composite
def matmul_shapes(draw):
    m, k, n = draw(st.integers(1, 23)), draw(st.integers(1, 37)), draw(st.integers(1, 35))
    batch = draw(st.lists(st.integers(1, 3), max_size=2))
    a_batch = [d if draw(st.booleans()) else 1 for d in batch]
    b_batch = [d if draw(st.booleans()) else 1 for d in batch]
    b_batch = b_batch[draw(st.integers(0, len(b_batch))):]  # B may have fewer batch axes
    a_shape = (*a_batch, m, k)
    b_shape = (*b_batch, k, n)
    if draw(st.integers(0, 5)) == 0:
        a_shape = (k,)
    if draw(st.integers(0, 5)) == 0:
        b_shape = (k,)
    return a_shape, b_shape


@settings(max_examples=60, deadline=None)
@given(shapes=matmul_shapes(), const_b=st.booleans(), seed=st.integers(0, 2**16))
def test_matmul_matches_reference(shapes, const_b, seed):
    rng = np.random.default_rng(seed)
    a, b = _rand(rng, shapes[0]), _rand(rng, shapes[1])
    node, ref = case("MatMul", [a, b], const_inputs=(1,) if const_b else ())
    impls = _supporting(MATMUL_IMPLS, node)
    if len(shapes[1]) == 2:
        assert {i.name for i in impls} >= {"MatMul.native.packed", "MatMul.native.batched"}
    for impl in impls:
        (y,) = run_in_layouts(impl, node, [a, b])
        assert y.shape == ref[0].shape, impl.name
        np.testing.assert_allclose(y, ref[0], rtol=1e-4, atol=_tol(a.shape[-1], a, b),
                                   err_msg=impl.name)


def test_matmul_large_batched_and_flattened():
    rng = np.random.default_rng(1)
    a, b = _rand(rng, (2, 3, 70, 90)), _rand(rng, (3, 90, 33))
    node, ref = case("MatMul", [a, b])
    for impl in _supporting(MATMUL_IMPLS, node):
        (y,) = run_in_layouts(impl, node, [a, b])
        np.testing.assert_allclose(y, ref[0], rtol=1e-4, atol=_tol(90, a, b), err_msg=impl.name)
    b2 = _rand(rng, (90, 130))
    node, ref = case("MatMul", [a, b2], const_inputs=(1,))
    for impl in _supporting(MATMUL_IMPLS, node):
        (y,) = run_in_layouts(impl, node, [a, b2])
        np.testing.assert_allclose(y, ref[0], rtol=1e-4, atol=_tol(90, a, b2), err_msg=impl.name)


# -- fused patterns --------------------------------------------------------------------------


def _chain(first: Node, ops, rng, swap: bool):
    """Nodes following `first` (Relu / Clip / Add), their extra inputs and the numpy effect."""
    out = first.outputs[0]
    nodes, extra, effects = [first], [], []
    prev = out
    for k, op in enumerate(ops):
        nxt = Value(f"v{k}", out.shape, F32)
        if op == "Relu":
            nodes.append(Node(f"relu{k}", "Relu", [prev], [nxt]))
            effects.append(lambda y: np.maximum(y, 0))
        elif op == "Clip":
            lo, hi = sorted(rng.uniform(-1.5, 1.5, 2).astype(np.float32))
            vals = [Value(f"lo{k}", (), F32, np.float32(lo)), Value(f"hi{k}", (), F32, np.float32(hi))]
            nodes.append(Node(f"clip{k}", "Clip", [prev, *vals], [nxt]))
            extra += [np.float32(lo), np.float32(hi)]
            effects.append(lambda y, lo=lo, hi=hi: np.clip(y, lo, hi))
        else:
            shape = out.shape if rng.integers(2) else (out.shape[-1],)
            r = _rand(rng, shape)
            rv = Value(f"r{k}", shape, F32)
            nodes.append(Node(f"add{k}", "Add", [rv, prev] if swap else [prev, rv], [nxt]))
            extra.append(r)
            effects.append(lambda y, r=r: y + r)
        prev = nxt
    return fuse(nodes), extra, effects


@pytest.mark.parametrize("pattern", [("Gemm", "Relu"), ("Gemm", "Clip"), ("MatMul", "Add"),
                                     ("MatMul", "Add", "Relu")], ids="+".join)
@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 30), k=st.integers(1, 30), n=st.integers(1, 30), batch=st.booleans(),
       swap=st.booleans(), seed=st.integers(0, 2**16))
def test_fused_patterns_match_reference(pattern, m, k, n, batch, swap, seed):
    rng = np.random.default_rng(seed)
    if pattern[0] == "Gemm":
        a, b, c = _rand(rng, (m, k)), _rand(rng, (k, n)), _rand(rng, (n,))
        first, ref = case("Gemm", [a, b, c], {"alpha": 0.5}, const_inputs=(1, 2))
        inputs = [a, b, c]
    else:
        a, b = _rand(rng, (2, m, k) if batch else (m, k)), _rand(rng, (k, n))
        first, ref = case("MatMul", [a, b], const_inputs=(1,))
        inputs = [a, b]
    fused, extra, effects = _chain(first, pattern[1:], rng, swap)
    y_ref = ref[0]
    for f in effects:
        y_ref = f(y_ref)
    impls = _supporting(native_impls("+".join(pattern)), fused)
    for impl in impls:
        (y,) = run_in_layouts(impl, fused, [*inputs, *extra])
        np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=_tol(k, a, b), err_msg=impl.name)


def test_fused_add_with_broadcast_output_is_refused():
    rng = np.random.default_rng(0)
    a, b = _rand(rng, (4, 5)), _rand(rng, (5, 6))
    first, _ = case("MatMul", [a, b], const_inputs=(1,))
    add = Node("add", "Add", [first.outputs[0], Value("r", (3, 4, 6), F32)],
               [Value("y", (3, 4, 6), F32)])
    fused = fuse([first, add])
    for impl in native_impls("MatMul+Add"):
        assert "broadcasts" in (impl.supports(fused) or ""), impl.name


# -- layouts, non-contiguous inputs, validation, ISA -----------------------------------------


@pytest.mark.parametrize(("layout", "shape"), [("KN16_packed", (37, 21)), ("NK16_packed", (21, 37)),
                                               ("KN16_packed", (5, 16)), ("KN16_packed", (0, 3))])
def test_packed_b_layouts_round_trip_and_zero_pad(layout, shape):
    rng = np.random.default_rng(2)
    w = _rand(rng, shape)
    reg = registry()
    (to,) = reg.layouts.path("std", layout, shape, F32)
    (back,) = reg.layouts.path(layout, "std", shape, F32)
    packed = to(w, shape)
    assert packed.shape == reg.layouts.layout(layout).stored_shape(shape)
    n = shape[1] if layout.startswith("KN") else shape[0]
    if n % 16:
        assert np.all(packed[-1, :, n % 16:] == 0)
    np.testing.assert_array_equal(back(packed, shape), w)


def test_kernels_accept_non_contiguous_inputs():
    rng = np.random.default_rng(3)
    a, b, c = _rand(rng, (9, 13)), _rand(rng, (13, 17)), _rand(rng, (9, 17))
    for op, inputs in (("Gemm", [a, b, c]), ("MatMul", [a, b])):
        node, ref = case(op, inputs)
        for impl in _supporting(native_impls(op), node):
            args = []
            for v, x, lay in zip(node.inputs, inputs, impl.input_layouts(node)):
                for conv in registry().layouts.path("std", lay, v.shape, F32):
                    x = conv(x, v.shape)
                view = np.repeat(x, 2, axis=-1)[..., ::2]
                assert not view.flags.c_contiguous
                args.append(view)
            y = impl.build(node)(*args)
            np.testing.assert_allclose(y, ref[0], rtol=1e-4, atol=_tol(13, a, b), err_msg=impl.name)


def test_bindings_validate_in_cpp():
    m = native()
    a = np.ones((4, 5), np.float32)
    p = m.gemm_pack_b(np.ones((5, 6), np.float32))
    bad = [
        lambda: m.gemm_packed(a.astype(np.float64), p, 6),            # dtype
        lambda: m.gemm_packed(np.ones((5, 4), np.float32).T, p, 6),    # non-contiguous
        lambda: m.gemm_packed(np.ones((4, 7), np.float32), p, 6),      # K mismatch
        lambda: m.gemm_packed(a, p, 40),                               # wrong panel count
        lambda: m.gemm_packed(a, p, 6, bias=np.ones((3, 6), np.float32)),   # bad broadcast
        lambda: m.gemm_packed(a, p, 6, residual=np.ones((4, 5), np.float32)),
        lambda: m.gemm_packed(a, p, 6, act="gelu"),
        lambda: m.gemm(a, np.ones((6, 6), np.float32)),
        lambda: m.matmul(np.ones((2, 4, 5), np.float32), np.ones((3, 5, 6), np.float32)),
        lambda: m.matmul(a, np.ones((4, 6), np.float32)),
        lambda: m.gemm_unpack_b(p, 100),
        lambda: m.gemm_pack_b(np.ones(5, np.float32)),
    ]
    for k, fn in enumerate(bad):
        with pytest.raises(ValueError):
            fn()
        assert k >= 0


def test_supports_gives_reasons():
    rng = np.random.default_rng(5)
    a, b = _rand(rng, (3, 4)), _rand(rng, (5, 6))
    node, _ = make_gemm_node(a, b)
    assert "inner dimensions" in (GEMM_IMPLS[0].supports(node) or "")
    a64 = a.astype(np.float64)
    node, _ = case("MatMul", [a64, a64.T.copy()])
    assert all("float32" in (i.supports(node) or "") for i in MATMUL_IMPLS)
    node, _ = case("MatMul", [_rand(rng, (2, 3, 4)), _rand(rng, (2, 4, 5))])
    packed = next(i for i in MATMUL_IMPLS if i.name.endswith(".packed"))
    assert "2-D B" in (packed.supports(node) or "")


def make_gemm_node(a: np.ndarray, b: np.ndarray):
    """A Gemm node with mismatched inner dimensions (the reference would reject it)."""
    from tests.support import make_node

    return make_node("Gemm", [a, b], {}, output_shapes=[(a.shape[0], b.shape[1])],
                     output_dtypes=[F32])


def test_generic_isa_gives_the_same_results():
    m = native()
    rng = np.random.default_rng(4)
    before = m.isa()
    for mm, k, n in ((37, 300, 41), (1, 500, 70), (130, 20, 16)):
        a, b = _rand(rng, (mm, k)), _rand(rng, (k, n))
        p = m.gemm_pack_b(b)
        bias = _rand(rng, (n,))
        fast = m.gemm_packed(a, p, n, False, 1.5, bias, 0.5, None, "clip", -1.0, 2.0)
        try:
            m.set_isa("generic")
            slow = m.gemm_packed(a, p, n, False, 1.5, bias, 0.5, None, "clip", -1.0, 2.0)
        finally:
            m.set_isa(before)
        np.testing.assert_allclose(slow, fast, rtol=1e-5, atol=1e-4)
        ref = np.clip(1.5 * (a.astype(np.float64) @ b) + 0.5 * bias, -1, 2)
        np.testing.assert_allclose(fast, ref, rtol=1e-4, atol=_tol(k, a, b))
    assert m.isa() == before


def test_unpickled_float32_arrays_are_float32():
    """An unpickled array's dtype is a copy of numpy's float32 singleton: the bindings compared
    dtypes by identity and refused it ("expected a float32 array, received dtype float32"; found
    by a throughput tuning of shufflenet on oneDNN's Conv)."""
    import pickle

    m = native()
    rng = np.random.default_rng(11)
    a, b = _rand(rng, (4, 5)), _rand(rng, (5, 6))
    a2, b2 = pickle.loads(pickle.dumps(a)), pickle.loads(pickle.dumps(b))
    assert a2.dtype is not np.dtype(np.float32) and a2.dtype == np.float32  # what the test is about
    y = m.gemm_packed(a2, m.gemm_pack_b(b2), 6)
    np.testing.assert_allclose(y, a @ b, rtol=1e-5, atol=1e-5)
