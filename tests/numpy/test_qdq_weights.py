"""QDQ weights as the tools write them (issue 52): 4-bit initializers (two a byte) pass the size
check and load as ml_dtypes' int4 / uint4 arrays, the numpy DequantizeLinear reads them per
block (opset 21 ``block_size``, either axis) as onnxruntime does, and the import keeps the
``DequantizeLinear`` of a constant quantized weight unfolded (the regions see the QDQ pattern)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dispatch.errors import ModelLoadError
from dispatch.onnx_weights import check_weight_size, read_initializers
from layouts.precision import dequantize_linear

ort = pytest.importorskip("onnxruntime")


def _packed(name: str, kind: int, values: np.ndarray) -> onnx.TensorProto:
    """A 4-bit initializer in raw_data (low nibble first), as the quantizers store them."""
    flat = (values.ravel().astype(np.int64) & 0xF).astype(np.uint8)
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    raw = (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8).tobytes()
    return helper.make_tensor(name, kind, list(values.shape), raw, raw=True)


@pytest.mark.parametrize("kind", [TensorProto.INT4, TensorProto.UINT4])
def test_4bit_initializers_hold_two_elements_a_byte(kind):
    lo, hi = (-8, 8) if kind == TensorProto.INT4 else (0, 16)
    vals = np.random.default_rng(0).integers(lo, hi, size=(64, 192))
    t = _packed("w", kind, vals)
    assert len(t.raw_data) == 64 * 192 // 2
    check_weight_size(t)  # 6,144 bytes for 12,288 elements: right
    arr = read_initializers(onnx.GraphProto(), [t])["w"]
    assert arr.shape == (64, 192)
    np.testing.assert_array_equal(arr.astype(np.int64), vals)
    odd = _packed("odd", kind, vals[:3, :5])  # 15 elements: 8 bytes
    assert len(odd.raw_data) == 8
    check_weight_size(odd)
    short = onnx.TensorProto(name="s", data_type=kind, dims=[64, 192], raw_data=b"\0" * 100)
    with pytest.raises(ModelLoadError, match=r"6,144 bytes of .*raw_data size \(100 bytes\) is too small"):
        check_weight_size(short)


def _ort_dequantize(x: onnx.TensorProto, scale: np.ndarray, zp: onnx.TensorProto | None,
                    axis: int, block: int) -> np.ndarray:
    names = ["x", "s"] + (["z"] if zp is not None else [])
    node = helper.make_node("DequantizeLinear", names, ["y"], axis=axis, block_size=block)
    inits = [x, numpy_helper.from_array(scale, "s")] + ([zp] if zp is not None else [])
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {})[0]


@pytest.mark.parametrize("kind", [TensorProto.INT4, TensorProto.UINT4])
@pytest.mark.parametrize("axis,block", [(0, 32), (1, 16), (0, 16), (-1, 32)])
@pytest.mark.parametrize("with_zp", [True, False])
def test_blocked_4bit_dequantize_matches_onnxruntime(kind, axis, block, with_zp):
    rng = np.random.default_rng(1)
    lo, hi = (-8, 8) if kind == TensorProto.INT4 else (0, 16)
    shape = (64, 48)
    vals = rng.integers(lo, hi, size=shape)
    ax = axis % 2
    sshape = list(shape)
    sshape[ax] = -(-shape[ax] // block)
    scale = rng.uniform(0.01, 0.1, size=sshape).astype(np.float32)
    zvals = rng.integers(lo, hi, size=sshape)
    x, zp = _packed("x", kind, vals), (_packed("z", kind, zvals) if with_zp else None)
    want = _ort_dequantize(x, scale, zp, axis, block)
    arrays = read_initializers(onnx.GraphProto(), [x] + ([zp] if zp is not None else []))
    got = dequantize_linear(arrays["x"], scale, arrays.get("z"), axis=axis, block_size=block)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def _qdq_matmul(weight: onnx.TensorProto, scale: np.ndarray, zp: onnx.TensorProto,
                block: int) -> onnx.ModelProto:
    """``x @ DequantizeLinear(w_q)``: per block along axis 0, or per column (``block`` 0)."""
    attrs = {"axis": 0, "block_size": block} if block else {"axis": 1}
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"], name="w_dq", **attrs),
             helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 48])],
        [weight, numpy_helper.from_array(scale, "w_s"), zp])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("kind,block", [(TensorProto.INT8, 0), (TensorProto.UINT4, 32),
                                        (TensorProto.INT4, 16)])
def test_weight_dequantize_stays_unfolded_and_runs(kind, block):
    """The import keeps ``w_q -> DequantizeLinear -> MatMul``: numpy alone reproduces
    onnxruntime's unoptimized float math, the default plan onnxruntime's default session."""
    from dispatch.session import Session

    rng = np.random.default_rng(2)
    lo, hi = {TensorProto.INT8: (-128, 128), TensorProto.INT4: (-8, 8), TensorProto.UINT4: (0, 16)}[kind]
    vals = rng.integers(lo, hi, size=(64, 48))
    sshape = [64 // block, 48] if block else [48]
    if kind == TensorProto.INT8:
        weight = numpy_helper.from_array(vals.astype(np.int8), "w_q")
        zp = numpy_helper.from_array(rng.integers(-3, 3, size=sshape).astype(np.int8), "w_z")
    else:
        weight, zp = _packed("w_q", kind, vals), _packed("w_z", kind, rng.integers(lo, hi, size=sshape))
    model = _qdq_matmul(weight, rng.uniform(0.01, 0.1, sshape).astype(np.float32), zp, block)
    onnx.checker.check_model(model)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    sess = Session(model, store=False, backends=["numpy"])
    assert [n.op_type for n in sess.graph.nodes] == ["DequantizeLinear", "MatMul"]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
    # the default plan's onnxruntime region fuses the pattern as onnxruntime does on the file, but
    # at MatMulNBits accuracy level 0 (float activations, as the file defines them; onnxruntime's
    # own default, level 4, rounds the activations to int8): it matches onnxruntime's session with
    # that option, and the unfused float math
    from impls.onnxruntime.region import QDQ_MATMULNBITS_LEVEL

    so = ort.SessionOptions()
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", QDQ_MATMULNBITS_LEVEL)
    fused = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    default = Session(model, store=False)
    assert "DequantizeLinear" in [n.op_type for n in default.graph.nodes]
    got = default.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, fused, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_a_qdq_models_dequantized_outputs_may_be_requantization_steps_apart():
    """End to end, a float output that a DequantizeLinear of a quantized activation makes may
    differ from the reference by QDQ_OUTPUT_STEPS steps of its scale (onnxruntime's QLinear
    kernels round integer sums, the reference float32 products); other outputs may not."""
    from dispatch.compare import MODEL_TOLERANCE, QDQ_OUTPUT_STEPS, check_outputs, dequantized_output_steps
    from dispatch.onnx_import import import_model

    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
             helper.make_node("Relu", ["x"], ["r"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("r", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.uint8(128), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    steps = dequantized_output_steps(import_model(model))
    assert steps == pytest.approx([QDQ_OUTPUT_STEPS * 0.05, 0.0])
    ref = [np.zeros(4, np.float32), np.zeros(4, np.float32)]
    two_steps = [np.full(4, 0.1, np.float32), np.zeros(4, np.float32)]
    assert check_outputs(two_steps, ref, [], tol=MODEL_TOLERANCE) is not None
    assert check_outputs(two_steps, ref, [], tol=MODEL_TOLERANCE, extra_atol=steps) is None
    three_steps = [np.full(4, 0.15, np.float32), np.zeros(4, np.float32)]
    assert check_outputs(three_steps, ref, [], tol=MODEL_TOLERANCE, extra_atol=steps) is not None
    off_relu = [np.zeros(4, np.float32), np.full(4, 0.01, np.float32)]
    assert check_outputs(off_relu, ref, [], tol=MODEL_TOLERANCE, extra_atol=steps) is not None
