"""The onnxruntime subgraph backend: its proposals, and every candidate it offers — per op and
per region — checked against the numpy reference through the tuner's own measurement check.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import onnx
import pytest

from dispatch import Session
from dispatch.backend import load_registry
from dispatch.fusion import REGION_OP, region_node
from dispatch.heuristic import heuristic_plan
from dispatch.zoo import light_model
from tests.builders import ModelBuilder, small_cnn
from tuner.candidates import enumerate_candidates
from tuner.measure import measure_candidate

pytest.importorskip("onnxruntime")

from impls.onnxruntime.region import _cut_points, propose, region_model


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def transformer_block(seed: int = 0):
    """A small pre-norm transformer MLP/attention-like block: LayerNormalization, MatMul, Add,
    Softmax, Gelu-by-Erf, Reshape/Transpose, ReduceMean, Where and Gather."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder(17, "block")
    x = b.input("x", [2, 5, 8])
    ln = b.op("LayerNormalization", [x, b.const(rng.uniform(0.5, 1.5, 8).astype(np.float32)),
                                     b.const(rng.normal(0, 0.1, 8).astype(np.float32))], axis=-1)
    q = b.op("MatMul", [ln, b.const(rng.normal(0, 0.3, (8, 8)).astype(np.float32))])
    k = b.op("MatMul", [ln, b.const(rng.normal(0, 0.3, (8, 8)).astype(np.float32))])
    kt = b.op("Transpose", [k], perm=[0, 2, 1])
    att = b.op("Softmax", [b.op("MatMul", [q, kt])], axis=-1)
    ctx = b.op("MatMul", [att, ln])
    h = b.op("Add", [x, ctx])
    u = b.op("MatMul", [h, b.const(rng.normal(0, 0.3, (8, 16)).astype(np.float32))])
    erf = b.op("Erf", [b.op("Div", [u, b.const(np.array(np.sqrt(2.0), np.float32))])])
    gelu = b.op("Mul", [b.op("Mul", [u, b.op("Add", [erf, b.const(np.array(1.0, np.float32))])]),
                        b.const(np.array(0.5, np.float32))])
    d = b.op("MatMul", [gelu, b.const(rng.normal(0, 0.3, (16, 8)).astype(np.float32))])
    y = b.op("Add", [h, d])
    m = b.op("ReduceMean", [y], axes=[-1], keepdims=1)
    pos = b.op("Greater", [y, m])
    sel = b.op("Where", [pos, y, m])
    flat = b.op("Reshape", [sel, b.const(np.array([10, 8], np.int64))])
    b.output(b.op("Gather", [flat, b.const(np.array([0, 3, 9], np.int64))], axis=0))
    return b.build()


MODELS = {"small_cnn": small_cnn, "transformer_block": transformer_block}


def _ort_candidates(reg, model):
    graph = Session(model, backends=["numpy"], registry=reg, store=False).graph
    cands = enumerate_candidates(graph, reg, ["numpy", "onnxruntime"])
    return graph, [c for c in cands.candidates if c.impl.backend == "onnxruntime"]


@pytest.mark.parametrize("name", MODELS)
def test_every_onnxruntime_candidate_matches_the_reference(reg, name):
    """Per op (single-node regions) and per region (blocks, maximal): each candidate's outputs
    match the numpy reference within the op tolerances (the tuner's own check)."""
    graph, cands = _ort_candidates(reg, MODELS[name]())
    singles = [c for c in cands if len(c.nodes) == 1]
    assert {c.nodes[0] for c in singles} == {n.name for n in graph.nodes}
    assert any(len(c.nodes) == len(graph.nodes) for c in cands), "no maximal region"
    for cand in cands:
        m = measure_candidate(reg, cand, time_cap_s=0.01, warmup=0, min_repeats=1)
        assert m.error is None, (cand.id, m.error)


def test_squeezenet_regions_match_the_reference(reg):
    graph, cands = _ort_candidates(reg, light_model("squeezenet", seed=0))
    sizes = sorted({len(c.nodes) for c in cands})
    assert sizes[0] == 1 and sizes[-1] == len(graph.nodes) and len(sizes) >= 4, sizes
    for cand in cands:
        if len(cand.nodes) > 1:
            m = measure_candidate(reg, cand, time_cap_s=0.01, warmup=0, min_repeats=1)
            assert m.error is None, (cand.id, m.error)


def test_proposals_are_contiguous_ranges_with_one_live_tensor_at_block_cuts(reg):
    graph = Session(light_model("resnet50", seed=0), backends=["numpy"], registry=reg, store=False).graph
    index = {n.name: k for k, n in enumerate(graph.nodes)}
    regions = propose(graph)
    assert len({tuple(r) for r in regions}) == len(regions), "a region is proposed twice"
    for r in regions:
        ks = [index[n] for n in r]
        assert ks == list(range(ks[0], ks[-1] + 1)), "not a contiguous range"
    # 16 bottleneck blocks, cut after the stem's max pool and before the head
    assert len(_cut_points(graph)) >= 16
    assert {len(r) for r in regions} >= {1, len(graph.nodes)}


def test_a_region_model_is_valid_onnx_with_constants_inside(reg):
    graph = Session(small_cnn(), backends=["numpy"], registry=reg, store=False).graph
    names = [n.name for n in graph.nodes[:4]]
    rnode = region_node(graph, names)
    model = region_model(rnode)
    assert [i.name for i in model.graph.input] == [v.name for v in rnode.inputs] == ["x"]
    assert {t.name for t in model.graph.initializer}, "weights must travel as initializers"
    assert rnode.op_type == REGION_OP


@pytest.mark.parametrize("name", ["squeezenet", "inception_v1"])
def test_an_onnxruntime_plan_matches_numpy_on_real_architectures(reg, name):
    model = light_model(name, seed=1)
    ort_sess = Session(model, backends=["onnxruntime"], registry=reg, store=False)
    assert ort_sess.plan.backends_used() == {"onnxruntime": len(ort_sess.graph.nodes)}
    assert len(ort_sess.plan.steps) == 1 and ort_sess.plan.steps[0].op == REGION_OP
    ref = Session(model, backends=["numpy"], registry=reg, store=False)
    x = np.random.default_rng(0).standard_normal(ref.get_inputs()[0].shape).astype(np.float32)
    feeds = {ref.get_inputs()[0].name: x}
    np.testing.assert_allclose(ort_sess.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-3, atol=1e-5)


def test_outputs_of_one_run_survive_the_next(reg):
    """onnxruntime allocates the outputs of each run anew: a returned array is never
    overwritten by a later run."""
    sess = Session(small_cnn(), backends=["onnxruntime"], registry=reg, store=False)
    a = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    first = sess.run(None, {"x": a})[0]
    kept = first.copy()
    sess.run(None, {"x": a + 1})
    np.testing.assert_array_equal(first, kept)


def test_heuristic_with_onnxruntime_first_mixes_around_what_it_cannot_take(reg):
    """Regions start where a node is uncovered; with numpy first, onnxruntime takes nothing."""
    graph = Session(small_cnn(), backends=["numpy"], registry=reg, store=False).graph
    numpy_first = heuristic_plan(graph, reg, ["numpy", "onnxruntime"])
    assert set(numpy_first.backends_used()) == {"numpy"}
    ort_first = heuristic_plan(graph, reg, ["onnxruntime", "numpy"])
    assert [s.op for s in ort_first.steps] == [REGION_OP]


def test_discovery_does_not_import_onnxruntime():
    code = ("import sys; from dispatch.backend import load_registry; r = load_registry(); "
            "assert 'onnxruntime' in r.available_backends(); "
            "assert 'onnxruntime' not in sys.modules, 'imported at discovery'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# -- settings variants ---------------------------------------------------------------------

EXTENDED = "Region.onnxruntime.session_extended"


def test_the_settings_variant_is_registered_with_its_settings_and_offered_on_large_regions(reg):
    """onnxruntime without its layout optimisations is a second candidate on the large regions
    (and the maximal ones, whatever their size) only: the tuning it adds stays bounded."""
    impl = reg.impl(EXTENDED)
    assert impl.settings == {"graph_optimization_level": "extended"}
    assert reg.impl("Region.onnxruntime.session").settings == {"graph_optimization_level": "all"}
    graph = Session(light_model("resnet50", seed=0), backends=["numpy"], registry=reg,
                    store=False).graph
    every, large = propose(graph), impl.propose(graph)
    assert set(map(tuple, large)) <= set(map(tuple, every))
    assert [n.name for n in graph.nodes] in large  # the whole graph
    assert 1 < len(large) < len(every) / 10, (len(large), len(every))
    assert all(len(r) >= 8 for r in large)


def test_the_settings_variant_matches_the_reference(reg):
    graph = Session(small_cnn(), backends=["numpy"], registry=reg, store=False).graph
    cands = [c for c in enumerate_candidates(graph, reg, ["numpy", "onnxruntime"]).candidates
             if c.impl.name == EXTENDED]
    assert cands, "no candidate of the settings variant"
    for cand in cands:
        m = measure_candidate(reg, cand, time_cap_s=0.01, warmup=0, min_repeats=1)
        assert m.error is None, (cand.id, m.error)


def test_a_plan_with_settings_round_trips_through_json_and_the_store(reg, tmp_path):
    """The variant (so its settings) is what the stored plan names; a Session looks it up and
    runs it; the same plan under a key whose onnxruntime version differs is refused with
    the reason."""
    from dispatch.plan import Plan
    from tuner.store import PlanStore
    from tuner.tune import plan_key

    model = small_cnn()
    graph = Session(model, backends=["numpy"], registry=reg, store=False).graph
    plan = heuristic_plan(graph, reg, ["onnxruntime", "numpy"])  # one region: the whole graph
    whole = [n.name for n in graph.nodes]
    plan.steps[0].impl = EXTENDED
    assert plan.steps[0].nodes == whole
    again = Plan.from_json(plan.to_json())
    assert again.steps[0].impl == EXTENDED
    backends = ["onnxruntime", "numpy"]
    key = plan_key(graph, reg, backends, "latency")
    again.provenance = dict(again.provenance, source="tuned", software=key.software)
    store = tmp_path / "plans.sqlite"
    with PlanStore(store) as plans:
        plans.put_plan(key, again)
    sess = Session(model, registry=reg, store=store, backends=backends)
    assert sess.plan_source == "store", sess.plan_note
    assert sess.plan.steps[0].impl == EXTENDED
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    ref = Session(model, registry=reg, store=False, backends=["numpy"]).run(None, {"x": x})
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref[0], rtol=1e-4, atol=1e-5)
    # the report shows the settings the step runs with
    from tuner.report import build_report

    rep = build_report(sess)
    nodes = rep.table[rep.table["kind"] == "node"]
    assert set(nodes["settings"]) == {"graph_optimization_level=extended"}
    assert "graph_optimization_level=extended" in rep.render("text", wide=True)
    assert "graph_optimization_level=extended" in rep.render("html")

    older = dict(key.software, backends=dict(key.software["backends"], onnxruntime="onnxruntime 0.1"))
    stale = dataclasses.replace(key, software=older)
    other = tmp_path / "other.sqlite"
    with PlanStore(other) as plans:
        plans.put_plan(stale, again)
    sess = Session(model, registry=reg, store=other, backends=backends)
    assert sess.plan_source == "heuristic"
    assert "onnxruntime" in sess.plan_note and "0.1" in sess.plan_note, sess.plan_note


def _matmul_integer(weight_dtype: type) -> tuple[object, np.ndarray, np.ndarray]:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (4, 17)).astype(np.uint8)
    w = (rng.integers(-128, 128, (17, 33)) if weight_dtype is np.int8
         else rng.integers(0, 256, (17, 33))).astype(weight_dtype)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, 17])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [4, 33])], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model, a, a.astype(np.int64) @ w.astype(np.int64)


@pytest.mark.parametrize("saturates", [True, False])
def test_uint8_by_int8_weights_computed_at_run_time_are_refused_where_the_cpu_saturates(monkeypatch,
                                                                                       saturates):
    """A constant int8 weight is never refused (the region widens it to uint8 where the CPU
    saturates: impls.onnxruntime.u8s8); one computed at run time is, on such a CPU only."""
    from dispatch.onnx_import import import_model
    from impls import region_quirks
    from impls.onnxruntime import u8s8

    monkeypatch.setattr(u8s8, "saturates_u8s8", lambda: saturates)
    model, _, _ = _matmul_integer(np.int8)
    assert region_quirks.onnxruntime_reason(import_model(model).nodes[0]) is None
    runtime_weight = onnx.ModelProto()
    runtime_weight.CopyFrom(model)
    w = runtime_weight.graph.initializer.pop()
    runtime_weight.graph.input.append(onnx.helper.make_tensor_value_info("w", w.data_type, list(w.dims)))
    why = region_quirks.onnxruntime_reason(import_model(runtime_weight).nodes[0])
    assert (why is not None) == saturates
    if why:
        assert "MatMulInteger" in why and "saturates on this CPU" in why
        assert "'w' is computed at run time" in why
    model, _, _ = _matmul_integer(np.uint8)  # uint8 weights: exact on every CPU
    assert region_quirks.onnxruntime_reason(import_model(model).nodes[0]) is None


def test_a_dispatched_matmul_integer_is_exact_on_this_cpu():
    """Whatever this CPU has: the Session's MatMulInteger of uint8 by int8 equals the exact
    integer product (onnxruntime runs it only where it does not saturate)."""
    model, a, want = _matmul_integer(np.int8)
    got = Session(model).run(None, {"a": a})[0]
    np.testing.assert_array_equal(got, want)


ONE_THREAD = "Region.onnxruntime.session_1thread"


def test_the_one_thread_variant_is_offered_on_large_regions_and_matches_the_reference(reg):
    """onnxruntime on one intra-op thread (small transformer files run faster so than on the
    default pool: impls.onnxruntime.region.build_region_1thread) is a candidate on the large
    regions only, never the untuned choice, and checked like the default build."""
    impl = reg.impl(ONE_THREAD)
    assert impl.settings == {"graph_optimization_level": "all", "intra_op_num_threads": 1}
    graph = Session(small_cnn(), backends=["numpy"], registry=reg, store=False).graph
    assert impl.propose(graph) == reg.impl(EXTENDED).propose(graph)
    assert all(s.impl != ONE_THREAD for s in heuristic_plan(graph, reg, ["onnxruntime", "numpy"]).steps)
    cands = [c for c in enumerate_candidates(graph, reg, ["numpy", "onnxruntime"]).candidates
             if c.impl.name == ONE_THREAD]
    assert cands
    for cand in cands:
        m = measure_candidate(reg, cand, time_cap_s=0.01, warmup=0, min_repeats=1)
        assert m.error is None, (cand.id, m.error)


def test_the_one_thread_variant_builds_a_one_thread_session(reg):
    from impls.onnxruntime.region import session

    graph = Session(small_cnn(), backends=["numpy"], registry=reg, store=False).graph
    whole = region_node(graph, [n.name for n in graph.nodes])
    assert session(whole, threads=1).get_session_options().intra_op_num_threads == 1
