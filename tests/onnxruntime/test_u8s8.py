"""onnxruntime's uint8 x int8 products on CPUs without VNNI (impls.onnxruntime.u8s8): the probe,
the widened weights (the exact integer math on every CPU), and the regions that use them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from impls.onnxruntime.u8s8 import saturates_u8s8, widen_int8_weights

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(5858)
K = 96


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def extreme_operands() -> tuple[np.ndarray, np.ndarray]:
    """uint8 activations near 255 and int8 weights near +-127: adjacent products whose pair
    sums pass 32767, where a saturating kernel clips."""
    a = RNG.integers(200, 256, (3, K)).astype(np.uint8)
    b = (RNG.choice([-1, 1], (K, 5)) * RNG.integers(100, 128, (K, 5))).astype(np.int8)
    return a, b


def matmul_integer(b: np.ndarray, b_zero: int | None) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(b, "b")]
    inputs = ["a", "b"]
    if b_zero is not None:
        inits.append(numpy_helper.from_array(np.asarray(b_zero, np.int8), "bz"))
        inputs += ["", "bz"]
    graph = helper.make_graph([helper.make_node("MatMulInteger", inputs, ["y"])], "mmi",
                              [helper.make_tensor_value_info("a", TensorProto.UINT8, [3, K])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [3, 5])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("b_zero", [None, 3])
def test_widened_weights_compute_the_exact_integer_products(b_zero):
    a, b = extreme_operands()
    model = matmul_integer(b, b_zero)
    exact = a.astype(np.int64) @ (b.astype(np.int64) - (b_zero or 0))
    raw = run(model, {"a": a})
    widened = onnx.ModelProto()
    widened.CopyFrom(model)
    assert widen_int8_weights(widened) == ["b"]
    inits = {t.name: t for t in widened.graph.initializer}
    assert inits["b"].data_type == TensorProto.UINT8
    zero_name = widened.graph.node[0].input[3]
    assert numpy_helper.to_array(inits[zero_name]).dtype == np.uint8
    assert int(numpy_helper.to_array(inits[zero_name])) == (b_zero or 0) + 128
    np.testing.assert_array_equal(run(widened, {"a": a}), exact)
    # the probe says what this CPU does: onnxruntime's own kernel clips here, or it is exact
    if saturates_u8s8():
        assert not np.array_equal(raw, exact)
    else:
        np.testing.assert_array_equal(raw, exact)


def qdq_matmul(activation: int, weight_zero: bool) -> onnx.ModelProto:
    """Q -> DQ (activation, ``activation`` type) and DQ (int8 weight, per column) -> MatMul: the
    pattern onnxruntime fuses into an integer kernel."""
    act_zero = np.asarray(3, np.uint8 if activation == TensorProto.UINT8 else np.int8)
    w = (RNG.choice([-1, 1], (K, 5)) * RNG.integers(100, 128, (K, 5))).astype(np.int8)
    inits = [numpy_helper.from_array(np.asarray(0.05, np.float32), "xs"),
             numpy_helper.from_array(act_zero, "xz"), numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(np.full(5, 0.01, np.float32), "ws")]
    w_inputs = ["w", "ws"]
    if weight_zero:
        inits.append(numpy_helper.from_array(np.zeros(5, np.int8), "wz"))
        w_inputs.append("wz")
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", w_inputs, ["wd"], axis=1),
             helper.make_node("MatMul", ["xd", "wd"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("activation", [TensorProto.UINT8, TensorProto.INT8], ids=["uint8", "int8"])
@pytest.mark.parametrize("weight_zero", [True, False])
def test_qdq_weights_widened_give_the_float_math(activation, weight_zero):
    """The weight's DequantizeLinear becomes uint8 (a per-column zero point of 128 where it had
    none); onnxruntime's result is the dequantized MatMul's."""
    model = qdq_matmul(activation, weight_zero)
    x = RNG.uniform(0, 6, (3, K)).astype(np.float32)
    widened = onnx.ModelProto()
    widened.CopyFrom(model)
    assert widen_int8_weights(widened) == ["w"]
    dq = widened.graph.node[2]
    zeros = numpy_helper.to_array({t.name: t for t in widened.graph.initializer}[dq.input[2]])
    assert zeros.dtype == np.uint8 and zeros.shape == (5,) and set(zeros.tolist()) == {128}
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    unfused = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    want = unfused.run(None, {"x": x})[0]
    np.testing.assert_allclose(run(widened, {"x": x}), want, rtol=1e-5, atol=1e-4)


def test_int8_activations_of_a_qoperator_node_are_left_alone():
    """int8 x int8 QGemm: MLAS's kernel does not saturate; the model is not rewritten."""
    w = np.ones((4, 2), np.int8)
    inits = [numpy_helper.from_array(np.asarray(v, t), n) for n, v, t in
             (("as", 0.1, np.float32), ("az", 0, np.int8), ("bs", 0.1, np.float32), ("bz", 0, np.int8))]
    inits.append(numpy_helper.from_array(w, "b"))
    node = helper.make_node("QGemm", ["a", "as", "az", "b", "bs", "bz"], ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "qgemm", [helper.make_tensor_value_info("a", TensorProto.INT8, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("com.microsoft", 1)])
    assert widen_int8_weights(model) == []
    assert {t.name: t for t in model.graph.initializer}["b"].data_type == TensorProto.INT8


def test_a_zero_point_two_weights_share_is_widened_once():
    a, b = extreme_operands()
    model = matmul_integer(b, 2)
    second = numpy_helper.from_array(b[::-1].copy(), "b2")
    model.graph.initializer.append(second)
    model.graph.node.append(helper.make_node("MatMulInteger", ["a", "b2", "", "bz"], ["y2"]))
    model.graph.output.append(helper.make_tensor_value_info("y2", TensorProto.INT32, [3, 5]))
    assert sorted(widen_int8_weights(model)) == ["b", "b2"]
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert int(inits["bz"]) == 130 and inits["bz"].dtype == np.uint8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    y, y2 = sess.run(None, {"a": a})
    np.testing.assert_array_equal(y, a.astype(np.int64) @ (b.astype(np.int64) - 2))
    np.testing.assert_array_equal(y2, a.astype(np.int64) @ (b[::-1].astype(np.int64) - 2))


def test_an_onnxruntime_region_computes_the_exact_products_on_every_cpu():
    """A Session on onnxruntime alone: where this CPU saturates, its region runs the widened
    weights; the result is the integer product either way."""
    from dispatch import Session

    a, b = extreme_operands()
    sess = Session(matmul_integer(b, None), backends=["onnxruntime"], store=False)
    np.testing.assert_array_equal(sess.run(None, {"a": a})[0], a.astype(np.int64) @ b.astype(np.int64))
