"""NaN/Inf semantics of tuned plans (:mod:`tuner.nonfinite`).

A FAKE backend whose Relu is ``max(x, 0)`` the way oneDNN and OpenVINO compute it
(``Relu(NaN) = 0``) agrees with the reference on finite inputs. Without the non-finite guard
(``nonfinite_guard=False``) the tuner must reject it (its candidates and the plans using it),
so the tuned plan puts NaN and Inf where the reference does; by default the plan using it is
kept, guarded (``tests/tuner/test_guard.py``); with ``allow_nonstrict_nan`` it may use it
unguarded, and the plan is then stored under an objective that says so
(``latency+nonstrict-nan``), which a default Session never picks.
The real libraries' differences (OpenVINO's Relu, onnxruntime's MaxPool) are checked to be
caught as well, where those backends are installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from dispatch import Session
from dispatch.backend import Backend, _activate, load_registry
from dispatch.errors import ArgumentError
from dispatch.objective import Objective
from dispatch.registry import ImplTable, Priority, Registry
from tests.builders import ModelBuilder
from tuner.candidates import enumerate_candidates
from tuner.nonfinite import (
    VERDICT_PREFIX,
    WRONG,
    candidate_error,
    nonfinite_difference,
    special_feeds,
    special_values,
)
from tuner.store import PlanStore
from tuner.tune import TuneOptions, load_graph, tune

REPO = Path(__file__).resolve().parents[2]
nanless_table = ImplTable("nanless")


@nanless_table.register("Relu", "skip_nan", priority=Priority.PREFERRED)
def _relu_skip_nan(node):
    """FAKE: Relu as ``x > 0 ? x : 0``, which gives 0 for NaN (oneDNN's and OpenVINO's)."""
    return lambda x: np.where(x > 0, x, np.zeros((), x.dtype)).astype(x.dtype)


class NanlessBackend(Backend):
    """FAKE backend whose Relu turns NaN into 0 (see the module docstring)."""

    name = "nanless"

    def version(self) -> str:
        return "nanless 1"

    def register(self, registry: Registry) -> None:
        registry.add_table(nanless_table)


@pytest.fixture(scope="module")
def reg() -> Registry:
    registry = load_registry(fresh=True)
    _activate(registry, NanlessBackend, "tests.tuner.test_nonfinite")
    return registry


def relu_model() -> onnx.ModelProto:
    b = ModelBuilder(17, "relus")
    x = b.input("x", [1, 4, 8, 8])
    y = b.op("Relu", [b.op("Relu", [x])])
    b.output(b.op("Add", [y, b.const(np.full((1, 4, 8, 8), 0.5, np.float32))]))
    return b.build()


def _opts(**kw) -> TuneOptions:
    base = dict(budget_s=30, top_k=2, validate_runs=3, per_candidate_cap_s=0.05, progress=False,
                backends=["nanless", "numpy"])
    base.update(kw)
    return TuneOptions(**base)


def _positions_match(a: np.ndarray, b: np.ndarray) -> bool:
    return all(np.array_equal(f(a), f(b)) for f in (np.isnan, np.isposinf, np.isneginf))


# ------------------------------------------------------------------------------------------
# the pieces
# ------------------------------------------------------------------------------------------


def test_special_values_are_sparse_nan_and_both_infinities():
    rng = np.random.default_rng(0)
    x = np.zeros((4, 8, 16), np.float32)
    y = special_values(x, rng)
    assert x.sum() == 0 and np.isfinite(x).all()  # a copy
    n = y.size // 32
    assert np.isnan(y).sum() + np.isinf(y).sum() == n
    assert np.isnan(y).any() and np.isposinf(y).any() and np.isneginf(y).any()
    assert special_values(np.zeros(1, np.float32), rng).size == 1
    assert np.isnan(special_values(np.zeros(1, np.float32), rng)).all()
    ints = np.arange(10)
    assert np.array_equal(special_values(ints, rng), ints)


def test_nonfinite_difference_compares_nan_and_inf_positions_only():
    ref = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    assert nonfinite_difference([ref + 0], [ref]) is None
    assert nonfinite_difference([np.array([np.nan, np.inf, -np.inf, 2.0], np.float32)], [ref]) is None
    why = nonfinite_difference([np.array([0.0, np.inf, -np.inf, 1.0], np.float32)], [ref])
    assert why is not None and "output 0: 1 of 4" in why and "0.0 where the reference gives nan" in why
    assert nonfinite_difference([np.array([np.nan, -np.inf, -np.inf, 1], np.float32)], [ref])
    assert nonfinite_difference([np.array([np.nan, 3e38, -np.inf, 1], np.float32)], [ref])
    assert nonfinite_difference([np.arange(3)], [np.arange(3) + 1]) is None  # integers: no NaN


def test_a_candidate_that_drops_nan_is_caught_and_a_propagating_one_is_not(reg):
    graph = load_graph(relu_model(), reg, ["nanless", "numpy"])
    cands = enumerate_candidates(graph, reg, ["nanless", "numpy"]).candidates
    nanless = [c for c in cands if c.impl.backend == "nanless"]
    assert nanless
    for c in nanless:
        why = candidate_error(reg, c)
        assert why is not None and "where the reference gives nan" in why and "(Relu)" in why
    assert all(candidate_error(reg, c) is None for c in cands if c.impl.backend == "numpy")


def test_objectives_name_nonstrict_nan():
    assert str(Objective("latency", nonstrict_nan=True)) == "latency+nonstrict-nan"
    assert str(Objective("latency", 1000, nonstrict_nan=True)) == "latency@cap=1000+nonstrict-nan"
    parsed = Objective.parse("latency@cap=1000+nonstrict-nan")
    assert (parsed.name, parsed.memory_cap) == ("latency", 1000)
    assert Objective.parse("memory+nonstrict-nan").nonstrict_nan
    assert not Objective.parse("memory").nonstrict_nan
    with pytest.raises(ArgumentError, match="nonstrict-nan"):
        Objective.parse("latency+lenient")


# ------------------------------------------------------------------------------------------
# tuning
# ------------------------------------------------------------------------------------------


def test_without_the_guard_the_tuned_plan_keeps_the_references_nan_and_inf(tmp_path, reg):
    store = PlanStore(tmp_path / "plans.sqlite")
    result = tune(relu_model(), store=store, options=_opts(nonfinite_guard=False), registry=reg)
    assert result.key.objective == "latency"
    assert "nanless" not in result.plan.backends_used()
    # the untuned plan (nanless first) runs its Relus on the FAKE backend: it never wins (it
    # is rejected when it would: only the plans that would win are run on NaN/Inf feeds)
    using = [pc for pc in result.validated if "nanless" in pc.plan.backends_used()]
    assert using and all(pc.error is None or pc.error.startswith(WRONG) for pc in using)
    assert "NaN/Inf: candidates and the winner checked" in result.summary()
    # the candidates lost on the check, and the verdict is cached like a measurement
    rejected = [r for s in result.plan.steps for r in s.rejected if r.backend == "nanless"]
    assert rejected and all(r.reason.startswith(WRONG) for r in rejected)
    verdicts = [r for r in store.db.query(
        "SELECT * FROM measurements WHERE signature LIKE ?", [VERDICT_PREFIX + "%"])]
    assert any(v["candidate"].startswith("Relu.nanless") and v["error"] for v in verdicts)
    again = tune(relu_model(), store=store, options=_opts(nonfinite_guard=False), registry=reg)
    assert again.stats["measured"] == 0 and "nanless" not in again.plan.backends_used()
    # the stored plan, run on NaN/Inf feeds, gives the reference's NaN and Inf
    graph = load_graph(relu_model(), reg, ["nanless", "numpy"])
    feeds = special_feeds(graph, 3)
    sess = Session(relu_model(), registry=reg, store=store, backends=["nanless", "numpy"])
    assert sess.plan_source == "store", sess.plan_note
    ref = Session(relu_model(), registry=reg, store=False, backends=["numpy"])
    with np.errstate(invalid="ignore"):
        assert _positions_match(sess.run(None, feeds)[0], ref.run(None, feeds)[0])
    store.close()


def test_without_the_guard_a_winner_that_differs_on_nan_is_rejected_for_the_next(reg):
    from dispatch.heuristic import heuristic_plan
    from tuner.nonfinite import nonfinite_winner
    from tuner.tune_types import PlanCandidate
    from tuner.validate import _winner

    graph = load_graph(relu_model(), reg, ["nanless", "numpy"])
    fast = PlanCandidate("nanless plan", heuristic_plan(graph, reg, ["nanless", "numpy"]), None,
                         latency_ms=1.0, spread_ms=0.0, peak_bytes=1, samples=5, baseline=True)
    slow = PlanCandidate("numpy plan", heuristic_plan(graph, reg, ["numpy"]), None,
                         latency_ms=2.0, spread_ms=0.0, peak_bytes=1, samples=5, baseline=True)
    assert "nanless" in fast.plan.backends_used()
    win, line = nonfinite_winner(graph, reg, [fast, slow], slow.plan,
                                 _opts(nonfinite_guard=False), _winner)
    assert win is slow and fast.error.startswith(WRONG) and "where the reference gives nan" in fast.error
    assert line.endswith("rejected for differing there: nanless plan")
    fast.error = None
    win, line = nonfinite_winner(graph, reg, [fast, slow], slow.plan,
                                 _opts(allow_nonstrict_nan=True), _winner)
    assert win is fast and fast.error is None and line.startswith("not checked")


def test_allow_nonstrict_nan_is_explicit_and_named_in_the_key(tmp_path, reg):
    store = PlanStore(tmp_path / "plans.sqlite")
    result = tune(relu_model(), store=store, options=_opts(allow_nonstrict_nan=True),
                  registry=reg)
    assert result.key.objective == "latency+nonstrict-nan"
    assert result.plan.provenance["objective"] == "latency+nonstrict-nan"
    using = [pc for pc in result.validated if "nanless" in pc.plan.backends_used()]
    assert using and all(pc.error is None for pc in using)
    assert "not checked (--allow-nonstrict-nan)" in result.summary()
    # a default Session never takes it; one asking for the objective does
    default = Session(relu_model(), registry=reg, store=store, backends=["nanless", "numpy"])
    assert default.plan_source == "heuristic"
    lenient = Session(relu_model(), registry=reg, store=store, backends=["nanless", "numpy"],
                      objective="latency+nonstrict-nan")
    assert lenient.plan_source == "store", lenient.plan_note
    store.close()


def test_a_first_run_session_with_the_nonstrict_objective_tunes_with_it(tmp_path, reg):
    sess = Session(relu_model(), registry=reg, store=tmp_path / "plans.sqlite",
                   backends=["nanless", "numpy"], objective="latency+nonstrict-nan",
                   tune="first-run", tune_options=_opts(budget_s=10))
    sess.run(None, {"x": np.ones((1, 4, 8, 8), np.float32)})  # tunes after this first run
    with PlanStore(tmp_path / "plans.sqlite", readonly=True) as store:
        assert [p.key.objective for p in store.all_plans()] == ["latency+nonstrict-nan"]
    assert sess.plan_source == "tuned", sess.plan_note


def test_the_command_line_takes_allow_nonstrict_nan(tmp_path):
    model = tmp_path / "relus.onnx"
    onnx.save(relu_model(), model)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-m", "tuner.cli", "tune", str(model), "--budget", "4",
                          "--no-progress", "--store", str(tmp_path / "s.sqlite"),
                          "--allow-nonstrict-nan", "--backends", "numpy"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    assert "objective latency+nonstrict-nan" in res.stdout
    assert "NaN/Inf: not checked (--allow-nonstrict-nan)" in res.stdout
    with PlanStore(tmp_path / "s.sqlite", readonly=True) as store:
        assert [p.key.objective for p in store.all_plans()] == ["latency+nonstrict-nan"]


# ------------------------------------------------------------------------------------------
# the real libraries
# ------------------------------------------------------------------------------------------


def conv_relu_maxpool() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    b = ModelBuilder(17, "crm")
    x = b.input("x", [1, 4, 12, 12])
    c = b.op("Conv", [x, b.const(rng.standard_normal((8, 4, 3, 3)).astype(np.float32))],
             pads=[1, 1, 1, 1])
    b.output(b.op("MaxPool", [b.op("Relu", [c])], kernel_shape=[2, 2], strides=[2, 2]))
    return b.build()


@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_the_libraries_differences_are_caught(backend):
    """OpenVINO's Relu(NaN) = 0 and MaxPool, onnxruntime's MaxPool skipping NaN: their
    candidates holding those nodes are rejected by the check."""
    reg = load_registry()
    if not (reg.backends.get(backend) and reg.backends[backend].available):
        pytest.skip(f"{backend} is not installed here")
    graph = load_graph(conv_relu_maxpool(), reg, [backend, "numpy"])
    cands = [c for c in enumerate_candidates(graph, reg, [backend, "numpy"]).candidates
             if c.impl.backend == backend and any(n in ("MaxPool", "Relu") for n in
                                                  (g.op_type for g in getattr(c.node, "nodes", [c.node])))]
    assert cands
    errors = [candidate_error(reg, c) for c in cands]
    assert any(e is not None and "NaN" in e for e in errors), errors
