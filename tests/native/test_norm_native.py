"""Native per-channel affine ops in every layout against the numpy reference: BatchNormalization
(inference, folded once at plan build), Mul / Add by a per-channel constant and the fused
Mul+Add; odd channel counts (padding inside the block), batches, 1x1 spatial extents, other
ranks in the standard layout, non-contiguous inputs; supports() reasons; C++ validation of
channel_affine and fold_batchnorm."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import impls.native.norm as native_norm
from dispatch.fusion import fuse
from impls.native._module import native
from impls.native.layouts import BLOCKS
from impls.native.norm import LAYOUTS
from tests.native.support import native_impls, registry, run_in_layouts
from tests.support import make_node

OP = "BatchNormalization"
REFERENCE = "BatchNormalization.numpy.affine"
CONSTS = (1, 2, 3, 4)


def _params(rng: np.random.Generator, c: int) -> list[np.ndarray]:
    """scale, B, mean, var (positive) of ``c`` channels."""
    return [
        rng.uniform(0.5, 1.5, c).astype(np.float32),
        rng.standard_normal(c).astype(np.float32),
        rng.standard_normal(c).astype(np.float32),
        rng.uniform(0.1, 2.0, c).astype(np.float32),
    ]


def reference_case(inputs, attrs=None, *, opset: int = 21, const_inputs=CONSTS, n_outputs: int = 1):
    """The node (outputs with the reference's shapes and dtypes) and the numpy reference."""
    node, _ = make_node(OP, inputs, attrs, opset=opset, const_inputs=const_inputs,
                        n_outputs=n_outputs)
    y = registry().impl(REFERENCE).build(node)(*inputs)
    node, _ = make_node(OP, inputs, attrs, opset=opset, const_inputs=const_inputs,
                        output_shapes=[y.shape], output_dtypes=[y.dtype])
    return node, y


def _layout_of(impl) -> str:
    return impl.name.rsplit(".", 1)[-1]


@st.composite
def bn_cases(draw):
    n = draw(st.integers(1, 3))
    c = draw(st.sampled_from([1, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 40]))
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    if draw(st.booleans()):
        h = w = 1
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = (rng.standard_normal((n, c, h, w)) * 3).astype(np.float32)
    eps = draw(st.sampled_from([1e-5, 1e-3, 0.1]))
    return [x, *_params(rng, c)], {"epsilon": eps}


@settings(max_examples=40, deadline=None)
@given(data=bn_cases(), opset=st.sampled_from([9, 14, 15, 21]))
def test_every_layout_matches_numpy(data, opset):
    inputs, attrs = data
    x = inputs[0]
    node, ref = reference_case(inputs, attrs, opset=opset)
    impls = native_impls(OP)
    assert {_layout_of(i) for i in impls} == set(LAYOUTS)
    for impl in impls:
        (y,) = run_in_layouts(impl, node, inputs)
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5, err_msg=impl.name)
        block = BLOCKS.get(_layout_of(impl))
        tail = x.shape[1] % block if block else 0
        if tail:  # the bias must not leak into the padding channels
            raw = impl.build(node)(native().nchw_to_blocked(x, block), *inputs[1:])
            assert np.all(raw[:, -1, ..., tail:] == 0), f"{impl.name} wrote the padding channels"


@pytest.mark.parametrize("shape", [(4, 7), (2, 5, 9), (1, 3, 2, 2, 3), (3, 17, 1)])
def test_std_takes_any_rank(shape):
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(shape).astype(np.float32), *_params(rng, shape[1])]
    node, ref = reference_case(inputs)
    impls = {_layout_of(i): i for i in native_impls(OP)}
    (y,) = run_in_layouts(impls["std"], node, inputs)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    for lay in ("nhwc", *BLOCKS):
        assert "rank-4" in (impls[lay].supports(node) or ""), lay


def test_kernels_accept_non_contiguous_inputs():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 21, 5, 6)).astype(np.float32)
    inputs = [x, *_params(rng, 21)]
    node, ref = reference_case(inputs)
    reg = registry()
    for impl in native_impls(OP):
        lay = _layout_of(impl)
        phys = x
        for conv in reg.layouts.path("std", lay, x.shape, x.dtype):
            phys = conv(phys, x.shape)
        view = np.repeat(phys, 2, axis=-1)[..., ::2]
        assert not view.flags.c_contiguous
        y = impl.build(node)(view, *inputs[1:])
        for conv in reg.layouts.path(lay, "std", ref.shape, ref.dtype):
            y = conv(y, ref.shape)
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5, err_msg=impl.name)


def test_parameters_are_folded_once_at_build(monkeypatch):
    """fold_batchnorm runs when the kernel is built, never per run; the run ignores the
    parameter arrays it is handed."""
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal((1, 9, 3, 3)).astype(np.float32), *_params(rng, 9)]
    node, ref = reference_case(inputs)
    calls = []
    real = native_norm.fold

    def counting(n):
        calls.append(n)
        return real(n)

    monkeypatch.setattr(native_norm, "fold", counting)
    impl = next(i for i in native_impls(OP) if _layout_of(i) == "std")
    kernel = impl.build(node)
    assert len(calls) == 1
    for _ in range(3):
        y = kernel(inputs[0], *(np.zeros_like(p) for p in inputs[1:]))
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    assert len(calls) == 1


def test_supports_gives_reasons():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 4, 3, 3)).astype(np.float32)
    p = _params(rng, 4)

    def reasons(inputs, attrs=None, **kw):
        node, _ = make_node(OP, inputs, attrs, **{"const_inputs": CONSTS, **kw})
        return [i.supports(node) or "" for i in native_impls(OP)]

    cases = [
        (([x, *p], {"training_mode": 1}), {}, "training_mode"),
        (([x, *p], None), {"n_outputs": 3}, "outputs"),
        (([x, *p], None), {"n_outputs": 3, "opset": 9}, "training mode"),
        (([x, *p], None), {"opset": 6}, "is_test"),
        (([x, *p], {"spatial": 0}), {"opset": 7}, "spatial=0"),
        (([x, *p], None), {"const_inputs": (1, 2, 4)}, "constant"),
        (([x.astype(np.float64), *p], None), {}, "float32"),
        (([x, p[0].astype(np.float16), *p[1:]], None), {}, "float32"),
        (([x, p[0][:3], *p[1:]], None), {}, "shape (4,)"),
        (([x, *p[:3], None], None), {}, "missing ['input_var']"),
        (([x[0, 0, 0], *p], None), {}, "rank"),
    ]
    for (inputs, attrs), kw, words in cases:
        for reason in reasons(inputs, attrs, **kw):
            assert words in reason, (kw, attrs, reason)


def test_bindings_validate_in_cpp():
    m = native()
    x = np.zeros((1, 3, 4, 4), np.float32)
    xb = np.zeros((1, 1, 4, 4, 16), np.float32)
    s = np.ones(3, np.float32)
    assert m.channel_affine(x, "std", s, s).shape == x.shape
    assert m.channel_affine(xb, "nchw16c", s, None, 3).shape == xb.shape
    a, b = m.fold_batchnorm(s, s, s, s, 1e-5)
    assert a.shape == b.shape == (3,)
    bad = [
        (lambda: m.channel_affine(x.astype(np.float64), "std", s, s), "float32"),
        (lambda: m.channel_affine(np.zeros(3, np.float32), "std", s, s), "rank >= 2"),
        (lambda: m.channel_affine(x, "nhwc", s, s), r"scale: expected shape \(4,\)"),  # C last
        (lambda: m.channel_affine(x[0], "nhwc", s, s), "rank-4"),
        (lambda: m.channel_affine(xb, "nchw16c", s, s), "logical channel count"),
        (lambda: m.channel_affine(xb, "nchw8c", s, s, 3), "physical shape"),
        (lambda: m.channel_affine(x, "std", s[:2], s), "scale: expected shape"),
        (lambda: m.channel_affine(x, "std", s, s.astype(np.float64)), "bias: expected a float32"),
        (lambda: m.channel_affine(x, "std", s, s, 4), "expected 4 channels"),
        (lambda: m.channel_affine(np.zeros((1, 3, 4, 8), np.float32)[..., ::2], "std", s, s),
         "C-contiguous"),
        (lambda: m.channel_affine(x, "nchw4c", s, s), "known: std"),
        (lambda: m.fold_batchnorm(s[None], s, s, s, 1e-5), "rank-1"),
        (lambda: m.fold_batchnorm(s, s[:2], s, s, 1e-5), "B: expected shape"),
        (lambda: m.fold_batchnorm(s, s, s.astype(np.int64), s, 1e-5), "mean: expected a float32"),
    ]
    for fn, words in bad:
        with pytest.raises(ValueError, match=words):
            fn()


# -- Mul / Add by a per-channel constant -----------------------------------------------------


def _channel_impls(op: str) -> dict[str, object]:
    return {_layout_of(i).removesuffix("_channel"): i for i in native_impls(op)
            if i.name.endswith("_channel")}


CONST_SHAPES = ["C11", "1C11", "1", "scalar", "1111"]


def _const(rng: np.random.Generator, kind: str, c: int) -> np.ndarray:
    shape = {"C11": (c, 1, 1), "1C11": (1, c, 1, 1), "1": (1,), "scalar": (), "1111": (1, 1, 1, 1)}[kind]
    return np.asarray(rng.uniform(0.5, 2.0, shape), np.float32)


def _elementwise_case(op: str, inputs, const_index: int):
    """A Mul / Add node with the numpy backend's output."""
    node, _ = make_node(op, inputs, const_inputs=(const_index,))
    y = registry().impl(f"{op}.numpy.ufunc").build(node)(*inputs)
    node, _ = make_node(op, inputs, const_inputs=(const_index,), output_shapes=[y.shape],
                        output_dtypes=[y.dtype])
    return node, y


@settings(max_examples=40, deadline=None)
@given(data=bn_cases(), op=st.sampled_from(["Mul", "Add"]), kind=st.sampled_from(CONST_SHAPES),
       swap=st.booleans())
def test_mul_add_by_channel_constant_every_layout(data, op, kind, swap):
    (x, *_), _ = data
    rng = np.random.default_rng(x.shape[1])
    k = _const(rng, kind, x.shape[1])
    inputs = [k, x] if swap else [x, k]
    node, ref = _elementwise_case(op, inputs, 0 if swap else 1)
    impls = _channel_impls(op)
    assert set(impls) == set(LAYOUTS)
    for lay, impl in impls.items():
        assert impl.input_layouts(node)[1 if swap else 0] == lay
        (y,) = run_in_layouts(impl, node, inputs)
        np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6, err_msg=impl.name)
        block = BLOCKS.get(lay)
        tail = x.shape[1] % block if block else 0
        if tail:  # Add's term must not leak into the padding channels
            phys = native().nchw_to_blocked(x, block)
            raw = impl.build(node)(*([k, phys] if swap else [phys, k]))
            assert np.all(raw[:, -1, ..., tail:] == 0), f"{impl.name} wrote the padding channels"


@pytest.mark.parametrize("shape", [(3, 5), (2, 4, 7)])
def test_mul_add_by_channel_constant_std_other_ranks(shape):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape).astype(np.float32)
    k = rng.standard_normal((shape[1],) + (1,) * (len(shape) - 2)).astype(np.float32)
    for op in ("Mul", "Add"):
        node, ref = _elementwise_case(op, [x, k], 1)
        (y,) = run_in_layouts(_channel_impls(op)["std"], node, [x, k])
        np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(data=bn_cases(), kinds=st.tuples(st.sampled_from(CONST_SHAPES), st.sampled_from(CONST_SHAPES)),
       swap=st.tuples(st.booleans(), st.booleans()))
def test_fused_mul_add_every_layout(data, kinds, swap):
    """Mul then Add by per-channel constants (an exporter's BatchNormalization) in one pass."""
    (x, *_), _ = data
    c = x.shape[1]
    rng = np.random.default_rng(c)
    s, b = _const(rng, kinds[0], c), _const(rng, kinds[1], c)
    mul, mid = _elementwise_case("Mul", [s, x] if swap[0] else [x, s], 0 if swap[0] else 1)
    add_in = [b, mid] if swap[1] else [mid, b]
    add, ref = _elementwise_case("Add", add_in, 0 if swap[1] else 1)
    add.inputs[1 if swap[1] else 0] = mul.outputs[0]  # chain the two nodes
    fused = fuse([mul, add])
    impls = {_layout_of(i).removesuffix("_channel"): i for i in native_impls("Mul+Add")}
    assert set(impls) == set(LAYOUTS)
    for lay, impl in impls.items():
        assert impl.supports(fused) is None, impl.supports(fused)
        assert impl.input_layouts(fused) == tuple(
            lay if v is not None and v.const is None else "std" for v in fused.inputs)
        (y,) = run_in_layouts(impl, fused, [*([s, x] if swap[0] else [x, s]), b])
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5, err_msg=impl.name)


def test_channel_supports_gives_reasons():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 6, 3, 4)).astype(np.float32)
    k = rng.standard_normal((6, 1, 1)).astype(np.float32)
    cases = [
        (([x, k], ()), "one constant operand"),  # a run-time tensor, not a constant
        (([x, x], (1,)), "does not broadcast per channel"),
        (([x, rng.standard_normal(4).astype(np.float32)], (1,)), "does not broadcast per channel"),
        (([x, rng.standard_normal((6, 3, 1)).astype(np.float32)], (1,)), "does not broadcast"),
        (([x.astype(np.float64), k.astype(np.float64)], (1,)), "float32"),
        (([x[0, 0, 0], k[:, 0, 0][:4]], (1,)), "rank"),
    ]
    for op in ("Mul", "Add"):
        for (inputs, consts), words in cases:
            node, _ = make_node(op, inputs, const_inputs=consts)
            for lay, impl in _channel_impls(op).items():
                assert words in (impl.supports(node) or ""), (op, lay, impl.supports(node))
