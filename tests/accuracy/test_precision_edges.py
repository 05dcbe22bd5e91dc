"""Reduced precision between regions: OpenVINO's bf16 regions reading and writing the ``bf16``
layout (:mod:`layouts.precision`), against the numpy reference, with the plan converting only
at the boundaries where a neighbour holds float32."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch.backend import load_registry
from dispatch.executor import Executor
from dispatch.fusion import REGION_OP, region_node
from dispatch.plan import PlanStep
from layouts import STANDARD
from tests.accuracy.test_accuracy import mlp_model
from tuner.accuracy.blocks import assemble, block_plan, edge_twin, precision_of, with_reduced_edges
from tuner.tune import load_graph

BF16, EDGES = "Region.openvino.compiled_bf16", "Region.openvino.compiled_bf16_edges"


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    reg = load_registry()
    if "openvino" not in reg.available_backends():
        pytest.skip("openvino is not available")
    path = mlp_model(tmp_path_factory.mktemp("edges") / "mlp.onnx")
    graph = load_graph(str(path), reg, reg.available_backends())
    why = reg.impl(BF16).supports(region_node(graph, [n.name for n in graph.nodes]))
    if why is not None and "natively" in why:
        pytest.skip(why)  # a CPU without bf16
    return reg, graph


def _two_regions(reg, graph):
    impl = reg.impl(BF16)
    steps = []
    for names in (["mm1", "relu"], ["mm2"]):
        node = region_node(graph, names)
        steps.append(PlanStep(nodes=names, op=REGION_OP, impl=impl.name, backend=impl.backend,
                              layouts_in=list(impl.input_layouts(node)), layouts_out=list(impl.output_layouts(node)),
                              precision=precision_of(impl)))
    return assemble(graph, reg, steps, {"label": "two bf16 regions"})


def test_the_edge_twin_is_found_and_kept_from_float32_and_block_search(setting):
    reg, graph = setting
    assert edge_twin(reg, reg.impl(BF16)).name == EDGES
    assert edge_twin(reg, reg.impl(EDGES)) is None
    assert edge_twin(reg, reg.impl("Region.openvino.compiled")) is None  # float32 has none
    assert edge_twin(reg, reg.impl("Region.openvino.compiled_int8")) is None
    assert EDGES not in [i.name for i in reg.regions()]  # never offered to float32 tuning
    bp = block_plan(graph, reg, "openvino")
    assert bp is not None and all(EDGES not in [i.name for i in vs] for vs in bp.variants)


def test_between_two_bf16_regions_nothing_is_converted(setting):
    reg, graph = setting
    plan = _two_regions(reg, graph)
    assert plan.conversions == []  # float32 edges: the library converts inside each region
    edged = with_reduced_edges(graph, reg, plan)
    assert edged is not None and [s.impl for s in edged.steps] == [EDGES, EDGES]
    assert all(s.precision["edges"] == "bf16" for s in edged.steps)
    got = sorted((c.value, c.src, c.dst) for c in edged.conversions)
    assert got == [("x", STANDARD, "bf16"), ("y", "bf16", STANDARD)]  # nothing for "r" between them
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 4, 64)).astype(np.float32)
    w1, w2 = (np.asarray(graph.value(n).const) for n in ("w1", "w2"))
    expected = np.maximum(x @ w1, 0) @ w2
    (plain,) = Executor(graph, plan, reg).run({"x": x})
    (y,) = Executor(graph, edged, reg).run({"x": x})
    assert y.dtype == np.float32 and y.shape == expected.shape
    scale = np.abs(expected).max()
    assert np.abs(y - expected).max() / scale < 0.03
    assert np.abs(y - plain).max() / scale < 0.03
    assert np.abs(y - expected).max() > 0  # computed in bf16, not float32


def test_a_plan_with_one_reduced_region_gets_no_edges(setting):
    reg, graph = setting
    impl = reg.impl(BF16)
    names = [n.name for n in graph.nodes]
    node = region_node(graph, names)
    one = assemble(graph, reg, [PlanStep(nodes=names, op=REGION_OP, impl=impl.name, backend=impl.backend,
                                         layouts_in=list(impl.input_layouts(node)),
                                         layouts_out=list(impl.output_layouts(node)), precision=precision_of(impl))])
    assert with_reduced_edges(graph, reg, one) is None
