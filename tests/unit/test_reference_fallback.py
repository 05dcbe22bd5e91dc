"""An operator without a numpy reference still tunes (issue 52): onnxruntime's own result is its
reference, the plan's provenance, the summary and ``explain`` say so, and onnxruntime's own
candidates for it are not checked against themselves as if independent."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from dispatch.registry import Registry

ort = pytest.importorskip("onnxruntime")


def _model():
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(v, t), n) for n, v, t in (
        ("xs", 0.02, np.float32), ("xz", 120, np.uint8), ("ws", 0.01, np.float32), ("wz", 0, np.int8),
        ("ys", 0.3, np.float32), ("yz", 128, np.uint8))]
    inits.append(numpy_helper.from_array(rng.integers(-128, 128, (8, 3, 3, 3)).astype(np.int8), "w"))
    nodes = [helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["q"],
                              name="qconv", pads=[1, 1, 1, 1]),
             helper.make_node("DequantizeLinear", ["q", "ys", "yz"], ["d"], name="dq"),
             helper.make_node("Relu", ["d"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.fixture
def no_numpy_qlinearconv(monkeypatch):
    """The numpy reference as if it had no QLinearConv."""
    original = Registry.reference_impl

    def reference_impl(self, node, exclude=()):
        return None if node.op_type == "QLinearConv" else original(self, node, exclude)

    monkeypatch.setattr(Registry, "reference_impl", reference_impl)


def test_onnxruntime_is_the_reference_and_says_so(no_numpy_qlinearconv, tmp_path):
    from dispatch.executor import reference_plan
    from dispatch.reference_fallback import onnxruntime_referenced
    from dispatch.session import Session
    from tests.numpy.contrib_support import exact_on_this_cpu

    model = _model()
    x = np.random.default_rng(1).integers(0, 256, (1, 3, 8, 8)).astype(np.uint8)
    # onnxruntime's result on the exact form where this CPU's uint8 x int8 kernels saturate (its
    # regions widen the weights so: impls.onnxruntime.u8s8)
    exact = exact_on_this_cpu(model).SerializeToString()
    want = ort.InferenceSession(exact, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    sess = Session(model, store=str(tmp_path / "plans.sqlite"))
    assert onnxruntime_referenced(sess.graph, sess.registry) == ["qconv"]
    ref = reference_plan(sess.graph, sess.registry, fallback=True)
    by_node = {n: s.backend for s in ref.steps for n in s.nodes}
    assert by_node["qconv"] == "onnxruntime" and by_node["relu"] == "numpy"
    result = sess.tune(budget_s=3, progress=False, inputs=[{"x": x}])
    assert result.plan.provenance["reference_from_onnxruntime"] == ["qconv"]
    assert "onnxruntime's own result for 1 node(s)" in result.summary()
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)

    from tuner.report.explain import _reference_note

    assert "not independently validated" in _reference_note(result.plan, "qconv")
    assert _reference_note(result.plan, "relu") == ""


def test_without_onnxruntime_the_error_is_as_before(no_numpy_qlinearconv, monkeypatch):
    import dispatch.reference_fallback as fallback
    from dispatch.executor import reference_overrides
    from dispatch.session import Session

    sess = Session(_model(), store=False, backends=["numpy", "onnxruntime"])
    monkeypatch.setattr(fallback, "fallback_impl", lambda registry, node: None)
    with pytest.raises(LookupError, match=r"no numpy reference implementation supports node 'qconv'"):
        reference_overrides(sess.graph, sess.registry, fallback=True)


def test_a_numpy_only_session_never_falls_back_to_onnxruntime(no_numpy_qlinearconv):
    """onnxruntime not allowed (or the runtime fallback plan): the error is as before."""
    from dispatch.executor import reference_overrides
    from dispatch.session import Session

    sess = Session(_model(), store=False, backends=["numpy", "onnxruntime"])
    with pytest.raises(LookupError, match=r"no numpy reference implementation supports node 'qconv'"):
        reference_overrides(sess.graph, sess.registry)
