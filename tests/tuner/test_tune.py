"""The tuner end to end: candidates are measured and checked, the optimiser chooses, the best
plans are validated, the winner is stored, and a Session reuses it with zero tuning.

The FAKE backend (tests/fakes.py: numpy kernels in non-standard layouts, an Add+Relu pattern)
widens the choice; it is a test double with no speed claims, so the tests check structure and
correctness, never which backend is faster."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch import Session
from dispatch.registry import ImplTable, Priority
from tests.builders import ModelBuilder, small_cnn
from tests.fakes import registry_with_fake
from tuner.store import PlanStore
from tuner.tune import TuneOptions, TuningError, tune


@pytest.fixture(scope="module")
def reg():
    return registry_with_fake()


def _opts(**kw):
    base = dict(budget_s=30, top_k=2, validate_runs=3, per_candidate_cap_s=0.05, progress=False)
    base.update(kw)
    return TuneOptions(**base)


def _x(shape=(1, 3, 16, 16), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_tune_stores_a_valid_plan_and_session_reuses_it(tmp_path, reg):
    store = PlanStore(tmp_path / "plans.sqlite")
    result = tune(small_cnn(), store=store, options=_opts(), registry=reg)
    assert result.plan.provenance["source"] == "tuned"
    assert result.stats["measured"] > 0 and result.stats["reused"] == 0
    assert any(pc.label == "untuned (heuristic)" for pc in result.validated)
    assert all(pc.error is None for pc in result.validated)
    assert "stored" in result.summary()
    # every node is covered once, and losing candidates carry their measured times
    covered = [n for s in result.plan.steps for n in s.nodes]
    assert sorted(covered) == sorted(
        n.name for n in Session(small_cnn(), registry=reg, store=False).graph.nodes)
    conv = next(n.name for n in Session(small_cnn(), registry=reg, store=False).graph.nodes
                if n.op_type == "Conv")
    conv_step = result.plan.step_for(conv)  # maybe a fused pattern or a region
    assert conv_step.cost_ms is not None and any("lost:" in r.reason for r in conv_step.rejected)

    sess = Session(small_cnn(), registry=reg, store=store)
    assert sess.plan_source == "store", sess.plan_note
    assert sess.plan.to_dict() == result.plan.to_dict()
    ref = Session(small_cnn(), backends=["numpy"], registry=reg, store=False)
    x = _x()
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_second_run_reuses_measurements(tmp_path, reg):
    store = PlanStore(tmp_path / "plans.sqlite")
    first = tune(small_cnn(), store=store, options=_opts(), registry=reg)
    again = tune(small_cnn(seed=3), store=store, options=_opts(), registry=reg)  # new weights
    assert again.stats["measured"] == 0 and again.stats["reused"] == first.stats["measured"]
    assert again.key.digest() == first.key.digest()
    assert [r.status for r in store.runs()] == ["finished", "finished"]


def test_a_wrong_candidate_never_wins(tmp_path):
    table = ImplTable("numpy")

    @table.register("Relu", "wrong_but_fast", priority=Priority.PREFERRED)
    def _wrong(node):
        """A deliberately wrong Relu (test double)."""
        return lambda x: x

    reg = registry_with_fake()
    reg.add_table(table)
    store = PlanStore(tmp_path / "plans.sqlite")
    result = tune(small_cnn(), store=store, options=_opts(), registry=reg)
    assert result.stats["wrong"] >= 1
    assert all(s.impl != "Relu.numpy.wrong_but_fast" for s in result.plan.steps)
    first_relu = next(n.name for n in Session(small_cnn(), registry=reg, store=False).graph.nodes
                      if n.op_type == "Relu")
    relu = result.plan.step_for(first_relu)  # maybe fused or in a region
    assert any(r.impl == "Relu.numpy.wrong_but_fast" and r.reason.startswith("wrong result")
               for r in relu.rejected)


def test_stale_key_is_never_used_silently(tmp_path, reg):
    store = PlanStore(tmp_path / "plans.sqlite")
    tune(small_cnn(), store=store, options=_opts(), registry=reg)
    sess = Session(small_cnn(), registry=reg, store=store, objective="memory")
    assert sess.plan_source == "heuristic"
    assert "objective: latency -> memory" in sess.plan_note or "memory" in sess.plan_note


def test_memory_objective_and_cap(tmp_path, reg):
    store = PlanStore(tmp_path / "plans.sqlite")
    mem = tune(small_cnn(), store=store, options=_opts(objective="memory"), registry=reg)
    assert mem.key.objective == "memory"
    peaks = [pc.peak_bytes for pc in mem.validated if pc.error is None]
    assert mem.peak_bytes == min(peaks)
    with pytest.raises(TuningError, match="memory cap"):
        tune(small_cnn(), store=store, options=_opts(memory_cap_bytes=1), registry=reg)
    assert store.runs()[0].status == "failed"  # newest first


def test_fused_candidates_take_part(tmp_path, reg):
    b = ModelBuilder()
    x = b.input("x", [1, 6, 8, 8])
    r = b.op("Relu", [x], name="r")
    a = b.op("Add", [x, r], name="add")
    b.output(b.op("Relu", [a], name="relu2"))
    store = PlanStore(tmp_path / "plans.sqlite")
    result = tune(b.build(), store=store, options=_opts(backends=["numpy", "fake"]), registry=reg)
    assert result.stats["candidates"] > 4
    xin = _x((1, 6, 8, 8))
    sess = Session(b.build(), registry=reg, store=store, backends=["numpy", "fake"])
    assert sess.plan_source == "store", sess.plan_note
    np.testing.assert_allclose(sess.run(None, {"x": xin})[0], np.maximum(xin + np.maximum(xin, 0), 0),
                               rtol=1e-6)


def test_unknown_objective_and_backend_are_user_errors(tmp_path, reg):
    with pytest.raises(TuningError, match="known: latency, memory"):
        tune(small_cnn(), store=tmp_path / "s.sqlite", options=_opts(objective="speed"), registry=reg)
    with pytest.raises(TuningError, match="not available"):
        tune(small_cnn(), store=tmp_path / "s.sqlite", options=_opts(backends=["cuda"]), registry=reg)
