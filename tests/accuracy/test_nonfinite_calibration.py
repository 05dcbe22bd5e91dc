"""Calibrated ranges that are not finite (issue 52): the transformers exports' attention masks
(``Where(mask, 0, -inf)``, then ``Add(scores, mask)``) reach min-max calibration whenever a
sample is padded, so those tensors' ranges end at -inf and have no int8 scale (the tool
computed a NaN zero point: "invalid value encountered in divide"). They stay in float; and the
accuracy stage never reports a cosine of -inf as a measurement."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dispatch import Session
from tests.accuracy import fake_precision
from tests.accuracy.fake_precision import registry_with_fake_precision
from tests.accuracy.test_accuracy import chain_model
from tuner.tune import load_graph

pytest.importorskip("onnxruntime")

SEQ, HIDDEN = 8, 16
#: the mask tensors of :func:`masked_attention`, whose calibrated range is [-inf, ...]
MASK_TENSORS = {"mask_bias", "scores_masked"}


def masked_attention(path: Path) -> Path:
    """One attention head as the TorchScript export of transformers writes it (MiniLM's
    layers): ``Where(keep, 0, -inf)`` added to the scores before the Softmax."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((HIDDEN, HIDDEN)) * 0.3).astype(np.float32), w)
             for w in ("wq", "wk", "wv", "wo")]
    inits += [numpy_helper.from_array(np.zeros(1, np.float32), "zero"),
              numpy_helper.from_array(np.full(1, -np.inf, np.float32), "ninf")]
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="query"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="key"),
        helper.make_node("MatMul", ["x", "wv"], ["v"], name="value"),
        helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
        helper.make_node("Where", ["keep", "zero", "ninf"], ["mask_bias"], name="mask"),
        helper.make_node("Add", ["scores", "mask_bias"], ["scores_masked"], name="add_mask"),
        helper.make_node("Softmax", ["scores_masked"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["ctx"], name="context"),
        helper.make_node("MatMul", ["ctx", "wo"], ["y"], name="out"),
    ]
    graph = helper.make_graph(nodes, "masked_attention",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SEQ, HIDDEN]),
                               helper.make_tensor_value_info("keep", TensorProto.BOOL, [1, 1, SEQ])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, SEQ, HIDDEN])],
                              inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def masked_pool_cnn(path: Path) -> Path:
    """Conv -> plus ``Where(keep, 0, -inf)`` (a masked max) -> MaxPool -> Conv: the mask's
    ``Add`` and the pooling are what OpenVINO's CNN recipe quantizes (a region without MatMul)."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32), "w0"),
             numpy_helper.from_array((rng.standard_normal((4, 4, 1, 1)) * 0.3).astype(np.float32), "w1"),
             numpy_helper.from_array(np.zeros(1, np.float32), "zero"),
             numpy_helper.from_array(np.full(1, -np.inf, np.float32), "ninf")]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Where", ["keep", "zero", "ninf"], ["mask_bias"], name="mask"),
        helper.make_node("Add", ["c", "mask_bias"], ["scores_masked"], name="add_mask"),
        helper.make_node("MaxPool", ["scores_masked"], ["p"], name="pool", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Conv", ["p", "w1"], ["y"], name="conv1"),
    ]
    graph = helper.make_graph(nodes, "masked_pool_cnn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8]),
                               helper.make_tensor_value_info("keep", TensorProto.BOOL, [1, 1, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def _keep_attention(rng: np.random.Generator) -> np.ndarray:
    keep = np.ones((1, 1, SEQ), bool)
    keep[..., int(rng.integers(3, SEQ)):] = False  # padding at the end, as a batch of sentences has
    return keep


def _keep_pool(rng: np.random.Generator) -> np.ndarray:
    keep = np.ones((1, 1, 8, 8), bool)
    keep[..., 1::2, 1::2] = rng.random((4, 4)) < 0.5  # one of each 2x2 window at most: finite maxima
    return keep


def _region_and_samples(model: Path, x_shape: tuple, keep, n: int = 8, seed: int = 2):
    from dispatch.backend import load_registry
    from dispatch.fusion import region_node

    graph = load_graph(str(model), load_registry(), ["numpy"])
    node = region_node(graph, [n.name for n in graph.nodes])
    rng = np.random.default_rng(seed)
    samples = [(rng.standard_normal(x_shape).astype(np.float32), keep(rng)) for _ in range(n)]
    return node, samples


def test_an_attention_mask_range_is_set_apart_and_its_tensors_stay_in_float(tmp_path):
    import impls.static_quant as sq

    node, samples = _region_and_samples(masked_attention(tmp_path / "attn.onnx"), (1, SEQ, HIDDEN),
                                        _keep_attention)
    calibration = sq.calibrate(node, samples)
    # the mask's ranges end at -inf: not in the tool's ranges, named as left in float
    for name, entry in calibration["data"].items():
        lo, hi = entry["lowest"]["data"][0], entry["highest"]["data"][0]
        assert np.isfinite(lo) and np.isfinite(hi), (name, lo, hi)
    assert "scores" in calibration["data"] and "probs" in calibration["data"]
    from impls.static_quant import FLOAT_KEY, finite_cache, float_tensors, qdq_model

    assert set(calibration[FLOAT_KEY]) == MASK_TENSORS
    assert float(calibration[FLOAT_KEY]["mask_bias"][0]) == -np.inf
    # the cache as a plan step stores it is strict JSON, and what the tool reads
    json.dumps(calibration, allow_nan=False)
    assert set(float_tensors(calibration)) == MASK_TENSORS
    assert finite_cache(calibration) == calibration
    node.attrs = {**node.attrs, "precision": {"dtype": "int8", "calibration": calibration}}
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no NaN zero point computed any more
        model = qdq_model(node)
    quantized = {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    assert not quantized & MASK_TENSORS and "scores" in quantized


def test_a_quantized_masked_addition_stays_in_float_and_the_output_finite(tmp_path):
    """OpenVINO's CNN recipe quantizes the inputs of additions and poolings: with the mask's
    [-inf, 0] range the tool's zero point was NaN and the region's output garbage. The mask's
    addition and the pooling of its sum stay in float; the Convs are quantized."""
    from impls.static_quant import calibrate, qdq_model

    model = masked_pool_cnn(tmp_path / "cnn.onnx")
    node, samples = _region_and_samples(model, (1, 4, 8, 8), _keep_pool)
    calibration = calibrate(node, samples)
    node.attrs = {**node.attrs, "precision": {"dtype": "int8", "calibration": calibration,
                                              "qdq_recipe": "openvino"}}
    qdq = qdq_model(node)
    import onnxruntime as ort

    sess = ort.InferenceSession(qdq.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = Session(str(model), backends=["numpy"], store=False)
    rng = np.random.default_rng(7)
    for _ in range(3):
        feeds = {"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32), "keep": _keep_pool(rng)}
        expected = ref.run(None, feeds)[0]
        got = sess.run(None, feeds)[0]
        assert np.isfinite(got).all()
        # (int8 of 8 calibration samples: 0.9% to 13% of the largest output here; NaN before)
        assert np.abs(got - expected).max() / np.abs(expected).max() < 0.25
    quantized = {n.input[0] for n in qdq.graph.node if n.op_type == "QuantizeLinear"}
    assert not quantized & MASK_TENSORS and {"x", "p"} <= quantized


def test_a_calibration_stored_with_infinite_ranges_still_builds(tmp_path, monkeypatch):
    """A plan step stored before the ranges were set apart holds them in ``data`` (JSON
    ``-Infinity``): the build sets them apart itself."""
    import impls.static_quant as sq

    node, samples = _region_and_samples(masked_attention(tmp_path / "attn.onnx"), (1, SEQ, HIDDEN),
                                        _keep_attention)
    with monkeypatch.context() as m:
        m.setattr(sq, "finite_cache", lambda calibration: calibration)  # the cache as the tool wrote it
        old = json.loads(json.dumps(sq.calibrate(node, samples)))  # as the store reads it back
    assert sq.FLOAT_KEY not in old and old["data"]["mask_bias"]["lowest"]["data"][0] == -np.inf
    assert set(sq.float_tensors(old)) == MASK_TENSORS
    node.attrs = {**node.attrs, "precision": {"dtype": "int8", "calibration": old}}
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        model = sq.qdq_model(node)
    assert not {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"} & MASK_TENSORS


# -- the accuracy stage: no cosine of -inf as a figure ------------------------------------------

def test_a_per_block_plan_backed_off_to_float32_is_no_candidate_of_minus_inf(tmp_path, monkeypatch):
    """Every reduced block backed off on the held-out samples leaves the float32 plan: the
    stage recorded that as a candidate of error inf (``cosine -inf``: what MiniLM's per-block
    int8 plan showed on the held-out samples). It is a note, not a measured figure."""
    from dispatch.executor import Executor
    from tuner.accuracy.blocks import block_plan
    from tuner.accuracy.data import load_data
    from tuner.accuracy.metrics import AccuracyObjective
    from tuner.accuracy.stage import AccuracyStage
    from tuner.accuracy.trials import outputs

    reg = registry_with_fake_precision()
    graph = load_graph(str(chain_model(tmp_path / "chain.onnx")), reg, ["fakeprec"])
    rng = np.random.default_rng(0)
    data = load_data([{"x": rng.uniform(0.5, 2.0, (1, 8)).astype(np.float32)} for _ in range(16)], graph)
    bp = block_plan(graph, reg, "fakeprec")
    assert bp is not None and len(bp.blocks) > 1
    ex = Executor(graph, bp.plan, reg)
    ref_cal, ref_held = outputs(ex, data.calibration), outputs(ex, data.held_out)
    # the int8 blocks add no error on the calibration samples, too much on the held-out ones
    # (as ranges calibrated on a few sentences clip others), whichever of them remain
    real_error = AccuracyStage._error
    monkeypatch.setattr(AccuracyStage, "_error", lambda self, reference, got: (
        real_error(self, reference, got) + (0.5 if reference is ref_held else 0.0)))
    monkeypatch.setitem(fake_precision.ERROR, "value", 0.0)
    stage = AccuracyStage(graph, reg, ["fakeprec"], AccuracyObjective.parse("cosine:0.999"), data,
                          time.monotonic() + 60, lambda _msg: None)
    found = stage._library("fakeprec", ref_cal, ref_held)
    assert found == []
    for c in stage.candidates:
        assert np.isfinite(c["error"]) and np.isfinite(c["figure"]), c
    assert not any(c["label"] == "fakeprec per block" for c in stage.candidates), stage.candidates
    assert any("back to float32" in n and "held-out" in n for n in stage.notes), stage.notes
    assert any(n.startswith("fakeprec per block: every reduced block") for n in stage.notes), stage.notes
    # a plan whose outputs are NaN or Inf (error inf) is rejected with that reason, no figure
    stage._candidate("nan plan", bp.plan, float("inf"), None)
    assert stage.candidates[-1]["figure"] is None and stage.candidates[-1]["error"] is None
    assert not stage.candidates[-1]["within"] and "NaN or Inf" in stage.candidates[-1]["rejected"]
    assert stage.notes[-1].startswith("nan plan: rejected: cosine: outputs NaN or Inf")


def test_non_finite_outputs_are_described_as_such_not_as_a_figure():
    """An error of inf (outputs NaN or Inf where float32's are finite) reads as what it is."""
    from tuner.accuracy.metrics import AccuracyObjective, cosine_error

    obj = AccuracyObjective.parse("cosine:0.999")
    ref = [[np.ones(4, np.float32)]]
    err = cosine_error(ref, [[np.array([1, np.nan, 1, 1], np.float32)]])
    assert err == np.inf and not obj.within(err)
    assert "-inf" not in obj.describe(err) and "NaN or Inf" in obj.describe(err)
