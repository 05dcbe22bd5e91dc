"""Control-flow bodies and dynamic values at import (issue 31): outer-scope reads become
implicit inputs, a pass that renames an outer value keeps the body's name working on every
backend, Paddle2ONNX's ``-1`` dimensions read as dynamic, and values whose shape the data
decides are left to the run."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from dispatch import Session
from dispatch.onnx_import import import_model
from dispatch.subgraph import Subgraph, outer_names

ort = pytest.importorskip("onnxruntime")


def _if_reading(outer: str, *, identity: bool) -> onnx.ModelProto:
    """``y = If(sum(x) > 0, outer + outer, -outer)``; ``outer`` is ``x`` itself or, with
    ``identity``, an Identity of it (which the load-time passes remove, renaming the value
    the bodies read)."""
    then_g = h.make_graph([h.make_node("Add", [outer, outer], ["t"])], "then", [],
                          [h.make_tensor_value_info("t", T.FLOAT, [2, 3])])
    else_g = h.make_graph([h.make_node("Neg", [outer], ["e"])], "else", [],
                          [h.make_tensor_value_info("e", T.FLOAT, [2, 3])])
    nodes = [h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             h.make_node("Greater", ["s", "zero"], ["c"]),
             h.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    if identity:
        nodes.insert(0, h.make_node("Identity", ["x"], [outer]))
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2, 3])],
                     [nh.from_array(np.array(0, np.float32), "zero")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_outer_scope_reads_become_implicit_inputs():
    graph = import_model(_if_reading("xi", identity=True))
    node = next(n for n in graph.nodes if n.op_type == "If")
    assert node.captures == ("xi",)
    assert [v.name for v in node.inputs] == ["c", "xi"]
    assert [v.name for v in node.explicit_inputs] == ["c"]
    assert isinstance(node.attrs["then_branch"], Subgraph)
    assert "sha256=" in repr(node.attrs["then_branch"])


def test_outer_names_reach_into_nested_bodies():
    inner = h.make_graph([h.make_node("Add", ["a", "deep"], ["o"])], "inner", [],
                         [h.make_tensor_value_info("o", T.FLOAT, None)])
    outer = h.make_graph([h.make_node("Relu", ["b"], ["a"]),
                          h.make_node("If", ["cond"], ["r"], then_branch=inner, else_branch=inner)],
                         "outer", [h.make_tensor_value_info("cond", T.BOOL, [])],
                         [h.make_tensor_value_info("r", T.FLOAT, None)])
    assert outer_names(outer) == ["b", "deep"]  # 'a' and 'cond' are its own


@pytest.mark.parametrize("backends", [["numpy"], ["onnxruntime"], None],
                         ids=["numpy", "onnxruntime", "default"])
def test_a_renamed_outer_value_still_reaches_the_body(backends):
    """The Identity is removed at load, so the If's implicit input is ``x`` while its bodies
    read ``xi``: both the reference backend and an onnxruntime region bridge the names."""
    model = _if_reading("xi", identity=True)
    sess = Session(model, backends=backends, store=False)
    expected = ort.InferenceSession(model.SerializeToString())
    assert not any(n.op_type == "Identity" for n in sess.graph.nodes)
    for x in (np.ones((2, 3), np.float32), -np.arange(6, dtype=np.float32).reshape(2, 3)):
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], expected.run(None, {"x": x})[0])


def test_paddle_negative_dims_read_as_dynamic():
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    g = h.make_graph([h.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [-1, 3, -1, -1])],
                     [h.make_tensor_value_info("y", T.FLOAT, [-1, 4, -1, -1])], [nh.from_array(w, "w")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 11)], producer_name="PaddlePaddle")
    sess = Session(model, input_shapes={"x": [2, 3, 7, 5]}, store=False)
    assert any("input 'x' declared [-1, 3, -1, -1]" in q and "Paddle2ONNX" in q
               for q in sess.graph.quirks)
    x = np.random.default_rng(1).standard_normal((2, 3, 7, 5)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)
    other = Session(model, store=False)  # symbolic: the shape comes with the first run
    y = np.ones((1, 3, 4, 4), np.float32)
    assert other.run(None, {"x": y})[0].shape == (1, 4, 4, 4)


def test_a_dynamic_value_is_checked_for_its_dtype_only():
    """NonZero's output is sized at run time: the executor expects no shape for it, and
    the plan runs inputs with different output lengths, empty included."""
    nodes = [h.make_node("NonZero", ["x"], ["nz"]), h.make_node("Transpose", ["nz"], ["t"]),
             h.make_node("GatherND", ["x", "t"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [3, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    for backends in (["numpy"], None):
        sess = Session(model, backends=backends, store=False)
        assert set(sess.graph.dynamic) >= {"nz", "t", "y"}
        assert "NonZero decides its output shapes from the data" in sess.graph.dynamic["nz"]
        for x in (np.zeros((3, 4), np.float32), np.eye(3, 4, dtype=np.float32),
                  np.arange(12, dtype=np.float32).reshape(3, 4) - 5):
            np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x[x != 0])
