"""Native Concat against the numpy reference: the standard layout on every axis and dtype, the
channel Concat in nhwc / nchw8c / nchw16c with odd channel counts (re-packing across blocks),
batches, 1x1 spatial extents, non-contiguous inputs; supports() reasons; C++ validation.
Plans: pooling, BatchNormalization and Concat keep a network in a native layout between its
convolutions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch import Session
from impls.native._module import native
from impls.native.concat import CHANNEL_LAYOUTS
from impls.native.layouts import BLOCKS
from tests.builders import ModelBuilder
from tests.native.support import native_impls, registry, run_in_layouts
from tests.support import make_node

OP = "Concat"
REFERENCE = "Concat.numpy.concatenate"


def reference_case(inputs, axis: int):
    """The node (output with the reference's shape and dtype) and the numpy reference."""
    attrs = {"axis": axis}
    node, _ = make_node(OP, inputs, attrs)
    y = registry().impl(REFERENCE).build(node)(*inputs)
    node, _ = make_node(OP, inputs, attrs, output_shapes=[y.shape], output_dtypes=[y.dtype])
    return node, y


def _layout_of(impl) -> str:
    return impl.name.rsplit(".", 1)[-1]


def _impls() -> dict[str, object]:
    return {_layout_of(i): i for i in native_impls(OP)}


@st.composite
def channel_cases(draw):
    """Rank-4 float32 inputs of one (N, H, W), odd and even channel counts (0 now and then)."""
    n = draw(st.integers(1, 3))
    h, w = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    if draw(st.booleans()):
        h = w = 1
    k = draw(st.integers(1, 4))
    counts = draw(st.lists(st.sampled_from([0, 1, 3, 5, 7, 8, 9, 12, 16, 17, 24, 31, 32, 33]),
                           min_size=k, max_size=k))
    if sum(counts) == 0:
        counts[0] = 5
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    xs = [rng.standard_normal((n, c, h, w)).astype(np.float32) for c in counts]
    return xs, draw(st.sampled_from([1, -3]))


@settings(max_examples=40, deadline=None)
@given(data=channel_cases())
def test_channel_concat_every_layout_matches_numpy(data):
    xs, axis = data
    node, ref = reference_case(xs, axis)
    impls = _impls()
    assert set(impls) == {"std", *CHANNEL_LAYOUTS}
    total = ref.shape[1]
    for lay, impl in impls.items():
        (y,) = run_in_layouts(impl, node, xs)
        np.testing.assert_array_equal(y, ref, err_msg=impl.name)
        block = BLOCKS.get(lay)
        if block and total % block:
            raw = impl.build(node)(*(native().nchw_to_blocked(x, block) for x in xs))
            assert np.all(raw[:, -1, ..., total % block:] == 0), f"{impl.name} wrote the padding"


DTYPES = [np.float32, np.float16, np.float64, np.int64, np.int32, np.int8, np.uint8, np.bool_]


@st.composite
def std_cases(draw):
    """Inputs of any rank (1-4) and dtype, concatenated along any axis."""
    rank = draw(st.integers(1, 4))
    shape = [draw(st.integers(1, 4)) for _ in range(rank)]
    axis = draw(st.integers(-rank, rank - 1))
    k = draw(st.integers(1, 4))
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    xs = []
    for _ in range(k):
        s = list(shape)
        s[axis] = draw(st.integers(0, 5))
        xs.append((rng.standard_normal(s) * 50).astype(dtype))
    return xs, axis


@settings(max_examples=40, deadline=None)
@given(data=std_cases())
def test_std_concat_any_axis_and_dtype(data):
    xs, axis = data
    node, ref = reference_case(xs, axis)
    impls = _impls()
    (y,) = run_in_layouts(impls["std"], node, xs)
    assert y.dtype == ref.dtype and y.flags.c_contiguous
    np.testing.assert_array_equal(y, ref)
    channel = xs[0].ndim == 4 and axis in (1, -3) and xs[0].dtype == np.float32
    for lay in CHANNEL_LAYOUTS:
        assert (impls[lay].supports(node) is None) == channel, (lay, impls[lay].supports(node))


def test_kernels_accept_non_contiguous_inputs():
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((2, c, 3, 5)).astype(np.float32) for c in (5, 16, 11)]
    node, ref = reference_case(xs, 1)
    reg = registry()
    for lay, impl in _impls().items():
        args = []
        for x in xs:
            for conv in reg.layouts.path("std", lay, x.shape, x.dtype):
                x = conv(x, x.shape)
            view = np.repeat(x, 2, axis=-1)[..., ::2]
            assert not view.flags.c_contiguous
            args.append(view)
        y = impl.build(node)(*args)
        for conv in reg.layouts.path(lay, "std", ref.shape, ref.dtype):
            y = conv(y, ref.shape)
        np.testing.assert_array_equal(y, ref, err_msg=impl.name)


def test_supports_gives_reasons():
    f = np.zeros((1, 3, 2, 2), np.float32)
    cases = [
        ([f, f.astype(np.float64)], 1, {"std": "one dtype", "*": "float32"}),
        ([np.array(["a"], dtype=object)] * 2, 0, {"std": "fixed-size", "*": "float32"}),
        ([f, f], 4, {"std": "out of range", "*": "channel axis"}),
        ([f, f], 2, {"*": "channel axis"}),
        ([f[0], f[0]], 0, {"*": "rank-4"}),
        ([f, np.zeros((1, 3, 2, 3), np.float32)], 1, {"*": "N, H and W"}),
        ([f, np.zeros((1, 3, 2), np.float32)], 1, {"std": "one rank", "*": "rank-4"}),
    ]
    for inputs, axis, expected in cases:
        node, _ = make_node(OP, inputs, {"axis": axis})
        for lay, impl in _impls().items():
            words = expected.get(lay if lay == "std" else "*")
            reason = impl.supports(node)
            if words is None:
                assert reason is None, (lay, reason)
            else:
                assert words in (reason or ""), (lay, axis, reason)
    node, _ = make_node(OP, [f, None], {"axis": 1})
    assert all("non-omitted" in (i.supports(node) or "") for i in native_impls(OP))
    node, _ = make_node(OP, [f, f])
    assert all("axis attribute" in (i.supports(node) or "") for i in native_impls(OP))


def test_bindings_validate_in_cpp():
    m = native()
    a = np.zeros((2, 3), np.float32)
    xb = np.zeros((1, 1, 2, 2, 8), np.float32)
    assert m.concat([a, a], -1).shape == (2, 6)
    assert m.concat([np.array(["ab"]), np.array(["cd", "ef"])], 0).tolist() == ["ab", "cd", "ef"]
    assert m.concat_channels([xb, xb], "nchw8c", [3, 5]).shape == (1, 1, 2, 2, 8)
    bad = [
        (lambda: m.concat([], 0), "at least one"),
        (lambda: m.concat([a, a], 2), "out of range"),
        (lambda: m.concat([np.array(1.0, np.float32)] * 2, 0), "rank >= 1"),
        (lambda: m.concat([a, a.astype(np.float64)], 0), "one dtype"),
        (lambda: m.concat([a, np.zeros((2, 4), np.float32)], 0), "match except along axis 0"),
        (lambda: m.concat([a, np.zeros((2,), np.float32)], 0), "match except"),
        (lambda: m.concat([a, np.zeros((2, 6), np.float32)[:, ::2]], 0), "C-contiguous"),
        (lambda: m.concat([np.array([None]), np.array([None])], 0), "object"),
        (lambda: m.concat_channels([], "nhwc", []), "at least one"),
        (lambda: m.concat_channels([xb], "nchw4c", [3]), "known: nhwc"),
        (lambda: m.concat_channels([xb, xb], "nchw8c", [3]), "one channel count per input"),
        (lambda: m.concat_channels([xb], "nchw8c", [-1]), "negative"),
        (lambda: m.concat_channels([xb], "nchw8c", [9]), "physical shape"),
        (lambda: m.concat_channels([xb], "nchw16c", [3]), "physical shape"),
        (lambda: m.concat_channels([xb.astype(np.float64)], "nchw8c", [3]), "float32"),
        (lambda: m.concat_channels([xb[0]], "nchw8c", [3]), "rank-5"),
        (lambda: m.concat_channels([np.zeros((1, 2, 2, 3), np.float32), np.zeros((1, 2, 3, 3),
                                                                                  np.float32)],
                                   "nhwc", [3, 3]), "input 1 must have physical shape"),
    ]
    for fn, words in bad:
        with pytest.raises(ValueError, match=words):
            fn()


# -- plans -----------------------------------------------------------------------------------


def _blocky_cnn(seed: int = 0):
    """Conv, Relu, BatchNormalization, MaxPool, two 1x1 branches joined by Concat (12 + 8
    channels: not whole 16-blocks), AveragePool, Conv, GlobalAveragePool, Flatten."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder(17, "blocky")

    def w(*shape):
        return b.const(rng.normal(0, 0.3, shape).astype(np.float32))

    x = b.input("x", [2, 3, 15, 15])
    r = b.op("Relu", [b.op("Conv", [x, w(16, 3, 3, 3)], pads=[1, 1, 1, 1])])
    bn = b.op("BatchNormalization", [r, b.const(rng.uniform(0.5, 1.5, 16).astype(np.float32)),
                                     w(16), w(16), b.const(rng.uniform(0.5, 1.5, 16).astype(np.float32))])
    p = b.op("MaxPool", [bn], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)
    left = b.op("Relu", [b.op("Conv", [p, w(12, 16, 1, 1)])])
    right = b.op("Relu", [b.op("Conv", [p, w(8, 16, 1, 1)])])
    cat = b.op("Concat", [left, right], axis=1)
    avg = b.op("AveragePool", [cat], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=0)
    c = b.op("Conv", [avg, w(9, 20, 1, 1)])
    g = b.op("GlobalAveragePool", [c])
    b.output(b.op("Flatten", [g]))
    return b.build()


POOL_NORM_CONCAT = ("MaxPool", "AveragePool", "GlobalAveragePool", "BatchNormalization", "Concat")


def test_native_first_plan_stays_in_a_native_layout():
    """The untuned plan runs pooling, BatchNormalization and Concat in the blocked layout the
    convolutions produce: the only conversion at run time is the pooled output to the
    standard layout Flatten reads."""
    reg = registry()
    model = _blocky_cnn()
    sess = Session(model, backends=["native", "numpy"], registry=reg, store=False)
    steps = {s.op: s for s in sess.plan.steps if s.op in POOL_NORM_CONCAT}
    assert set(steps) == set(POOL_NORM_CONCAT)
    for op, step in steps.items():
        assert step.backend == "native", (op, step.impl)
        assert step.layouts_in[0] in BLOCKS and step.layouts_out[0] == step.layouts_in[0], step
    runtime = [c for c in sess.plan.conversions if not c.at_build]
    assert len(runtime) == 1 and runtime[0].dst == "std", runtime
    base = Session(model, backends=["numpy"], registry=reg, store=False)
    x = np.random.default_rng(1).standard_normal((2, 3, 15, 15)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], base.run(None, {"x": x})[0],
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layout", ["std", *CHANNEL_LAYOUTS])
def test_forced_layouts_match_numpy(layout):
    reg = registry()
    model = _blocky_cnn(seed=2)
    base = Session(model, backends=["numpy"], registry=reg, store=False)
    over = {n.name: f"{n.op_type}.native.{layout}" for n in base.graph.nodes
            if n.op_type in POOL_NORM_CONCAT}
    assert len(over) == len(POOL_NORM_CONCAT)
    sess = Session(model, backends=["native", "numpy"], registry=reg, overrides=over, store=False)
    assert {s.impl for s in sess.plan.steps} >= set(over.values())
    x = np.random.default_rng(3).standard_normal((2, 3, 15, 15)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], base.run(None, {"x": x})[0],
                               rtol=1e-4, atol=1e-5)
