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
                              layouts_in=list(impl.input_layouts(node)),
                              layouts_out=list(impl.output_layouts(node)),
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
                                         layouts_out=list(impl.output_layouts(node)),
                                         precision=precision_of(impl))])
    assert with_reduced_edges(graph, reg, one) is None


# -- the accuracy stage offers the plan again with its regions' edge twins ------------------------

def test_the_stage_offers_reduced_precision_between_regions(tmp_path):
    """A FAKE edge twin of the fake int8 region (tests/accuracy/fake_precision.py) that reads and
    writes the ``u8`` layout: the per-block plan of four adjacent int8 blocks is offered again
    with the twins, nothing converted between them, checked on the held-out half like any plan
    (the u8 rounding adds its error), and the plan that wins is stored and runs again."""
    from dispatch.registry import ImplTable, Priority
    from dispatch.session import Session
    from layouts.precision import QuantizedArray, from_u8, to_u8
    from tests.accuracy import fake_precision
    from tests.accuracy.test_accuracy import _tune, chain_model, samples

    twins = ImplTable("fakeprec")
    u8 = lambda node: tuple("u8" for _ in node.inputs)  # noqa: E731
    u8_out = lambda node: tuple("u8" for _ in node.outputs)  # noqa: E731

    @twins.register_region("scaled_u8", propose=fake_precision._whole, priority=Priority.FALLBACK,
                           precision="int8", settings={"edges": "u8"}, layouts_in=u8, layouts_out=u8_out)
    def _scaled_u8(region):
        """FAKE int8 region reading and writing the u8 layout (dequantize, the fake's int8
        arithmetic, quantize)."""
        inner = fake_precision._runner(region, fake_precision.ERROR["value"], 0.0)

        def run(*arrays):
            assert all(isinstance(a, QuantizedArray) for a in arrays), [type(a) for a in arrays]
            outs = inner(*(from_u8(a, a.shape) for a in arrays))
            return tuple(to_u8(o, o.shape) for o in outs)

        return run

    original = fake_precision.registry_with_fake_precision

    def with_twins():
        reg = original()
        reg.add_table(twins)
        return reg

    import tests.accuracy.test_accuracy as ta

    ta.registry_with_fake_precision = with_twins
    try:
        result, store = _tune(chain_model(tmp_path / "chain.onnx"), tmp_path, "max-rel:0.05", samples(8),
                              budget=14.0)
    finally:
        ta.registry_with_fake_precision = original
    acc = result.plan.provenance["accuracy"]
    by_label = {c["label"]: c for c in acc["candidates"]}
    edged = by_label.get("fakeprec per block, reduced precision between regions")
    assert edged is not None, sorted(by_label)
    plain = by_label["fakeprec per block"]
    assert edged["within"] and edged["error"] > plain["error"]  # u8 rounding on top of the fake's
    assert edged["precisions"] == plain["precisions"]
    # the four int8 blocks also run as one region: the fake's arithmetic, so its error
    whole = by_label["fakeprec per block, like neighbours merged"]
    assert whole["within"] and whole["error"] == pytest.approx(plain["error"], rel=1e-6)
    stored = store.get_plan(result.key).plan()
    assert stored.precisions() == result.plan.precisions()
    reg = with_twins()
    again = Session(str(tmp_path / "chain.onnx"), store=str(tmp_path / "plans.db"), backends=["fakeprec"],
                    registry=reg, objective=result.key.objective, require_plan=True)
    assert again.plan.precisions() == result.plan.precisions()
    x = samples(1, seed=9)[0]
    reference = Session(str(tmp_path / "chain.onnx"), store=False).run(None, x)[0]
    np.testing.assert_allclose(again.run(None, x)[0], reference, rtol=0.05)


def test_like_neighbouring_blocks_run_as_one_region(tmp_path):
    """:func:`tuner.accuracy.blocks.merged` on the FAKE precision backend's chain (4 blocks of 3
    nodes): consecutive blocks in the same precision become one region step, computing what
    the blocks computed."""
    from tests.accuracy.fake_precision import registry_with_fake_precision
    from tests.accuracy.test_accuracy import chain_model, samples
    from tuner.accuracy.blocks import merged, with_precisions

    reg = registry_with_fake_precision()
    graph = load_graph(str(chain_model(tmp_path / "chain.onnx")), reg, ["fakeprec"])
    bp = block_plan(graph, reg, "fakeprec")
    assert bp is not None and len(bp.blocks) == 4 and bp.origins == [bp.origins[0]] * 4
    scaled = reg.impl("Region.fakeprec.scaled")
    chosen = {k: (scaled, precision_of(scaled)) for k in (0, 1, 3)}
    plan = merged(graph, reg, bp, chosen, "per block")
    regions = [s for s in plan.steps if s.op == REGION_OP]
    assert [(len(s.nodes), s.impl) for s in regions] == [
        (6, scaled.name), (3, bp.blocks[2].impl), (3, scaled.name)]
    assert plan.precisions() == {"int8": 9, "float32": 3}
    cut = with_precisions(graph, reg, bp, chosen, "per block")
    x = samples(1, seed=4)[0]
    np.testing.assert_allclose(Executor(graph, plan, reg).run(x)[0], Executor(graph, cut, reg).run(x)[0],
                               rtol=1e-6)
    # nothing alike next to each other: nothing to merge
    alternate = {k: (scaled, precision_of(scaled)) for k in (0, 2)}
    assert merged(graph, reg, bp, alternate, "per block") is None
