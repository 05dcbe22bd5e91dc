"""numpy Conv, Gemm, MatMul, pooling and normalisation kernels against onnx's reference.

Every registered implementation of each operator runs every case (an implementation whose
``supports()`` declines a case must say why, and some implementation must accept every
case). Where onnx's ReferenceEvaluator is known to be wrong the expected values come from a
spec-level construction instead, named in each test:

- BatchNormalization before opset 14: the evaluator runs training mode (``is_test`` /
  ``momentum`` defaults), so the opset-15 inference reference is used;
- Softmax / LogSoftmax before opset 13: the evaluator ignores the 2-D coercion, so the
  opset-13 reference runs on the coerced 2-D input;
- LRN: the evaluator loops over the batch axis instead of the channels (it is right only
  when N == C), so cases use N == C or a direct per-channel sum;
- MaxPool Indices at stride 1 / dilation 1 (the evaluator's flat indices are wrong there) are
  checked by gathering X at the indices; strided cases compare with the reference;
- GlobalMaxPool beyond 2-D spatial (the evaluator reduces the wrong axes): np.max.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import make_node, reference_outputs, run_impl

for _module in ("conv", "gemm", "pool", "norm"):
    importlib.import_module(f"impls.numpy.{_module}")

from impls.numpy.table import impls  # noqa: E402

RNG = np.random.default_rng(20240601)


def impls_of(op: str) -> list:
    found = [i for i in impls if i.op == op]
    assert found, f"no numpy implementation of {op}"
    return found


def by_name(impl) -> str:
    return impl.name


def rand(*shape: int, dtype: Any = np.float32, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def tolerances(dtype: Any) -> dict[str, float]:
    dt = np.dtype(dtype)
    if dt == np.float16:
        return {"rtol": 1e-2, "atol": 1e-2}
    if dt == np.float64:
        return {"rtol": 1e-9, "atol": 1e-10}
    if dt.kind in "iu":
        return {"rtol": 0, "atol": 0}
    return {"rtol": 1e-4, "atol": 1e-5}


def run_checked(impl, node, inputs, n_outputs: int) -> list[np.ndarray] | None:
    """Run ``impl`` (``None`` when it declines the node, with a reason); check the outputs
    are contiguous arrays, one per node output."""
    reason = impl.supports(node)
    if reason is not None:
        assert isinstance(reason, str) and reason, impl.name
        return None
    outs = run_impl(impl, node, inputs)
    assert len(outs) == n_outputs, impl.name
    for y in outs:
        assert isinstance(y, np.ndarray) and y.flags.c_contiguous, impl.name
    return outs


def compare(
    op: str,
    impl,
    inputs: list[np.ndarray | None],
    attrs: dict | None = None,
    *,
    opset: int = 21,
    n_outputs: int = 1,
    const: tuple[int, ...] = (),
    expected: list[np.ndarray] | None = None,
    check: tuple[int, ...] | None = None,
    tol: dict[str, float] | None = None,
) -> list[np.ndarray] | None:
    """Compare ``impl`` with the reference outputs (or ``expected``) on outputs ``check``."""
    node, proto = make_node(op, inputs, attrs, n_outputs=n_outputs, opset=opset, const_inputs=const)
    outs = run_checked(impl, node, inputs, n_outputs)
    if outs is None:
        return None
    if expected is None:
        expected = reference_outputs(proto, inputs, opset)
    tol = tol or tolerances(inputs[0].dtype)
    for k in check if check is not None else range(n_outputs):
        y, e = outs[k], np.asarray(expected[k])
        assert y.shape == e.shape, f"{impl.name} output {k}: shape {y.shape} != {e.shape}"
        if k == 0:
            assert y.dtype == e.dtype, f"{impl.name}: dtype {y.dtype} != {e.dtype}"
        np.testing.assert_allclose(y, e, err_msg=f"{impl.name} output {k}", **tol)
    return outs


def assert_someone_supports(op: str, inputs, attrs=None, *, opset=21, n_outputs=1) -> None:
    node, _ = make_node(op, inputs, attrs, n_outputs=n_outputs, opset=opset)
    reasons = {i.name: i.supports(node) for i in impls_of(op)}
    assert any(r is None for r in reasons.values()), reasons


# -- Conv ------------------------------------------------------------------------------------

CONV_CASES = [
    # (x shape, w shape, attrs, dtype, bias, const W/B, opset)
    ((1, 3, 7, 7), (4, 3, 3, 3), {}, np.float32, True, (), 21),
    ((2, 3, 8, 9), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}, np.float32, True, (1, 2), 21),
    ((2, 4, 9, 8), (6, 4, 3, 3), {"pads": [1, 0, 2, 1], "strides": [2, 3]}, np.float32, False, (), 21),
    ((1, 2, 11, 10), (3, 2, 3, 2), {"dilations": [2, 3], "pads": [2, 1, 0, 3]}, np.float32, True, (1,), 21),
    ((2, 6, 7, 7), (4, 3, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}, np.float32, True, (1, 2), 21),
    ((2, 4, 9, 9), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}, np.float32, True, (1,), 21),
    ((1, 4, 9, 9), (8, 1, 3, 3), {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]}, np.float32, True, (),
     21),
    ((1, 6, 8, 8), (6, 2, 3, 3), {"group": 3, "dilations": [2, 2], "auto_pad": "SAME_UPPER"},
     np.float32, False, (), 21),
    ((3, 3, 9, 10), (4, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, np.float32, True, (), 21),
    ((1, 3, 9, 10), (4, 3, 2, 4), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}, np.float32, True, (), 21),
    ((1, 3, 7, 6), (2, 3, 2, 2), {"auto_pad": "SAME_LOWER"}, np.float32, False, (), 11),
    ((1, 3, 9, 10), (4, 3, 3, 2), {"auto_pad": "VALID", "strides": [2, 3]}, np.float32, True, (), 21),
    ((2, 3, 11), (4, 3, 3), {"pads": [2, 1], "strides": [2], "dilations": [2]}, np.float32, True, (), 21),
    ((2, 4, 13), (4, 2, 4), {"group": 2, "auto_pad": "SAME_UPPER"}, np.float64, True, (), 21),
    ((1, 2, 5, 6, 7), (3, 2, 3, 2, 3), {"pads": [1, 0, 1, 1, 1, 0]}, np.float32, True, (1,), 21),
    ((2, 4, 5, 6, 5), (4, 2, 2, 2, 2), {"group": 2, "strides": [2, 1, 2], "dilations": [1, 2, 1]}, np.float64,
     False, (), 21),
    ((2, 8, 6, 6), (5, 8, 1, 1), {}, np.float32, True, (1, 2), 21),
    ((2, 8, 7, 7), (5, 8, 1, 1), {"strides": [2, 2]}, np.float32, False, (), 21),
    ((1, 3, 7, 7), (4, 3, 3, 3), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, np.float64, True, (1,), 11),
    ((1, 3, 8, 8), (2, 3, 5, 5), {"pads": [2, 2, 2, 2]}, np.float64, True, (), 7),
    ((1, 3, 6, 7), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}, np.float16, True, (), 21),
    ((2, 5, 3, 3), (2, 5, 3, 3), {}, np.float32, True, (), 21),
]


@pytest.mark.parametrize("impl", impls_of("Conv"), ids=by_name)
@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_conv(impl, case):
    xs, ws, attrs, dtype, bias, const, opset = CONV_CASES[case]
    inputs = [rand(*xs, dtype=dtype), rand(*ws, dtype=dtype)]
    if bias:
        inputs.append(rand(ws[0], dtype=dtype))
    compare("Conv", impl, inputs, attrs, const=const, opset=opset)
    assert_someone_supports("Conv", inputs, attrs, opset=opset)


@pytest.mark.parametrize("name", ["Conv.numpy.im2col", "Conv.numpy.direct"])
def test_general_conv_algorithms_accept_every_case(name):
    impl = next(i for i in impls_of("Conv") if i.name == name)
    for xs, ws, attrs, dtype, bias, _, opset in CONV_CASES:
        inputs = [np.zeros(xs, dtype), np.zeros(ws, dtype)] + ([np.zeros(ws[0], dtype)] if bias else [])
        node, _ = make_node("Conv", inputs, attrs, opset=opset)
        assert impl.supports(node) is None, (xs, ws, attrs)


def test_conv_winograd_accepts_3x3_stride_1():
    names = [i.name for i in impls_of("Conv")]
    assert {"Conv.numpy.im2col", "Conv.numpy.direct"} <= set(names)
    x, w = rand(1, 2, 5, 5), rand(3, 2, 3, 3)
    node, _ = make_node("Conv", [x, w], {"pads": [1, 1, 1, 1]})
    if "Conv.numpy.winograd" in names:
        wino = next(i for i in impls_of("Conv") if i.name == "Conv.numpy.winograd")
        assert wino.supports(node) is None


def test_conv_runtime_weights_change_between_calls():
    """A non-constant W is packed on every call (no stale packing)."""
    x = rand(1, 3, 6, 6)
    for impl in impls_of("Conv"):
        w1, w2 = rand(4, 3, 3, 3), rand(4, 3, 3, 3)
        node, proto = make_node("Conv", [x, w1], {"pads": [1, 1, 1, 1]})
        if impl.supports(node) is not None:
            continue
        kernel = impl.build(node)
        for w in (w1, w2):
            expected = reference_outputs(proto, [x, w])[0]
            np.testing.assert_allclose(kernel(x, w), expected, rtol=1e-4, atol=1e-5)


@st.composite
def conv_params(draw):
    nd = draw(st.integers(1, 2))
    group = draw(st.integers(1, 3))
    cg, mg = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, 3)) for _ in range(nd)]
    strides = [draw(st.integers(1, 3)) for _ in range(nd)]
    dilations = [draw(st.integers(1, 2)) for _ in range(nd)]
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    pads = [draw(st.integers(0, 2)) for _ in range(2 * nd)]
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    spatial = [draw(st.integers(e, e + 6)) for e in extent]
    attrs: dict[str, Any] = {"group": group, "strides": strides, "dilations": dilations}
    if auto_pad == "NOTSET":
        attrs["pads"] = pads
    else:
        attrs["auto_pad"] = auto_pad
    batch = draw(st.integers(1, 2))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    bias = draw(st.booleans())
    return (batch, group * cg, *spatial), (group * mg, cg, *kernel), attrs, dtype, bias


@settings(max_examples=40, deadline=None)
@given(conv_params())
def test_conv_property(params):
    xs, ws, attrs, dtype, bias = params
    inputs = [rand(*xs, dtype=dtype), rand(*ws, dtype=dtype)]
    if bias:
        inputs.append(rand(ws[0], dtype=dtype))
    node, proto = make_node("Conv", inputs, attrs)
    expected = reference_outputs(proto, inputs)
    accepted = 0
    for impl in impls_of("Conv"):
        outs = run_checked(impl, node, inputs, 1)
        if outs is None:
            continue
        accepted += 1
        assert outs[0].shape == expected[0].shape, impl.name
        np.testing.assert_allclose(outs[0], expected[0], err_msg=impl.name, **tolerances(dtype))
    assert accepted >= 2


# -- Gemm ------------------------------------------------------------------------------------

GEMM_CASES = [
    # (A shape, B shape, C shape or None, attrs, dtype, const, opset)
    ((3, 4), (4, 5), (5,), {}, np.float32, (), 21),
    ((4, 3), (5, 4), (3, 1), {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}, np.float32, (1, 2), 21),
    ((4, 3), (4, 5), None, {"transA": 1, "alpha": 0.25}, np.float32, (1,), 13),
    ((3, 4), (5, 4), (1, 5), {"transB": 1}, np.float32, (1,), 9),
    ((3, 4), (4, 5), (3, 5), {"beta": 0.0}, np.float32, (), 7),
    ((3, 4), (4, 5), (), {"beta": 0.3}, np.float64, (2,), 11),
    ((7, 1), (1, 6), (7, 6), {"alpha": -1.5, "beta": -0.5}, np.float64, (1,), 7),
    ((5, 6), (6, 3), (3,), {}, np.float16, (1, 2), 13),
    ((3, 4), (4, 5), (5,), {}, np.int32, (), 13),
    ((4, 3), (5, 4), (1,), {"transA": 1, "transB": 1}, np.int64, (1,), 11),
    ((3, 4), (4, 5), (5,), {"alpha": 0.5, "beta": 1.5}, np.int32, (), 21),
]


def _ints(*shape: int, dtype: Any) -> np.ndarray:
    return RNG.integers(-5, 6, size=shape).astype(dtype)


def _operand(shape, dtype) -> np.ndarray:
    if np.dtype(dtype).kind in "iu":
        return _ints(*shape, dtype=dtype)
    return rand(*shape, dtype=dtype)


@pytest.mark.parametrize("impl", impls_of("Gemm"), ids=by_name)
@pytest.mark.parametrize("case", range(len(GEMM_CASES)))
def test_gemm(impl, case):
    a, b, c, attrs, dtype, const, opset = GEMM_CASES[case]
    inputs = [_operand(a, dtype), _operand(b, dtype)]
    if c is not None:
        inputs.append(_operand(c, dtype))
    compare("Gemm", impl, inputs, attrs, const=const, opset=opset)
    assert_someone_supports("Gemm", inputs, attrs, opset=opset)


def test_gemm_has_two_algorithms():
    assert {"Gemm.numpy.matmul", "Gemm.numpy.einsum"} <= {i.name for i in impls_of("Gemm")}


# -- MatMul ----------------------------------------------------------------------------------

MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 3, 4), (4, 5)),
    ((2, 1, 3, 4), (5, 4, 2)),
    ((4,), (2, 4, 3)),
    ((2, 3, 4), (4,)),
    ((1, 3, 4), (2, 4, 6)),
    ((2, 2, 3, 4), (2, 2, 4, 3)),
]


@pytest.mark.parametrize("impl", impls_of("MatMul"), ids=by_name)
@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64], ids=str)
@pytest.mark.parametrize("const", [(), (1,)], ids=["runtime_b", "const_b"])
def test_matmul(impl, shapes, dtype, const):
    inputs = [_operand(shapes[0], dtype), _operand(shapes[1], dtype)]
    compare("MatMul", impl, inputs, {}, const=const, opset=13)
    assert_someone_supports("MatMul", inputs)


def test_matmul_opset_8_is_float_only():
    a, b = _ints(2, 3, dtype=np.int32), _ints(3, 2, dtype=np.int32)
    node, _ = make_node("MatMul", [a, b], opset=8)
    for impl in impls_of("MatMul"):
        assert "int32" in impl.supports(node)


# -- MaxPool ---------------------------------------------------------------------------------

#: windows of more than impls.numpy.pool.LARGE_WINDOW cells (pooled axis by axis, in closed
#: form): strides, pads, a window as large as the padded input, 1-d and 3-d. onnx's reference
#: gets large windows with ceil_mode wrong (onnxruntime and these kernels agree) and refuses a
#: window larger than its input: test_a_huge_window_costs_neither_time_nor_memory checks both
#: against the closed form
LARGE_WINDOW_CASES = [
    ((1, 2, 12, 13), {"kernel_shape": [9, 9], "strides": [2, 3], "pads": [3, 2, 4, 1]}),
    ((1, 3, 7, 7), {"kernel_shape": [9, 9], "pads": [1, 1, 1, 1]}),
    ((2, 2, 15, 9), {"kernel_shape": [11, 7], "strides": [3, 1], "auto_pad": "SAME_UPPER"}),
    ((2, 3, 150), {"kernel_shape": [70], "strides": [10], "pads": [5, 7]}),
    ((1, 2, 6, 7, 8), {"kernel_shape": [4, 5, 4], "strides": [2, 2, 3], "pads": [1, 2, 0, 1, 1, 2]}),
]

MAXPOOL_CASES = [
    # (x shape, attrs) -- 2-D stride 1 / dilation 1 cases go through the reference's generic path
    ((2, 3, 7, 8), {"kernel_shape": [3, 3]}),
    ((2, 3, 7, 8), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ((1, 2, 6, 7), {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 6, 7), {"kernel_shape": [3, 2], "auto_pad": "SAME_LOWER"}),
    ((2, 3, 7, 8), {"kernel_shape": [3, 2], "strides": [2, 2]}),
    ((2, 3, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 3, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 2], "ceil_mode": 1}),
    ((1, 3, 7, 7), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 3, 9, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 3, 9, 10), {"kernel_shape": [3, 3], "strides": [2, 1], "auto_pad": "VALID"}),
    ((1, 2, 8, 8), {"kernel_shape": [2, 2], "dilations": [2, 2]}),
    ((1, 2, 8, 9), {"kernel_shape": [2, 3], "dilations": [2, 1], "strides": [2, 2], "pads": [1, 1, 0, 1],
                    "ceil_mode": 1}),
    ((2, 3, 11), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    ((2, 3, 12), {"kernel_shape": [2], "strides": [3], "dilations": [2], "ceil_mode": 1}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [3, 2, 2], "strides": [2, 1, 2], "pads": [1, 0, 1, 1, 1, 0]}),
    ((1, 2, 6, 5, 6), {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2], "ceil_mode": 1}),
    # large windows (> LARGE_WINDOW cells): pooled axis by axis unless Indices are wanted
    *LARGE_WINDOW_CASES,
]


def _reference_indices_reliable(attrs: dict) -> bool:
    strides, dilations = attrs.get("strides", [1]), attrs.get("dilations", [1])
    return set(strides) != {1} or set(dilations) != {1}


def _gather_check(x: np.ndarray, y: np.ndarray, idx: np.ndarray, storage_order: int) -> None:
    """Indices must point at the maxima: flat (N, C) base plus the spatial offset in row- or
    column-major order."""
    spatial = x.shape[2:]
    size = int(np.prod(spatial))
    nc, rest = np.divmod(idx, size)
    order = "C" if storage_order == 0 else "F"
    coords = np.unravel_index(rest, spatial, order=order)
    rowmajor = nc * size + np.ravel_multi_index(coords, spatial)
    np.testing.assert_array_equal(x.reshape(-1)[rowmajor], y)


@pytest.mark.parametrize("impl", impls_of("MaxPool"), ids=by_name)
@pytest.mark.parametrize("case", range(len(MAXPOOL_CASES)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16], ids=str)
def test_maxpool(impl, case, dtype):
    xs, attrs = MAXPOOL_CASES[case]
    x = rand(*xs, dtype=dtype)
    compare("MaxPool", impl, [x], attrs)
    assert_someone_supports("MaxPool", [x], attrs)


@pytest.mark.parametrize("impl", impls_of("MaxPool"), ids=by_name)
@pytest.mark.parametrize("case", range(len(MAXPOOL_CASES)))
@pytest.mark.parametrize("storage_order", [0, 1])
def test_maxpool_indices(impl, case, storage_order):
    xs, attrs = MAXPOOL_CASES[case]
    attrs = {**attrs, "storage_order": storage_order}
    # small integers as floats: many ties, so the first-maximum rule is exercised
    x = RNG.integers(-3, 4, size=xs).astype(np.float32)
    reliable = _reference_indices_reliable(attrs) and attrs.get("auto_pad") != "SAME_LOWER"
    outs = compare(
        "MaxPool", impl, [x], attrs, n_outputs=2, opset=12, check=(0, 1) if reliable else (0,)
    )
    assert_someone_supports("MaxPool", [x], attrs, n_outputs=2, opset=12)
    if outs is not None:
        assert outs[1].dtype == np.int64
        _gather_check(x, outs[0], outs[1], storage_order)


def test_maxpool_indices_all_minus_inf_point_into_the_input():
    """A window whose real cells are all -inf reports its first real cell, never padding."""
    x = np.full((1, 1, 3, 3), -np.inf, dtype=np.float32)
    x[0, 0, 2, 2] = 1.0
    attrs = {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1], "strides": [2, 2]}
    node, proto = make_node("MaxPool", [x], attrs, n_outputs=2)
    expected = reference_outputs(proto, [x])
    for impl in impls_of("MaxPool"):
        outs = run_checked(impl, node, [x], 2)
        if outs is not None:
            np.testing.assert_array_equal(outs[0], expected[0])
            np.testing.assert_array_equal(outs[1], expected[1])
            np.testing.assert_array_equal(outs[1], [[[[0, 1], [3, 8]]]])


@pytest.mark.parametrize("impl", impls_of("MaxPool"), ids=by_name)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=str)
def test_maxpool_int8(impl, dtype):
    x = RNG.integers(0 if dtype == np.uint8 else -128, 128, size=(2, 3, 7, 8)).astype(dtype)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    compare("MaxPool", impl, [x], attrs, opset=12)
    compare("MaxPool", impl, [x], attrs, n_outputs=2, opset=12)


# -- AveragePool -----------------------------------------------------------------------------

AVGPOOL_CASES = [
    # (x shape, attrs, opset)
    ((2, 3, 7, 8), {"kernel_shape": [3, 3]}, 11),
    ((2, 3, 7, 8), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, 7),
    ((2, 3, 7, 8), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 2, 1]}, 11),
    ((2, 3, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 2], "ceil_mode": 1}, 10),
    ((1, 3, 7, 7), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, 19),
    ((1, 2, 6, 7), {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"}, 11),
    ((1, 2, 6, 7), {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER", "strides": [2, 2]}, 19),
    ((1, 3, 9, 10), {"kernel_shape": [3, 3], "strides": [2, 1], "auto_pad": "VALID"}, 19),
    ((1, 2, 8, 8), {"kernel_shape": [2, 2], "dilations": [2, 2]}, 19),
    ((1, 2, 8, 9), {"kernel_shape": [2, 3], "dilations": [2, 1], "strides": [2, 2], "pads": [1, 1, 0, 1],
                    "ceil_mode": 1}, 19),
    ((2, 3, 11), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, 19),
    ((1, 2, 5, 6, 7), {"kernel_shape": [3, 2, 2], "strides": [2, 1, 2], "pads": [1, 0, 1, 1, 1, 0]}, 19),
    ((1, 2, 6, 5, 6), {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2], "ceil_mode": 1}, 19),
    *((xs, attrs, 19) for xs, attrs in LARGE_WINDOW_CASES),
]


@pytest.mark.parametrize("impl", impls_of("AveragePool"), ids=by_name)
@pytest.mark.parametrize("case", range(len(AVGPOOL_CASES)))
@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16], ids=str)
def test_averagepool(impl, case, count_include_pad, dtype):
    xs, attrs, opset = AVGPOOL_CASES[case]
    attrs = {**attrs, "count_include_pad": count_include_pad}
    x = rand(*xs, dtype=dtype)
    compare("AveragePool", impl, [x], attrs, opset=opset)
    assert_someone_supports("AveragePool", [x], attrs, opset=opset)


@pytest.mark.parametrize("op", ["AveragePool", "MaxPool"])
def test_a_huge_window_costs_neither_time_nor_memory(op):
    """EfficientNet's pooler as transformers writes it: a 1280x1280 window, ceil_mode, over a
    1280x7x7 map (one output per channel). Per offset that is 1.6 million offsets over an 8 GB
    padded input; in closed form it is the channel mean / max, computed in a few MB."""
    import tracemalloc

    x = rand(1, 1280, 7, 7)
    attrs = {"kernel_shape": [1280, 1280], "strides": [1280, 1280], "ceil_mode": 1}
    node, _ = make_node(op, [x], attrs, opset=19)
    expected = (x.mean(axis=(2, 3), keepdims=True) if op == "AveragePool"
                else x.max(axis=(2, 3), keepdims=True))
    for impl in impls_of(op):
        tracemalloc.start()
        try:
            y = run_checked(impl, node, [x], 1)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        if y is None:
            continue
        np.testing.assert_allclose(y[0], expected, rtol=1e-5, atol=1e-6, err_msg=impl.name)
        assert peak < 64 * 2**20, f"{impl.name} allocated {peak / 2**20:.0f} MB"


# -- global pooling --------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 5)], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16], ids=str)
def test_global_pool(op, shape, dtype):
    x = rand(*shape, dtype=dtype)
    expected = None
    if op == "GlobalMaxPool" and len(shape) != 4:  # the reference reduces the wrong axes
        expected = [x.max(axis=tuple(range(2, x.ndim)), keepdims=True)]
    for impl in impls_of(op):
        compare(op, impl, [x], {}, expected=expected)


# -- BatchNormalization ----------------------------------------------------------------------


def _bn_inputs(x_shape, dtype=np.float32, param_dtype=None):
    c = x_shape[1]
    pd = param_dtype or dtype
    return [
        rand(*x_shape, dtype=dtype),
        rand(c, dtype=pd),
        rand(c, dtype=pd),
        rand(c, dtype=pd),
        (np.abs(rand(c)) + 0.2).astype(pd),
    ]


BN_CASES = [
    # (x shape, attrs, dtype, param dtype, const params, opset, n_outputs)
    ((2, 3, 4, 5), {}, np.float32, None, (), 15, 1),
    ((2, 3, 4, 5), {"epsilon": 1e-2}, np.float32, None, (1, 2, 3, 4), 15, 1),
    ((2, 3, 4, 5), {"epsilon": 1e-3, "training_mode": 0}, np.float64, None, (), 14, 1),
    ((3, 4), {}, np.float32, None, (1, 2, 3, 4), 15, 1),
    ((2, 4, 7), {"momentum": 0.7}, np.float64, None, (), 15, 1),
    ((1, 3, 2, 3, 4), {}, np.float32, None, (), 15, 1),
    ((2, 3, 4, 5), {}, np.float16, np.float32, (), 15, 1),
    ((2, 3, 4, 5), {}, np.float16, None, (1, 2, 3, 4), 15, 1),
]


@pytest.mark.parametrize("impl", impls_of("BatchNormalization"), ids=by_name)
@pytest.mark.parametrize("case", range(len(BN_CASES)))
def test_batchnorm(impl, case):
    xs, attrs, dtype, pdtype, const, opset, n_out = BN_CASES[case]
    inputs = _bn_inputs(xs, dtype, pdtype)
    compare("BatchNormalization", impl, inputs, attrs, opset=opset, const=const, n_outputs=n_out)


@pytest.mark.parametrize("impl", impls_of("BatchNormalization"), ids=by_name)
def test_batchnorm_inference_outputs_running_stats(impl):
    """training_mode=0 with three outputs: Y, and the running statistics unchanged."""
    inputs = _bn_inputs((2, 3, 4, 5))
    _, proto = make_node("BatchNormalization", inputs, {"training_mode": 0})
    expected = reference_outputs(proto, inputs, 15)
    outs = compare("BatchNormalization", impl, inputs, {"training_mode": 0}, opset=15,
                   n_outputs=3, check=(0,), expected=expected)
    np.testing.assert_array_equal(outs[1], inputs[3])
    np.testing.assert_array_equal(outs[2], inputs[4])


@pytest.mark.parametrize("impl", impls_of("BatchNormalization"), ids=by_name)
@pytest.mark.parametrize("opset", [7, 9])
@pytest.mark.parametrize("const", [(), (1, 2, 3, 4)])
def test_batchnorm_old_opsets(impl, opset, const):
    """Before opset 14 the evaluator runs training mode: compare with opset 15 inference."""
    inputs = _bn_inputs((2, 3, 5, 4))
    _, proto15 = make_node("BatchNormalization", inputs, {"epsilon": 1e-3})
    expected = reference_outputs(proto15, inputs, 15)
    attrs = {"epsilon": 1e-3, **({"spatial": 1} if opset < 9 else {})}
    compare("BatchNormalization", impl, inputs, attrs, opset=opset, const=const, expected=expected)


@pytest.mark.parametrize("impl", impls_of("BatchNormalization"), ids=by_name)
def test_batchnorm_opset7_per_activation(impl):
    """spatial=0: scale, bias, mean and var hold one value per (C, D1, ...) activation."""
    x = rand(2, 3, 4, 5)
    scale, bias, mean = rand(3, 4, 5), rand(3, 4, 5), rand(3, 4, 5)
    var = np.abs(rand(3, 4, 5)) + 0.2
    eps = 1e-4
    expected = [(x - mean) / np.sqrt(var + eps) * scale + bias]
    compare("BatchNormalization", impl, [x, scale, bias, mean, var],
            {"spatial": 0, "epsilon": eps}, opset=7, expected=expected)


# -- LRN -------------------------------------------------------------------------------------


def _lrn_direct(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """The ONNX formula, summing squares channel by channel."""
    c = x.shape[1]
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    xd = x.astype(np.float64)
    square_sum = np.zeros_like(xd)
    for ch in range(c):
        square_sum[:, ch] = (xd[:, max(0, ch - lo) : min(c, ch + hi + 1)] ** 2).sum(axis=1)
    return (xd / (bias + alpha / size * square_sum) ** beta).astype(x.dtype)


LRN_CASES = [
    # (x shape, attrs, dtype) -- N == C so that the reference is right
    ((3, 3, 4, 5), {"size": 3}, np.float32),
    ((5, 5, 3, 3), {"size": 5, "alpha": 0.01, "beta": 0.6, "bias": 2.0}, np.float32),
    ((4, 4, 3, 2), {"size": 2, "alpha": 0.2}, np.float64),
    ((6, 6, 2, 2), {"size": 4, "alpha": 0.1, "beta": 1.0}, np.float64),
    ((3, 3, 4, 4), {"size": 3, "alpha": 0.05}, np.float16),
]


@pytest.mark.parametrize("impl", impls_of("LRN"), ids=by_name)
@pytest.mark.parametrize("case", range(len(LRN_CASES)))
def test_lrn(impl, case):
    xs, attrs, dtype = LRN_CASES[case]
    compare("LRN", impl, [rand(*xs, dtype=dtype, scale=3.0)], attrs, opset=13)


@pytest.mark.parametrize("impl", impls_of("LRN"), ids=by_name)
@pytest.mark.parametrize("shape", [(2, 7, 3, 3), (1, 5, 4), (2, 6, 2, 2, 2)], ids=str)
@pytest.mark.parametrize("size", [1, 3, 4, 9])
def test_lrn_direct(impl, shape, size):
    x = rand(*shape, scale=2.0)
    attrs = {"size": size, "alpha": 0.3, "beta": 0.75, "bias": 1.5}
    expected = [_lrn_direct(x, size, 0.3, 0.75, 1.5)]
    compare("LRN", impl, [x], attrs, opset=7, expected=expected)


# -- LayerNormalization ----------------------------------------------------------------------

LN_CASES = [
    # (x shape, scale/bias shape, has bias, attrs, dtype, n_outputs, const)
    ((2, 3, 5), (5,), True, {}, np.float32, 1, ()),
    ((2, 3, 5), (5,), True, {}, np.float32, 3, (1, 2)),
    ((2, 3, 4, 5), (4, 5), False, {"axis": 2, "epsilon": 1e-3}, np.float32, 2, ()),
    ((2, 3, 4, 5), (3, 4, 5), True, {"axis": -3}, np.float64, 3, ()),
    ((4, 6), (4, 6), True, {"axis": 0}, np.float64, 3, ()),
    ((3, 7), (7,), True, {"axis": 1, "stash_type": 1}, np.float16, 1, ()),
    ((2, 3, 5), (1,), False, {}, np.float32, 1, ()),
]


@pytest.mark.parametrize("impl", impls_of("LayerNormalization"), ids=by_name)
@pytest.mark.parametrize("case", range(len(LN_CASES)))
def test_layernorm(impl, case):
    xs, ps, has_bias, attrs, dtype, n_out, const = LN_CASES[case]
    inputs = [rand(*xs, dtype=dtype, scale=2.0) + 1, rand(*ps, dtype=dtype)]
    if has_bias:
        inputs.append(rand(*ps, dtype=dtype))
    # Mean / InvStdDev have type U, the stash type (float32): float32 tolerances for them
    outs = compare("LayerNormalization", impl, inputs, attrs, opset=17, n_outputs=n_out,
                   const=const, check=(0,))
    if outs is None or n_out == 1:
        return
    _, proto = make_node("LayerNormalization", inputs, attrs, n_outputs=n_out)
    expected = reference_outputs(proto, inputs, 17)
    for k in range(1, n_out):
        assert outs[k].dtype == np.float32
        np.testing.assert_allclose(outs[k], expected[k], **tolerances(np.float32))


# -- Softmax / LogSoftmax --------------------------------------------------------------------

SOFTMAX_SHAPES = [(2, 3, 4, 5), (3, 7), (6,)]


def _axes_for(shape: tuple[int, ...]) -> list[int | None]:
    r = len(shape)
    return [None, *range(-r, r)]


SOFTMAX_CASES = [(s, a) for s in SOFTMAX_SHAPES for a in _axes_for(s)]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("case", range(len(SOFTMAX_CASES)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16], ids=str)
def test_softmax_opset13(op, case, dtype):
    shape, axis = SOFTMAX_CASES[case]
    x = rand(*shape, dtype=dtype, scale=8.0)
    attrs = {} if axis is None else {"axis": axis}
    expected = None
    if dtype == np.float16 and op == "LogSoftmax":
        # the evaluator takes log(softmax) in float16, which underflows to log(0): reference
        # on float32, rounded to float16
        _, proto = make_node(op, [x], attrs, opset=13)
        x32 = x.astype(np.float32)
        expected = [reference_outputs(proto, [x32], 13)[0].astype(np.float16)]
    for impl in impls_of(op):
        compare(op, impl, [x], attrs, opset=13, expected=expected)


def _coerced_reference(op: str, x: np.ndarray, axis: int) -> np.ndarray:
    """Before opset 13: flatten to 2-D at ``axis`` and normalise each row (opset-13
    reference on the 2-D view)."""
    ax = axis + x.ndim if axis < 0 else axis
    x2 = x.reshape(int(np.prod(x.shape[:ax])), -1)
    _, proto = make_node(op, [x2], {"axis": 1})
    return reference_outputs(proto, [x2], 13)[0].reshape(x.shape)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [1, 11])
@pytest.mark.parametrize("case", range(len(SOFTMAX_CASES)))
def test_softmax_coerced(op, opset, case):
    shape, axis = SOFTMAX_CASES[case]
    if axis is not None and (axis < 0 and opset < 11):
        return  # negative axes arrive with opset 11
    x = rand(*shape, scale=8.0)
    attrs = {} if axis is None else {"axis": axis}
    expected = [_coerced_reference(op, x, 1 if axis is None else axis)]
    for impl in impls_of(op):
        compare(op, impl, [x], attrs, opset=opset, expected=expected)


def test_softmax_opsets_differ():
    """The same node means different things before and from opset 13."""
    x = rand(2, 3, 4)
    impl = impls_of("Softmax")[0]
    y11 = run_impl(impl, make_node("Softmax", [x], {"axis": 1}, opset=11)[0], [x])[0]
    y13 = run_impl(impl, make_node("Softmax", [x], {"axis": 1}, opset=13)[0], [x])[0]
    np.testing.assert_allclose(y11.reshape(2, 12).sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(y13.sum(axis=1), 1.0, rtol=1e-5)
    assert not np.allclose(y11, y13)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_is_numerically_stable(op):
    x = np.array([[1000.0, 1001.0, -np.inf, 999.0], [-1e4, -1e4, -1e4, -1e4]], dtype=np.float32)
    fn = scipy.special.softmax if op == "Softmax" else scipy.special.log_softmax
    expected = [fn(x.astype(np.float64), axis=-1).astype(np.float32)]
    for impl in impls_of(op):
        compare(op, impl, [x], {"axis": -1}, opset=13, expected=expected)
        y = run_impl(impl, make_node(op, [x], {"axis": -1}, opset=13)[0], [x])[0]
        assert not np.isnan(y).any()


# -- supports() rejections -------------------------------------------------------------------


def _rejection_cases() -> list[tuple[str, str, list, dict, int, int, str]]:
    """(op, impl name, inputs, attrs, opset, n_outputs, expected words in the reason)."""
    f = np.float32
    x4, w3 = np.zeros((1, 4, 6, 6), f), np.zeros((2, 4, 3, 3), f)
    return [
        ("Conv", "Conv.numpy.im2col", [x4, np.zeros((2, 3, 3, 3), f)], {}, 21, 1, "channels"),
        ("Conv", "Conv.numpy.direct", [x4, w3], {"group": 3}, 21, 1, "divisible"),
        ("Conv", "Conv.numpy.im2col", [x4.astype(np.int32), w3.astype(np.int32)], {}, 21, 1, "int32"),
        ("Conv", "Conv.numpy.im2col", [x4, w3], {"auto_pad": "SAME"}, 21, 1, "auto_pad"),
        ("Conv", "Conv.numpy.direct", [x4, w3], {"strides": [1, 1, 1]}, 21, 1, "strides"),
        ("Conv", "Conv.numpy.im2col", [x4, w3], {"kernel_shape": [2, 2]}, 21, 1, "kernel_shape"),
        ("Conv", "Conv.numpy.winograd", [x4, np.zeros((2, 4, 5, 5), f)], {}, 21, 1, "5x5"),
        ("Conv", "Conv.numpy.winograd", [x4, w3], {"strides": [2, 2]}, 21, 1, "stride"),
        ("Gemm", "Gemm.numpy.matmul", [np.zeros((2, 3, 4), f), np.zeros((4, 5), f)], {}, 13, 1, "2-D"),
        ("Gemm", "Gemm.numpy.einsum", [np.zeros((3, 4), f), np.zeros((3, 5), f)], {}, 13, 1, "inner"),
        ("Gemm", "Gemm.numpy.matmul", [np.zeros((3, 4), np.int32), np.zeros((4, 5), np.int32)], {}, 7, 1,
         "int32"),
        ("MatMul", "MatMul.numpy.tensordot", [np.zeros((2, 3, 4), f), np.zeros((2, 4, 5), f)], {}, 13, 1,
         "rank"),
        ("MatMul", "MatMul.numpy.matmul", [np.zeros((3, 4), f), np.zeros((5, 6), f)], {}, 13, 1, "inner"),
        ("MaxPool", "MaxPool.numpy.reduce", [x4], {"kernel_shape": [2, 2]}, 21, 2, "Indices"),
        ("MaxPool", "MaxPool.numpy.offsets", [x4.astype(np.int8)], {"kernel_shape": [2, 2]}, 11, 1, "int8"),
        ("MaxPool", "MaxPool.numpy.offsets", [x4], {}, 21, 1, "kernel_shape"),
        ("MaxPool", "MaxPool.numpy.offsets", [x4], {"kernel_shape": [2, 2], "storage_order": 2}, 21, 2,
         "storage_order"),
        ("AveragePool", "AveragePool.numpy.offsets", [x4], {"kernel_shape": [2, 2], "pads": [1, 1]}, 21, 1,
         "pads"),
        ("GlobalAveragePool", "GlobalAveragePool.numpy.mean", [np.zeros((2, 3), f)], {}, 21, 1, "rank"),
        ("BatchNormalization", "BatchNormalization.numpy.affine", _bn_inputs((2, 3, 4)), {"training_mode": 1},
         15, 3, "training_mode"),
        ("BatchNormalization", "BatchNormalization.numpy.affine", _bn_inputs((2, 3, 4)), {}, 9, 5,
         "training"),
        ("LRN", "LRN.numpy.window", [x4], {}, 13, 1, "size"),
        ("LayerNormalization", "LayerNormalization.numpy.twopass", [x4, np.ones(6, f)], {"stash_type": 7},
         17, 1, "stash_type"),
        ("LayerNormalization", "LayerNormalization.numpy.twopass", [x4, np.ones(6, f)], {"axis": 4}, 17, 1,
         "axis"),
        ("Softmax", "Softmax.numpy.stable", [x4], {"axis": 4}, 13, 1, "axis"),
        ("LogSoftmax", "LogSoftmax.numpy.stable", [x4.astype(np.int64)], {}, 13, 1, "int64"),
    ]


@pytest.mark.parametrize("case", _rejection_cases(), ids=lambda c: f"{c[1]}-{c[6]}")
def test_supports_rejections_are_reasons(case):
    op, name, inputs, attrs, opset, n_out, words = case
    impl = next((i for i in impls_of(op) if i.name == name), None)
    if impl is None:
        pytest.skip(f"{name} is not registered")
    node, _ = make_node(op, inputs, attrs, opset=opset, n_outputs=n_out)
    reason = impl.supports(node)
    assert isinstance(reason, str) and reason
    assert words.lower() in reason.lower(), reason


def test_winograd_rejection_names_the_kernel():
    x, w = np.zeros((1, 2, 8, 8), np.float32), np.zeros((2, 2, 5, 5), np.float32)
    node, _ = make_node("Conv", [x, w])
    for impl in impls_of("Conv"):
        if impl.name == "Conv.numpy.winograd":
            assert "received kernel 5x5" in impl.supports(node)
