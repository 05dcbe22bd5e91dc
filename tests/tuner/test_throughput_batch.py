"""Batch sizes as throughput candidates (issue 30, :mod:`tuner.throughput.batch`): only a model
with a symbolic batch tuned at batch 1 gets them; its plan run at another batch size gives each
request what the batch-1 plan gives it alone; a winner in batches is stored with its batch size
and beside the plan its batched runs load, which a Session, ``opdispatch run`` and the server
then use.

Nothing here asserts a speed. In the tuning test the load figures are fakes that make batches
win (the thing under test is what is validated, stored and served once they do, not which
wins on this machine); the winner's validation under load and everything after it are real.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

from bench.models.symbolic_batch import symbolic_batch
from dispatch import Session
from dispatch.errors import OpDispatchError
from dispatch.executor import Executor
from tests.builders import small_cnn
from tuner.throughput import stage as tp
from tuner.throughput.batch import batch_sizes, batched_call, plan_at_batch, samples, shapes_at
from tuner.throughput.load import LoadResult
from tuner.tune import TuneOptions, load_graph, tune

SHAPE = [1, 3, 16, 16]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    p = tmp_path_factory.mktemp("batch") / "cnn_batch.onnx"
    p.write_bytes(symbolic_batch(onnx.shape_inference.infer_shapes(small_cnn())).SerializeToString())
    return str(p)


def _feeds(seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)}


def test_only_a_symbolic_batch_tuned_at_batch_1_gets_batch_sizes(model):
    graph = Session(model, input_shapes={"x": SHAPE}, store=False).graph
    assert batch_sizes(graph, 4) == [2, 4]
    assert batch_sizes(graph, 16) == [2, 4, 8, 16]
    assert batch_sizes(graph, 3) == [] and batch_sizes(graph, 1) == []
    assert batch_sizes(Session(small_cnn(), store=False).graph, 4) == []  # exported at batch 1
    at_two = Session(model, input_shapes={"x": [2, 3, 16, 16]}, store=False).graph
    assert batch_sizes(at_two, 4) == []  # tuned at batch 2: not re-batched


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_plan_at_another_batch_gives_each_request_what_it_gives_alone(model, backend):
    pytest.importorskip(backend)
    sess = Session(model, backends=[backend], input_shapes={"x": SHAPE}, store=False)
    graph4 = load_graph(model, sess.registry, sess.registry.available_backends(),
                        shapes_at(sess.graph, 4))
    assert tuple(graph4.inputs[0].shape) == (4, 3, 16, 16)
    plan4 = plan_at_batch(sess.plan, graph4, sess.registry)
    assert [s.impl for s in plan4.steps] == [s.impl for s in sess.plan.steps]
    group = samples(_feeds(), 4)
    assert not np.array_equal(group[0]["x"], group[1]["x"])  # distinct requests
    got = batched_call(Executor(graph4, plan4, sess.registry).run, group)
    for k, feeds in enumerate(group):
        for g, w in zip(got[k], sess.run(None, feeds)):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_a_plan_of_another_model_does_not_apply(model):
    sess = Session(model, input_shapes={"x": SHAPE}, store=False)
    other = Session(small_cnn(seed=1), store=False)
    other.plan.steps[0].nodes = ["not-a-node"]
    with pytest.raises(OpDispatchError, match="not-a-node"):
        plan_at_batch(other.plan, sess.graph, sess.registry)


@pytest.fixture(scope="module")
def batched_winner(model, tmp_path_factory, monkeypatch_module):
    """A throughput@n=4 plan whose load figures (faked) make batches of 4 win."""
    def fake_load(self, plan, config, window):
        rate = 100.0 * (config.batch or 1)
        return LoadResult(self.concurrency, int(rate), 1.0, rate, 1.0, 1.0, 1.0, 1.0)

    monkeypatch_module.setattr(tp.ThroughputStage, "_load", fake_load)
    store = str(tmp_path_factory.mktemp("batch-store") / "plans.sqlite")
    options = TuneOptions(budget_s=30, top_k=2, validate_runs=3, per_candidate_cap_s=0.05,
                          progress=False, objective="throughput", concurrency=4)
    result = tune(model, store=store, options=options, input_shapes={"x": SHAPE})
    monkeypatch_module.undo()
    return store, result


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_a_winner_in_batches_records_its_batch_size_and_the_evidence(batched_winner):
    _, result = batched_winner
    config = result.plan.serving_config()
    assert config.batch == 4 and config.concurrency == 4 and config.requests == 1
    trials = result.plan.provenance["throughput"]["trials"]
    assert {t["config"]["batch"] for t in trials} == {None, 2, 4}
    final = result.plan.provenance["throughput"]["final"]  # measured for real, per request
    assert final["concurrency"] == 4 and final["requests"] % 4 == 0 and final["requests"] > 0
    assert "batches of 4" in result.summary()


def test_the_batched_plan_is_stored_and_a_session_runs_batches_on_it(batched_winner, model):
    store, result = batched_winner
    objective = result.key.objective
    at4 = Session(model, store=store, objective=objective, input_shapes={"x": [4, 3, 16, 16]},
                  require_plan=True)
    assert at4.plan_source == "store" and at4.plan.serving_config().batch == 4
    sess = Session(model, store=store, objective=objective, input_shapes={"x": SHAPE},
                   require_plan=True)
    group = samples(_feeds(3), 4)
    got = sess.run_batch(group)
    for k, feeds in enumerate(group):
        assert not isinstance(got[k], Exception), got[k]
        np.testing.assert_allclose(got[k][0], sess.run(None, feeds)[0], rtol=1e-5, atol=1e-6)
    batched = sess._shape_sessions.planned()
    assert len(batched) == 1 and all(s.plan_source == "store" for s in batched.values())


def test_opdispatch_run_measures_a_batched_plan_in_batches(batched_winner, model):
    store, result = batched_winner
    proc = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "run", model, "--store", store, "--objective",
         result.key.objective, "--shape", "x=1x3x16x16", "--concurrency", "4", "--duration",
         "0.5", "--json", "-"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout)
    assert "batches of 4" in figures["what"]
    assert figures["concurrency"] == 4 and figures["requests"] % 4 == 0 and figures["errors"] == 0


def test_the_server_groups_requests_in_the_plans_batch_size_by_default(batched_winner, model):
    pytest.importorskip("prometheus_client")
    from pathlib import Path

    from tuner.serve.repository import ModelSpec, ServeSettings
    from tuner.serve.runner import ModelRunner

    store, result = batched_winner
    settings = ServeSettings(objective=result.key.objective, shapes={"x": SHAPE}).checked("test")
    assert settings.max_batch_size is None
    runner = ModelRunner(ModelSpec("cnn-batch-default", Path(model), settings), store)
    assert runner.load(), runner.reason
    assert runner.batch_sizes == [1, 4]
    off = ServeSettings(objective=result.key.objective, shapes={"x": SHAPE},
                        max_batch_size=1).checked("test")
    runner_off = ModelRunner(ModelSpec("cnn-batch-off", Path(model), off), store)
    assert runner_off.load(), runner_off.reason
    assert runner_off.batch_sizes == [1]  # the user's setting wins
    for r in (runner, runner_off):
        asyncio.run(r.drain(grace_s=5))
