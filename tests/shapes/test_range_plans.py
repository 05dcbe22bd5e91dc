"""Range plans end to end (issue 51) on a small real ONNX model with a symbolic sequence axis:
tuned with onnxruntime's whole-model ways, stored, carried by bundles, run by a Session at
every shape of the range without a plan per shape; shapes outside fall back or raise."""

from __future__ import annotations

import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dispatch import Session
from dispatch.errors import ArgumentError, PlanNotFoundError
from dispatch.range_padding import split_name
from tuner.shapes.tune_range import tune_range
from tuner.store import PlanStore

ort = pytest.importorskip("onnxruntime")
BACKENDS = ["onnxruntime", "numpy"]


def _model(path) -> str:
    """x: float32 [1, seq, 8], mask: int64 [1, seq] -> y = relu(x @ W) * mask (a real model
    with a symbolic axis shared by two inputs)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["m", "axes"], ["m3"]),
             helper.make_node("Mul", ["r", "m3"], ["y"])]
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    graph = helper.make_graph(
        nodes, "ranged",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 8]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, [1, "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", 8])], [w, axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    out = str(path / "ranged.onnx")
    onnx.save(model, out)
    return out


def _feeds(n: int, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + n)
    return {"x": rng.standard_normal((1, n, 8)).astype(np.float32),
            "mask": rng.integers(0, 2, (1, n)).astype(np.int64)}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ranged")
    model = _model(folder)
    store = str(folder / "plans.sqlite")
    requests = [_feeds(n) for n in (3, 3, 17, 40)]
    result = tune_range(model, {"x": [1, "1..64", 8]}, store=store, budget_s=3,
                        backends=BACKENDS, requests=requests)
    return model, store, result


def test_the_range_is_measured_at_its_ends_and_the_requests_shapes(tuned):
    _, _, result = tuned
    assert result.plan_id is not None
    sizes = [s.size for s in result.samples]
    assert sizes[0] == 1 and sizes[-1] == 64 and {3, 17, 40} <= set(sizes)
    assert result.key.inputs == "range x=1x1..64x8 mask=1x1..64"
    ranged = result.plan.range_plan()
    assert ranged.buckets[0].lo == 1 and ranged.buckets[-1].hi == 64
    # onnxruntime's ways, padded or not (which one wins a bucket is the machine's measurement)
    assert {split_name(w)[0] for w in ranged.ways_used()} <= {"onnxruntime", "onnxruntime-1thread"}
    assert ranged.notes["repeats_from"] == "the requests given"
    assert "range x=1x1..64x8" in result.summary()


@pytest.mark.parametrize("n", [1, 2, 3, 17, 33, 40, 64])
def test_every_length_in_the_range_matches_onnxruntime(tuned, n):
    model, store, _ = tuned
    sess = Session(model, store=store, backends=BACKENDS)
    feeds = _feeds(n, seed=7)
    (got,) = sess.run(None, feeds)
    (want,) = ort.InferenceSession(model).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert sess.plan_source == "store" and "range plan" in sess.plan_note
    assert sess.planned_shapes()[1:] == []  # no plan per shape


def test_a_session_given_the_range_runs_its_plan(tuned):
    model, store, _ = tuned
    sess = Session(model, store=store, backends=BACKENDS, require_plan=True,
                   input_shapes={"x": [1, "1..64", 8]})
    assert sess.plan_source == "store"
    assert sess.stored_ranges == ["x=1x1..64x8 mask=1x1..64"]
    assert "size 1.." in sess.describe()
    assert sess.run(["y"], _feeds(50))[0].shape == (1, 50, 8)


def test_outside_every_range_the_untuned_plan_runs(tuned):
    model, store, _ = tuned
    sess = Session(model, store=store, backends=BACKENDS)
    sess.run(None, _feeds(10))
    (got,) = sess.run(None, _feeds(80))
    (want,) = ort.InferenceSession(model).run(None, _feeds(80))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    other = sess.for_shapes({"x": [1, 80, 8]})
    assert other.plan_source == "heuristic"


def test_require_plan_names_the_stored_ranges(tuned):
    model, store, _ = tuned
    with pytest.raises(PlanNotFoundError) as err:
        Session(model, store=store, backends=BACKENDS, require_plan=True,
                input_shapes={"x": [1, "1..100", 8]})
    text = str(err.value)
    assert "no range plan is stored for x=1x1..100x8 mask=1x1..100" in text
    assert "ranges stored: x=1x1..64x8 mask=1x1..64" in text
    assert "--shape x=1x1..100x8" in text
    sess = Session(model, store=store, backends=BACKENDS, require_plan=True,
                   input_shapes={"x": [1, 10, 8]})  # a shape inside: the range plan runs it
    assert sess.plan_source == "store"
    with pytest.raises(PlanNotFoundError, match="no plan is stored for these input shapes"):
        Session(model, store=store, backends=BACKENDS, require_plan=True,
                input_shapes={"x": [1, 80, 8]})


def test_range_plans_round_trip_a_bundle(tuned, tmp_path):
    model, store, result = tuned
    with PlanStore(store) as src:
        bundle = src.export_plans([result.plan_id])
    other = str(tmp_path / "other.sqlite")
    with PlanStore(other) as dst:
        (new_id,) = dst.import_plans(bundle)
        stored = dst.plan_by_id(new_id)
        assert stored.key.family == result.key.family
        assert stored.plan().range_plan().to_dict() == result.range_plan.to_dict()
    sess = Session(model, store=other, backends=BACKENDS, require_plan=True,
                   input_shapes={"x": [1, "1..64", 8]})
    assert sess.plan_source == "store"


def test_a_thousand_distinct_lengths_keep_memory_bounded(tmp_path):
    model = _model(tmp_path)
    store = str(tmp_path / "plans.sqlite")
    tune_range(model, {"x": [1, "1..1000", 8]}, store=store, budget_s=2, backends=BACKENDS)
    sess = Session(model, store=store, backends=BACKENDS)
    sess.run(None, _feeds(1))
    tracemalloc.start()
    for n in range(2, 200):
        sess.run(None, _feeds(n))
    base, _ = tracemalloc.get_traced_memory()
    for n in range(200, 1001):
        sess.run(None, _feeds(n))
    grown, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert sess.planned_shapes()[1:] == []
    # Python-side growth over 800 new lengths stays small (nothing kept per shape)
    assert grown - base < 2 * 1024 * 1024, (base, grown)


def test_the_report_shows_buckets_and_every_way_at_every_sample(tuned, capsys):
    import json

    from tuner.cli import main

    model, store, result = tuned
    assert main(["report", model, "--store", store]) == 0
    out = capsys.readouterr().out
    assert "x=1x1..64x8 mask=1x1..64 (seq 1..64)" in out and "buckets:" in out
    assert "measured at the sample shapes" in out and "onnxruntime ms (first)" in out
    assert main(["report", model, "--store", store, "--shape", "x=1x1..64x8", "--format",
                 "json"]) == 0
    (rep,) = json.loads(capsys.readouterr().out)
    assert rep["plan_id"] == result.plan_id
    assert [s["size"] for s in rep["samples"]] == [s.size for s in result.samples]
    assert main(["report", model, "--store", store, "--shape", "x=1x1..99x8"]) == 2
    err = capsys.readouterr().err
    assert "no range plan" in err and "x=1x1..64x8 mask=1x1..64" in err


def test_a_range_plan_needs_only_the_backends_its_ways_run(tuned):
    model, store, _ = tuned  # tuned with onnxruntime and numpy only
    sess = Session(model, store=store, require_plan=True,
                   input_shapes={"x": [1, "1..64", 8]})  # every backend allowed here
    assert sess.plan_source == "store"
    with pytest.raises(PlanNotFoundError, match="way onnxruntime.* is not offered here"):
        Session(model, store=store, require_plan=True, backends=["numpy"],
                input_shapes={"x": [1, "1..64", 8]})


def test_padding_is_offered_where_a_mask_keeps_the_outputs_exact(tuned):
    _, _, result = tuned
    padding = result.range_plan.notes["padding"]
    assert padding["step"] == 16 and padding["axes"] == {"y": [1]} and padding["mask"] == ["mask"]
    padded = [s for s in result.samples if "onnxruntime+pad16" in s.ms]
    assert padded and not any("onnxruntime+pad16" in s.rejected for s in result.samples)


def _mean_model(path) -> str:
    """x: [1, seq, 8], mask: [1, seq] -> y = mean of x over seq, the mask ignored: padding
    changes every output."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=0),
             helper.make_node("Identity", ["mask"], ["mask_out"])]
    graph = helper.make_graph(
        nodes, "mean",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 8]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, [1, "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8]),
         helper.make_tensor_value_info("mask_out", TensorProto.INT64, [1, "seq"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    out = str(path / "mean.onnx")
    onnx.save(model, out)
    return out


def test_a_padding_that_changes_the_outputs_is_rejected_with_the_reason(tmp_path):
    model = _mean_model(tmp_path)
    result = tune_range(model, {"x": [1, "1..40", 8]}, store=str(tmp_path / "p.sqlite"),
                        budget_s=2, backends=BACKENDS)
    reasons = {s.size: s.rejected.get("onnxruntime+pad16") for s in result.samples}
    odd = [size for size in reasons if size % 16 and size != 40]
    assert odd and all(reasons[size].startswith(
        "padding changes the outputs at the real positions: output 'y' differs")
        for size in odd)
    assert all("+pad" not in b.way for b in result.range_plan.buckets)
    sess = Session(model, store=str(tmp_path / "p.sqlite"), backends=BACKENDS)
    for n in (3, 17, 40):
        feeds = _feeds(n)
        (want,) = ort.InferenceSession(model).run(["y"], feeds)
        np.testing.assert_allclose(sess.run(["y"], feeds)[0], want, rtol=1e-5, atol=1e-6)


def test_a_padded_way_runs_every_length_exactly(tuned, tmp_path):
    from dispatch.plan import Plan
    from dispatch.range_plan import Bucket, RangePlan

    model, _, result = tuned
    ranged = result.range_plan
    forced = RangePlan(ranged.range, [Bucket(1, 64, "onnxruntime+pad16")], ranged.ways,
                       ranged.notes)
    plan = Plan("ranged", [], [], shapes=forced.to_dict())
    with PlanStore(str(tmp_path / "forced.sqlite")) as store:
        store.put_plan(result.key, plan.to_json())
    sess = Session(model, store=str(tmp_path / "forced.sqlite"), backends=BACKENDS)
    for n in (1, 5, 16, 17, 63, 64):
        feeds = _feeds(n, seed=3)
        (want,) = ort.InferenceSession(model).run(None, feeds)
        (got,) = sess.run(None, feeds)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_session_given_a_range_tunes_it(tmp_path):
    model = _model(tmp_path)
    store = str(tmp_path / "plans.sqlite")
    sess = Session(model, store=store, backends=BACKENDS, input_shapes={"x": [1, "1..32", 8]})
    assert sess.plan_source == "heuristic" and "no range plan is stored" in sess.plan_note
    result = sess.tune(budget_s=2, requests=[_feeds(n) for n in (4, 9, 30)])
    assert sess.plan_source == "tuned" and "range plan" in sess.plan_note
    assert result.range_plan.range.text() == "x=1x1..32x8 mask=1x1..32"
    for n in (1, 9, 32):
        feeds = _feeds(n, seed=5)
        (want,) = ort.InferenceSession(model).run(None, feeds)
        np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-5, atol=1e-5)
    again = Session(model, store=store, backends=BACKENDS, require_plan=True,
                    input_shapes={"x": [1, "1..32", 8]})
    assert again.plan_source == "store"
    with pytest.raises(ArgumentError, match="takes budget_s and requests"):
        sess.tune(budget_s=2, top_k=3)


def test_a_throughput_objective_measures_every_way_under_its_load(tmp_path):
    model = _model(tmp_path)
    store = str(tmp_path / "plans.sqlite")
    result = tune_range(model, {"x": [1, "1..64", 8]}, store=store, budget_s=3,
                        objective="throughput@n=2")
    ranged = result.range_plan
    assert ranged.notes["concurrency"] == 2 and "2 in flight" in ranged.notes["figure"]
    assert result.key.objective == "throughput@n=2"
    if "openvino" in {w.split("-")[0] for w in ranged.ways}:
        assert "openvino-throughput" in ranged.ways  # offered for this objective only
    sess = Session(model, store=store, objective="throughput@n=2", require_plan=True,
                   input_shapes={"x": [1, "1..64", 8]})
    for n in (2, 40):
        feeds = _feeds(n)
        (want,) = ort.InferenceSession(model).run(None, feeds)
        np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-5, atol=1e-5)
    latency = tune_range(model, {"x": [1, "1..64", 8]}, store=store, budget_s=1)
    assert "openvino-throughput" not in latency.range_plan.ways
