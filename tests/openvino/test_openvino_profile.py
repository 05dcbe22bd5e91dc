"""Per-node time inside OpenVINO regions (issue 18, impls/openvino/profile.py): OpenVINO's
per-layer counters mapped back to the region's nodes through the executed graph's original
layer names, and the memory OpenVINO allocates for a region.

On whole-graph regions of squeezenet and resnet50 (onnx's light models, seeded weights) and a
transformer-style block (OpenVINO fuses MatMul with its bias Add and the Erf-GELU chain, and
names the fused layer after the Add): every region node gets a time, the times add up to the
kernels' sum, convolutions get time of their own (a Relu shares its Conv's kernel), nodes
OpenVINO names no layer after share the kernel they were fused into, and the library's
allocations are positive. The profiling build stays out of the compiled cache. Through the
report: a tuned squeezenet plan that is one OpenVINO region and an untuned Session's plan show
the library's time on every node, with no "not profiled" note, and count OpenVINO's
allocations in the peak memory."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

pytest.importorskip("openvino", reason="openvino is not installed (pip install 'opdispatch[openvino]')")

from dispatch import Session
from dispatch.backend import load_registry
from dispatch.fusion import region_node
from dispatch.heuristic import heuristic_plan
from dispatch.zoo import light_model
from impls.openvino import region as ov_region
from impls.openvino.compiled_cache import compile_region
from impls.openvino.profile import RUNS, profile_region, run_means, runtime_layers
from impls.openvino.region import compile_config, core
from tests.report.conftest import options, tune_into
from tests.report.models import transformer_block
from tuner.report import build_report
from tuner.report.library import is_library_source, memory_figures, region_profiles
from tuner.report.sources import Sources

IMPL = "Region.openvino.compiled"
MODELS = {"squeezenet": lambda: light_model("squeezenet", seed=0),
          "resnet50": lambda: light_model("resnet50", seed=0),
          "transformer": transformer_block}


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def _whole(model: onnx.ModelProto, reg):
    graph = Session(model, backends=["numpy"], registry=reg, store=False).graph
    return graph, region_node(graph, [n.name for n in graph.nodes])


def _feeds(region) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(tuple(v.shape)).astype(v.dtype) for v in region.inputs]


@pytest.fixture(scope="module")
def profiled(reg):
    """name -> (graph, whole-graph region, its profile)."""
    out = {}
    for name, make in MODELS.items():
        graph, region = _whole(make(), reg)
        out[name] = (graph, region, profile_region(region, IMPL, _feeds(region)))
    return out


def weight_bytes(graph) -> int:
    return sum(int(v.nbytes) for v in graph.values.values() if v.is_const)


@pytest.mark.parametrize("name", list(MODELS))
def test_every_node_gets_a_time_adding_up_to_the_kernels(profiled, name):
    _, region, p = profiled[name]
    assert p.library == "openvino" and p.runs == RUNS
    assert list(p.node_ms) == [n.name for n in region.nodes]
    assert all(ms >= 0 for ms in p.node_ms.values())
    assert p.kernels_ms > 0 and p.run_ms is not None and p.run_ms > 0
    # every kernel's time lands on some node (fused, renamed and inserted layers included)
    assert sum(p.node_ms.values()) == pytest.approx(p.kernels_ms, rel=1e-9)
    assert not any("matched no node" in n for n in p.notes), p.notes
    assert p.notes[0].startswith("OpenVINO's per-layer counters are running averages")


@pytest.mark.parametrize("name", ["squeezenet", "resnet50"])
def test_convolutions_get_their_own_time(profiled, name):
    _, region, p = profiled[name]
    convs = [n.name for n in region.nodes if n.op_type == "Conv"]
    assert convs and all(p.node_ms[c] > 0 for c in convs), [c for c in convs if p.node_ms[c] <= 0]
    # the kernels' sum is the time of a run (one stream runs the layers one after another);
    # loose bounds: the machine may be busy, and the wall time holds Python's call too
    assert 0.25 * p.run_ms < p.kernels_ms < 2.0 * p.run_ms
    # the convolutions take most of it
    assert sum(p.node_ms[c] for c in convs) > 0.5 * p.kernels_ms


def test_a_relu_shares_the_kernel_of_its_convolution(profiled):
    _, region, p = profiled["squeezenet"]
    producer = {v.name: n for n in region.nodes for v in n.outputs}
    relus = [n for n in region.nodes if n.op_type == "Relu"]
    assert relus
    for relu in relus:
        conv = producer[relu.inputs[0].name]
        assert conv.op_type == "Conv"
        assert p.shared[relu.name] == p.shared[conv.name]
        assert p.node_ms[conv.name] > p.node_ms[relu.name]
    # the final Softmax runs as a layer of a generated name, between reshapes (opset 9 on a
    # 4-D input): its time still lands on it
    softmax = next(n.name for n in region.nodes if n.op_type == "Softmax")
    assert p.node_ms[softmax] > 0


def test_nodes_openvino_names_no_layer_after_share_the_kernel_they_were_fused_into(profiled):
    """OpenVINO names a MatMul fused with its bias Add after the Add, and folds the Erf-GELU
    chain into the layer before it: those nodes take a share of that layer's time."""
    _, region, p = profiled["transformer"]
    compiled = compile_region(core(), region, compile_config(), "off")
    layers = runtime_layers(compiled.get_runtime_model())
    named = {k for layer in layers for k in (layer.name, *layer.originals)}
    unnamed = [n for n in region.nodes
               if n.name not in named and not any(v.name in named for v in n.outputs)]
    assert any(n.op_type == "MatMul" for n in unnamed), [n.name for n in unnamed]
    assert all(n.name in p.shared for n in unnamed), [n.name for n in unnamed if n.name not in p.shared]
    # ... of a layer OpenVINO ran
    assert {p.shared[n.name] for n in unnamed} <= {layer.name for layer in layers}


@pytest.mark.parametrize("name", list(MODELS))
def test_library_bytes_are_measured(profiled, name):
    graph, _, p = profiled[name]
    assert isinstance(p.library_bytes, int) and p.library_bytes > 0
    assert "C heap" in p.memory_basis and "compiled model" in p.memory_basis
    if name == "resnet50":
        # the CPU plugin keeps its own (repacked) copy of the weights: measured 115 MB for
        # resnet50's 102 MB of weights
        assert p.library_bytes > 0.5 * weight_bytes(graph)


def test_running_averages_give_the_mean_of_the_profiled_runs():
    """OpenVINO reports ``sum of whole-microsecond run times / runs`` since compiling: after
    a 100 us warm-up, 3 runs of 10 us read 32 (130 / 4, truncated)."""
    got = run_means({"a": 100.0, "b": 5.0, "c": 0.0}, {"a": 32.0, "b": 1.0, "c": 0.0}, 3)
    assert got["a"] == pytest.approx((32 * 4 - 100) / 3 / 1e3)
    assert got["b"] == 0.0 and got["c"] == 0.0  # never negative


def test_the_profiling_build_stays_out_of_the_compiled_cache(profiled, monkeypatch, tmp_path):
    """The plan's build goes through the compiled cache as usual (one entry, the digest a
    normal build has); the profiling build (PERF_COUNT on) writes none."""
    _, region, _ = profiled["squeezenet"]
    monkeypatch.setitem(ov_region.SETTINGS, "compiled_cache", str(tmp_path / "cache"))
    profile_region(region, IMPL, _feeds(region), runs=1)
    entries = [e for e in (tmp_path / "cache").iterdir() if not e.name.startswith(".")]
    assert len(entries) == 1
    compile_region(core(), region, compile_config(), str(tmp_path / "cache"))
    assert [e for e in (tmp_path / "cache").iterdir() if not e.name.startswith(".")] == entries


# ------------------------------------------------------------------------------------------
# through the report
# ------------------------------------------------------------------------------------------


def node_rows(rep):
    return rep.table[rep.table["kind"] == "node"]


def _region_rows_are_the_librarys(rep, graph):
    rows = node_rows(rep)
    assert len(rows) == len(graph.nodes) > 1
    assert rows["median_ms"].notna().all(), rows[rows["median_ms"].isna()]["name"].tolist()
    assert all(is_library_source(s) and "(openvino" in s for s in rows["time_source"])
    assert not [n for n in rep.notes if "not profiled" in n], rep.notes
    assert any("openvino's profiler" in n and "mean of" in n for n in rep.notes), rep.notes
    return rows


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, reg):
    """squeezenet tuned over OpenVINO and numpy (a short budget), and the plan reported: the
    winner when it is one OpenVINO region (it usually is), else the untuned OpenVINO-first
    plan (the whole graph as one region, measured by the same tuning run)."""
    folder = tmp_path_factory.mktemp("squeezenet-openvino")
    t = tune_into(folder, "squeezenet", light_model("squeezenet", seed=0), reg,
                  options(8.0, top_k=1, validate_runs=1, backends=["openvino", "numpy"]))
    plan = t.result.plan
    if len(plan.steps) != 1:
        plan = heuristic_plan(t.graph, t.registry, ["openvino", "numpy"])
    assert len(plan.steps) == 1 and plan.steps[0].backend == "openvino"
    return t, plan


def test_tuned_plan_reports_openvino_times_on_every_node(tuned):
    t, plan = tuned
    rep = build_report(plan, t.graph, store=t.store, registry=t.registry, key=t.result.key)
    rows = _region_rows_are_the_librarys(rep, t.graph)
    step_ms = rep.summary["kernels_ms"]
    assert step_ms is not None, rep.notes
    # scaled to the region's measured time
    assert abs(float(rows["median_ms"].sum()) - step_ms) <= 0.15 * step_ms
    assert (rows["median_ms"] > 0).sum() > len(rows) // 2
    assert "library profiler (openvino" in rep.render("csv")


def test_tuned_peak_memory_counts_what_openvino_allocated(tuned):
    """The tuned plan's peak memory counts OpenVINO's allocations (the region measures them
    as it is built; for a plan stored before it did, the report adds the region profile's)."""
    t, _ = tuned
    rep = t.report()  # the tuned winner, whatever it is
    s = rep.summary
    regions = [k for k, st in enumerate(rep.plan.steps) if st.backend == "openvino" and len(st.nodes) > 1]
    assert regions
    for k in regions:
        assert s["memory"]["library_bytes"][str(k)] > 0
    assert s["peak_bytes"] >= weight_bytes(t.graph) + s["peak_liveness_bytes"] + sum(
        s["memory"]["library_bytes"][str(k)] for k in regions)
    assert "library allocations" in s["memory"]["basis"] and "lower bound" not in s["memory"]["basis"]


def test_untuned_session_reports_openvino_times_and_memory(reg, tmp_path):
    """An OpenVINO-first Session (no store): the whole graph is one OpenVINO region, every
    node row carries the profiler's (raw) time; with a liveness figure, the peak memory counts
    OpenVINO's allocations, not a lower bound."""
    path = tmp_path / "squeezenet.onnx"
    onnx.save(light_model("squeezenet", seed=0), str(path))
    sess = Session(str(path), backends=["openvino", "numpy"], store=False)
    assert [st.backend for st in sess.plan.steps] == ["openvino"]
    rep = build_report(sess)
    rows = _region_rows_are_the_librarys(rep, sess.graph)
    assert (rows["median_ms"] > 0).sum() > len(rows) // 2
    src = Sources(sess.plan, sess.graph, None, sess.registry, None, None)
    profiles = region_profiles(src)
    mem = memory_figures(src, 1000, profiles)
    assert mem["library_bytes"]["0"] > 0
    assert mem["constant_bytes"] >= weight_bytes(sess.graph)
    assert mem["peak_bytes"] == 1000 + mem["constant_bytes"] + mem["library_bytes"]["0"]
    assert "openvino" in mem["basis"] and "lower bound" not in mem["basis"]


def test_the_plans_peak_memory_counts_what_openvino_allocated(reg, tmp_path):
    """The plan path itself (not only the report's profiler) measures an OpenVINO region's
    allocations, so the memory objective compares whole peaks for OpenVINO plans too."""
    from tuner.plan_memory import plan_memory

    model = light_model("resnet50", seed=0)
    path = tmp_path / "resnet50.onnx"
    onnx.save(model, str(path))
    sess = Session(str(path), backends=["openvino", "numpy"], store=False, registry=reg)
    assert [s.backend for s in sess.plan.steps] == ["openvino"]
    x = np.random.default_rng(0).standard_normal(sess.get_inputs()[0].shape).astype(np.float32)
    sess.run(None, {sess.get_inputs()[0].name: x})
    mem = plan_memory(sess.executor)
    weights = weight_bytes(sess.graph)
    # OpenVINO holds its own copy of the weights (repacked for its kernels)
    assert mem.library_bytes > weights // 2, mem.to_dict()
    assert mem.peak_bytes >= mem.liveness_bytes + mem.constant_bytes + mem.library_bytes
