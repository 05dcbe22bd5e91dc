"""The numpy references of ConvInteger and QLinearConv (issue 52: the quantizers' QOperator CNNs)
equal onnxruntime's kernels: uint8 / int8 activations and weights, zero points per tensor and
per output channel, per-channel scales, bias, padding (the zero point), strides, dilations,
groups, 1-D and 2-D, saturation."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from dispatch.session import Session
from tests.numpy.contrib_support import exact_on_this_cpu

ort = pytest.importorskip("onnxruntime")

_TYPES = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}

#: (x shape, w shape, attributes)
GEOMETRIES = [
    ((1, 3, 9, 9), (8, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 4, 10, 7), (6, 2, 3, 2), {"group": 2, "strides": [2, 1], "pads": [0, 1, 2, 0]}),
    ((1, 6, 8, 8), (6, 1, 3, 3), {"group": 6, "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((1, 5, 11), (4, 5, 3), {"auto_pad": "SAME_UPPER", "strides": [2]}),
    ((1, 8, 5, 5), (16, 8, 1, 1), {}),
]


def _rand(rng: np.random.Generator, dtype: type, shape) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, size=shape).astype(dtype)


def _run_both(node, feeds: dict[str, np.ndarray], out_type: int,
              onnx_reference: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The numpy backend's result and onnxruntime's (onnx's reference evaluator's with
    ``onnx_reference``) of one-node ``node``; feeds named ``c_*`` are initializers. onnxruntime
    runs the model's exact form (tests.numpy.contrib_support.exact_on_this_cpu)."""
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
              for k, v in feeds.items() if not k.startswith("c_")]
    inits = [numpy_helper.from_array(v, k) for k, v in feeds.items() if k.startswith("c_")]
    outputs = [helper.make_tensor_value_info("y", out_type, None)]
    graph = helper.make_graph([node], "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    runtime = {k: v for k, v in feeds.items() if not k.startswith("c_")}
    if onnx_reference:
        from onnx.reference import ReferenceEvaluator

        want = ReferenceEvaluator(model).run(None, runtime)[0]
    else:  # (where this CPU's uint8 x int8 kernels saturate, the same products unsaturated)
        exact = exact_on_this_cpu(model).SerializeToString()
        want = ort.InferenceSession(exact, providers=["CPUExecutionProvider"]).run(None, runtime)[0]
    got = Session(model, store=False, backends=["numpy"]).run(None, runtime)[0]
    return got, want


@pytest.mark.parametrize("geometry", range(len(GEOMETRIES)))
@pytest.mark.parametrize("xt,wt", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
@pytest.mark.parametrize("per_channel", [False, True])
def test_conv_integer_matches_onnxruntime(geometry, xt, wt, per_channel):
    """onnxruntime 1.32's ConvInteger takes uint8 X and one w_zero_point: per channel, onnx's
    reference evaluator is the judge."""
    if xt == np.int8:
        pytest.skip("onnxruntime's ConvInteger takes uint8 X")
    rng = np.random.default_rng(geometry)
    xs, ws, attrs = GEOMETRIES[geometry]
    if per_channel and len(xs) != 4:
        pytest.skip("onnx 1.23's reference ConvInteger broadcasts per-channel zero points in 2-D only")
    feeds = {"x": _rand(rng, xt, xs), "c_w": _rand(rng, wt, ws),
             "c_xz": _rand(rng, xt, ()), "c_wz": _rand(rng, wt, (ws[0],) if per_channel else ())}
    node = helper.make_node("ConvInteger", ["x", "c_w", "c_xz", "c_wz"], ["y"], **attrs)
    got, want = _run_both(node, feeds, TensorProto.INT32, onnx_reference=per_channel)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("geometry", range(len(GEOMETRIES)))
@pytest.mark.parametrize("xt,wt", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_qlinear_conv_matches_onnxruntime(geometry, xt, wt, per_channel, bias):
    rng = np.random.default_rng(10 + geometry)
    xs, ws, attrs = GEOMETRIES[geometry]
    m = ws[0]
    wz = np.zeros((m,) if per_channel else (), wt) if wt == np.int8 else _rand(rng, wt, (m,) if per_channel
                                                                            else ())
    if wt == np.uint8 and per_channel:
        wz = np.full((m,), wz.ravel()[0], wt)  # onnxruntime: per-channel uint8 W zero points alike
    feeds = {
        "x": _rand(rng, xt, xs), "c_xs": np.float32(rng.uniform(0.01, 0.05)),
        "c_xz": _rand(rng, xt, ()), "c_w": _rand(rng, wt, ws),
        "c_ws": rng.uniform(0.002, 0.02, size=(m,) if per_channel else ()).astype(np.float32),
        "c_wz": wz, "c_ys": np.float32(rng.uniform(0.05, 0.4)), "c_yz": _rand(rng, xt, ()),
    }
    names = ["x", "c_xs", "c_xz", "c_w", "c_ws", "c_wz", "c_ys", "c_yz"]
    if bias:
        feeds["c_b"] = rng.integers(-2000, 2000, size=(m,)).astype(np.int32)
        names.append("c_b")
    node = helper.make_node("QLinearConv", names, ["y"], **attrs)
    got, want = _run_both(node, {k: np.asarray(v) for k, v in feeds.items()}, _TYPES[xt])
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_saturation_and_empty_batch():
    rng = np.random.default_rng(3)
    feeds = {"x": np.full((1, 2, 4, 4), 255, np.uint8), "c_xs": np.float32(1.0), "c_xz": np.uint8(0),
             "c_w": np.full((3, 2, 2, 2), 127, np.int8), "c_ws": np.float32(1.0), "c_wz": np.int8(0),
             "c_ys": np.float32(0.5), "c_yz": np.uint8(rng.integers(0, 255))}
    node = helper.make_node("QLinearConv", list(feeds), ["y"])
    got, want = _run_both(node, {k: np.asarray(v) for k, v in feeds.items()}, TensorProto.UINT8)
    np.testing.assert_array_equal(got, want)
    assert (got == 255).all()
