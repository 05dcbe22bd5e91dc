"""Load-time simplification: constant folding, no-op removal, BatchNormalization folding."""

from __future__ import annotations

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from dispatch import Session
from dispatch.backend import load_registry
from dispatch.onnx_import import import_model
from dispatch.passes import simplify
from tests.builders import ModelBuilder, small_cnn


def _weights_by_shape_chain() -> onnx.ModelProto:
    """x -> Conv(W) where W = ConstantOfShape(Unsqueeze(Shape(x)[1]...)) style chain."""
    b = ModelBuilder(opset=13)
    x = b.input("x", [1, 4, 5, 5])
    shp = b.op("Shape", [x])                      # [1, 4, 5, 5]
    c = b.op("Gather", [shp, b.const(np.array(1, np.int64))], axis=0)  # 4
    cu = b.op("Unsqueeze", [c, b.const(np.array([0], np.int64))])      # [4]
    wshape = b.op("Concat", [cu, cu, b.const(np.array([1, 1], np.int64))], axis=0)  # [4,4,1,1]
    w = b.op("ConstantOfShape", [wshape], value=onnx.numpy_helper.from_array(np.array([0.5], np.float32)))
    y = b.op("Conv", [x, w])
    i = b.op("Identity", [y])
    d = b.op("Dropout", [i])
    b.output(b.op("Relu", [d]))
    return b.build()


def test_constant_chains_fold_and_noops_vanish():
    reg = load_registry()
    g = import_model(_weights_by_shape_chain())
    stats = simplify(g, reg)
    assert [n.op_type for n in g.nodes] == ["Conv", "Relu"]
    assert stats["folded_constants"] >= 5 and stats["removed_noops"] == 2
    w = g.nodes[0].input(1)
    assert w.is_const and w.shape == (4, 4, 1, 1) and np.all(w.const == 0.5)


def test_simplified_model_still_matches_reference():
    model = _weights_by_shape_chain()
    x = np.random.default_rng(1).standard_normal((1, 4, 5, 5)).astype(np.float32)
    (ref,) = ReferenceEvaluator(model).run(None, {"x": x})
    (got,) = Session(model, backends=["numpy"]).run(None, {"x": x})
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_batchnorm_folds_into_conv_and_keeps_numerics():
    model = small_cnn()
    reg = load_registry()
    g = import_model(model)
    stats = simplify(g, reg)
    assert stats["folded_batchnorm"] == 1
    assert "BatchNormalization" not in [n.op_type for n in g.nodes]
    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)
    (ref,) = ReferenceEvaluator(model).run(None, {"x": x})
    (got,) = Session(model, backends=["numpy"]).run(None, {"x": x})
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)


def test_identity_to_graph_output_keeps_output_name():
    b = ModelBuilder()
    x = b.input("x", [2, 3])
    r = b.op("Relu", [x])
    out = b.op("Identity", [r])
    b.output(out)
    sess = Session(b.build(), backends=["numpy"])
    assert [o.name for o in sess.get_outputs()] == [out]
    assert [n.op_type for n in sess.graph.nodes] == ["Relu"]
    a = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": a})[0], np.maximum(a, 0))


def test_identity_of_input_to_output_is_kept():
    b = ModelBuilder()
    x = b.input("x", [2])
    b.output(b.op("Identity", [x]))
    sess = Session(b.build(), backends=["numpy"])
    a = np.array([1.0, 2.0], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": a})[0], a)
