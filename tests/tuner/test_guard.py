"""Guarded plans (:mod:`dispatch.guard`, :func:`tuner.nonfinite.nonfinite_winner`).

The FAKE backend of ``test_nonfinite.py`` computes ``Relu(NaN) = 0`` (as oneDNN and OpenVINO
do). By default the tuner keeps a winner that differs on NaN/Inf inputs, guarded: requests
whose float inputs hold NaN or Inf run a fallback plan that agrees with the reference, every
all-finite request runs the fast plan. Which executor answered is observable through the
executor's :class:`~dispatch.guard.NonfiniteGuard` (built or not, runs counted), not timing.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from dispatch import Session
from dispatch.errors import PlanError
from dispatch.executor import Executor
from dispatch.guard import has_nonfinite
from dispatch.heuristic import heuristic_plan
from dispatch.plan import Plan
from dispatch.plan_check import validate_plan
from tests.tuner.test_nonfinite import _opts, _positions_match, reg, relu_model  # noqa: F401
from tuner.nonfinite import WRONG, guarded_plan, nonfinite_winner, special_feeds
from tuner.report import build_report, render_text
from tuner.store import PlanStore, validate_bundle
from tuner.tune import load_graph, tune
from tuner.tune_types import PlanCandidate
from tuner.validate import _winner

BACKENDS = ["nanless", "numpy"]


@pytest.fixture()
def guarded(reg):  # noqa: F811
    """The relu model's graph and a plan whose Relus run on the FAKE backend, guarded by the
    numpy plan."""
    graph = load_graph(relu_model(), reg, BACKENDS)
    fast = heuristic_plan(graph, reg, BACKENDS)
    assert fast.backends_used().get("nanless") == 2
    return graph, guarded_plan(fast, heuristic_plan(graph, reg, ["numpy"]), "numpy only")


def _reference(graph, reg, feeds):  # noqa: F811
    with np.errstate(all="ignore"):
        return Executor(graph, heuristic_plan(graph, reg, ["numpy"]), reg).run(dict(feeds))


def test_has_nonfinite_checks_only_the_named_inputs():
    x = np.ones((2, 3), np.float32)
    y = x.copy()
    y[1, 2] = np.inf
    assert not has_nonfinite({"x": x}, ["x"])
    assert has_nonfinite({"x": x, "y": y}, ["x", "y"])
    assert not has_nonfinite({"x": x, "y": y}, ["x"])
    y[1, 2] = np.nan
    assert has_nonfinite({"y": y}, ["y"])


def test_the_fast_plan_runs_finite_feeds_and_the_fallback_nan_and_inf(reg, guarded):  # noqa: F811
    graph, plan = guarded
    ex = Executor(graph, plan, reg)
    fast = Executor(graph, Plan.from_dict({**plan.to_dict(), "nonfinite_fallback": None}), reg)
    assert ex.guard is not None and ex.guard.float_inputs == ("x",)
    assert not ex.guard.built  # built on the first NaN/Inf request, not with the executor
    x = np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype(np.float32)
    for _ in range(3):  # finite: the fast plan's outputs, the fallback never built
        assert np.array_equal(ex.run({"x": x})[0], fast.run({"x": x})[0])
    assert not ex.guard.built and ex.guard.fallback_runs == 0
    specials = special_feeds(graph, 3)
    with np.errstate(all="ignore"):
        got = ex.run(dict(specials))[0]
        unguarded = fast.run(dict(specials))[0]
    ref = _reference(graph, reg, specials)[0]
    assert _positions_match(got, ref)
    assert not _positions_match(unguarded, ref)  # the fast plan alone drops the NaN
    assert ex.guard.built and ex.guard.fallback_runs == 1
    ex.run({"x": x})
    assert ex.guard.fallback_runs == 1
    for kind in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[0, 1, 2, 3] = kind
        with np.errstate(all="ignore"):
            assert _positions_match(ex.run({"x": y})[0], _reference(graph, reg, {"x": y})[0])
    assert ex.guard.fallback_runs == 4


def test_a_guarded_plan_round_trips_through_json_and_is_checked_whole(reg, guarded):  # noqa: F811
    graph, plan = guarded
    back = Plan.from_json(plan.to_json())
    assert back == plan and back.nonfinite_fallback is not None
    assert back.guard_label() == "numpy only"
    assert "guarded: NaN/Inf inputs run numpy only" in back.describe()
    # an older plan without the field loads unchanged
    old = plan.to_dict()
    del old["nonfinite_fallback"]
    assert Plan.from_dict(old).nonfinite_fallback is None
    # the fallback is checked field by field, and may not nest
    data = plan.to_dict()
    data["nonfinite_fallback"]["surprise"] = 1
    with pytest.raises(PlanError, match="nonfinite_fallback.*unknown field"):
        Plan.from_dict(data)
    data = plan.to_dict()
    data["nonfinite_fallback"]["nonfinite_fallback"] = plan.to_dict()["nonfinite_fallback"]
    with pytest.raises(PlanError, match="cannot have a fallback of its own"):
        Plan.from_dict(data)
    with pytest.raises(PlanError, match="nonfinite_fallback"):
        Plan.from_dict({**plan.to_dict(), "nonfinite_fallback": [1]})
    # ... and against the graph and the registry, before anything is built
    data = plan.to_dict()
    data["nonfinite_fallback"]["steps"][0]["impl"] = "Relu.numpy.nonexistent"
    with pytest.raises(PlanError, match="nonfinite_fallback .*Relu.numpy.nonexistent"):
        validate_plan(Plan.from_dict(data), graph, reg)
    with pytest.raises(PlanError, match="nonfinite_fallback"):
        Executor(graph, Plan.from_dict(data), reg)


def test_the_fallback_is_checked_in_outline_with_the_plan_and_in_full_when_first_run(
        reg, guarded):  # noqa: F811
    """Start-up checks the fallback's coverage, names and backends (registering nothing);
    what needs its implementations (layouts, support of the nodes) is checked when its
    executor is built, on the first NaN/Inf request, which then fails with a clear error."""
    graph, plan = guarded
    data = plan.to_dict()
    data["nonfinite_fallback"]["steps"][0]["layouts_out"] = ["nchw16c"]  # names exist; wrong
    tampered = Plan.from_dict(data)
    validate_plan(tampered, graph, reg)  # the outline holds
    ex = Executor(graph, tampered, reg)
    x = np.ones((1, 4, 8, 8), np.float32)
    ex.run({"x": x})  # finite requests run the fast plan
    x[0, 0, 0, 0] = np.nan
    for _ in range(2):  # refused each time, never half-built
        with pytest.raises(PlanError, match=r"nonfinite_fallback .*layouts_out \['nchw16c'\].*re-tune"):
            ex.run({"x": x})
    assert not ex.guard.built
    # what the outline does check: the fallback covers the graph, with known names
    data = plan.to_dict()
    data["nonfinite_fallback"]["steps"].pop()
    with pytest.raises(PlanError, match="nonfinite_fallback .*nodes without a step"):
        validate_plan(Plan.from_dict(data), graph, reg)
    data = plan.to_dict()
    data["nonfinite_fallback"]["steps"][0]["backend"] = "nanless"
    with pytest.raises(PlanError, match="nonfinite_fallback .*belongs to backend 'numpy'"):
        validate_plan(Plan.from_dict(data), graph, reg)
    data = plan.to_dict()
    data["nonfinite_fallback"]["conversions"] = [
        {"value": "x", "src": "standard", "dst": "nchw16c", "chain": ["no_such_converter"], "consumers": []}]
    with pytest.raises(PlanError, match="nonfinite_fallback .*unknown converter 'no_such_converter'"):
        validate_plan(Plan.from_dict(data), graph, reg)


def test_a_winner_that_differs_on_nan_is_kept_guarded_by_the_next_that_agrees(reg):  # noqa: F811
    graph = load_graph(relu_model(), reg, BACKENDS)
    fast = PlanCandidate("nanless plan", heuristic_plan(graph, reg, BACKENDS), None,
                         latency_ms=1.0, spread_ms=0.0, peak_bytes=1, samples=5, baseline=True)
    slow = PlanCandidate("numpy plan", heuristic_plan(graph, reg, ["numpy"]), None,
                         latency_ms=2.0, spread_ms=0.0, peak_bytes=1, samples=5, baseline=True)
    win, line = nonfinite_winner(graph, reg, [fast, slow], slow.plan, _opts(), _winner)
    assert win is fast and fast.error is None
    assert win.plan.nonfinite_fallback is not None and win.plan.guard_label() == "numpy plan"
    assert "nanless" not in win.plan.nonfinite_fallback.backends_used()
    assert "nanless plan, guarded: NaN/Inf inputs run numpy plan" in line
    assert win.plan.provenance["nonfinite_guard"]["fallback"] == "numpy plan"
    assert 1.0 < win.latency_ms < 2.0  # the guard's check counted, microseconds
    # no other plan agrees: the reference plan is the fallback
    fast2 = PlanCandidate("nanless plan", heuristic_plan(graph, reg, BACKENDS), None,
                          latency_ms=1.0, spread_ms=0.0, peak_bytes=1, samples=5, baseline=True)
    win, line = nonfinite_winner(graph, reg, [fast2], slow.plan, _opts(), _winner)
    assert win is fast2 and "run the numpy reference" in line


def _nanless_first(plans, opts):
    """A chooser that prefers the plans running the FAKE Relu (as if they measured fastest:
    the two backends take microseconds, so timing alone would decide at random)."""
    ok = [pc for pc in plans if pc.error is None]
    if not ok:
        return _winner(plans, opts)  # raises, saying why
    return max(ok, key=lambda pc: (pc.plan.backends_used().get("nanless", 0), -pc.latency_ms))


def test_a_tuned_guarded_plan_round_trips_through_the_store_and_a_bundle(tmp_path, reg,  # noqa: F811
                                                                          monkeypatch):
    monkeypatch.setattr("tuner.stages.base._winner", _nanless_first)
    store = PlanStore(tmp_path / "plans.sqlite")
    result = tune(relu_model(), store=store, options=_opts(), registry=reg)
    assert result.key.objective == "latency"
    assert "nanless" in result.plan.backends_used()  # the fast plan is kept...
    assert result.plan.nonfinite_fallback is not None  # ... guarded
    assert "nanless" not in result.plan.nonfinite_fallback.backends_used()
    assert ", guarded: NaN/Inf inputs run " in result.summary()
    assert not [pc for pc in result.validated if (pc.error or "").startswith(WRONG)]
    graph = load_graph(relu_model(), reg, BACKENDS)
    feeds = special_feeds(graph, 3)
    ref = _reference(graph, reg, feeds)[0]
    rep = build_report(result.plan, graph, store=store, registry=reg)
    assert rep.summary["nonfinite_guard"] == result.plan.guard_label()
    assert "guarded: NaN/Inf inputs run" in render_text(rep)
    bundle = json.loads(json.dumps(store.export_plans()))
    validate_bundle(bundle)
    store.close()
    other = PlanStore(tmp_path / "imported.sqlite")
    other.import_plans(bundle)
    other.close()
    x = np.random.default_rng(2).standard_normal((1, 4, 8, 8)).astype(np.float32)
    for path in ("plans.sqlite", "imported.sqlite"):
        sess = Session(relu_model(), registry=reg, store=tmp_path / path, backends=BACKENDS)
        assert sess.plan_source == "store", sess.plan_note
        assert sess.plan == result.plan
        guard = sess.executor.guard
        assert guard is not None and not guard.built  # not at start-up
        sess.run(None, {"x": x})
        assert not guard.built
        with np.errstate(all="ignore"):
            assert _positions_match(sess.run(None, feeds)[0], ref)
        assert guard.built and guard.fallback_runs == 1


def test_concurrent_finite_and_nonfinite_runs_build_the_fallback_once(reg, guarded):  # noqa: F811
    graph, plan = guarded
    sess = Session(relu_model(), registry=reg, store=False, backends=BACKENDS, plan=plan)
    x = np.random.default_rng(4).standard_normal((1, 4, 8, 8)).astype(np.float32)
    y = special_feeds(graph, 5)["x"]
    want = {"x": sess.run(None, {"x": x})[0]}
    with np.errstate(all="ignore"):
        want["y"] = _reference(graph, reg, {"x": y})[0]
    built: list[object] = []
    real = sess.executor.guard._build

    def counting():
        built.append(1)
        return real()

    sess.executor.guard._build = counting
    errors: list[str] = []
    barrier = threading.Barrier(8)

    def work(k: int) -> None:
        barrier.wait()
        for j in range(6):
            which = "y" if (k + j) % 2 else "x"
            with np.errstate(all="ignore"):
                got = sess.run(None, {"x": x if which == "x" else y})[0]
            ok = (np.array_equal(got, want["x"]) if which == "x"
                  else _positions_match(got, want["y"]))
            if not ok:
                errors.append(f"thread {k} run {j} ({which})")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(built) == 1
    assert sess.executor.guard.fallback_runs == 24
