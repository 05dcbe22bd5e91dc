"""Native blocked-layout convolutions (every Conv implementation and fused pattern) against
the ONNX reference: odd channel counts, strides, dilations, pads and auto_pad, groups and
depthwise, batches, 1x1 outputs, non-contiguous inputs; weight layout round trips; C++
validation; the generic instruction-set path."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch.fusion import fuse
from dispatch.graph import Node, Value
from impls.native._module import native
from impls.native.conv import PATTERNS, WEIGHT_LAYOUTS, weight_layout
from tests.native.support import case, native_impls, registry, run_in_layouts

F32 = np.dtype(np.float32)
KINDS = ("direct", "1x1", "depthwise", "grouped", "first")


def _blocked(op: str) -> list:
    """The native implementations of ``op`` in the blocked layouts (this module's; other
    native Conv layouts are tested in their own files)."""
    return [i for i in native_impls(op) if i.name.split(".")[-1].split("_")[0] in ("nchw8c", "nchw16c")]


CONV_IMPLS = _blocked("Conv")


def _kind(impl) -> str:
    return impl.name.rsplit("_", 1)[-1]


def _tol(x: np.ndarray, w: np.ndarray) -> float:
    k = math.prod(w.shape[1:])
    return 3e-6 * math.sqrt(k) * float(np.abs(x).max(initial=1)) * float(np.abs(w).max(initial=1)) + 1e-5


@st.composite
def conv_cases(draw, mode: str | None = None):
    """(inputs, attrs) of a random 2-D Conv in one of the modes the native variants cover."""
    mode = mode or draw(st.sampled_from(["dense", "1x1", "depthwise", "grouped", "aligned", "first"]))
    n = draw(st.integers(1, 2))
    group = 1
    if mode == "depthwise":
        c = m = group = draw(st.integers(1, 20))
    elif mode == "grouped":
        group = draw(st.integers(2, 4))
        c, m = group * draw(st.integers(1, 5)), group * draw(st.integers(1, 6))
    elif mode == "aligned":
        group = 2
        c, m = 2 * draw(st.sampled_from([8, 16])), 2 * draw(st.sampled_from([8, 16]))
    elif mode == "first":
        c, m = draw(st.integers(1, 4)), draw(st.integers(1, 37))
    else:
        c, m = draw(st.integers(1, 37)), draw(st.integers(1, 37))
    k = (1, 1) if mode == "1x1" else (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    strides = [draw(st.integers(1, 2)), draw(st.integers(1, 3))]
    dil = [1, 1] if mode == "1x1" else [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 14))
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    attrs: dict = {"strides": strides, "dilations": dil, "group": group}
    ext = [(k[i] - 1) * dil[i] + 1 for i in range(2)]
    if auto_pad == "NOTSET":
        pads = [draw(st.integers(0, 2)) for _ in range(4)]
        attrs["pads"] = pads
        span = [h + pads[0] + pads[2], w + pads[1] + pads[3]]
    else:
        attrs["auto_pad"] = auto_pad
        span = [h, w] if auto_pad == "VALID" else [10**6, 10**6]
    if span[0] < ext[0] or span[1] < ext[1]:  # grow the input so the window fits
        h, w = h + max(0, ext[0] - span[0]), w + max(0, ext[1] - span[1])
    if draw(st.booleans()):
        attrs["kernel_shape"] = list(k)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((m, c // group, *k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if draw(st.booleans()) else None
    return [x, wt, b] if b is not None else [x, wt], attrs


def _to_layouts(impl, node, inputs):
    """Standard inputs converted to the physical arrays `impl` consumes."""
    out = []
    for v, a, lay in zip(node.inputs, inputs, impl.input_layouts(node)):
        if a is not None:
            for conv in registry().layouts.path("std", lay, v.shape, F32):
                a = conv(a, v.shape)
        out.append(a)
    return out


def _check(impl, node, inputs, ref):
    (y,) = run_in_layouts(impl, node, inputs)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=_tol(inputs[0], inputs[1]), err_msg=impl.name)


def _conv_case(inputs, attrs):
    return case("Conv", inputs, attrs, const_inputs=(1, 2))


@settings(max_examples=150, deadline=None)
@given(data=conv_cases())
def test_every_supporting_conv_impl_matches_reference(data):
    inputs, attrs = data
    node, ref = _conv_case(inputs, attrs)
    ok = [i for i in CONV_IMPLS if i.supports(node) is None]
    assert ok, f"no native Conv supports {attrs} X {inputs[0].shape} W {inputs[1].shape}"
    for impl in ok:
        _check(impl, node, inputs, ref[0])


@pytest.mark.parametrize("impl", CONV_IMPLS, ids=lambda i: i.name)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_each_conv_impl_on_its_own_cases(impl, data):
    mode = {"direct": "dense", "1x1": "1x1", "depthwise": "depthwise", "grouped": "grouped",
            "first": "first"}[_kind(impl)]
    inputs, attrs = data.draw(conv_cases(mode))
    node, ref = _conv_case(inputs, attrs)
    if impl.supports(node) is not None:  # e.g. grouped drew a depthwise-only case
        inputs, attrs = data.draw(conv_cases("dense"))
        node, ref = _conv_case(inputs, attrs)
    reason = impl.supports(node)
    assert reason is None or _kind(impl) == "grouped", reason
    if reason is None:
        _check(impl, node, inputs, ref[0])


EDGE_CASES = [
    # (X shape, W shape, attrs): 1x1 kernels with pads (border pixels of a one-row output),
    # kernels as large as the padded input, pads larger than the kernel, strides past the
    # input, one output pixel, channels exactly one block, long rows
    ((1, 1, 1, 1), (1, 1, 1, 1), {"pads": [0, 0, 0, 1]}),
    ((1, 3, 1, 5), (5, 3, 1, 1), {"pads": [1, 2, 0, 1], "strides": [1, 2]}),
    ((2, 5, 3, 3), (7, 5, 3, 3), {}),
    ((1, 4, 2, 2), (3, 4, 3, 3), {"pads": [3, 3, 3, 3], "dilations": [2, 3]}),
    ((1, 16, 5, 5), (16, 16, 3, 3), {"pads": [1, 1, 1, 1], "strides": [3, 3]}),
    ((1, 8, 7, 7), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 9, 1, 40), (17, 9, 1, 3), {"auto_pad": "SAME_LOWER"}),
    ((1, 3, 11, 11), (20, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    ((1, 32, 4, 4), (32, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 32}),
    ((1, 64, 2, 3), (64, 8, 1, 1), {"group": 8}),
]


@pytest.mark.parametrize(("xs", "ws", "attrs"), EDGE_CASES)
def test_edge_geometries(xs, ws, attrs):
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32),
              rng.standard_normal(ws[0]).astype(np.float32)]
    node, ref = _conv_case(inputs, attrs)
    ok = [i for i in CONV_IMPLS if i.supports(node) is None]
    assert ok
    for impl in ok:
        _check(impl, node, inputs, ref[0])


def test_runtime_weights_and_bias():
    """W and B as graph inputs (not constants): the plan converts W to the packed layout on
    every run; every variant but the grouped one (which packs at build) runs them."""
    rng = np.random.default_rng(8)
    for xs, ws, attrs in EDGE_CASES[4:]:
        inputs = [rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32),
                  rng.standard_normal(ws[0]).astype(np.float32)]
        node, ref = case("Conv", inputs, attrs)
        ok = [i for i in CONV_IMPLS if i.supports(node) is None]
        assert ok and not any(_kind(i) == "grouped" for i in ok)
        for impl in ok:
            _check(impl, node, inputs, ref[0])


# -- fused patterns --------------------------------------------------------------------------


def _fused_case(pattern, inputs, attrs, rng, *, swap_add=False, clip_opset6=False):
    """The FusedNode of `pattern` over a Conv, its standard inputs and the reference output."""
    conv, ref = _conv_case(inputs, attrs)
    out = conv.outputs[0]
    y = ref[0]
    nodes, extra = [conv], []
    prev = out
    for k, op in enumerate(pattern[1:]):
        nxt = Value(f"v{k}", out.shape, F32)
        if op == "Relu":
            node = Node(f"relu{k}", "Relu", [prev], [nxt])
            y = np.maximum(y, 0)
        elif op == "Clip":
            lo, hi = sorted(rng.uniform(-1.5, 1.5, 2).astype(np.float32))
            if clip_opset6:
                node = Node(f"clip{k}", "Clip", [prev], [nxt], {"min": float(lo), "max": float(hi)},
                            opset=6)
            else:
                vals = [Value(f"lo{k}", (), F32, np.float32(lo)), Value(f"hi{k}", (), F32, np.float32(hi))]
                node = Node(f"clip{k}", "Clip", [prev, *vals], [nxt])
                extra += [np.float32(lo), np.float32(hi)]
            y = np.clip(y, lo, hi)
        else:  # Add or a two-input Sum
            r = rng.standard_normal(out.shape).astype(np.float32)
            rv = Value(f"res{k}", out.shape, F32)
            node = Node(f"add{k}", op, [rv, prev] if swap_add else [prev, rv], [nxt])
            extra.append(r)
            y = y + r
        nodes.append(node)
        prev = nxt
    return fuse(nodes), [*inputs, *extra], y


@pytest.mark.parametrize("pattern", PATTERNS, ids="+".join)
@settings(max_examples=30, deadline=None)
@given(data=conv_cases(), seed=st.integers(0, 1000), swap=st.booleans(), opset6=st.booleans())
def test_fused_patterns_match_reference(pattern, data, seed, swap, opset6):
    inputs, attrs = data
    fused, ins, ref = _fused_case(pattern, inputs, attrs, np.random.default_rng(seed),
                                  swap_add=swap, clip_opset6=opset6)
    impls = _blocked("+".join(pattern))
    ok = [i for i in impls if i.supports(fused) is None]
    assert ok, f"no native {'+'.join(pattern)} supports {attrs}"
    for impl in ok:
        (y,) = run_in_layouts(impl, fused, ins)
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=_tol(inputs[0], inputs[1]), err_msg=impl.name)
        lay = impl.output_layouts(fused)[0]
        block = int(lay[4:-1])
        tail = inputs[1].shape[0] % block
        if tail:  # the padding channels of the blocked output stay zero (Clip with lo > 0 too)
            phys = _to_layouts(impl, fused, ins)
            raw = impl.build(fused)(*phys)
            assert np.all(raw[:, -1, :, :, tail:] == 0), impl.name


def test_every_variant_registers_every_pattern():
    names = {i.name.split(".", 1)[1] for i in CONV_IMPLS}
    assert {n.rsplit("_", 1)[-1] for n in names} == set(KINDS)
    for pattern in PATTERNS:
        assert {i.name.split(".", 1)[1] for i in _blocked("+".join(pattern))} == names


def test_pattern_supports_give_reasons():
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((1, 16, 5, 5)).astype(np.float32),
              rng.standard_normal((16, 16, 3, 3)).astype(np.float32)]
    conv, _ = _conv_case(inputs, {"pads": [1, 1, 1, 1]})
    out = conv.outputs[0]
    bcast = Node("add", "Add", [out, Value("r", (1, 16, 1, 1), F32)], [Value("y", out.shape, F32)])
    clip = Node("clip", "Clip", [out, Value("lo", (), F32), None], [Value("y", out.shape, F32)])
    sum3 = Node("sum", "Sum", [out, Value("r", out.shape, F32), Value("s", out.shape, F32)],
                [Value("y", out.shape, F32)])
    for nodes, pattern, words in (([conv, bcast], "Conv+Add", "no broadcasting"),
                                  ([conv, sum3], "Conv+Sum", "one other tensor"),
                                  ([conv, clip], "Conv+Clip", "constants")):
        fused = fuse(nodes)
        for impl in [i for i in _blocked(pattern) if _kind(i) == "direct"]:
            assert words in (impl.supports(fused) or ""), impl.name


# -- non-contiguous inputs, layouts, validation, ISA -----------------------------------------


def test_kernels_accept_non_contiguous_inputs():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 7, 9)).astype(np.float32)
    w = rng.standard_normal((11, 5, 3, 3)).astype(np.float32)
    b = rng.standard_normal(11).astype(np.float32)
    node, ref = _conv_case([x, w, b], {"pads": [1, 0, 1, 2], "strides": [2, 1]})
    reg = registry()
    for impl in [i for i in CONV_IMPLS if i.supports(node) is None]:
        kernel = impl.build(node)
        args = []
        for a in _to_layouts(impl, node, [x, w, b]):
            view = np.repeat(a, 2, axis=-1)[..., ::2]  # a strided view of the same values
            assert not view.flags.c_contiguous
            args.append(view)
        y = kernel(*args)
        for conv in reg.layouts.path(impl.output_layouts(node)[0], "std", ref[0].shape, F32):
            y = conv(y, ref[0].shape)
        np.testing.assert_allclose(y, ref[0], rtol=1e-4, atol=_tol(x, w), err_msg=impl.name)


@pytest.mark.parametrize("fmt", list(WEIGHT_LAYOUTS))
@pytest.mark.parametrize("block", [8, 16])
def test_weight_layouts_round_trip_and_zero_pad(fmt, block):
    rng = np.random.default_rng(2)
    shape = {"blocked": (19, 21, 3, 2), "depthwise": (21, 1, 3, 3), "first": (19, 3, 7, 7)}[fmt]
    w = rng.standard_normal(shape).astype(np.float32)
    reg = registry()
    lay = weight_layout(fmt, block)
    (to,) = reg.layouts.path("std", lay, shape, F32)
    (back,) = reg.layouts.path(lay, "std", shape, F32)
    packed = to(w, shape)
    assert packed.shape == reg.layouts.layout(lay).stored_shape(shape)
    np.testing.assert_array_equal(back(packed, shape), w)
    assert np.count_nonzero(packed) == np.count_nonzero(w)  # padding is zero
    if fmt == "blocked":  # element (o, i, kh, kw) sits at [o/B, i/B, kh, kw, i%B, o%B]
        o, i = 17, 20
        assert packed[o // block, i // block, 2, 1, i % block, o % block] == w[o, i, 2, 1]


def test_grouped_packing_zeroes_cross_group_weights():
    w = np.ones((12, 2, 1, 1), np.float32)
    packed, starts = native().pack_conv_weight_grouped(w, 6, 3, 8)
    assert starts.dtype == np.int64 and starts.shape == (2,)
    dense = packed[0, 0, 0, 0]  # (ic, oc) of output block 0
    groups = np.arange(6)[:, None] // 2 == np.arange(8)[None, :] // 4
    np.testing.assert_array_equal(dense[:6], groups.astype(np.float32))
    assert not dense[6:].any()


def _params(c=16, m=16, k=3, pad=1, group=1):
    return [c, m, k, k, 1, 1, 1, 1, pad, pad, pad, pad, group]


def test_bindings_validate_in_cpp():
    m = native()
    x = np.zeros((1, 1, 5, 5, 16), np.float32)
    w = m.pack_conv_weight(np.zeros((16, 16, 3, 3), np.float32), "blocked", 16)
    ok = m.conv2d_blocked(x, w, None, None, _params(), 16)
    assert ok.shape == (1, 1, 5, 5, 16)
    bad = [
        (lambda: m.conv2d_blocked(x.astype(np.float64), w, None, None, _params(), 16), "float32"),
        (lambda: m.conv2d_blocked(np.zeros((1, 1, 5, 10, 16), np.float32)[:, :, :, ::2], w, None,
                                  None, _params(), 16), "C-contiguous"),
        (lambda: m.conv2d_blocked(x, w[:, :, :2], None, None, _params(), 16), "expected shape"),
        (lambda: m.conv2d_blocked(np.zeros((1, 2, 5, 5, 16), np.float32), w, None, None,
                                  _params(), 16), "expected shape"),
        (lambda: m.conv2d_blocked(x, w, np.zeros(3, np.float32), None, _params(), 16), "bias"),
        (lambda: m.conv2d_blocked(x, w, None, np.zeros((1, 1, 4, 5, 16), np.float32), _params(),
                                  16), "residual"),
        (lambda: m.conv2d_blocked(x, w, None, None, _params()[:5], 16), "13 ints"),
        (lambda: m.conv2d_blocked(x, w, None, None, _params(k=9, pad=0), 16), "output height"),
        (lambda: m.conv2d_blocked(x, w, None, None, _params(group=3), 16), "modulo group"),
        (lambda: m.conv2d_blocked(x, w, None, None, _params(), 12), "block must be 8 or 16"),
        (lambda: m.conv2d_blocked(x, w, None, None, _params(), 16, 1.0, 0.0), "lo <= hi"),
        (lambda: m.conv2d_blocked(x, w, None, None, [16, 16, 3, 3, 0, 1, 1, 1, 1, 1, 1, 1, 1], 16),
         "stride"),
        (lambda: m.conv2d_blocked(x, w, None, None, _params(), 16, ib_start=np.zeros(1, np.int32)),
         "int64"),
        (lambda: m.conv2d_blocked(x, np.zeros((1, 1, 3, 3, 16, 16), np.float32), None, None,
                                  _params(), 16, ib_start=np.array([5])), "grouped input block"),
        (lambda: m.conv2d_depthwise_blocked(x, np.zeros((1, 3, 3, 16), np.float32), None, None,
                                            _params(), 16), "group == C == M"),
        (lambda: m.conv2d_first_blocked(np.zeros((1, 3, 5, 5), np.float32),
                                        np.zeros((1, 3, 3, 3, 16), np.float32), None, None,
                                        _params(c=4), 16), "expected shape"),
        (lambda: m.pack_conv_weight(np.zeros((4, 2, 3), np.float32), "blocked", 16), "rank-4"),
        (lambda: m.pack_conv_weight(np.zeros((4, 2, 3, 3), np.float32), "depthwise", 16),
         "depthwise"),
        (lambda: m.pack_conv_weight(np.zeros((4, 2, 3, 3), np.float32), "nope", 16), "known"),
        (lambda: m.unpack_conv_weight(np.zeros((1, 1, 3, 3, 8, 8), np.float32), [4, 2, 3, 3],
                                      "blocked", 16), "expected shape"),
        (lambda: m.pack_conv_weight_grouped(np.zeros((4, 2, 1, 1), np.float32), 5, 2, 8), "group"),
    ]
    for fn, words in bad:
        with pytest.raises(ValueError, match=words):
            fn()


def test_supports_reasons():
    rng = np.random.default_rng(3)
    x3 = rng.standard_normal((1, 4, 9)).astype(np.float32)
    node, _ = case("Conv", [x3, rng.standard_normal((4, 4, 3)).astype(np.float32)], {}, const_inputs=(1,))
    assert all("2-D" in (i.supports(node) or "") for i in CONV_IMPLS)
    x = rng.standard_normal((1, 4, 6, 6))
    node, _ = case("Conv", [x, rng.standard_normal((4, 4, 3, 3))], {}, const_inputs=(1,))
    assert all("float32" in (i.supports(node) or "") for i in CONV_IMPLS)
    xg = rng.standard_normal((1, 6, 6, 6)).astype(np.float32)
    wg = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    node, _ = case("Conv", [xg, wg], {"group": 3})  # runtime weight
    grouped = [i for i in CONV_IMPLS if _kind(i) == "grouped"]
    assert all("constant weight" in (i.supports(node) or "") for i in grouped)
    direct = [i for i in CONV_IMPLS if _kind(i) == "direct"]
    assert all("multiples of the block" in (i.supports(node) or "") for i in direct)


def test_generic_isa_gives_the_same_results():
    m = native()
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 21, 9, 11)).astype(np.float32)
    cases = [
        (rng.standard_normal((19, 21, 3, 3)).astype(np.float32), {"pads": [1, 1, 1, 1]}),
        (rng.standard_normal((19, 21, 1, 1)).astype(np.float32), {"strides": [2, 2]}),
        (rng.standard_normal((21, 1, 3, 3)).astype(np.float32), {"group": 21, "pads": [1, 2, 0, 1]}),
        (rng.standard_normal((14, 3, 2, 3)).astype(np.float32), {"group": 7, "dilations": [2, 1]}),
    ]
    before = m.isa()
    for w, attrs in cases:
        node, ref = _conv_case([x, w], attrs)
        for impl in [i for i in CONV_IMPLS if i.supports(node) is None]:
            (fast,) = run_in_layouts(impl, node, [x, w])
            try:
                m.set_isa("generic")
                (slow,) = run_in_layouts(impl, node, [x, w])
            finally:
                m.set_isa(before)
            np.testing.assert_allclose(slow, fast, rtol=1e-5, atol=1e-4, err_msg=impl.name)
            np.testing.assert_allclose(slow, ref[0], rtol=1e-4, atol=_tol(x, w), err_msg=impl.name)
    assert m.isa() == before
