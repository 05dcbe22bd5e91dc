"""Native elementwise implementations against the ONNX reference, in every layout."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from impls.native._module import native
from tests.native.support import case, native_impls, run_in_layouts

shapes4 = st.tuples(st.integers(1, 2), st.integers(1, 35), st.integers(1, 7), st.integers(1, 7))


def _supporting(op, node):
    impls = [i for i in native_impls(op) if i.supports(node) is None]
    assert impls, f"no native {op} supports {node}"
    return impls


@settings(max_examples=25, deadline=None)
@given(shape=shapes4, op=st.sampled_from(["Add", "Sub", "Mul", "Div", "Max", "Min"]))
def test_binary_same_shape_every_layout(shape, op):
    rng = np.random.default_rng(3)
    a = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(shape).astype(np.float32) + (3.0 if op == "Div" else 0.0)
    node, ref = case(op, [a, b])
    impls = _supporting(op, node)
    layouts = {i.input_layouts(node)[0] for i in impls}
    assert {"std", "nhwc"} <= layouts and (op == "Div" or {"nchw8c", "nchw16c"} <= layouts)
    for impl in impls:
        (y,) = run_in_layouts(impl, node, [a, b])
        np.testing.assert_allclose(y, ref[0], rtol=1e-6, atol=1e-6, err_msg=impl.name)


@pytest.mark.parametrize(
    ("sa", "sb"),
    [((2, 3, 4, 5), (3, 1, 1)), ((4, 5), (5,)), ((1,), (3, 4)), ((2, 1, 4), (3, 1)), ((), (2, 2)),
     ((3, 4), ())],
)
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_binary_broadcast(sa, sb, op):
    rng = np.random.default_rng(4)
    a = np.asarray(rng.standard_normal(sa), np.float32)
    b = np.asarray(rng.standard_normal(sb) + 2.5, np.float32)
    node, ref = case(op, [a, b])
    impl = next(i for i in native_impls(op) if i.name.endswith(".broadcast"))
    assert impl.supports(node) is None
    (y,) = run_in_layouts(impl, node, [a, b])
    np.testing.assert_allclose(y, ref[0], rtol=1e-6, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(shape=shapes4, lo=st.floats(-2, 1), width=st.floats(0.1, 3))
def test_relu_and_clip_every_layout_keep_padding_zero(shape, lo, width):
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    lo_hi = [np.float32(lo), np.float32(lo + width)]
    for op, inputs, consts in (("Relu", [x], ()), ("Clip", [x, *lo_hi], (1, 2))):
        node, ref = case(op, inputs, const_inputs=consts)
        for impl in _supporting(op, node):
            (y,) = run_in_layouts(impl, node, inputs)
            np.testing.assert_allclose(y, ref[0], rtol=1e-6, atol=1e-6, err_msg=impl.name)
            lay = impl.output_layouts(node)[0]
            if lay.startswith("nchw") and lay.endswith("c"):
                block = int(lay[4:-1])
                phys = native().nchw_to_blocked(x, block)
                out = impl.build(node)(phys, *inputs[1:])
                tail = shape[1] % block
                if tail:
                    assert np.all(out[:, -1, :, :, tail:] == 0), f"{impl.name} wrote the padding"


def test_clip_opset_6_attributes():
    x = np.linspace(-3, 3, 2 * 3 * 4 * 4, dtype=np.float32).reshape(2, 3, 4, 4)
    node, ref = case("Clip", [x], {"min": -1.0, "max": 0.5}, opset=6)
    for impl in _supporting("Clip", node):
        (y,) = run_in_layouts(impl, node, [x])
        np.testing.assert_allclose(y, ref[0])


def test_sum_variadic():
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((2, 20, 3, 3)).astype(np.float32) for _ in range(3)]
    node, ref = case("Sum", xs)
    for impl in _supporting("Sum", node):
        (y,) = run_in_layouts(impl, node, xs)
        np.testing.assert_allclose(y, ref[0], rtol=1e-6, atol=1e-6)


def test_unsupported_cases_give_reasons():
    x = np.zeros((2, 3), np.float64)
    node, _ = case("Relu", [x])
    for impl in native_impls("Relu"):
        assert "float32" in (impl.supports(node) or "")
    a = np.zeros((2, 3, 4, 4), np.float32)
    node, _ = case("Clip", [a, np.float32(0), np.float32(1)])  # runtime bounds
    assert all("constant" in (i.supports(node) or "") for i in native_impls("Clip"))


def test_kernels_validate_input():
    m = native()
    with pytest.raises(ValueError, match="do not broadcast"):
        m.binary_broadcast("add", np.zeros((2, 3), np.float32), np.zeros((4,), np.float32))
    with pytest.raises(ValueError, match="same shape"):
        m.binary_same("add", np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="known: add"):
        m.binary_same("pow", np.zeros(2, np.float32), np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="at least one"):
        m.sum_n([])


def test_generic_isa_gives_the_same_results():
    m = native()
    x = np.random.default_rng(7).standard_normal((3, 1000)).astype(np.float32)
    before = m.isa()
    try:
        m.set_isa("generic")
        a = m.binary_same("mul", x, x, True)
    finally:
        m.set_isa(before)
    np.testing.assert_array_equal(a, m.binary_same("mul", x, x, True))
