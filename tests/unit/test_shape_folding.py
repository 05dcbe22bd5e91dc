"""Shape computations fold to constants at load (issue 14, item 2): subgraphs that compute
pads, shapes, ranges and broadcast targets from static shapes (Shape -> Gather -> Cast ->
arithmetic -> Concat -> Pad/Reshape/Slice/Expand/Range), with and without onnx's data
propagation, and through operators the reference backend cannot evaluate (onnx's reference
implementation folds them); a shape that needs the input data raises an error naming the node
and the chain of nodes that computes the value."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from dispatch import Session, onnx_import, shape_folding
from dispatch.backend import load_registry
from dispatch.errors import ModelLoadError
from dispatch.onnx_import import import_model
from dispatch.passes import simplify
from tests.builders import ModelBuilder

I64 = np.int64
SHAPE_OPS = {"Shape", "Gather", "Cast", "Mod", "Sub", "Div", "Mul", "Concat", "Unsqueeze",
             "ConstantOfShape", "Range"}


def _i(b: ModelBuilder, *values: int) -> str:
    return b.const(np.array(values, I64))


def _swin_like() -> onnx.ModelProto:
    """x [2, 3, 14, 10] -> Pad to multiples of 4 with pads computed as Swin's maybe_pad is
    exported (Shape, Gather, Mod, Sub, Mod, Cast, Unsqueeze, Concat), a Reshape whose target is
    computed with Div and Mul, a Slice whose end is half the width, an Expand to a computed
    shape and a Range over the computed height, all from static shapes."""
    b = ModelBuilder(opset=17)
    x = b.input("x", [2, 3, 14, 10])
    shp = b.op("Shape", [x])
    h = b.op("Gather", [shp, b.const(np.array(2, I64))], axis=0)
    w = b.op("Gather", [shp, b.const(np.array(3, I64))], axis=0)
    four = b.const(np.array(4, I64))
    pad_h = b.op("Mod", [b.op("Sub", [four, b.op("Mod", [h, four])]), four])
    pad_w = b.op("Cast", [b.op("Mod", [b.op("Sub", [four, b.op("Mod", [w, four])]), four])],
                 to=onnx.TensorProto.INT64)
    zero = _i(b, 0)
    pads = b.op("Concat", [zero, zero, zero, zero, zero, zero,
                           b.op("Unsqueeze", [pad_h, zero]), b.op("Unsqueeze", [pad_w, zero])],
                axis=0)
    padded = b.op("Pad", [x, pads])                                      # [2, 3, 16, 12]
    # Reshape to [N, C, H/2, 2, -1] with H/2 from a float Div and a Cast back
    ph = b.op("Gather", [b.op("Shape", [padded]), b.const(np.array(2, I64))], axis=0)
    half = b.op("Cast", [b.op("Div", [b.op("Cast", [ph], to=onnx.TensorProto.FLOAT),
                                      b.const(np.array(2.0, np.float32))])],
                to=onnx.TensorProto.INT64)
    target = b.op("Concat", [b.op("Shape", [padded], end=2), b.op("Unsqueeze", [half, zero]),
                             _i(b, 2), _i(b, -1)], axis=0)
    r = b.op("Reshape", [padded, target])                                # [2, 3, 8, 2, 12]
    # Slice the last axis to half of its (computed) length
    end = b.op("Div", [b.op("Shape", [r], start=-1), _i(b, 2)])
    s = b.op("Slice", [r, zero, end, _i(b, -1)])                        # [2, 3, 8, 2, 6]
    # Expand a bias to a shape computed with Mul, and a Range over the padded height
    bias_shape = b.op("Concat", [b.op("Shape", [s], end=-1), b.op("Mul", [_i(b, 3), _i(b, 2)])],
                      axis=0)
    bias = b.op("Expand", [b.const(np.array([0.5], np.float32)), bias_shape])
    steps = b.op("Cast", [b.op("Range", [b.const(np.array(0, I64)), ph, b.const(np.array(1, I64))])],
                 to=onnx.TensorProto.FLOAT)                              # [16]
    ramp = b.op("Reshape", [b.op("Slice", [steps, _i(b, 0), _i(b, 6), _i(b, 0)]), _i(b, 1, 6)])
    b.output(b.op("Add", [b.op("Add", [s, bias]), ramp]))
    return b.build()


@pytest.fixture(params=[True, False], ids=["data_prop", "no_data_prop"])
def data_prop(request, monkeypatch):
    """Run with onnx's data propagation, and without it (as for models where a constant of
    unknown size turns it off): folding alone must reach every shape."""
    if not request.param:
        monkeypatch.setattr(onnx_import, "_safe_for_data_prop", lambda inferred: False)
    return request.param


def _expected(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ReferenceEvaluator(model).run(None, {"x": x})[0]


def test_shape_chains_fold_to_constants(data_prop):
    model = _swin_like()
    g = import_model(model)
    simplify(g, load_registry())
    left = [n.op_type for n in g.nodes]
    assert not set(left) & SHAPE_OPS, left
    assert left.count("Pad") == 1 and left.count("Reshape") == 1 and "Slice" in left
    for node in g.nodes:
        if node.op_type in ("Pad", "Reshape", "Slice", "Expand"):
            assert all(v is None or v.is_const for v in node.inputs[1:]), node.name
    x = np.random.default_rng(0).standard_normal((2, 3, 14, 10)).astype(np.float32)
    got = Session(model, backends=["numpy"], store=False).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, _expected(model, x), rtol=1e-6, atol=1e-6)


def _without_mod(monkeypatch):
    """A registry whose backends know no Mod (as before the numpy backend had one)."""
    reg = load_registry()
    has_op = reg.has_op
    monkeypatch.setattr(reg, "has_op", lambda op: op != "Mod" and has_op(op))
    return reg


def test_folding_reaches_operators_the_reference_backend_lacks(monkeypatch, data_prop):
    """The Swin failure of issue 14: Mod had no reference implementation, its chain was not
    folded and the Pad "depended on the runtime values" of a value computed from shapes.
    onnx's reference implementation now folds what the backends cannot."""
    reg = _without_mod(monkeypatch)
    g = import_model(_swin_like())
    simplify(g, reg)
    assert not {n.op_type for n in g.nodes} & SHAPE_OPS
    pad = next(n for n in g.nodes if n.op_type == "Pad")
    np.testing.assert_array_equal(pad.inputs[1].const, [0, 0, 0, 0, 0, 0, 2, 2])


def test_a_chain_that_cannot_fold_is_named(monkeypatch):
    """When nothing can evaluate a node of the chain, the Pad's output is left dynamic, and
    why says that the value comes from constants only, names the chain and the node, and why
    it was not folded."""
    reg = _without_mod(monkeypatch)

    def refuse(node, inputs):
        raise RuntimeError("no onnx reference either")

    monkeypatch.setattr(shape_folding, "onnx_reference_evaluate", refuse)
    monkeypatch.setattr(onnx_import, "_safe_for_data_prop", lambda inferred: False)
    g = import_model(_swin_like())
    simplify(g, reg)
    pad = next(n for n in g.nodes if n.op_type == "Pad")
    assert pad.outputs[0].shape is None
    text = g.dynamic[pad.outputs[0].name]
    assert "output shape of node 'Pad_" in text and "computed from constants" in text
    assert "could not be folded" in text and "(Mod) has constant inputs only" in text
    assert "-> Concat_" in text and "(Concat) -> Pad_" in text
    assert "no onnx reference either" in text


def _data_dependent(kind: str) -> onnx.ModelProto:
    b = ModelBuilder(opset=17)
    x = b.input("x", [2, 3, 4, 4])
    p = b.input("p", [2], I64 if kind == "int" else np.float32)
    if kind == "float":  # float data -> Mul -> Cast -> Concat -> Pad
        p = b.op("Cast", [b.op("Mul", [p, b.const(np.array(2.0, np.float32))], name="scale")],
                 to=onnx.TensorProto.INT64, name="to_int")
    else:
        p = b.op("Add", [p, _i(b, 1)], name="plus_one")
    pads = b.op("Concat", [_i(b, 0, 0, 0, 0, 0, 0), p], axis=0, name="pads")
    b.output(b.op("Pad", [x, pads], name="pad"))
    return b.build()


@pytest.mark.parametrize("kind, chain", [
    ("int", "graph input 'p' -> plus_one (Add) -> pads (Concat) -> pad (Pad)"),
    ("float", "graph input 'p' -> scale (Mul) -> to_int (Cast) -> pads (Concat) -> pad (Pad)"),
])
def test_pads_from_input_data_name_the_chain(kind, chain):
    """Pads computed from the input data: the output's shape is left to the run (a dynamic
    value, issue 31), the graph says why with the chain, and every run matches onnx."""
    model = _data_dependent(kind)
    sess = Session(model, backends=["numpy"], store=False)
    (text,) = sess.graph.dynamic.values()
    assert "output shape of node 'pad' (Pad) depends on the runtime values of" in text
    assert f"the chain that needs the input data: {chain}" in text
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    for pv in ([0, 1], [2, 0], [1, 3]):
        p = np.array(pv, I64 if kind == "int" else np.float32)
        want = ReferenceEvaluator(model).run(None, {"x": x, "p": p})[0]
        got = sess.run(None, {"x": x, "p": p})[0]
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_reshape_target_from_input_data_names_the_chain():
    b = ModelBuilder(opset=17)
    x = b.input("x", [2, 6])
    n = b.input("n", [1], I64)
    target = b.op("Concat", [b.op("Abs", [n], name="abs"), _i(b, -1)], axis=0, name="target")
    b.output(b.op("Reshape", [x, target], name="reshape"))
    sess = Session(b.build(), backends=["numpy"], store=False)
    (why,) = sess.graph.dynamic.values()
    assert re.search(r"'reshape' \(Reshape\) depends on the runtime values of .*graph input "
                     r"'n' -> abs \(Abs\) -> target \(Concat\) -> reshape \(Reshape\)", why)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    for n in (1, 3, -4):
        got = sess.run(None, {"x": x, "n": np.array([n], I64)})[0]
        np.testing.assert_array_equal(got, x.reshape(abs(n), -1))


def _pool(ceil_mode: int, op: str = "AveragePool") -> onnx.ModelProto:
    b = ModelBuilder(opset=17)
    x = b.input("x", [2, 4, 3, 3])
    b.output(b.op(op, [x], kernel_shape=[4, 4], strides=[4, 4], ceil_mode=ceil_mode))
    return b.build()


@pytest.mark.parametrize("op", ["AveragePool", "MaxPool"])
def test_ceil_mode_pool_larger_than_its_input_loads(op):
    """nn.AvgPool2d(k, ceil_mode=True) on a map smaller than k (EfficientNet's pooler, as the
    dynamo exporter writes it): one window, clipped to the input."""
    ort = pytest.importorskip("onnxruntime")
    model = _pool(1, op)
    x = np.random.default_rng(0).standard_normal((2, 4, 3, 3)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = Session(model, backends=["numpy"], store=False).run(None, {"x": x})[0]
    assert got.shape == ref.shape == (2, 4, 1, 1)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    with pytest.raises(ModelLoadError, match="window spans 4 elements"):
        Session(_pool(0, op), backends=["numpy"], store=False)
