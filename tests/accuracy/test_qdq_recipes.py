"""The static int8 variants' QDQ recipes (:mod:`impls.static_quant`): which tensors each
recipe quantizes, that a plan step stored before a recipe had a name builds the one it was
measured with, and OpenVINO's CNN recipe (residual additions and poolings quantized too)
against the numpy reference on a small residual CNN."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dispatch import Session
from tests.accuracy.test_accuracy import mlp_model
from tuner.tune import load_graph

pytest.importorskip("onnxruntime")


def residual_cnn(path: Path) -> Path:
    """Conv -> Relu -> Conv, plus the input (a 2-input ``Sum``, as onnx's ResNet-50 adds) ->
    Relu -> MaxPool -> Conv -> plus a constant (a bias, not a residual connection)."""
    rng = np.random.default_rng(1)

    def w(*shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32),
                                       f"w{len(inits)}")

    inits: list = []
    for shape in ((8, 8, 3, 3), (8, 8, 3, 3), (4, 8, 1, 1)):
        inits.append(w(*shape))
    inits.append(numpy_helper.from_array(np.full((1, 4, 1, 1), 0.5, np.float32), "bias"))
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w1"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Sum", ["c2", "x"], ["s"], name="residual"),
        helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
        helper.make_node("MaxPool", ["r2"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", "w2"], ["c3"], name="conv3"),
        helper.make_node("Add", ["c3", "bias"], ["y"], name="add_bias"),
    ]
    graph = helper.make_graph(nodes, "residual_cnn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def _region(model: Path, seed: int = 3):
    """The whole model as one region, calibrated on 8 random inputs of its input's shape."""
    from dispatch.backend import load_registry
    from dispatch.fusion import region_node
    from impls.static_quant import calibrate

    graph = load_graph(str(model), load_registry(), ["numpy"])
    node = region_node(graph, [n.name for n in graph.nodes])
    shape = tuple(graph.inputs[0].shape)
    rng = np.random.default_rng(seed)
    calibration = calibrate(node, [(rng.standard_normal(shape).astype(np.float32),) for _ in range(8)])
    return node, calibration


def _quantized(model) -> set[str]:
    """The tensors a QDQ model quantizes (activations: the weights' pairs are on initializers)."""
    weights = {i.name for i in model.graph.initializer}
    return {n.input[0] for n in model.graph.node
            if n.op_type == "QuantizeLinear" and n.input[0] not in weights}


def test_each_recipe_quantizes_what_it_says(tmp_path):
    from impls.static_quant import qdq_model

    node, calibration = _region(residual_cnn(tmp_path / "cnn.onnx"))
    node.attrs = {**node.attrs, "precision": {"dtype": "int8", "calibration": calibration}}
    ort, inputs, ov = (_quantized(qdq_model(node, r)) for r in ("onnxruntime", "inputs", "openvino"))
    assert inputs == {"x", "r1", "p"}  # the Convs' inputs only
    assert ort >= inputs | {"c1", "c2", "c3"}  # and the Conv outputs, for QLinearConv
    # OpenVINO's: the residual addition's inputs (the Sum made Add) and the pooling's too; the
    # bias addition (a constant) is no residual connection and stays in float
    assert ov == inputs | {"c2", "r2"}
    assert "y" not in ov and "c3" not in ov
    with pytest.raises(ValueError, match="unknown QDQ recipe 'fp4'.*known: onnxruntime, inputs, openvino"):
        qdq_model(node, "fp4")


def test_a_matmul_region_keeps_its_additions_in_float_as_nncf_does_for_transformers(tmp_path):
    from impls.static_quant import qdq_model

    node, calibration = _region(mlp_model(tmp_path / "mlp.onnx"))
    node.attrs = {**node.attrs, "precision": {"dtype": "int8", "calibration": calibration}}
    assert _quantized(qdq_model(node, "openvino")) == _quantized(qdq_model(node, "inputs")) == {"x", "r"}


def test_a_step_stored_before_recipes_had_names_builds_the_recipe_it_was_measured_with(tmp_path):
    from dispatch.backend import load_registry
    from impls.static_quant import qdq_model, recipe_of
    from tuner.accuracy.blocks import precision_of

    assert recipe_of({}).name == "onnxruntime"  # stop 39's steps
    assert recipe_of({"quantized_outputs": "no"}).name == "inputs"  # stop 40's OpenVINO steps
    assert recipe_of({"qdq_recipe": "openvino", "quantized_outputs": "no"}).name == "openvino"
    node, calibration = _region(residual_cnn(tmp_path / "cnn.onnx"))
    node.attrs = {**node.attrs, "precision": {"dtype": "int8", "calibration": calibration,
                                              "quantized_outputs": "no"}}
    assert _quantized(qdq_model(node)) == _quantized(qdq_model(node, "inputs"))
    reg = load_registry()
    assert precision_of(reg.impl("Region.onnxruntime.session_int8_static"))["qdq_recipe"] == "onnxruntime"
    if "openvino" in reg.available_backends():
        for name in ("Region.openvino.compiled_int8", "Region.openvino.compiled_int8_bf16"):
            assert precision_of(reg.impl(name))["qdq_recipe"] == "openvino"


@pytest.mark.parametrize("impl_name",
                         ["Region.openvino.compiled_int8", "Region.onnxruntime.session_int8_static"])
def test_the_static_int8_variants_on_a_residual_cnn_against_the_reference(tmp_path, impl_name):
    from dispatch.backend import load_registry
    from tuner.accuracy.blocks import precision_of

    reg = load_registry()
    if impl_name.split(".")[1] not in reg.available_backends():
        pytest.skip(f"{impl_name.split('.')[1]} is not available")
    model = residual_cnn(tmp_path / "cnn.onnx")
    node, calibration = _region(model)
    impl = reg.impl(impl_name)
    assert impl.supports(node) is None
    node.attrs = {**node.attrs, "precision": {**precision_of(impl), "calibration": calibration}}
    x = np.random.default_rng(9).standard_normal((1, 8, 16, 16)).astype(np.float32)
    expected = Session(str(model), backends=["numpy"], store=False).run(None, {"x": x})[0]
    got = impl.build(node)(x)[0]
    rel = np.abs(got - expected).max() / np.abs(expected).max()
    assert 0 < rel < 0.05, rel  # int8 (not float32), within what 8 bits keep of this range


def test_calibration_in_chunks_is_the_range_of_every_sample(tmp_path):
    from dispatch.backend import load_registry
    from dispatch.fusion import region_node
    from impls.static_quant import CALIBRATION_CHUNK, calibrate, calibration_stride

    assert [calibration_stride(n) for n in (1, 16, 19, 32, 128, 96, 31)] == [1, 16, 1, 16, 16, 16, 1]
    assert calibration_stride(24) == 12 and calibration_stride(CALIBRATION_CHUNK + 1) == 1

    graph = load_graph(str(residual_cnn(tmp_path / "cnn.onnx")), load_registry(), ["numpy"])
    node = region_node(graph, [n.name for n in graph.nodes])
    rng = np.random.default_rng(5)
    # more samples than a stride (of 10: 20 samples); the largest input in the last stride
    n = 20
    xs = [rng.standard_normal((1, 8, 16, 16)).astype(np.float32) for _ in range(n)]
    xs[-1] *= 4.0
    data = calibrate(node, [(x,) for x in xs])["data"]
    assert data["x"]["lowest"]["data"][0] == pytest.approx(min(float(x.min()) for x in xs))
    assert data["x"]["highest"]["data"][0] == pytest.approx(max(float(x.max()) for x in xs))
    # a tensor inside: the first chunk's range alone is narrower than the merged one
    first = calibrate(node, [(x,) for x in xs[:CALIBRATION_CHUNK]])["data"]
    assert data["r1"]["highest"]["data"][0] >= first["r1"]["highest"]["data"][0]
    assert data["r1"]["highest"]["data"][0] > first["r1"]["highest"]["data"][0] or \
        data["r1"]["lowest"]["data"][0] < first["r1"]["lowest"]["data"][0]
