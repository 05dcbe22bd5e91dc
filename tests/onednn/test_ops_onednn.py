"""oneDNN Gemm / MatMul, pooling, eltwise, binary and batch normalization implementations
(every one, in every layout it declares, and their fused patterns) against the ONNX
reference, and their errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch.fusion import fuse
from dispatch.graph import Node, Value
from impls.onednn import elementwise as onednn_elementwise
from impls.onednn._module import onednn
from tests.onednn.support import ONLY_REFERENCE, case, check_all, onednn_impls, registry, supporting
from tests.support import make_node

F32 = np.dtype(np.float32)


def _rand(shape, seed=0, positive=False):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return np.abs(x) + 0.1 if positive else x


# -- Gemm / MatMul ---------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 9), k=st.integers(1, 70), n=st.integers(1, 70), ta=st.booleans(),
       tb=st.booleans(), bias=st.sampled_from([None, "1d", "2d"]), const=st.booleans())
def test_gemm_matches_reference(m, k, n, ta, tb, bias, const):
    a = _rand((k, m) if ta else (m, k), 1)
    b = _rand((n, k) if tb else (k, n), 2)
    ins = [a, b]
    if bias:
        ins.append(_rand((n,) if bias == "1d" else (1, n), 3))
    node, ref = case("Gemm", ins, {"transA": int(ta), "transB": int(tb)},
                     const_inputs=(1, 2) if const else ())
    check_all("Gemm", node, ins, ref, atol=1e-4)


def test_gemm_declares_onednns_weight_format():
    b = _rand((1000, 512), 4)
    node, _ref = case("Gemm", [_rand((1, 512)), b, _rand((1000,))], {"transB": 1}, const_inputs=(1, 2))
    impl = registry().impl("Gemm.onednn.matmul")
    w_layout = impl.input_layouts(node)[1]
    assert w_layout.startswith("dnnl:") or w_layout == "std"
    prim = impl.build(node).primitive
    if w_layout.startswith("dnnl:"):
        assert prim.weights_in_place


def _chain(first: Node, later: list[tuple[str, list]]) -> Node:
    nodes, prev = [first], first.outputs[0]
    for k, (op, extra) in enumerate(later):
        out = Value(f"c{k}", prev.shape, F32)
        nodes.append(Node(f"c{k}", op, [prev, *extra], [out]))
        prev = out
    return fuse(nodes)


def test_gemm_relu_and_clip_post_ops():
    a, b, c = _rand((3, 20), 5), _rand((20, 30), 6), _rand((30,), 7)
    node, ref = case("Gemm", [a, b, c], {}, const_inputs=(1, 2))
    fused = _chain(node, [("Relu", [])])
    check_all("Gemm+Relu", fused, [a, b, c], [np.maximum(ref[0], 0)], atol=1e-4)
    lo, hi = Value("lo", (), F32, np.float32(-0.5)), Value("hi", (), F32, np.float32(0.5))
    fused = _chain(node, [("Clip", [lo, hi])])
    check_all("Gemm+Clip", fused, [a, b, c, np.float32(-0.5), np.float32(0.5)],
              [np.clip(ref[0], -0.5, 0.5)], atol=1e-4)


@pytest.mark.parametrize(("sa", "sb"), [((4, 9), (9, 6)), ((2, 3, 9), (9, 6)), ((2, 3, 4, 9), (9, 17)),
                                        ((2, 3, 5, 9), (3, 9, 4)), ((1, 5, 9), (2, 9, 4)),
                                        ((5, 9), (2, 9, 4)), ((2, 1, 5, 9), (3, 9, 4))])
@pytest.mark.parametrize("const", [False, True])
def test_matmul_matches_reference(sa, sb, const):
    a, b = _rand(sa, 8), _rand(sb, 9)
    node, ref = case("MatMul", [a, b], {}, const_inputs=(1,) if const else ())
    names = check_all("MatMul", node, [a, b], ref, atol=1e-4)
    want = "MatMul.onednn.matmul" if len(sb) == 2 else "MatMul.onednn.batched"
    assert want in names


def test_matmul_relu():
    a, b = _rand((2, 3, 9), 10), _rand((9, 6), 11)
    node, ref = case("MatMul", [a, b], {}, const_inputs=(1,))
    check_all("MatMul+Relu", _chain(node, [("Relu", [])]), [a, b], [np.maximum(ref[0], 0)],
              atol=1e-4, expect=1)


def test_gemm_unsupported_cases_say_why():
    impl = registry().impl("Gemm.onednn.matmul")
    node, _ = case("Gemm", [_rand((2, 3)), _rand((3, 4))], {"alpha": 2.0})
    assert "alpha" in impl.supports(node)
    node, _ = case("Gemm", [_rand((2, 3)), _rand((3, 4)), _rand((2, 4))], {})
    assert "bias" in impl.supports(node)


# -- pooling ---------------------------------------------------------------------------------


@st.composite
def pool_cases(draw):
    op = draw(st.sampled_from(["MaxPool", "AveragePool"]))
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 37))
    h, w = draw(st.integers(1, 10)), draw(st.integers(1, 10))
    k = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    attrs: dict = {"kernel_shape": k, "strides": [draw(st.integers(1, 3)), draw(st.integers(1, 2))]}
    if op == "MaxPool" and draw(st.booleans()):
        attrs["dilations"] = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    dil = attrs.get("dilations", [1, 1])
    ext = [(k[i] - 1) * dil[i] + 1 for i in range(2)]
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "VALID"]))
    if auto_pad == "NOTSET":
        pads = [draw(st.integers(0, k[0] - 1)), draw(st.integers(0, k[1] - 1)),
                draw(st.integers(0, k[0] - 1)), draw(st.integers(0, k[1] - 1))]
        attrs["pads"] = pads
        h, w = max(h, ext[0] - pads[0] - pads[2]), max(w, ext[1] - pads[1] - pads[3])
        attrs["ceil_mode"] = int(draw(st.booleans()))
    else:
        attrs["auto_pad"] = auto_pad
        h, w = max(h, ext[0]), max(w, ext[1])
        # onnx's reference evaluator computes negative pads for strides past the kernel
        attrs["strides"] = [min(s, e) for s, e in zip(attrs["strides"], ext)]
    if op == "AveragePool":
        attrs["count_include_pad"] = int(draw(st.booleans()))
    return op, _rand((n, c, h, w), draw(st.integers(0, 1000))), attrs


#: onnx's ReferenceEvaluator mishandles some pads / dilations of its pooling ops: the
#: project's numpy backend is the reference for pooling (as in tests/native).
POOL_REFERENCE = {"MaxPool": "MaxPool.numpy.offsets", "AveragePool": "AveragePool.numpy.offsets"}


def _pool_case(op: str, x: np.ndarray, attrs: dict):
    node, _ = make_node(op, [x], attrs)
    y = registry().impl(POOL_REFERENCE[op]).build(node)(x)
    node, _ = make_node(op, [x], attrs, output_shapes=[y.shape], output_dtypes=[y.dtype])
    return node, [y]


@settings(max_examples=80, deadline=None)
@given(data=pool_cases())
def test_pooling_matches_reference(data):
    op, x, attrs = data
    node, ref = _pool_case(op, x, attrs)
    impls = supporting(op, node)
    if not impls:  # count_include_pad with ceil-mode windows past the padding, or a MaxPool
        # window entirely in the padding (oneDNN: -FLT_MAX, ONNX: -inf)
        reason = registry().impl(f"{op}.onednn.std").supports(node)
        assert "count_include_pad" in reason or "entirely in the padding" in reason, reason
        return
    reasons = {i.name: i.supports(node) for i in onednn_impls(op)}
    assert reasons[f"{op}.onednn.std"] is None, reasons
    assert all(r is None or "reference implementation" in r for r in reasons.values()), reasons
    check_all(op, node, [x], ref, atol=1e-5)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(1, 5, 7, 7), (2, 20, 3, 1), (1, 64, 1, 1)])
def test_global_pooling(op, shape):
    x = _rand(shape, 12)
    node, ref = case(op, [x], {})
    ran = check_all(op, node, [x], ref, atol=1e-5, expect=4)
    refused = [i.name for i in onednn_impls(op) if ONLY_REFERENCE in (i.supports(node) or "")]
    assert len(ran) + len(refused) == 4, (ran, refused)


def test_maxpool_with_indices_is_not_supported():
    node, _ = case("MaxPool", [_rand((1, 2, 4, 4))], {"kernel_shape": [2, 2]})
    node.outputs.append(Value("idx", (1, 2, 3, 3), np.dtype(np.int64)))
    assert "Indices" in registry().impl("MaxPool.onednn.std").supports(node)


# -- eltwise ---------------------------------------------------------------------------------

UNARY_ATTRS = {"LeakyRelu": {"alpha": 0.2}, "Elu": {"alpha": 0.7}}


@pytest.mark.parametrize("op", sorted(onednn_elementwise.UNARY))
@pytest.mark.parametrize("shape", [(2, 20, 3, 5), (1, 32, 2, 2), (3, 7)])
def test_unary_in_every_layout(op, shape):
    positive = op in ("Sqrt", "Log")
    x = _rand(shape, 13, positive=positive)
    opset = 20 if op == "Gelu" else 21
    ins: list = [x]
    const: tuple = ()
    if op == "Clip":
        ins, const = [x, np.float32(-0.3), np.float32(0.8)], (1, 2)
    node, ref = case(op, ins, UNARY_ATTRS.get(op), opset=opset, const_inputs=const)
    names = check_all(op, node, ins, ref, rtol=1e-4, atol=1e-5)
    expected = (1 if len(shape) != 4
                else 4 if onednn_elementwise.UNARY[op].zero((-0.3, 0.8)) or shape[1] % 16 == 0
                else 2)
    assert len(names) == expected, names


def test_empty_tensors_are_left_to_other_backends():
    for op, ins in (("Relu", [np.zeros((2, 0, 4), np.float32)]),
                    ("Mul", [np.zeros((2, 0, 4), np.float32)] * 2),
                    ("MatMul", [np.zeros((0, 3), np.float32), np.zeros((3, 4), np.float32)])):
        node, _ = case(op, ins, {})
        assert not supporting(op, node), op
        assert all("empty" in i.supports(node) for i in onednn_impls(op) if "shapes" not in i.supports(node))


def test_gelu_tanh_approximation():
    x = _rand((2, 16, 3, 3), 14)
    node, ref = case("Gelu", [x], {"approximate": "tanh"}, opset=20)
    check_all("Gelu", node, [x], ref, atol=1e-5, expect=4)


def test_blocked_outputs_keep_zero_padding():
    """Sigmoid(0) = 0.5: in nchw16c with C=20 oneDNN must leave the padding channels zero."""
    impl = registry().impl("Sigmoid.onednn.nchw16c")
    node, _ = case("Sigmoid", [_rand((1, 32, 2, 2))], {})
    assert impl.supports(node) is None
    x = _rand((1, 20, 2, 2))
    node, _ref = case("Sigmoid", [x], {})
    assert "whole channel blocks" in impl.supports(node)


@pytest.mark.parametrize("op", sorted(onednn_elementwise.BINARY))
@pytest.mark.parametrize(("sa", "sb"), [((2, 20, 3, 5), (2, 20, 3, 5)), ((2, 32, 3, 3), (2, 32, 3, 3)),
                                        ((2, 20, 3, 5), (20, 1, 1)), ((3, 1), (3, 4))])
def test_binary_matches_reference(op, sa, sb):
    a, b = _rand(sa, 15), _rand(sb, 16, positive=op == "Div")
    node, ref = case(op, [a, b], {})
    impls = supporting(op, node)
    commutative = onednn_elementwise.BINARY[op][1]
    if not commutative and tuple(node.outputs[0].shape) != sa:
        assert not impls
        assert "not commutative" in registry().impl(f"{op}.onednn.broadcast").supports(node)
        return
    check_all(op, node, [a, b], ref, atol=1e-5)


def test_add_relu_fused():
    a, b = _rand((2, 20, 3, 5), 17), _rand((2, 20, 3, 5), 18)
    node, ref = case("Add", [a, b], {})
    names = check_all("Add+Relu", _chain(node, [("Relu", [])]), [a, b], [np.maximum(ref[0], 0)],
                      atol=1e-5, expect=4)
    assert "Add+Relu.onednn.nhwc_same" in names


# -- batch normalization ---------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 20, 3, 5), (1, 32, 4, 4), (3, 7), (2, 5, 4)])
@pytest.mark.parametrize("relu", [False, True])
def test_batchnorm_matches_reference(shape, relu):
    c = shape[1]
    x = _rand(shape, 19)
    params = [_rand((c,), 20), _rand((c,), 21), _rand((c,), 22), _rand((c,), 23, positive=True)]
    node, ref = case("BatchNormalization", [x, *params], {"epsilon": 1e-3}, const_inputs=(1, 2, 3, 4))
    want = np.maximum(ref[0], 0) if relu else ref[0]
    op = "BatchNormalization+Relu" if relu else "BatchNormalization"
    target = _chain(node, [("Relu", [])]) if relu else node
    names = check_all(op, target, [x, *params], [want], atol=1e-4)
    assert len(names) == (4 if len(shape) == 4 else 1), names


def test_batchnorm_padding_stays_zero():
    x = _rand((1, 20, 3, 3), 24)
    params = [_rand((20,), 25), _rand((20,), 26), _rand((20,), 27), _rand((20,), 28, positive=True)]
    node, _ = case("BatchNormalization", [x, *params], {}, const_inputs=(1, 2, 3, 4))
    impl = registry().impl("BatchNormalization.onednn.nchw16c")
    (to,) = registry().layouts.path("std", "nchw16c", x.shape, F32)
    y = impl.build(node)(to(x, x.shape), *params)
    assert np.all(y[:, 1, :, :, 4:] == 0)


def test_batchnorm_needs_constant_parameters():
    x = _rand((1, 4, 2, 2))
    params = [_rand((4,)), _rand((4,)), _rand((4,)), _rand((4,), positive=True)]
    node, _ = case("BatchNormalization", [x, *params], {}, const_inputs=(1, 2, 3))
    assert "constant" in registry().impl("BatchNormalization.onednn.std").supports(node)


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m: m.Eltwise("cube", 0, 0, [4], "a"), "unknown eltwise kind"),
        (lambda m: m.Eltwise("clip", 2, 1, [4], "a"), "lo <= hi"),
        (lambda m: m.Eltwise("relu", 0, 0, [4], "a")(np.zeros(5, np.float32)), "elements"),
        (lambda m: m.Binary("pow", [4], "a", [4], "a"), "unknown binary kind"),
        (lambda m: m.Binary("add", [4, 3], "ab", [2, 3], "ab"), "does not broadcast"),
        (lambda m: m.Binary("add", [4], "a", [4], "a")(np.zeros(4, np.float32), np.zeros(4)), "float32"),
        (lambda m: m.Pool([1, 2, 3], "max", "abcd"), "14 ints"),
        (lambda m: m.Pool([1, 2, 3, 3, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0], "median", "abcd"), "kind"),
        (lambda m: m.Pool([1, 2, 3, 3, 5, 5, 1, 1, 1, 1, 0, 0, 0, 0], "max", "abcd"), "empty"),
        (lambda m: m.Pool([1, 2, 3, 3, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0], "max", "abcd")(
            np.zeros((1, 2, 3, 4), np.float32)),
         "expected shape"),
        (lambda m: m.MatMul([2, 3], [4, 5], False, "ab", "ab"), "inner dims"),
        (lambda m: m.MatMul([2, 3, 4], [5, 4, 2], False, "abc", "abc"), "broadcast"),
        (lambda m: m.MatMul([2, 3], [3, 5], True, "ab", "ab")(
            np.zeros((2, 3), np.float32), np.zeros((3, 5), np.float32)),
         "bias"),
        (lambda m: m.BatchNorm([2], "a", 1e-5, False, np.zeros(2, np.float32), np.zeros(2, np.float32),
                               np.zeros(2, np.float32), np.ones(2, np.float32)), r"\(N, C"),
        (lambda m: m.BatchNorm([1, 3, 2, 2], "abcd", 1e-5, False, np.zeros(2, np.float32),
                               np.zeros(3, np.float32), np.zeros(3, np.float32), np.ones(3, np.float32)),
         "scale"),
    ],
)
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call(onednn())


def test_a_maxpool_window_entirely_in_the_padding_is_refused():
    """A dilated window that lands only in padding: ONNX's maximum there is -inf, oneDNN's is
    -FLT_MAX (found by the pooling property test), so oneDNN refuses the node."""
    x = np.array([[[[0.125]]]], np.float32)
    attrs = {"kernel_shape": [1, 2], "strides": [1, 1], "dilations": [1, 2], "pads": [0, 1, 0, 1]}
    node, _ = case("MaxPool", [x], attrs)
    assert "entirely in the padding" in registry().impl("MaxPool.onednn.std").supports(node)
    attrs["pads"] = [0, 0, 0, 0]
    x2 = np.ones((1, 1, 1, 3), np.float32)
    node, _ = case("MaxPool", [x2], attrs)
    assert registry().impl("MaxPool.onednn.std").supports(node) is None


def test_unpickled_float32_weights_and_inputs_run():
    """An unpickled array's dtype is not numpy's float32 singleton; the bindings once compared
    dtypes by identity and refused it ("expected a float32 array, received dtype float32")."""
    import pickle

    a, b, c = (pickle.loads(pickle.dumps(x)) for x in (_rand((3, 7), 1), _rand((7, 5), 2), _rand((5,), 3)))
    assert a.dtype is not np.dtype(np.float32) and a.dtype == np.float32  # what the test is about
    node, ref = case("Gemm", [a, b, c], {}, const_inputs=(1, 2))
    check_all("Gemm", node, [a, b, c], ref, atol=1e-4)
