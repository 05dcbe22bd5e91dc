"""oneDNN convolutions (every Conv implementation and fused pattern) against the ONNX reference:
odd channel counts, strides, dilations, pads and auto_pad, groups and depthwise, batches, 1x1
outputs, non-contiguous inputs, weights given at run time; the declared layouts match the
primitive's; C++ validation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch.fusion import fuse
from dispatch.graph import Node, Value
from impls.onednn import conv as onednn_conv
from impls.onednn._module import onednn
from tests.onednn.support import (
    ONLY_REFERENCE,
    case,
    conv_tol,
    onednn_impls,
    registry,
    run_in_layouts,
    supporting,
)

F32 = np.dtype(np.float32)


@st.composite
def conv_cases(draw, mode: str | None = None):
    """(inputs, attrs) of a random 2-D Conv."""
    mode = mode or draw(st.sampled_from(["dense", "1x1", "depthwise", "grouped", "first", "wide"]))
    n = draw(st.integers(1, 3))
    group = 1
    if mode == "depthwise":
        c = m = group = draw(st.integers(1, 40))
    elif mode == "grouped":
        group = draw(st.integers(2, 4))
        c, m = group * draw(st.integers(1, 8)), group * draw(st.integers(1, 8))
    elif mode == "first":
        c, m = draw(st.integers(1, 4)), draw(st.integers(1, 70))
    elif mode == "wide":
        c, m = draw(st.sampled_from([16, 32, 48, 64])), draw(st.sampled_from([16, 24, 64, 80]))
    else:
        c, m = draw(st.integers(1, 37)), draw(st.integers(1, 37))
    k = (1, 1) if mode == "1x1" else (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    strides = [draw(st.integers(1, 2)), draw(st.integers(1, 3))]
    dil = [1, 1] if mode == "1x1" else [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 12))
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
    if span[0] < ext[0] or span[1] < ext[1]:
        h, w = h + max(0, ext[0] - span[0]), w + max(0, ext[1] - span[1])
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((m, c // group, *k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if draw(st.booleans()) else None
    return [x, wt, b] if b is not None else [x, wt], attrs


def _conv_case(inputs, attrs, const=(1, 2)):
    return case("Conv", inputs, attrs, const_inputs=const)


def _check(impl, node, inputs, ref):
    (y,) = run_in_layouts(impl, node, inputs)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=conv_tol(inputs[0], inputs[1]), err_msg=impl.name)


@settings(max_examples=120, deadline=None)
@given(data=conv_cases())
def test_every_supporting_conv_impl_matches_reference(data):
    inputs, attrs = data
    node, ref = _conv_case(inputs, attrs)
    ok = supporting("Conv", node)
    names = [i.name for i in ok]
    assert "Conv.onednn.any" in names, {i.name: i.supports(node) for i in onednn_impls("Conv")}
    for impl in ok:
        _check(impl, node, inputs, ref[0])


@settings(max_examples=25, deadline=None)
@given(data=conv_cases())
def test_weights_given_at_run_time(data):
    """W as a graph input (not a constant): declared in oneDNN's format it is converted per
    run; in std it is reordered inside the kernel."""
    inputs, attrs = data
    node, ref = _conv_case(inputs, attrs, const=())
    for impl in supporting("Conv", node):
        _check(impl, node, inputs, ref[0])


def test_declared_layouts_are_the_primitives():
    """The layouts an implementation declares are those of the primitive its build creates:
    the weights are used in place (never reordered again) when they are in a dnnl: layout."""
    rng = np.random.default_rng(0)
    for xs, ws, attrs in [((1, 64, 14, 14), (128, 64, 3, 3), {"pads": [1] * 4}),
                          ((1, 3, 32, 32), (64, 3, 7, 7), {"pads": [3] * 4, "strides": [2, 2]}),
                          ((2, 32, 9, 9), (32, 1, 3, 3), {"pads": [1] * 4, "group": 32}),
                          ((1, 512, 7, 7), (1000, 512, 1, 1), {})]:
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal(ws).astype(np.float32)
        node, _ = _conv_case([x, w], attrs)
        for impl in supporting("Conv", node):
            ins, outs = impl.input_layouts(node), impl.output_layouts(node)
            prim = impl.build(node).primitive
            reg = registry()
            assert list(prim.src_shape) == list(reg.layouts.layout(ins[0]).stored_shape(xs))
            yshape = node.outputs[0].shape
            assert list(prim.dst_shape) == list(reg.layouts.layout(outs[0]).stored_shape(yshape))
            if ins[1].startswith("dnnl:"):
                assert prim.weights_in_place, (impl.name, ins[1], prim.weights_format)


PATTERN_CASES = [
    # (X, W, attrs, pattern, extra): extra inputs of the later nodes
    ((1, 16, 8, 8), (16, 16, 3, 3), {"pads": [1] * 4}, ("Conv", "Relu")),
    ((2, 5, 7, 9), (7, 5, 3, 3), {"pads": [1, 0, 1, 2], "strides": [2, 1]}, ("Conv", "Relu")),
    ((1, 16, 8, 8), (20, 16, 1, 1), {}, ("Conv", "Clip")),
    ((1, 8, 6, 6), (8, 8, 3, 3), {"pads": [1] * 4}, ("Conv", "Add")),
    ((2, 12, 5, 5), (12, 1, 3, 3), {"pads": [1] * 4, "group": 12}, ("Conv", "Add", "Relu")),
    ((1, 3, 9, 9), (17, 3, 3, 3), {"pads": [1] * 4}, ("Conv", "Add", "Relu")),
    ((1, 24, 6, 6), (24, 8, 3, 3), {"pads": [1] * 4, "group": 3}, ("Conv", "Sum")),
    ((1, 16, 4, 4), (32, 16, 1, 1), {}, ("Conv", "Sum", "Relu")),
]


def _fused_case(xs, ws, attrs, pattern, seed=0, clip=(0.25, 1.5)):
    """The FusedNode of the chain and the reference output (numpy after the conv)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    conv, ref = _conv_case([x, w, b], attrs)
    y = ref[0]
    nodes: list[Node] = [conv]
    inputs = [x, w, b]
    prev = conv.outputs[0]
    for k, op in enumerate(pattern[1:]):
        out = Value(f"o{k}", y.shape, F32)
        if op == "Relu":
            nodes.append(Node(f"n{k}", "Relu", [prev], [out]))
            y = np.maximum(y, 0)
        elif op == "Clip":
            lo = Value("lo", (), F32, np.float32(clip[0]))
            hi = Value("hi", (), F32, np.float32(clip[1]))
            nodes.append(Node(f"n{k}", "Clip", [prev, lo, hi], [out]))
            inputs += [np.float32(clip[0]), np.float32(clip[1])]
            y = np.clip(y, *clip)
        else:
            r = rng.standard_normal(y.shape).astype(np.float32)
            rv = Value(f"r{k}", y.shape, F32)
            ins = [rv, prev] if k % 2 else [prev, rv]
            nodes.append(Node(f"n{k}", op, ins, [out]))
            inputs.append(r)
            y = y + r
        prev = out
    return fuse(nodes), inputs, y, (x, w)


@pytest.mark.parametrize(("xs", "ws", "attrs", "pattern"), PATTERN_CASES)
def test_every_fused_pattern_matches_reference(xs, ws, attrs, pattern):
    fused, inputs, ref, (x, w) = _fused_case(xs, ws, attrs, pattern)
    key = "+".join(pattern)
    ok = supporting(key, fused)
    assert any(i.name.endswith(".any") for i in ok), {i.name: i.supports(fused) for i in onednn_impls(key)}
    for impl in ok:
        (y,) = run_in_layouts(impl, fused, inputs)
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=conv_tol(x, w), err_msg=impl.name)
        if any(op in ("Add", "Sum") for op in pattern):  # either way of adding the residual
            assert isinstance(impl.build(fused).primitive.residual_in_place, bool)


def test_every_pattern_is_registered_for_every_variant():
    for variant in onednn_conv.VARIANTS:
        for pattern in onednn_conv.PATTERNS:
            assert registry().impl(f"{'+'.join(pattern)}.onednn.{variant}").pattern == pattern


def test_clip_post_op_keeps_blocked_padding_zero():
    """Clip(1, 6) maps the padding channels' zeros to 1 unless oneDNN zeroes the padding of
    its output: a native kernel reading the block would then see garbage channels."""
    fused, inputs, _ref, _ = _fused_case((1, 32, 6, 6), (20, 32, 1, 1), {}, ("Conv", "Clip"),
                                        clip=(1.0, 6.0))
    impl = registry().impl("Conv+Clip.onednn.nchw16c")
    if ONLY_REFERENCE in (impl.supports(fused) or ""):
        pytest.skip(f"no optimised oneDNN kernel for nchw16c on this CPU: {impl.supports(fused)}")
    assert impl.supports(fused) is None, impl.supports(fused)
    ins = []
    for v, a, layout in zip(fused.inputs, inputs, impl.input_layouts(fused)):
        for c in registry().layouts.path("std", layout, v.shape, F32) if v.shape else ():
            a = c(a, v.shape)
        ins.append(a)
    y = impl.build(fused)(*ins)
    assert y.shape == (1, 2, 6, 6, 16)
    assert np.all(y[:, 1, :, :, 4:] == 0)


def test_non_contiguous_input_is_read_correctly():
    rng = np.random.default_rng(3)
    base = rng.standard_normal((1, 9, 11, 6)).astype(np.float32)
    x = base.transpose(0, 3, 1, 2)  # logical (1, 6, 9, 11), not contiguous
    w = rng.standard_normal((10, 6, 3, 3)).astype(np.float32)
    node, ref = _conv_case([np.ascontiguousarray(x), w], {"pads": [1] * 4})
    for impl in supporting("Conv", node):
        _check(impl, node, [x, w], ref[0])


def test_one_by_one_output_and_batches():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 7, 3, 3)).astype(np.float32)
    w = rng.standard_normal((9, 7, 3, 3)).astype(np.float32)
    node, ref = _conv_case([x, w], {})
    assert ref[0].shape == (4, 9, 1, 1)
    for impl in supporting("Conv", node):
        _check(impl, node, [x, w], ref[0])


def test_unsupported_nodes_say_why():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 2, 5, 5, 5)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3, 3)).astype(np.float32)
    node, _ = _conv_case([x, w], {})
    assert "2-D" in registry().impl("Conv.onednn.any").supports(node)
    x64 = np.zeros((1, 2, 5, 5))
    node, _ = _conv_case([x64, np.zeros((3, 2, 3, 3))], {})
    assert "float32" in registry().impl("Conv.onednn.any").supports(node)


P = [1, 4, 6, 6, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1]


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda m: m.Conv(P[:15], False, "acdb", "acdb", "abcd"), ValueError, "16 ints"),
        (lambda m: m.Conv([1, 4, 6, 6, 8, 3, 3, 0, 1, 1, 1, 0, 0, 0, 0, 1], False, "acdb", "acdb", "abcd"),
         ValueError, "SH=0"),
        (lambda m: m.Conv([1, 4, 6, 6, 8, 3, 3, 1, 1, 1, 1, 0, 0, 0, 0, 3], False, "acdb", "acdb", "abcd"),
         ValueError, "group=3"),
        (lambda m: m.Conv([1, 4, 1, 1, 8, 3, 3, 1, 1, 1, 1, 0, 0, 0, 0, 1], False, "acdb", "acdb", "abcd"),
         ValueError, "empty"),
        (lambda m: m.Conv(P, False, "nChw16c", "acdb", "abcd"), ValueError, "unknown oneDNN format tag"),
        (lambda m: m.Conv(P, False, "acdb", "acdb", "abcde"), ValueError, "rank-5"),
        (lambda m: m.Conv(P, False, "acdb", "acdb", "abcd", eltwise="gelu"), ValueError, "eltwise"),
        (lambda m: m.Conv(P, False, "acdb", "acdb", "abcd", eltwise="clip", alpha=2, beta=1),
         ValueError, "lo <= hi"),
        (lambda m: m.Conv(P, False, "acdb", "acdb", "abcd")(
            np.zeros((1, 6, 6, 4)), np.zeros((8, 4, 3, 3), np.float32)),
         ValueError, "float32"),
        (lambda m: m.Conv(P, False, "acdb", "acdb", "abcd")(
            np.zeros((1, 4, 6, 6), np.float32), np.zeros((8, 4, 3, 3), np.float32)),
         ValueError, "expected shape"),
        (lambda m: m.Conv(P, False, "acdb", "acdb", "abcd")(
            np.zeros((1, 6, 6, 4), np.float32), np.zeros((8, 4, 3), np.float32)),
         ValueError, "elements"),
        (lambda m: m.Conv(P, False, "acdb", "acdb", "abcd")(np.zeros((1, 6, 6, 4), np.float32)),
         ValueError, "weights W are required"),
        (lambda m: m.Conv(P, True, "acdb", "acdb", "abcd")(
            np.zeros((1, 6, 6, 4), np.float32), np.zeros((8, 4, 3, 3), np.float32)),
         ValueError, "bias"),
        (lambda m: m.Conv(P, False, "acdb", "acdb", "abcd", sum=True)(
            np.zeros((1, 6, 6, 4), np.float32), np.zeros((8, 4, 3, 3), np.float32)),
         ValueError, "residual"),
        (lambda m: m.Conv(P, False, "acdb", "acdb", "abcd")(
            np.zeros((1, 6, 4, 12), np.float32)[:, :, :, ::3], np.zeros((8, 4, 3, 3), np.float32)),
         ValueError, "C-contiguous"),
    ],
)
def test_bad_input_raises_python_exceptions(call, exc, match):
    with pytest.raises(exc, match=match):
        call(onednn())
