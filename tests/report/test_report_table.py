"""The report table and summary: one row per node plus the converters, and every number equal
to the plan store's (checked cell by cell against lookups made here, independently of the
report's own code)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from dispatch.fusion import REGION_OP
from dispatch.heuristic import heuristic_plan
from tuner.candidates import enumerate_candidates
from tuner.fingerprint import hardware_digest, software_digest
from tuner.report import COLUMNS, build_report, fmt_ms, report
from tuner.report.library import is_library_source
from tuner.store import PlanStore


def _same(a, b) -> bool:
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b is None or (isinstance(b, float) and math.isnan(b))
    return a == b


def test_one_row_per_node_and_per_converter(tuned):
    rep = tuned.report()
    table = rep.table
    assert list(table.columns) == list(COLUMNS)
    nodes = table[table["kind"] == "node"]
    assert sorted(nodes["name"]) == sorted(n.name for n in tuned.graph.nodes)
    assert len(table[table["kind"] == "converter"]) == len(tuned.result.plan.conversions)
    assert list(table["order"]) == list(range(len(table)))
    # execution order: steps appear in plan order, each run-time converter before its first consumer
    assert list(dict.fromkeys(nodes["step"])) == list(range(len(tuned.result.plan.steps)))
    for k, step in enumerate(tuned.result.plan.steps):
        rows = nodes[nodes["step"] == k]
        assert list(rows["name"]) == step.nodes
        assert set(rows["impl"]) == {step.impl} and set(rows["backend"]) == {step.backend}
        assert rows.iloc[0]["layouts_in"] == ",".join(step.layouts_in)
        # the step's time is on its first node only, or (a library region, issue 18) spread
        # over its nodes by the library's profiler and scaled to it: sums per backend hold
        if rows["time_source"].map(is_library_source).all():
            assert rows["median_ms"].notna().all()
        else:
            assert rows.iloc[1:]["median_ms"].isna().all()
    for r in nodes.itertuples():
        node = tuned.graph.node(r.name)
        assert r.op == node.op_type
        assert "x".join(map(str, node.outputs[0].shape)) in r.shapes
    # tuner.report.report(plan, ...) is the same table
    via_plan = report(tuned.result.plan, tuned.graph, store=tuned.store, registry=tuned.registry)
    pd.testing.assert_frame_equal(via_plan, table)


def test_numbers_equal_the_store_cell_by_cell(tuned):
    plan, graph, reg = tuned.result.plan, tuned.graph, tuned.registry
    rep = tuned.report()
    table = rep.table
    with PlanStore(tuned.store, readonly=True) as store:
        stored = store.plan_by_id(tuned.result.plan_id)
        hw, sw = hardware_digest(stored.key.hardware), software_digest(stored.key.software)
        cands = enumerate_candidates(graph, reg, list(stored.key.software["backends"]))
        by_id = {(c.impl.name, c.nodes): c for c in cands.candidates}

        def lookup(impl: str, nodes):
            return store.get_measurement(by_id[(impl, tuple(nodes))].signature, impl, hw, sw)

        def measured(impl: str, nodes) -> tuple:
            m = lookup(impl, nodes)
            assert m is not None and m.error is None, (impl, nodes)
            return m.median_s * 1e3, m.spread_s * 1e3, m.samples

        nodes = table[table["kind"] == "node"]
        step_ms = []
        for k, step in enumerate(plan.steps):
            rows = nodes[nodes["step"] == k]
            row = rows.iloc[0]
            median, spread, samples = measured(step.impl, step.nodes)
            if is_library_source(row["time_source"]):  # per node from the library (issue 18)
                assert rows["median_ms"].sum() == pytest.approx(median, rel=1e-9)
            else:
                assert row["median_ms"] == median
                assert row["time_source"] == "store"
                assert row["median_ms"] == pytest.approx(step.cost_ms, rel=1e-12)
            assert row["spread_ms"] == spread
            assert row["samples"] == samples
            step_ms.append(median)
            if row["runner_up"] and "(+" not in row["runner_up"]:
                assert row["runner_up_ms"] == measured(row["runner_up"], step.nodes)[0]
                assert row["runner_up_delta_ms"] == pytest.approx(row["runner_up_ms"] - median)
        conv_ms = []
        convs = table[table["kind"] == "converter"]
        for c in plan.conversions:
            row = convs[convs["name"] == f"convert {c.value} {c.src}->{c.dst}"].iloc[0]
            assert row["impl"] == " > ".join(c.chain) and row["cost_bytes"] == c.cost_bytes
            if c.at_build:
                assert row["when"] == "build" and math.isnan(row["median_ms"])
                continue
            v = graph.value(c.value)
            sig = f"convert:{c.src}->{c.dst}:{'x'.join(map(str, v.shape))}:{np.dtype(v.dtype).str}"
            m = store.get_measurement(sig, " > ".join(c.chain), hw, sw)
            if m is None:  # estimated by the tuner, never stored: not known
                assert math.isnan(row["median_ms"]) and row["time_source"] == "not measured"
                conv_ms.append(None)
            else:
                assert row["median_ms"] == m.median_s * 1e3
                assert row["spread_ms"] == m.spread_s * 1e3
                conv_ms.append(m.median_s * 1e3)
        # an alternative shows a time exactly when the store holds one, and it is that one;
        # failed or wrong ones show the stored error
        for alts in rep.alternatives.values():
            for a in alts:
                if a.verdict == "unsupported" or not a.covers:
                    continue
                m = lookup(a.impl, a.covers)
                if m is None:
                    assert a.median_ms is None and a.verdict == "not measured"
                elif m.error is not None:
                    assert a.median_ms is None and a.reason == m.error
                else:
                    assert a.median_ms == m.median_s * 1e3 and a.spread_ms == m.spread_s * 1e3
        run = next(r for r in store.runs() if r.id == stored.run_id)

    s = rep.summary
    assert s["plan_id"] == stored.id and s["plan_key"] == stored.key.digest()
    assert s["latency_ms"] == stored.latency_ms
    # the stored peak is the whole figure the tuner validated (liveness + constants + what the
    # region libraries allocated: issue 18), and the report shows it with its parts
    assert s["peak_bytes"] == stored.peak_bytes
    assert s["peak_liveness_bytes"] < s["peak_bytes"]
    assert s["memory"]["liveness_bytes"] == s["peak_liveness_bytes"]
    assert s["hardware_digest"] == hw and s["software_digest"] == sw
    assert s["kernels_ms"] == pytest.approx(sum(step_ms))
    per_backend: dict[str, float] = {}
    for step, ms in zip(plan.steps, step_ms):
        per_backend[step.backend] = per_backend.get(step.backend, 0.0) + ms
    assert s["time_per_backend_ms"] == pytest.approx(per_backend)
    if all(ms is not None for ms in conv_ms):
        total = sum(step_ms) + sum(conv_ms)
        assert s["sum_of_parts_ms"] == pytest.approx(total)
        assert table["share"].sum() == pytest.approx(1.0)
    else:
        assert s["sum_of_parts_ms"] is None and s["converter_share"] is None
    validated = {v["label"]: v for v in plan.provenance["validated"]}
    heur = validated["untuned (heuristic)"]
    assert s["vs_heuristic"]["heuristic_ms"] == heur["latency_ms"]
    assert s["vs_heuristic"]["speedup"] == pytest.approx(heur["latency_ms"] / stored.latency_ms)
    assert s["tuning"]["tuning_s"] == run.stats["tuning_s"]
    assert s["tuning"]["run_id"] == run.id and s["tuning"]["budget_s"] == run.budget_s

    # the JSON rendering carries the same numbers (floats round-trip exactly)
    data = json.loads(rep.render("json"))
    assert len(data["rows"]) == len(table)
    for rec, row in zip(data["rows"], table.to_dict("records")):
        for col in ("median_ms", "spread_ms", "share", "runner_up_ms", "cost_bytes"):
            assert _same(rec[col], row[col]), (col, rec, row)
    assert data["summary"]["latency_ms"] == stored.latency_ms
    # ... and the text rendering shows them
    text = rep.render("text")
    for r in table[table["median_ms"].notna()].itertuples():
        line = next(ln for ln in text.splitlines() if f" {r.name} " in ln or f"[{r.name}" in ln)
        assert fmt_ms(r.median_ms) in line


def test_rejections_cover_every_kind_with_reasons(small, resnet50):
    rep = small.report()
    rej = rep.rejections
    assert len(rej) > 0 and rej["reason"].str.len().min() > 0
    verdicts = set(rej["verdict"])
    assert {"unsupported", "slower"} <= verdicts
    slower = rej[rej["verdict"] == "slower"]
    assert (slower["delta_ms"] >= 0).all()
    assert slower["reason"].str.contains("slower by").all()
    faster = rej[rej["verdict"] == "faster alone"]
    assert (faster["delta_ms"] < 0).all()
    # the rows' rejected column lists the same candidates
    nodes = rep.table[rep.table["kind"] == "node"].set_index("name")
    for node, group in rej.groupby("node"):
        assert nodes.loc[node, "n_rejected"] == len(group)
        for impl in group["impl"]:
            assert impl in nodes.loc[node, "rejected"]
    # resnet50 was tuned on a budget too short to measure everything: those say so
    big = resnet50.report().rejections
    unmeasured = big[big["verdict"] == "not measured"]
    assert len(unmeasured) > 0
    assert unmeasured["reason"].str.contains("budget").all()


def test_summary_states_what_is_not_known(resnet50):
    rep = resnet50.report()
    rows = dict(rep.summary_rows())
    for label in ("total latency", "converter share", "time per backend", "peak memory",
                  "vs heuristic plan", "tuning", "tuned at", "machine", "plan key", "fingerprints"):
        assert label in rows, label
    for b in resnet50.result.plan.provenance["software"]["backends"]:
        text = rows[f"vs {b}-only plan"]
        # either an estimate labelled as such, or why not
        assert "estimated" in text or "not known" in text or "cannot run" in text, text


def test_single_backend_estimates_are_sums_of_stored_measurements(transformer):
    rep = transformer.report()
    graph, reg = transformer.graph, transformer.registry
    est = rep.summary["vs_single_backend"]["numpy"]
    single = heuristic_plan(graph, reg, ["numpy"])
    with PlanStore(transformer.store, readonly=True) as store:
        key = transformer.stored().key
        hw, sw = hardware_digest(key.hardware), software_digest(key.software)
        cands = {(c.impl.name, c.nodes): c for c in enumerate_candidates(graph, reg, ["numpy"]).candidates}
        total = 0.0
        for step in single.steps:
            c = cands[(step.impl, tuple(step.nodes))]
            m = store.get_measurement(c.signature, step.impl, hw, sw)
            if m is None:
                assert est["estimated_ms"] is None and "not known" in est["note"]
                return
            total += m.median_s * 1e3
    assert est["estimated_ms"] == pytest.approx(total)
    assert est["speedup"] == pytest.approx(total / rep.summary["sum_of_parts_ms"])


def test_regions_are_reported_node_by_node(transformer):
    plan = transformer.result.plan
    rep = transformer.report()
    regions = [s for s in plan.steps if s.op == REGION_OP]
    if not regions:
        pytest.skip("the tuner chose no onnxruntime region for the transformer block on this machine")
    step = max(regions, key=lambda s: len(s.nodes))
    rows = rep.table[rep.table["impl"] == step.impl]
    assert set(step.nodes) <= set(rows["name"])
    assert (rows["step_op"] == REGION_OP).all()


def test_report_of_a_session_and_of_a_bare_plan(small):
    from dispatch import Session

    sess = Session(str(small.model), store=str(small.store), registry=small.registry)
    assert sess.plan_source == "store"
    via_session = build_report(sess)
    pd.testing.assert_frame_equal(via_session.table, small.report().table)
    # without graph or store: the plan's own figures, and the report says what is missing
    bare = build_report(small.result.plan)
    assert len(bare.table[bare.table["kind"] == "node"]) == len(small.graph.nodes)
    # each step's time is the plan's own figure, on its first node or, for a region whose
    # library profile the plan carries (issue 18), spread over its nodes
    nodes = bare.table[(bare.table["kind"] == "node") & bare.table["median_ms"].notna()]
    for k, step in enumerate(small.result.plan.steps):
        assert nodes[nodes["step"] == k]["median_ms"].sum() == pytest.approx(step.cost_ms)
    assert nodes["time_source"].map(lambda s: s == "plan" or is_library_source(s)).all()
    assert any("no plan store" in n for n in bare.notes)
    assert report(small.result.plan).shape == bare.table.shape


def test_untuned_plan_uses_this_machines_measurements(small):
    from tuner.tune import plan_key

    reg, graph = small.registry, small.graph
    key = small.stored().key
    untuned = heuristic_plan(graph, reg, list(key.software["backends"]))
    rep = build_report(untuned, graph, store=small.store, registry=reg,
                       key=plan_key(graph, reg, list(key.software["backends"]), "latency"))
    firsts = rep.table[(rep.table["kind"] == "node") & rep.table["median_ms"].notna()]
    assert len(firsts) == len(untuned.steps)  # the tuner measured every untuned candidate
    assert rep.summary["source"] == "heuristic"
    assert "not known" in rep.summary["vs_heuristic"]["note"]


def test_unknown_store_and_mismatched_graph_are_clear_errors(small, transformer, tmp_path):
    from tuner.report import ReportError

    with pytest.raises(ReportError, match="no plan store at"):
        build_report(small.result.plan, small.graph, store=tmp_path / "none.sqlite")
    with pytest.raises(ReportError, match="does not match graph"):
        build_report(small.result.plan, transformer.graph, registry=small.registry)


def test_resnet50_memory_and_region_times(resnet50):
    """Issue 18: the report's peak memory holds resnet50's weights; a region of several nodes
    has a time on each of them."""
    rep = resnet50.report()
    weights = sum(int(v.nbytes) for v in resnet50.graph.values.values() if v.is_const)
    assert rep.summary["peak_bytes"] >= weights
    print(rep.summary["peak_basis"])
    nodes = rep.table[rep.table["kind"] == "node"]
    for k, step in enumerate(resnet50.result.plan.steps):
        if step.backend == "onnxruntime" and len(step.nodes) > 1:
            assert nodes[nodes["step"] == k]["median_ms"].notna().all()
