"""Stored plans from the command line: ``run --require-plan`` in a second process that measures
nothing, its one-line error on a miss, and ``plans list|show|export|import|prune``.

Plans are tuned in this process with the default registry (the one the CLI loads), so that a
CLI process computes the same plan keys."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest

from dispatch import Session
from dispatch.backend import load_registry
from dispatch.plan import step_label
from tests.builders import ModelBuilder, small_cnn
from tuner.store import PlanStore
from tuner.tune import TuneOptions, tune


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True,
                          text=True, timeout=300)


def _opts() -> TuneOptions:
    return TuneOptions(budget_s=30, top_k=2, validate_runs=3, per_candidate_cap_s=0.05,
                       progress=False)


def _one_line_error(res: subprocess.CompletedProcess, *messages: str) -> str:
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    for message in messages:
        assert message in lines[0], lines[0]
    return lines[0]


def _counts(path) -> tuple[int, int, int]:
    """(plans, measurements, tuning runs) recorded in the store at ``path``."""
    with PlanStore(path, readonly=True) as s:
        return len(s.all_plans()), s.count_measurements(), len(s.runs())


@pytest.fixture(scope="module")
def reg():
    return load_registry()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    small = folder / "small.onnx"
    small.write_bytes(small_cnn().SerializeToString())
    b = ModelBuilder(17, "tiny")
    x = b.input("x", [1, 4, 8, 8])
    b.output(b.op("Relu", [b.op("Add", [x, x])]))
    tiny = folder / "tiny.onnx"
    tiny.write_bytes(b.build().SerializeToString())
    return {"small": small, "tiny": tiny}


@pytest.fixture(scope="module")
def tuned_store(tmp_path_factory, models, reg):
    """A store holding a plan for small.onnx, tuned once for the module; copy it to change it."""
    path = tmp_path_factory.mktemp("tuned") / "plans.sqlite"
    with PlanStore(path) as store:
        result = tune(str(models["small"]), store=store, options=_opts(), registry=reg)
    return path, result


@pytest.fixture
def store(tmp_path, tuned_store):
    path = tmp_path / "plans.sqlite"
    shutil.copy(tuned_store[0], path)
    return path


# ------------------------------------------------------------------------------------------
# run --require-plan
# ------------------------------------------------------------------------------------------


def test_a_second_process_runs_the_stored_plan_and_measures_nothing(store, models, tuned_store):
    result = tuned_store[1]
    before = _counts(store)
    assert before[0] == 1 and before[1] > 0 and before[2] == 1
    res = cli("run", str(models["small"]), "--store", str(store), "--require-plan",
              "--repeat", "2")
    assert res.returncode == 0, res.stderr
    assert f"plan: store (plan {result.plan_id} ({result.key.digest()[:16]}) from the store " \
           f"{store}" in res.stdout
    for step in result.plan.steps:
        assert step.impl in res.stdout
    assert _counts(store) == before  # no measurement, no tuning run, no new plan


def test_require_plan_on_an_empty_store_is_one_line_exit_2(tmp_path, models):
    empty = tmp_path / "empty.sqlite"
    res = cli("run", str(models["small"]), "--store", str(empty), "--require-plan")
    _one_line_error(res, "opdispatch run: error: no usable tuned plan", str(empty),
                    "no plan store exists there")
    assert not empty.exists()
    PlanStore(empty).close()
    res = cli("run", str(models["small"]), "--store", str(empty), "--require-plan")
    _one_line_error(res, str(empty), "never tuned here")


def test_require_plan_for_an_untuned_model_is_one_line_exit_2(store, models):
    res = cli("run", str(models["tiny"]), "--store", str(store), "--require-plan")
    _one_line_error(res, str(store), "never tuned here")


def test_require_plan_shows_why_a_stored_plan_does_not_match(store, models):
    res = cli("run", str(models["small"]), "--store", str(store), "--require-plan",
              "--objective", "memory")
    _one_line_error(res, str(store), "objective: latency -> memory")
    _tamper_numpy_version(store)
    res = cli("run", str(models["small"]), "--store", str(store), "--require-plan")
    _one_line_error(res, str(store), "numpy: 0.0.1 -> ")
    res = cli("run", str(models["small"]), "--store", str(store), "--repeat", "1")
    assert res.returncode == 0, res.stderr
    assert "plan: heuristic (no stored plan for this key: plan " in res.stdout
    assert "numpy: 0.0.1 -> " in res.stdout


def test_untuned_and_require_plan_exclude_each_other(store, models):
    res = cli("run", str(models["small"]), "--store", str(store), "--require-plan", "--untuned")
    _one_line_error(res, "exclude each other")


def _tamper_numpy_version(path) -> int:
    """Re-store the only plan as if it had been tuned with numpy 0.0.1."""
    with PlanStore(path) as s:
        (stored,) = s.all_plans()
        sw = stored.key.software
        key = dataclasses.replace(stored.key, software={
            **sw, "backends": {**sw["backends"], "numpy": "numpy 0.0.1"}})
        s.delete_plan(stored.id)
        return s.put_plan(key, stored.plan_json, latency_ms=stored.latency_ms)


# ------------------------------------------------------------------------------------------
# plans list | show | export | import | prune
# ------------------------------------------------------------------------------------------


def test_plans_list_and_show(store, tuned_store):
    result = tuned_store[1]
    res = cli("plans", "list", "--store", str(store))
    assert res.returncode == 0, res.stderr
    header, _, row = res.stdout.splitlines()[:3]
    for column in ("id", "model", "objective", "latency_ms", "created", "backends used"):
        assert column in header
    assert row.split()[0] == str(result.plan_id)
    assert result.key.model[:12] in row and " latency " in row
    model_file = result.plan.provenance["model_file"]  # the file the user gave tune (issue 18)
    assert os.path.isabs(model_file) and os.path.basename(model_file) in row
    assert f"{result.latency_ms:.3f}" in row
    for backend in result.plan.backends_used():
        assert backend in row
    assert row.rstrip().endswith("yes")  # usable on this machine

    res = cli("plans", "show", str(result.plan_id), "--store", str(store))
    assert res.returncode == 0, res.stderr
    assert f"plan {result.plan_id}" in res.stdout and result.key.model in res.stdout
    assert result.key.digest() in res.stdout and "tuning run" in res.stdout
    assert "model file" in res.stdout and model_file in res.stdout
    assert "provenance" in res.stdout and "validated end to end" in res.stdout
    for step in result.plan.steps:
        assert step.impl in res.stdout and step_label(step.nodes) in res.stdout

    res = cli("plans", "show", str(result.plan_id), "--json", "--store", str(store))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == result.plan.to_dict()


def test_plans_export_import_round_trip(store, tmp_path, models, reg, tuned_store):
    result = tuned_store[1]
    bundle = tmp_path / "bundle.json"
    res = cli("plans", "export", "--model", str(models["small"]), "-o", str(bundle),
              "--store", str(store))
    assert res.returncode == 0, res.stderr
    assert f"exported 1 plan(s) (ids {result.plan_id})" in res.stdout
    data = json.loads(bundle.read_text())
    assert data["plans"][0]["key"]["model"] == result.key.model

    other = tmp_path / "other" / "plans.sqlite"
    res = cli("plans", "import", str(bundle), "--store", str(other))
    assert res.returncode == 0, res.stderr
    assert "imported 1 new plan(s); 0 already in the store" in res.stdout, res.stdout
    assert "usable here: yes" in res.stdout
    # the same bundle again: nothing new, and the message says so
    res = cli("plans", "import", str(bundle), "--store", str(other))
    assert res.returncode == 0, res.stderr
    assert "imported 0 new plan(s); 1 already in the store" in res.stdout, res.stdout
    with PlanStore(other, readonly=True) as s:
        assert s.count_measurements() == 0 and s.runs() == []
    sess = Session(str(models["small"]), registry=reg, store=other, require_plan=True)
    assert sess.plan_source == "store" and sess.plan.to_dict() == result.plan.to_dict()
    res = cli("run", str(models["small"]), "--store", str(other), "--require-plan", "--repeat", "1")
    assert res.returncode == 0 and "plan: store" in res.stdout, res.stderr

    by_id = tmp_path / "by_id.json"
    assert cli("plans", "export", str(result.plan_id), "-o", str(by_id), "--store",
               str(store)).returncode == 0
    assert json.loads(by_id.read_text())["plans"] == data["plans"]


def test_plans_export_of_an_untuned_model_or_unknown_id(store, tmp_path, models):
    out = str(tmp_path / "b.json")
    _one_line_error(cli("plans", "export", "--model", str(models["tiny"]), "-o", out,
                        "--store", str(store)), "opdispatch plans export: error: no plan for")
    _one_line_error(cli("plans", "export", "999", "-o", out, "--store", str(store)),
                    "no plan with id 999", "stored ids: 1")
    _one_line_error(cli("plans", "list", "--store", str(tmp_path / "none.sqlite")),
                    "no plan store at")


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "is not a JSON plan bundle"),
        ("[]", "the bundle: expected a JSON object"),
        ('{"format": "other"}', "not a plan bundle"),
        ('{"format": "opdispatch-plan-bundle", "version": 2, "plans": []}',
         "format version 2 is not supported"),
        ('{"format": "opdispatch-plan-bundle", "version": 1, "plans": [{"key": {"model": "m"}}]}',
         "plans[0].key.inputs: expected a string"),
    ],
)
def test_plans_import_of_a_malformed_bundle(tmp_path, content, message):
    bundle = tmp_path / "bundle.json"
    bundle.write_text(content)
    dst = tmp_path / "dst.sqlite"
    _one_line_error(cli("plans", "import", str(bundle), "--store", str(dst)),
                    "opdispatch plans import: error:", message)
    assert not dst.exists()  # the bundle is checked before the store is created


def test_plans_prune(store, tmp_path, models, reg):
    res = cli("plans", "prune", "--store", str(store))
    _one_line_error(res, "give --stale and/or --older-than")
    res = cli("plans", "prune", "--stale", "--older-than", "30", "--store", str(store))
    assert res.returncode == 0, res.stderr
    assert "removed 0 plan(s)" in res.stdout and "1 kept" in res.stdout

    stale_id = _tamper_numpy_version(store)
    tiny = tune(str(models["tiny"]), store=store, options=_opts(), registry=reg)
    res = cli("plans", "list", "--store", str(store))
    assert "no: numpy: 0.0.1 -> " in res.stdout
    res = cli("plans", "prune", "--stale", "--dry-run", "--store", str(store))
    assert f"would remove plan {stale_id} " in res.stdout and _counts(store)[0] == 2
    res = cli("plans", "prune", "--stale", "--store", str(store))
    assert res.returncode == 0, res.stderr
    assert f"removed plan {stale_id} " in res.stdout and "numpy: 0.0.1 -> " in res.stdout
    assert "removed 1 plan(s)" in res.stdout and "1 kept" in res.stdout
    with PlanStore(store, readonly=True) as s:
        assert [p.id for p in s.all_plans()] == [tiny.plan_id]

    # an imported plan keeps its creation time, so --older-than sees its real age
    with PlanStore(store, readonly=True) as s:
        bundle = s.export_plans()
    bundle["plans"][0]["created_at"] = "2020-01-01T00:00:00+00:00"
    old = tmp_path / "old.json"
    old.write_text(json.dumps(bundle))
    fresh = tmp_path / "fresh.sqlite"
    assert cli("plans", "import", str(old), "--store", str(fresh)).returncode == 0
    tune(str(models["small"]), store=fresh, options=_opts(), registry=reg)
    res = cli("plans", "prune", "--older-than", "30", "--store", str(fresh))
    assert res.returncode == 0, res.stderr
    assert "created 2020-01-01 00:00:00" in res.stdout and "older than 30" in res.stdout
    assert "removed 1 plan(s)" in res.stdout and "1 kept" in res.stdout
