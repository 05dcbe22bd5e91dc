"""Native pooling (MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool) in every layout
against the numpy reference: odd channel counts (padding inside the block), strides, pads,
dilations, auto_pad, ceil_mode, count_include_pad, batches, 1x1 spatial extents,
non-contiguous inputs; supports() reasons; C++ validation."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from impls.native._module import native
from impls.native.layouts import BLOCKS
from impls.native.pool import LAYOUTS
from tests.native.support import native_impls, registry, run_in_layouts
from tests.support import make_node

#: The numpy implementation each op is checked against.
REFERENCE = {
    "MaxPool": "MaxPool.numpy.offsets",
    "AveragePool": "AveragePool.numpy.offsets",
    "GlobalAveragePool": "GlobalAveragePool.numpy.mean",
    "GlobalMaxPool": "GlobalMaxPool.numpy.max",
}
WINDOW_OPS = ("MaxPool", "AveragePool")
GLOBAL_OPS = ("GlobalAveragePool", "GlobalMaxPool")


def reference_case(op: str, x: np.ndarray, attrs: dict | None = None):
    """The node (output value with the reference's shape and dtype) and the numpy reference
    output. (onnx's ReferenceEvaluator mishandles some pads / dilations of its pooling ops, so
    the project's numpy backend is the reference here.)"""
    node, _ = make_node(op, [x], attrs)
    y = registry().impl(REFERENCE[op]).build(node)(x)
    node, _ = make_node(op, [x], attrs, output_shapes=[y.shape], output_dtypes=[y.dtype])
    return node, y


def _layout_of(impl) -> str:
    return impl.name.rsplit(".", 1)[-1]


def _check_all(op: str, node, x: np.ndarray, ref: np.ndarray) -> None:
    """Every native implementation of ``op`` supports ``node`` and matches ``ref``; blocked
    outputs keep their padding channels zero."""
    impls = native_impls(op)
    assert {_layout_of(i) for i in impls} == set(LAYOUTS)
    for impl in impls:
        (y,) = run_in_layouts(impl, node, [x])
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5, err_msg=impl.name)
        block = BLOCKS.get(_layout_of(impl))
        tail = x.shape[1] % block if block else 0
        if tail:
            raw = impl.build(node)(native().nchw_to_blocked(x, block))
            assert np.all(raw[:, -1, ..., tail:] == 0), f"{impl.name} wrote the padding channels"


@st.composite
def window_cases(draw):
    """(op, x, attrs) of a 2-D MaxPool / AveragePool with a non-empty output."""
    op = draw(st.sampled_from(WINDOW_OPS))
    n = draw(st.integers(1, 3))
    c = draw(st.sampled_from([1, 3, 5, 7, 8, 9, 13, 16, 17, 24, 31, 33]))
    k = [draw(st.integers(1, 4)), draw(st.integers(1, 4))]
    strides = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    dil = [draw(st.sampled_from([1, 1, 2])), draw(st.sampled_from([1, 1, 2]))]
    ext = [(k[i] - 1) * dil[i] + 1 for i in range(2)]
    # the input at least as large as the dilated window: every auto_pad mode has an output
    h = draw(st.integers(ext[0], ext[0] + 8))
    w = draw(st.integers(ext[1], ext[1] + 8))
    attrs: dict = {"kernel_shape": k, "strides": strides, "dilations": dil}
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if auto_pad == "NOTSET":
        attrs["pads"] = [draw(st.integers(0, ext[i % 2] - 1)) for i in range(4)]
        attrs["ceil_mode"] = draw(st.integers(0, 1))
    else:
        attrs["auto_pad"] = auto_pad
    if op == "AveragePool":
        attrs["count_include_pad"] = draw(st.integers(0, 1))
    if draw(st.booleans()):  # 1x1 spatial extent
        h = w = 1
        attrs = {"kernel_shape": [1, 1], "strides": strides}
    seed = draw(st.integers(0, 2**16))
    x = np.random.default_rng(seed).standard_normal((n, c, h, w)).astype(np.float32)
    return op, x, attrs


@settings(max_examples=40, deadline=None)
@given(data=window_cases())
def test_window_pool_every_layout_matches_numpy(data):
    op, x, attrs = data
    node, ref = reference_case(op, x, attrs)
    _check_all(op, node, x, ref)


EDGE_CASES = [
    # (op, X shape, attrs)
    # ceil_mode: a window longer than the padded input by less than a stride (one output)
    ("AveragePool", (1, 15, 1, 8), {"kernel_shape": [3, 3], "strides": [2, 3], "pads": [1, 1, 0, 0],
                                    "ceil_mode": 1, "count_include_pad": 1}),
    ("MaxPool", (2, 17, 1, 1), {"kernel_shape": [1, 3], "strides": [2, 3], "dilations": [2, 1],
                                "pads": [0, 1, 0, 0], "ceil_mode": 1}),
    # ceil_mode windows past the end padding: the divisor never counts those cells
    ("AveragePool", (1, 9, 6, 6), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                   "ceil_mode": 1, "count_include_pad": 1}),
    ("AveragePool", (2, 20, 5, 7), {"kernel_shape": [2, 3], "strides": [2, 2], "pads": [0, 1, 0, 1],
                                    "ceil_mode": 1}),
    # the networks' shapes: stride-2 3x3 with asymmetric padding, the 7x7 head
    ("MaxPool", (1, 24, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 1, 1]}),
    ("AveragePool", (2, 33, 7, 7), {"kernel_shape": [7, 7], "pads": [0, 0, 1, 1]}),
    ("AveragePool", (1, 16, 7, 7), {"kernel_shape": [7, 7]}),
    # windows that see only padding (dilation skips the single row): -inf / NaN like numpy
    ("MaxPool", (1, 5, 1, 3), {"kernel_shape": [2, 1], "dilations": [2, 1], "pads": [1, 0, 1, 0]}),
    ("AveragePool", (1, 5, 1, 3), {"kernel_shape": [2, 1], "dilations": [2, 1], "pads": [1, 0, 1, 0]}),
    # strides larger than the kernel, long rows
    ("MaxPool", (1, 3, 4, 40), {"kernel_shape": [1, 2], "strides": [3, 5]}),
    ("AveragePool", (3, 1, 5, 5), {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER", "count_include_pad": 1}),
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's 0 / 0 of an all-padding window
@pytest.mark.parametrize(("op", "shape", "attrs"), EDGE_CASES)
def test_edge_geometries(op, shape, attrs):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    node, ref = reference_case(op, x, attrs)
    _check_all(op, node, x, ref)


@st.composite
def global_cases(draw):
    n = draw(st.integers(1, 3))
    c = draw(st.integers(1, 40))
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    if draw(st.booleans()):
        h = w = 1
    seed = draw(st.integers(0, 2**16))
    x = np.random.default_rng(seed).standard_normal((n, c, h, w)).astype(np.float32)
    return draw(st.sampled_from(GLOBAL_OPS)), x


@settings(max_examples=40, deadline=None)
@given(data=global_cases())
def test_global_pool_every_layout_matches_numpy(data):
    op, x = data
    node, ref = reference_case(op, x)
    _check_all(op, node, x, ref)


@pytest.mark.parametrize("op", GLOBAL_OPS)
@pytest.mark.parametrize("shape", [(2, 3, 7), (1, 5, 2, 3, 4), (2, 4, 1)])
def test_global_pool_std_takes_any_rank(op, shape):
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    node, ref = reference_case(op, x)
    impls = {_layout_of(i): i for i in native_impls(op)}
    (y,) = run_in_layouts(impls["std"], node, [x])
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    for lay in ("nhwc", *BLOCKS):
        assert "rank-4" in (impls[lay].supports(node) or ""), lay


@pytest.mark.parametrize("op", WINDOW_OPS + GLOBAL_OPS)
def test_kernels_accept_non_contiguous_inputs(op):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 19, 7, 9)).astype(np.float32)
    attrs = None if op in GLOBAL_OPS else {"kernel_shape": [3, 2], "strides": [2, 2],
                                            "pads": [1, 0, 1, 1], "ceil_mode": 1}
    node, ref = reference_case(op, x, attrs)
    reg = registry()
    for impl in native_impls(op):
        lay = _layout_of(impl)
        phys = x
        for conv in reg.layouts.path("std", lay, x.shape, x.dtype):
            phys = conv(phys, x.shape)
        view = np.repeat(phys, 2, axis=-1)[..., ::2]  # the same values, strided
        assert not view.flags.c_contiguous
        y = impl.build(node)(view)
        for conv in reg.layouts.path(lay, "std", ref.shape, ref.dtype):
            y = conv(y, ref.shape)
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5, err_msg=impl.name)


# -- supports() ------------------------------------------------------------------------------


def _reasons(op: str, inputs: Sequence[np.ndarray], attrs: dict | None = None, **kw) -> list[str]:
    node, _ = make_node(op, inputs, attrs, **kw)
    return [impl.supports(node) or "" for impl in native_impls(op)]


def test_supports_rejects_what_the_kernels_do_not_cover():
    x4 = np.zeros((1, 3, 5, 5), np.float32)
    k = {"kernel_shape": [2, 2]}
    cases = [
        ("MaxPool", [np.zeros((1, 3, 5, 5, 5), np.float32)], {"kernel_shape": [2, 2, 2]}, {}, "2-D"),
        ("AveragePool", [np.zeros((1, 3, 5), np.float32)], {"kernel_shape": [2]}, {}, "2-D"),
        ("MaxPool", [x4], k, {"n_outputs": 2}, "Indices"),
        ("MaxPool", [x4], {**k, "storage_order": 2}, {}, "storage_order"),
        ("MaxPool", [x4.astype(np.float64)], k, {}, "float32"),
        ("AveragePool", [x4.astype(np.float16)], k, {}, "float32"),
        ("MaxPool", [x4], {}, {}, "kernel_shape"),
        ("MaxPool", [x4], {"kernel_shape": [2, 2], "strides": [0, 1]}, {}, "strides"),
        ("MaxPool", [x4], {"kernel_shape": [2, 2], "pads": [1, 1]}, {}, "pads"),
        ("AveragePool", [x4], {"kernel_shape": [7, 2]}, {}, "output would be"),
        ("MaxPool", [x4], {**k, "auto_pad": "FOO"}, {}, "auto_pad"),
        ("GlobalMaxPool", [np.zeros((2, 3), np.float32)], None, {}, "rank"),
        ("GlobalAveragePool", [x4.astype(np.float64)], None, {}, "float32"),
        ("GlobalAveragePool", [np.zeros((1, 3, 0, 2), np.float32)], None, {}, "non-empty"),
    ]
    for op, inputs, attrs, kw, words in cases:
        for reason in _reasons(op, inputs, attrs, **kw):
            assert words in reason, (op, attrs, reason)


def test_maxpool_storage_order_without_indices_is_supported():
    x = np.random.default_rng(4).standard_normal((1, 9, 5, 5)).astype(np.float32)
    node, ref = reference_case("MaxPool", x, {"kernel_shape": [3, 3], "storage_order": 1})
    _check_all("MaxPool", node, x, ref)


# -- C++ validation --------------------------------------------------------------------------


def test_bindings_validate_in_cpp():
    m = native()
    x = np.zeros((1, 3, 5, 5), np.float32)
    xb = np.zeros((1, 1, 5, 5, 8), np.float32)
    win = {"kernel": [2, 2], "strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0]}
    assert m.pool2d(x, "std", "max", **win).shape == (1, 3, 4, 4)
    assert m.pool2d(xb, "nchw8c", "avg", **win, channels=3).shape == (1, 1, 4, 4, 8)
    bad = [
        (lambda: m.pool2d(x.astype(np.float64), "std", "max", **win), "float32"),
        (lambda: m.pool2d(x[0], "std", "max", **win), "rank-4"),
        (lambda: m.pool2d(xb, "nchw8c", "max", **win), "logical channel count"),
        (lambda: m.pool2d(xb, "nchw8c", "max", **win, channels=9), "physical shape"),
        (lambda: m.pool2d(xb, "nchw16c", "max", **win, channels=3), "physical shape"),
        (lambda: m.pool2d(x, "std", "max", **win, channels=4), "4 channels"),
        (lambda: m.pool2d(np.zeros((1, 3, 5, 10), np.float32)[..., ::2], "std", "max", **win),
         "C-contiguous"),
        (lambda: m.pool2d(x, "nchw4c", "max", **win), "known: std"),
        (lambda: m.pool2d(x, "std", "min", **win), "known: max, avg"),
        (lambda: m.pool2d(x, "std", "max", **{**win, "kernel": [2]}), "kernel needs 2"),
        (lambda: m.pool2d(x, "std", "max", **{**win, "pads": [0, 0]}), "pads"),
        (lambda: m.pool2d(x, "std", "max", **{**win, "strides": [0, 1]}), "stride"),
        (lambda: m.pool2d(x, "std", "max", **{**win, "dilations": [1, -1]}), "dilation"),
        (lambda: m.pool2d(x, "std", "max", **{**win, "pads": [0, -1, 0, 0]}), "leading pad"),
        (lambda: m.pool2d(x, "std", "max", **{**win, "kernel": [0, 1]}), "kernel size"),
        (lambda: m.pool2d(x, "std", "max", **{**win, "kernel": [9, 1]}), "output would be empty"),
        (lambda: m.pool2d(np.zeros((1, 3, 0, 5), np.float32), "std", "max", **win), "empty"),
        (lambda: m.global_pool(np.zeros((2, 3), np.float32), "std", "avg"), "rank >= 3"),
        (lambda: m.global_pool(x.astype(np.int32), "std", "avg"), "float32"),
        (lambda: m.global_pool(x, "nhwc", "avg", 4), "4 channels"),
        (lambda: m.global_pool(np.zeros((1, 3, 0, 5), np.float32), "std", "max"), "non-empty"),
        (lambda: m.global_pool(xb, "nchw8c", "max"), "logical channel count"),
        (lambda: m.global_pool(xb, "nchw8c", "sum", 3), "known: max, avg"),
    ]
    for fn, words in bad:
        with pytest.raises(ValueError, match=words):
            fn()
