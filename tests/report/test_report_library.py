"""Inside library regions (issue 18): a plan that is one onnxruntime region reports time on
every node of the region from onnxruntime's profiler, summing to the region's measured time
(within 15%); the peak memory counts the weights and what onnxruntime allocated; a mixed plan
(numpy for the first node, onnxruntime for the rest) shows per-node times too, in the table,
the graph and the HTML page (opened in headless Chromium where installed).

squeezenet (onnx's light model, seeded weights) keeps it quick: tuned once over onnxruntime
and numpy with a short budget, whose winner is the whole graph as one onnxruntime region."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from dispatch.executor import Executor
from dispatch.heuristic import heuristic_plan
from dispatch.zoo import light_model
from tests.report.conftest import Tuned, options, tune_into
from tests.report.test_report_html import chromium, console_lines, needs_chromium
from tuner.plan_memory import plan_memory
from tuner.report import build_report, render_html
from tuner.report.library import LIBRARY_MARK, is_library_source


def weight_bytes(graph) -> int:
    return sum(int(v.nbytes) for v in graph.values.values() if v.is_const)


@pytest.fixture(scope="module")
def squeezenet(tmp_path_factory, reg) -> Tuned:
    folder = tmp_path_factory.mktemp("squeezenet")
    model: onnx.ModelProto = light_model("squeezenet", seed=0)
    return tune_into(folder, "squeezenet", model, reg,
                     options(10.0, top_k=1, validate_runs=1, backends=["onnxruntime", "numpy"]))


@pytest.fixture(scope="module")
def one_region(squeezenet):
    """The tuned winner when it is one onnxruntime region (it usually is), else the untuned
    onnxruntime-first plan (the whole graph as one region, measured by the same tuning run:
    the untuned plan's candidates are measured first)."""
    plan = squeezenet.result.plan
    if len(plan.steps) != 1:
        plan = heuristic_plan(squeezenet.graph, squeezenet.registry, ["onnxruntime", "numpy"])
    assert len(plan.steps) == 1 and plan.steps[0].backend == "onnxruntime"
    return plan


def report_of(squeezenet, plan):
    return build_report(plan, squeezenet.graph, store=squeezenet.store,
                        registry=squeezenet.registry, key=squeezenet.result.key)


@pytest.fixture(scope="module")
def mixed_plan(squeezenet):
    """numpy for the first Conv, one onnxruntime region for the rest."""
    g = squeezenet.graph
    first = g.nodes[0]
    conv = next(i.name for i in squeezenet.registry.impls_for(first.key_op, ["numpy"])
                if i.supports(first) is None)
    plan = heuristic_plan(g, squeezenet.registry, ["onnxruntime", "numpy"], overrides={first.name: conv})
    assert {s.backend for s in plan.steps} == {"numpy", "onnxruntime"}
    return plan


def node_rows(rep):
    return rep.table[rep.table["kind"] == "node"]


def test_one_region_plan_has_time_on_every_node(squeezenet, one_region):
    rep = report_of(squeezenet, one_region)
    rows = node_rows(rep)
    step_ms = rep.summary["kernels_ms"]
    assert step_ms is not None, rep.notes
    assert len(rows) == len(squeezenet.graph.nodes) > 1
    assert rows["median_ms"].notna().all(), rows[rows["median_ms"].isna()]["name"].tolist()
    assert all(is_library_source(s) for s in rows["time_source"])
    assert "onnxruntime" in rows["time_source"].iloc[0]
    # reconciled with the region's measured time (within 15%)
    assert abs(float(rows["median_ms"].sum()) - step_ms) <= 0.15 * step_ms
    assert (rows["median_ms"] > 0).sum() > len(rows) // 2
    note = next(n for n in rep.notes if "onnxruntime's profiler" in n)
    assert "profiled runs" in note and "scaled" in note
    text = rep.render("text", width=200)
    assert f"{LIBRARY_MARK} = per-node time inside a region" in text
    md = rep.render("markdown")
    assert LIBRARY_MARK in md
    assert "library profiler (onnxruntime" in rep.render("csv")
    assert "library profiler (onnxruntime" in rep.render("json")


def activation_bytes(graph) -> int:
    """Every non-constant value once: the most a liveness peak of a plan without layout
    copies can hold."""
    return sum(int(v.nbytes) for v in graph.values.values() if not v.is_const)


def test_tuned_peak_memory_counts_weights_and_library(squeezenet):
    """The tuned winner, whatever it is (one onnxruntime region, or numpy steps next to
    regions): the liveness figure holds activations only, the peak adds every weight and
    what each multi-node region's library allocated."""
    rep = squeezenet.report()
    s = rep.summary
    weights = weight_bytes(squeezenet.graph)
    assert not rep.plan.conversions  # onnxruntime and numpy share the standard layout
    assert s["peak_liveness_bytes"] is not None
    assert 0 < s["peak_liveness_bytes"] <= activation_bytes(squeezenet.graph)
    assert s["peak_bytes"] >= weights + s["peak_liveness_bytes"]
    regions = [k for k, st in enumerate(rep.plan.steps) if st.backend == "onnxruntime" and len(st.nodes) > 1]
    for k in regions:
        assert s["memory"]["library_bytes"][str(k)] > 0
    assert ("library allocations" in rep.render("text", width=200)) == bool(regions)


def test_one_region_liveness_is_the_region_boundary(squeezenet):
    """A plan that is one onnxruntime region holds only its input and output outside the
    library: far below the weights, which the peak adds with onnxruntime's allocations. (The
    liveness peak is the stored winner's: only a tuned winner of one region can show it.)"""
    plan = squeezenet.result.plan
    if len(plan.steps) != 1:
        pytest.skip(f"the tuned winner is not one onnxruntime region ({len(plan.steps)} steps: "
                    "measured on a loaded machine, numpy won a node); an untuned plan has no "
                    "stored liveness peak to check")
    assert plan.steps[0].backend == "onnxruntime"
    s = report_of(squeezenet, plan).summary
    weights = weight_bytes(squeezenet.graph)
    assert s["peak_liveness_bytes"] is not None and s["peak_liveness_bytes"] < weights
    assert s["memory"]["library_bytes"]["0"] > 0
    assert s["peak_bytes"] >= weights + s["peak_liveness_bytes"] + s["memory"]["library_bytes"]["0"]


def test_executor_figure_counts_what_onnxruntime_allocates(squeezenet, one_region):
    """:func:`tuner.plan_memory.plan_memory` (the figure the memory objective is to compare)
    counts the weights and onnxruntime's allocations, where the executor's liveness peak is
    the region's input and output only."""
    g, reg = squeezenet.graph, squeezenet.registry
    ex = Executor(g, one_region, reg)
    feeds = {v.name: np.zeros(v.shape, v.dtype) for v in g.inputs}
    ex.run(feeds)
    mem = plan_memory(ex)
    assert mem.library_bytes > 0 and len(mem.per_call) == 1
    assert mem.peak_bytes >= weight_bytes(g) + ex.memory.peak_bytes
    assert mem.to_dict()["peak_bytes"] == mem.peak_bytes


def test_mixed_plan_has_time_on_region_nodes(squeezenet, mixed_plan):
    rep = report_of(squeezenet, mixed_plan)
    rows = node_rows(rep)
    region = rows[rows["backend"] == "onnxruntime"]
    assert len(region) == len(squeezenet.graph.nodes) - 1
    assert region["median_ms"].notna().all()
    sizes = region["step"].map(region["step"].value_counts())
    assert all(is_library_source(src) for src, n in zip(region["time_source"], sizes) if n > 1)
    assert (sizes > 1).sum() > 1


def _timed_boxes(page: str) -> int:
    """Graph boxes (SVG text lines) carrying a time."""
    graph = page.split('id="graph"', 1)[1].split("</svg>", 1)[0]
    return len(re.findall(r">[0-9]+\.[0-9]{4} ms\*?<", graph))


def _page(squeezenet, plan) -> str:
    return render_html(report_of(squeezenet, plan))


@pytest.mark.parametrize("which", ["one region", "mixed"])
def test_html_shows_time_on_more_than_one_node(squeezenet, one_region, mixed_plan, which):
    page = _page(squeezenet, one_region if which == "one region" else mixed_plan)
    assert _timed_boxes(page) > 1
    assert 'id="library-times"' in page


@needs_chromium
@pytest.mark.parametrize("which", ["one region", "mixed"])
def test_html_in_chromium_shows_time_on_more_than_one_node(squeezenet, one_region, mixed_plan,
                                                           which, tmp_path: Path):
    path = tmp_path / f"squeezenet-{which.replace(' ', '-')}.html"
    path.write_text(_page(squeezenet, one_region if which == "one region" else mixed_plan))
    res = chromium(tmp_path, path, "--dump-dom")
    assert console_lines(res) == []
    assert _timed_boxes(res.stdout) > 1
