"""Native nhwc convolutions (and the std 1x1 conv) on the packed GEMM, every variant and fused
pattern, against the ONNX reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch.fusion import fuse
from dispatch.graph import Node, Value
from impls.native._module import native
from impls.native.conv_nhwc import HWIO16O, PATTERNS, VARIANTS
from tests.native.support import case, native_impls, registry, run_in_layouts

F32 = np.dtype(np.float32)
VARIANT_NAMES = {v[0] for v in VARIANTS.values()}
MINE = [i for i in native_impls("Conv") if i.name.split(".")[-1] in VARIANT_NAMES]


def _tol(x: np.ndarray, w: np.ndarray) -> float:
    k = math.prod(w.shape[1:])
    return 3e-6 * math.sqrt(k) * float(np.abs(x).max(initial=1)) * float(np.abs(w).max(initial=1)) + 1e-5


@st.composite
def conv_cases(draw, mode: str | None = None):
    """(inputs, attrs) of a random 2-D Conv: dense, 1x1, depthwise, grouped or a depthwise
    channel multiplier."""
    mode = mode or draw(st.sampled_from(["dense", "dense", "1x1", "depthwise", "grouped", "mult"]))
    n = draw(st.integers(1, 2))
    group = 1
    if mode == "depthwise":
        c = m = group = draw(st.integers(1, 40))
    elif mode == "grouped":
        group = draw(st.integers(2, 4))
        c, m = group * draw(st.integers(1, 5)), group * draw(st.integers(1, 20))
    elif mode == "mult":
        c = group = draw(st.integers(1, 6))
        m = c * draw(st.integers(2, 3))
    else:
        c, m = draw(st.integers(1, 37)), draw(st.integers(1, 37))
    k = (1, 1) if mode == "1x1" else (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    strides = ([1, 1] if mode == "1x1" and draw(st.booleans())
               else [draw(st.integers(1, 2)), draw(st.integers(1, 3))])
    dil = [1, 1] if mode == "1x1" else [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 14))
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    attrs: dict = {"strides": strides, "dilations": dil, "group": group}
    ext = [(k[i] - 1) * dil[i] + 1 for i in range(2)]
    if auto_pad == "NOTSET":
        pads = ([0, 0, 0, 0] if mode == "1x1" and draw(st.booleans())
                else [draw(st.integers(0, 2)) for _ in range(4)])
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
    out = []
    for v, a, lay in zip(node.inputs, inputs, impl.input_layouts(node)):
        if a is not None:
            for conv in registry().layouts.path("std", lay, v.shape, F32):
                a = conv(a, v.shape)
        out.append(a)
    return out


def _supporting(node):
    return [i for i in MINE if i.supports(node) is None]


def test_registered_variants_and_patterns():
    assert {i.name for i in MINE} == {f"Conv.native.{v}" for v in VARIANT_NAMES}
    for pattern in PATTERNS:
        names = {i.name.split(".")[-1] for i in native_impls("+".join(pattern))}
        assert names >= VARIANT_NAMES, pattern


@settings(max_examples=120, deadline=None)
@given(data=conv_cases(), const_w=st.booleans())
def test_conv_matches_reference(data, const_w):
    inputs, attrs = data
    node, ref = case("Conv", inputs, attrs, const_inputs=(1, 2) if const_w else ())
    ok = _supporting(node)
    assert any(i.name.endswith(("nhwc_gemm", "nhwc_depthwise")) for i in ok), attrs
    for impl in ok:
        (y,) = run_in_layouts(impl, node, inputs)
        np.testing.assert_allclose(y, ref[0], rtol=1e-4, atol=_tol(inputs[0], inputs[1]),
                                   err_msg=impl.name)


@pytest.mark.parametrize(("xs", "ws", "attrs"), [
    ((2, 70, 9, 9), (40, 70, 3, 3), {"pads": [1, 1, 1, 1]}),        # K = 630: two K blocks
    ((1, 64, 23, 23), (33, 64, 1, 1), {}),                          # 529 rows: several M blocks
    ((1, 48, 12, 12), (96, 48, 1, 1), {"strides": [2, 2]}),          # strided 1x1 (gathered)
    ((2, 64, 10, 10), (64, 1, 3, 3), {"group": 64, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 3, 31, 31), (16, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    ((1, 32, 1, 1), (20, 32, 1, 1), {}),                            # 1x1 spatial
])
def test_conv_larger_shapes(xs, ws, attrs):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    node, ref = case("Conv", [x, w, b], attrs, const_inputs=(1, 2))
    ok = _supporting(node)
    assert ok
    for impl in ok:
        (y,) = run_in_layouts(impl, node, [x, w, b])
        np.testing.assert_allclose(y, ref[0], rtol=1e-4, atol=_tol(x, w), err_msg=impl.name)


# -- fused patterns --------------------------------------------------------------------------


def _fused_case(pattern, inputs, attrs, rng, *, swap_add=False, clip_opset6=False):
    conv, ref = case("Conv", inputs, attrs, const_inputs=(1, 2))
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
@settings(max_examples=20, deadline=None)
@given(data=conv_cases(), seed=st.integers(0, 1000), swap=st.booleans(), opset6=st.booleans())
def test_fused_patterns_match_reference(pattern, data, seed, swap, opset6):
    inputs, attrs = data
    fused, ins, ref = _fused_case(pattern, inputs, attrs, np.random.default_rng(seed),
                                  swap_add=swap, clip_opset6=opset6)
    impls = [i for i in native_impls("+".join(pattern))
             if i.name.split(".")[-1] in VARIANT_NAMES and i.supports(fused) is None]
    assert impls, f"no nhwc {'+'.join(pattern)} supports {attrs}"
    for impl in impls:
        (y,) = run_in_layouts(impl, fused, ins)
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=_tol(inputs[0], inputs[1]),
                                   err_msg=impl.name)


def test_pattern_supports_give_reasons():
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((1, 16, 5, 5)).astype(np.float32),
              rng.standard_normal((16, 16, 3, 3)).astype(np.float32)]
    conv, _ = case("Conv", inputs, {"pads": [1, 1, 1, 1]}, const_inputs=(1,))
    out = conv.outputs[0]
    bcast = Node("add", "Add", [out, Value("r", (1, 16, 1, 1), F32)], [Value("y", out.shape, F32)])
    clip = Node("clip", "Clip", [out, Value("lo", (), F32), None], [Value("y", out.shape, F32)])
    for nodes, pattern, words in (([conv, bcast], "Conv+Add", "no broadcasting"),
                                  ([conv, clip], "Conv+Clip", "constants")):
        fused = fuse(nodes)
        impl = next(i for i in native_impls(pattern) if i.name.endswith("nhwc_gemm"))
        assert words in (impl.supports(fused) or "")


# -- non-contiguous inputs, layouts, validation, ISA -----------------------------------------


def test_kernels_accept_non_contiguous_inputs():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6, 7, 9)).astype(np.float32)
    cases = [
        (rng.standard_normal((11, 6, 3, 3)).astype(np.float32), {"pads": [1, 0, 1, 2], "strides": [2, 1]}),
        (rng.standard_normal((6, 1, 3, 3)).astype(np.float32), {"group": 6, "pads": [1, 1, 1, 1]}),
        (rng.standard_normal((9, 6, 1, 1)).astype(np.float32), {}),
        (rng.standard_normal((10, 3, 1, 2)).astype(np.float32), {"group": 2}),
    ]
    for w, attrs in cases:
        b = rng.standard_normal(w.shape[0]).astype(np.float32)
        node, ref = case("Conv", [x, w, b], attrs)
        for impl in _supporting(node):
            kernel = impl.build(node)
            args = []
            for a in _to_layouts(impl, node, [x, w, b]):
                view = np.repeat(a, 2, axis=-1)[..., ::2]
                assert not view.flags.c_contiguous
                args.append(view)
            y = kernel(*args)
            for conv in registry().layouts.path(impl.output_layouts(node)[0], "std", ref[0].shape, F32):
                y = conv(y, ref[0].shape)
            np.testing.assert_allclose(y, ref[0], rtol=1e-4, atol=_tol(x, w), err_msg=impl.name)


@pytest.mark.parametrize("shape", [(19, 21, 3, 2), (16, 5, 1, 1), (3, 1, 2, 2)])
def test_weight_layout_round_trip_and_zero_pad(shape):
    rng = np.random.default_rng(2)
    w = rng.standard_normal(shape).astype(np.float32)
    reg = registry()
    (to,) = reg.layouts.path("std", HWIO16O, shape, F32)
    (back,) = reg.layouts.path(HWIO16O, "std", shape, F32)
    packed = to(w, shape)
    assert packed.shape == reg.layouts.layout(HWIO16O).stored_shape(shape)
    if shape[0] % 16:
        assert np.all(packed[-1, :, shape[0] % 16:] == 0)
    np.testing.assert_array_equal(back(packed, shape), w)
    # the packed matrix is W as (KH*KW*C, M), row (ky*KW + kx)*C + c
    mat = w.transpose(2, 3, 1, 0).reshape(-1, shape[0])
    np.testing.assert_array_equal(packed.transpose(1, 0, 2).reshape(mat.shape[0], -1)[:, : shape[0]], mat)


def test_bindings_validate_in_cpp():
    m = native()
    x = np.ones((1, 5, 5, 8), np.float32)
    wp = m.conv_pack_weight(np.ones((4, 8, 3, 3), np.float32), 1)
    geo = ([3, 3], [1, 1], [1, 1], [1, 1, 1, 1])
    assert m.conv_nhwc(x, wp, 4, *geo).shape == (1, 5, 5, 4)
    bad = [
        lambda: m.conv_nhwc(x.astype(np.float64), wp, 4, *geo),
        lambda: m.conv_nhwc(np.ones((1, 5, 8, 5), np.float32).transpose(0, 1, 3, 2), wp, 4, *geo),
        lambda: m.conv_nhwc(x, wp, 20, *geo),                                 # wrong M
        lambda: m.conv_nhwc(x, wp, 4, [3, 3], [0, 1], [1, 1], [1, 1, 1, 1]),  # stride 0
        lambda: m.conv_nhwc(x, wp, 4, [3, 3], [1, 1], [1, 1], [1, 1, 1]),     # 3 pads
        lambda: m.conv_nhwc(x, wp, 4, *geo, group=3),
        lambda: m.conv_nhwc(x, wp, 4, *geo, bias=np.ones(5, np.float32)),
        lambda: m.conv_nhwc(x, wp, 4, *geo, residual=np.ones((1, 5, 5, 5), np.float32)),
        lambda: m.conv_nhwc(x, wp, 4, *geo, act="tanh"),
        lambda: m.conv_nhwc_depthwise(x, np.ones((3, 3, 7), np.float32), [1, 1], [1, 1], [1, 1, 1, 1]),
        lambda: m.conv_nhwc_depthwise(x, np.ones((3, 3, 8), np.float32), [1, 1], [1, 1], [-1, 1, 1, 1]),
        lambda: m.conv_nchw_1x1(np.ones((1, 8, 4, 4), np.float32), np.ones((4, 7), np.float32)),
        lambda: m.conv_pack_weight(np.ones((5, 8, 3, 3), np.float32), 2),
        lambda: m.conv_unpack_weight(wp, [4, 8, 3, 2], 1),
    ]
    for fn in bad:
        with pytest.raises(ValueError):
            fn()


def test_supports_reasons():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 6, 5, 5)).astype(np.float32)
    node, _ = case("Conv", [x, rng.standard_normal((6, 1, 3, 3)).astype(np.float32)], {"group": 6})
    gemm = next(i for i in MINE if i.name.endswith("nhwc_gemm"))
    assert "nhwc_depthwise" in (gemm.supports(node) or "")
    node, _ = case("Conv", [x, rng.standard_normal((4, 6, 3, 3)).astype(np.float32)])
    dw = next(i for i in MINE if i.name.endswith("nhwc_depthwise"))
    assert "depthwise" in (dw.supports(node) or "")
    one = next(i for i in MINE if i.name.endswith("std_1x1"))
    assert "1x1" in (one.supports(node) or "")
    x3 = rng.standard_normal((1, 6, 5)).astype(np.float32)
    node, _ = case("Conv", [x3, rng.standard_normal((4, 6, 3)).astype(np.float32)])
    assert all("2-D" in (i.supports(node) or "") for i in MINE)


def test_generic_isa_gives_the_same_results():
    m = native()
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 21, 9, 11)).astype(np.float32)
    cases = [
        (rng.standard_normal((19, 21, 3, 3)).astype(np.float32), {"pads": [1, 1, 1, 1]}),
        (rng.standard_normal((19, 21, 1, 1)).astype(np.float32), {"strides": [2, 2]}),
        (rng.standard_normal((33, 21, 1, 1)).astype(np.float32), {}),
        (rng.standard_normal((21, 1, 3, 3)).astype(np.float32), {"group": 21, "pads": [1, 2, 0, 1]}),
        (rng.standard_normal((14, 3, 2, 3)).astype(np.float32), {"group": 7, "dilations": [2, 1]}),
    ]
    before = m.isa()
    for w, attrs in cases:
        node, ref = case("Conv", [x, w], attrs, const_inputs=(1,))
        for impl in _supporting(node):
            (fast,) = run_in_layouts(impl, node, [x, w])
            try:
                m.set_isa("generic")
                (slow,) = run_in_layouts(impl, node, [x, w])
            finally:
                m.set_isa(before)
            np.testing.assert_allclose(slow, fast, rtol=1e-5, atol=1e-4, err_msg=impl.name)
            np.testing.assert_allclose(slow, ref[0], rtol=1e-4, atol=_tol(x, w), err_msg=impl.name)
    assert m.isa() == before
