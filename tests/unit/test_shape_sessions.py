"""One Session, many input shapes (issue 14): a model with symbolic input dimensions runs any
feed that fits them, each concrete shape on its own plan (stored, else untuned), executors
kept in a bounded cache; ``require_plan`` names the shape that has no plan and the shapes
that have one; ``opdispatch tune`` tunes several shapes in one run.

The model is a small attention-like block built by hand (MatMul, a mask broadcast through
Unsqueeze, a Reshape to the Shape of the input, Softmax) with inputs ``x: [batch, seq, 8]``
and ``mask: [batch, seq]``; answers are checked against the numpy reference plan of each
shape, never against timings."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dispatch import Session
from dispatch.errors import ArgumentError, FeedError, PlanNotFoundError, SymbolicShapeError
from dispatch.input_shapes import bind, declared_inputs, family_digest, format_shapes
from dispatch.onnx_import import import_model
from tuner.cli.args import UsageError, parse_shape_sets
from tuner.store import PlanStore
from tuner.tune import TuneOptions, tune


def dynamic_model(hidden: int = 8, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", hidden])
    mask = helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "seq"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(rng.standard_normal((hidden, hidden)).astype(np.float32), "w")
    ax = numpy_helper.from_array(np.array([-1], np.int64), "ax")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Unsqueeze", ["mask", "ax"], ["m3"]),
        helper.make_node("Mul", ["h", "m3"], ["hm"]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Reshape", ["hm", "s"], ["r"]),
        helper.make_node("Softmax", ["r"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(nodes, "dyn", [x, mask], [y], [w, ax])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(batch: int, seq: int, hidden: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.float32)
    mask[:, seq // 2:] = 0
    return {"x": rng.standard_normal((batch, seq, hidden)).astype(np.float32), "mask": mask}


def _expected(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    x, mask = feeds["x"], feeds["mask"]
    w = numpy_helper.to_array(model.graph.initializer[0])
    h = (x @ w) * mask[..., None]
    e = np.exp(h - h.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


SHAPES = [(1, 7), (1, 128), (4, 64)]


def test_a_session_without_input_shapes_plans_each_shape_at_its_first_run():
    model = dynamic_model()
    sess = Session(model, store=False)
    assert sess.plan_source == "deferred"
    assert "x: float32 [batch, seq, 8]" in sess.plan_note
    assert [i.shape for i in sess.get_inputs()] == [["batch", "seq", 8], ["batch", "seq"]]
    with pytest.raises(ArgumentError, match="no plan yet.*symbolic"):
        sess.plan  # noqa: B018
    for batch, seq in [*SHAPES, SHAPES[0]]:
        feeds = _feeds(batch, seq)
        (y,) = sess.run(None, feeds)
        assert y.shape == (batch, seq, 8)
        np.testing.assert_allclose(y, _expected(model, feeds), rtol=1e-5, atol=1e-6)
    assert sess.plan_source == "heuristic"
    planned = sess.planned_shapes()
    assert [dict(p)["mask"] for p in planned] == [(1, 7), (1, 128), (4, 64)]
    assert sess.get_inputs()[0].shape == [1, 7, 8]  # the session's own shape: its first run's


def test_a_session_with_input_shapes_runs_other_shapes_too():
    model = dynamic_model()
    sess = Session(model, store=False, input_shapes={"x": [2, 5, 8]})  # mask sized from x
    assert [i.shape for i in sess.get_inputs()] == [[2, 5, 8], [2, 5]]
    for batch, seq in [(2, 5), (3, 9)]:
        feeds = _feeds(batch, seq)
        np.testing.assert_allclose(sess.run(None, feeds)[0], _expected(model, feeds), rtol=1e-5, atol=1e-6)
    other = sess.for_shapes({"x": [3, 9, 8]})
    assert other is not sess and other.get_inputs()[1].shape == [3, 9]
    assert sess.for_shapes({"mask": [2, 5]}) is sess


def test_feeds_that_do_not_fit_the_declaration_are_refused_with_the_declaration():
    sess = Session(dynamic_model(), store=False)
    feeds = _feeds(2, 5)
    with pytest.raises(FeedError,
                       match=r"received shape \[2, 5, 7\], expected \[batch, seq, 8\] \(dimension 2 is 7"):
        sess.run(None, {"x": np.zeros((2, 5, 7), np.float32), "mask": feeds["mask"]})
    with pytest.raises(FeedError, match="'seq' is 5 in input 'x' and 4 in input 'mask'"):
        sess.run(None, {"x": feeds["x"], "mask": np.ones((2, 4), np.float32)})
    with pytest.raises(FeedError, match="rank 2, but the model declares rank 3"):
        sess.run(None, {"x": np.zeros((2, 5), np.float32), "mask": feeds["mask"]})
    with pytest.raises(FeedError, match="missing input"):
        sess.run(None, {"x": feeds["x"]})


def test_feeds_of_another_shape_are_checked_once_and_again_when_they_change(monkeypatch):
    """Feeds of a shape other than the session's own skip the checks once their names, dtypes
    and shapes passed them (Session._checked_shapes); a change of any is checked in full."""
    import dispatch.shape_sessions as shape_sessions

    model = dynamic_model()
    sess = Session(model, store=False, input_shapes={"x": [2, 5, 8]})
    calls = []
    checked = shape_sessions.check_declared_feeds
    monkeypatch.setattr(shape_sessions, "check_declared_feeds",
                        lambda *a: calls.append(1) or checked(*a))
    feeds = _feeds(3, 9)
    np.testing.assert_allclose(sess.run(None, feeds)[0], _expected(model, feeds), rtol=1e-5, atol=1e-6)
    assert calls and len(sess._checked_shapes) == 1
    calls.clear()
    for _ in range(2):
        np.testing.assert_allclose(sess.run(None, feeds)[0], _expected(model, feeds), rtol=1e-5, atol=1e-6)
    assert not calls
    with pytest.raises(FeedError, match="received dtype float64"):
        sess.run(None, {"x": feeds["x"].astype(np.float64), "mask": feeds["mask"]})
    with pytest.raises(FeedError, match="'seq' is 9 in input 'x' and 4 in input 'mask'"):
        sess.run(None, {"x": feeds["x"], "mask": np.ones((3, 4), np.float32)})
    with pytest.raises(FeedError, match="missing input"):
        sess.run(None, {"x": feeds["x"]})
    assert len(sess._checked_shapes) == 1
    np.testing.assert_allclose(sess.run(None, feeds)[0], _expected(model, feeds), rtol=1e-5, atol=1e-6)


def test_the_shape_cache_is_bounded():
    sess = Session(dynamic_model(), store=False, max_shapes=2)
    for seq in (3, 4, 5, 6):
        sess.run(None, _feeds(1, seq))
    kept = [dict(p)["mask"] for p in sess.planned_shapes()]
    assert kept == [(1, 3), (1, 5), (1, 6)]  # its own, then the two most recent
    with pytest.raises(ArgumentError, match="max_shapes"):
        Session(dynamic_model(), store=False, max_shapes=0)


def test_shapes_are_bound_through_shared_symbols():
    declared = declared_inputs(dynamic_model())
    assert bind(declared, {"x": [4, 64, 8]}) == {"x": [4, 64, 8], "mask": [4, 64]}
    assert bind(declared, {}) == {}
    assert format_shapes({"x": [1, 2], "y": [3]}) == "x[1,2], y[3]"


def test_the_family_is_the_same_for_every_shape_and_differs_between_models():
    def family(model, shapes):
        graph = import_model(model, shapes)
        return family_digest(graph, graph.declared)

    a = family(dynamic_model(), {"x": [1, 7, 8]})
    assert a == family(dynamic_model(), {"x": [4, 64, 8]})
    assert a == family(dynamic_model(seed=3), {"x": [2, 2, 8]})  # weights are not structure
    assert a != family(dynamic_model(hidden=16), {"x": [1, 7, 16]})


def test_symbolic_inputs_without_shapes_stop_the_import_with_the_declaration():
    with pytest.raises(SymbolicShapeError, match="input_shapes") as info:
        import_model(dynamic_model())
    assert [d.describe() for d in info.value.inputs] == ["x: float32 [batch, seq, 8]",
                                                         "mask: float32 [batch, seq]"]


def test_plans_stored_for_two_shapes_run_from_the_store_and_the_third_is_named(tmp_path):
    model = dynamic_model()
    store = tmp_path / "plans.db"
    opts = TuneOptions(budget_s=20, top_k=1, validate_runs=3, per_candidate_cap_s=0.05,
                       progress=False, backends=["numpy"])
    for batch, seq in SHAPES[:2]:
        result = tune(model, store=store, options=opts, input_shapes={"x": [batch, seq, 8]})
        assert result.plan_id is not None
    with PlanStore(store, readonly=True) as s:
        plans = s.all_plans()
        assert len({p.key.family for p in plans}) == 1 and plans[0].key.family
    sess = Session(model, store=store, require_plan=True, backends=["numpy"])
    for batch, seq in SHAPES[:2]:
        feeds = _feeds(batch, seq)
        np.testing.assert_allclose(sess.run(None, feeds)[0], _expected(model, feeds), rtol=1e-5, atol=1e-6)
        assert sess.for_shapes({"x": [batch, seq, 8]}).plan_source == "store"
    with pytest.raises(PlanNotFoundError) as info:
        sess.run(None, _feeds(*SHAPES[2]))
    text = str(info.value)
    assert "at input shapes x[4,64,8], mask[4,64]" in text
    assert "stored for the input shapes x[1,7,8], mask[1,7] | x[1,128,8], mask[1,128]" in text
    assert "--shape x=4x64x8" in text
    # the session goes on running the shapes it has plans for
    feeds = _feeds(*SHAPES[0])
    np.testing.assert_allclose(sess.run(None, feeds)[0], _expected(model, feeds), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("args", "want"), [
    (["x=1x128"], [{"x": [1, 128]}]),
    (["x=1,4x128"], [{"x": [1, 128]}, {"x": [4, 128]}]),
    (["x=1x16:48:16"], [{"x": [1, 16]}, {"x": [1, 32]}, {"x": [1, 48]}]),
    (["x=1x8", "x=2x8", "y=3"], [{"x": [1, 8], "y": [3]}, {"x": [2, 8], "y": [3]}]),
    (["x=1x8", "x=2x8", "y=3", "y=4"], [{"x": [1, 8], "y": [3]}, {"x": [2, 8], "y": [4]}]),
    ([], [{}]),
])
def test_shape_sets_of_the_command_line(args, want):
    assert parse_shape_sets(args) == want


@pytest.mark.parametrize(("args", "match"), [
    (["x1x2"], "NAME=DIMxDIM"),
    (["x=1x9:3"], "range START:STOP:STEP"),
    (["x=1x1:9:0"], "STEP > 0"),
    (["x=1,2", "y=1,2,3"], "different numbers of shapes"),
    (["x=1:100x1:2"], "at most 64"),
])
def test_bad_shape_sets_are_usage_errors(args, match):
    with pytest.raises(UsageError, match=match):
        parse_shape_sets(args)
