"""Tuned plans in production: a Session that requires a stored plan, tunes on its first run or
on request, ignores (and explains) a plan whose fingerprint no longer matches, plan bundles
shipped between stores, pruning, and several processes tuning into one store while another
reads it.

The checks are about where a plan came from and what the store records (plans, measurements,
tuning runs), never about timings."""

from __future__ import annotations

import copy
import dataclasses
import multiprocessing
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from dispatch import Session
from dispatch.errors import ArgumentError, OpDispatchError, PlanNotFoundError
from tests.builders import ModelBuilder, small_cnn
from tests.fakes import registry_with_fake
from tuner.store import (
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    BundleError,
    PlanStore,
    stale_reasons,
)
from tuner.tune import TuneOptions, tune


@pytest.fixture(scope="module")
def reg():
    return registry_with_fake()


@pytest.fixture(scope="module")
def tuned_stores(tmp_path_factory, reg):
    """One tuning per model for the whole module (tuning is what costs): ``name -> (store path,
    result)`` for ``small_cnn`` and ``other_cnn``; a test takes its own copy (:func:`_copy`)."""
    folder = tmp_path_factory.mktemp("tuned")
    out = {}
    for name, model in (("small_cnn", small_cnn()), ("other_cnn", other_cnn())):
        path = folder / f"{name}.sqlite"
        out[name] = (path, tune(model, store=path, options=_opts(), registry=reg))
    return out


def _copy(tuned_stores, name: str, to: Path):
    """A copy at ``to`` of the store holding ``name``'s tuned plan, and its tuning result."""
    source, result = tuned_stores[name]
    src, dst = sqlite3.connect(source), sqlite3.connect(to)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    return result


def _opts(**kw) -> TuneOptions:
    base = dict(budget_s=30, top_k=2, validate_runs=3, per_candidate_cap_s=0.05, progress=False)
    base.update(kw)
    return TuneOptions(**base)


def _x(shape=(1, 3, 16, 16), seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def other_cnn(seed: int = 0):
    """A model of another structure than small_cnn (Conv-Relu-pool on a 1x4x8x8 input)."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder(17, "other_cnn")
    x = b.input("x", [1, 4, 8, 8])
    c = b.op("Conv", [x, b.const(rng.normal(0, 0.3, (6, 4, 3, 3)).astype(np.float32))],
             pads=[1, 1, 1, 1])
    r = b.op("Relu", [c])
    b.output(b.op("GlobalAveragePool", [r]))
    return b.build()


def _reference(model, x, reg):
    return Session(model, backends=["numpy"], registry=reg, store=False).run(None, {"x": x})


def _counts(path) -> tuple[int, int, int]:
    """(plans, measurements, tuning runs) recorded in the store at ``path``."""
    with PlanStore(path, readonly=True) as s:
        return len(s.all_plans()), s.count_measurements(), len(s.runs())


# ------------------------------------------------------------------------------------------
# require_plan
# ------------------------------------------------------------------------------------------


def test_require_plan_without_a_store_names_the_path(tmp_path, reg):
    path = tmp_path / "none" / "plans.sqlite"
    with pytest.raises(PlanNotFoundError) as info:
        Session(small_cnn(), registry=reg, store=path, require_plan=True)
    msg = str(info.value)
    assert str(path) in msg and "no plan store exists there" in msg and "\n" not in msg
    assert info.value.store_path == str(path)
    assert not path.exists()  # looking a plan up never creates the store


def test_require_plan_on_an_untuned_model_says_never_tuned(tmp_path, reg, tuned_stores):
    path = tmp_path / "plans.sqlite"
    _copy(tuned_stores, "other_cnn", path)  # another model only
    with pytest.raises(PlanNotFoundError, match="never tuned here") as info:
        Session(small_cnn(), registry=reg, store=path, require_plan=True)
    assert str(path) in str(info.value)
    assert info.value.reasons == ["this model was never tuned here"]


def test_require_plan_hit_runs_the_stored_plan_and_measures_nothing(tmp_path, reg, tuned_stores):
    path = tmp_path / "plans.sqlite"
    result = _copy(tuned_stores, "small_cnn", path)
    before = _counts(path)
    sess = Session(small_cnn(seed=5), registry=reg, store=path, require_plan=True)  # new weights
    assert sess.plan_source == "store", sess.plan_note
    assert sess.plan.to_dict() == result.plan.to_dict()
    assert f"plan {result.plan_id} " in sess.plan_note and str(path) in sess.plan_note
    x = _x()
    np.testing.assert_allclose(sess.run(None, {"x": x})[0],
                               _reference(small_cnn(seed=5), x, reg)[0], rtol=1e-4, atol=1e-5)
    assert _counts(path) == before


# ------------------------------------------------------------------------------------------
# stale fingerprints and other objectives
# ------------------------------------------------------------------------------------------


def _tamper_software(path, backend: str = "numpy", version: str = "numpy 0.0.1") -> int:
    """Re-store the only plan as if it had been tuned with another ``backend`` version."""
    with PlanStore(path) as s:
        (stored,) = s.all_plans()
        software = {**stored.key.software,
                    "backends": {**stored.key.software["backends"], backend: version}}
        s.delete_plan(stored.id)
        return s.put_plan(dataclasses.replace(stored.key, software=software), stored.plan_json,
                          latency_ms=stored.latency_ms)


def test_a_plan_of_other_software_is_not_used_and_the_reason_is_shown(tmp_path, reg,
                                                                     tuned_stores):
    path = tmp_path / "plans.sqlite"
    _copy(tuned_stores, "small_cnn", path)
    plan_id = _tamper_software(path)
    sess = Session(small_cnn(), registry=reg, store=path)
    assert sess.plan_source == "heuristic"
    assert f"plan {plan_id} " in sess.plan_note and "numpy: 0.0.1 -> " in sess.plan_note
    assert "numpy: 0.0.1 -> " in sess.describe()
    with pytest.raises(PlanNotFoundError, match=r"numpy: 0\.0\.1 -> ") as info:
        Session(small_cnn(), registry=reg, store=path, require_plan=True)
    assert str(path) in str(info.value)
    with PlanStore(path, readonly=True) as s:
        (stored,) = s.all_plans()
        assert any(r.startswith("numpy: 0.0.1 -> ") for r in stale_reasons(stored, reg))


def test_another_objective_is_a_miss_with_its_reason(tmp_path, reg, tuned_stores):
    path = tmp_path / "plans.sqlite"
    _copy(tuned_stores, "small_cnn", path)
    with pytest.raises(PlanNotFoundError, match="objective: latency -> memory"):
        Session(small_cnn(), registry=reg, store=path, objective="memory", require_plan=True)
    sess = Session(small_cnn(), registry=reg, store=path, objective="latency@cap=1000000")
    assert sess.plan_source == "heuristic"
    assert "objective: latency -> latency@cap=1000000" in sess.plan_note


# ------------------------------------------------------------------------------------------
# tune="first-run" and Session.tune
# ------------------------------------------------------------------------------------------


def test_first_run_tunes_once_stores_and_switches(tmp_path, reg):
    path = tmp_path / "plans.sqlite"
    sess = Session(small_cnn(), registry=reg, store=path, tune="first-run",
                   tune_options=_opts())
    assert sess.plan_source == "heuristic" and "first run tunes it" in sess.plan_note
    assert not path.exists()  # nothing is written before the first run
    x = _x()
    ref = _reference(small_cnn(), x, reg)
    first = sess.run(None, {"x": x})
    np.testing.assert_allclose(first[0], ref[0], rtol=1e-4, atol=1e-5)
    assert sess.plan_source == "tuned", sess.plan_note
    assert sess.tune_result is not None and sess.plan is sess.tune_result.plan
    assert "tuned on the first run" in sess.plan_note
    counts = _counts(path)
    assert counts[0] == 1 and counts[2] == 1 and counts[1] > 0
    for seed in (1, 2):  # later runs use the tuned plan and never tune again
        x2 = _x(seed=seed)
        np.testing.assert_allclose(sess.run(None, {"x": x2})[0], _reference(small_cnn(), x2, reg)[0],
                                   rtol=1e-4, atol=1e-5)
    assert _counts(path) == counts

    again = Session(small_cnn(), registry=reg, store=path, tune="first-run", tune_options=_opts())
    assert again.plan_source == "store", again.plan_note
    assert again.plan.to_dict() == sess.plan.to_dict()
    again.run(None, {"x": x})
    assert _counts(path) == counts  # a store hit never tunes


def test_first_run_honours_the_session_budget(tmp_path, reg):
    path = tmp_path / "plans.sqlite"
    sess = Session(small_cnn(), registry=reg, store=path, tune="first-run", tune_budget_s=7,
                   tune_options=_opts())
    sess.run(None, {"x": _x()})
    with PlanStore(path, readonly=True) as s:
        (run,) = s.runs()
    assert run.budget_s == 7 and run.status == "finished"


def test_first_run_tuning_failure_keeps_the_untuned_plan_and_warns(tmp_path, reg):
    path = tmp_path / "plans.sqlite"
    sess = Session(small_cnn(), registry=reg, store=path, tune="first-run", tune_options=_opts(),
                   objective="latency@cap=1")  # no plan fits in one byte
    x = _x()
    with pytest.warns(RuntimeWarning, match="memory cap"):
        out = sess.run(None, {"x": x})
    np.testing.assert_allclose(out[0], _reference(small_cnn(), x, reg)[0], rtol=1e-4, atol=1e-5)
    assert sess.plan_source == "heuristic" and "tuning on the first run failed" in sess.plan_note
    sess.run(None, {"x": x})  # tried once only: no second warning, no second run
    with PlanStore(path, readonly=True) as s:
        assert [r.status for r in s.runs()] == ["failed"] and not s.all_plans()


def test_session_tune_stores_and_switches(tmp_path, reg):
    path = tmp_path / "plans.sqlite"
    sess = Session(other_cnn(), registry=reg, store=path)
    assert sess.plan_source == "heuristic"
    result = sess.tune(budget_s=20, top_k=2, validate_runs=3, per_candidate_cap_s=0.05,
                       progress=False)
    assert sess.plan_source == "tuned" and sess.plan is result.plan
    assert sess.plan_key == result.key
    with PlanStore(path, readonly=True) as s:
        assert s.get_plan(result.key).id == result.plan_id
        assert s.runs()[0].budget_s == 20
    x = _x((1, 4, 8, 8))
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _reference(other_cnn(), x, reg)[0],
                               rtol=1e-4, atol=1e-5)
    assert Session(other_cnn(), registry=reg, store=path).plan_source == "store"


def test_session_tune_into_a_given_store_object(tmp_path, reg):
    with PlanStore(tmp_path / "plans.sqlite") as store:
        sess = Session(other_cnn(), registry=reg, store=store, tune_options=_opts())
        result = sess.tune()
        assert store.get_plan(result.key) is not None and sess.store_path == str(store.path)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tune="always"), "tune must be one of None, 'first-run', received 'always'"),
        (dict(tune="first-run", store=False), "needs a plan store, received store=False"),
        (dict(tune="first-run", require_plan=True), "exclude each other"),
        (dict(require_plan=True, overrides={"Relu_3": "Relu.numpy.basic"}), "cannot be combined"),
        (dict(tune="first-run", tune_budget_s=0), "tune_budget_s must be a positive number"),
        (dict(tune_options={"budget_s": 1}), "tune_options must be a tuner.tune.TuneOptions"),
        (dict(store=3), "store must be a path"),
    ],
)
def test_bad_session_arguments(tmp_path, reg, kwargs, message):
    kwargs.setdefault("store", tmp_path / "plans.sqlite")
    with pytest.raises(ArgumentError) as info:
        Session(small_cnn(), registry=reg, **kwargs)
    assert message in str(info.value)
    assert isinstance(info.value, OpDispatchError)


def test_bad_session_tune_calls(tmp_path, reg):
    sess = Session(small_cnn(), registry=reg, store=False)
    with pytest.raises(ArgumentError, match="store=False"):
        sess.tune(budget_s=1)
    sess = Session(small_cnn(), registry=reg, store=tmp_path / "plans.sqlite")
    with pytest.raises(ArgumentError, match="objective come"):
        sess.tune(objective="memory")
    with pytest.raises(ArgumentError, match=r"unknown option\(s\) \['budget'\]"):
        sess.tune(budget=3)
    with pytest.raises(ArgumentError, match="budget_s must be a positive number"):
        sess.tune(budget_s=-1)
    with pytest.raises(ArgumentError, match="unknown objective 'speed'"):
        Session(small_cnn(), registry=reg, store=tmp_path / "plans.sqlite", objective="speed")
    assert not (tmp_path / "plans.sqlite").exists()


# ------------------------------------------------------------------------------------------
# bundles and pruning (the API; the CLI is tested in tests/cli/test_cli_plans.py)
# ------------------------------------------------------------------------------------------


def test_bundle_round_trip_into_a_fresh_store(tmp_path, reg):
    src = tmp_path / "a.sqlite"
    result = tune(small_cnn(), store=src, options=_opts(), registry=reg)
    tune(other_cnn(), store=src, options=_opts(), registry=reg)
    with PlanStore(src, readonly=True) as s:
        bundle = s.export_plans([result.plan_id])
        everything = s.export_plans()
    assert bundle["format"] == BUNDLE_FORMAT and bundle["version"] == BUNDLE_VERSION
    assert len(bundle["plans"]) == 1 and len(everything["plans"]) == 2
    with PlanStore(tmp_path / "b.sqlite") as dst:
        (new_id,) = dst.import_plans(bundle)
        got = dst.plan_by_id(new_id)
        assert got.key == result.key and got.plan().to_dict() == result.plan.to_dict()
        assert got.created_at == bundle["plans"][0]["created_at"] and "imported_at" in got.notes
        assert dst.import_plans(bundle) == [new_id]  # importing again replaces, never duplicates
        assert dst.count_measurements() == 0 and dst.runs() == []
    sess = Session(small_cnn(), registry=reg, store=tmp_path / "b.sqlite", require_plan=True)
    assert sess.plan.to_dict() == result.plan.to_dict()


@pytest.fixture(scope="module")
def good_bundle(tmp_path_factory) -> dict:
    """A tuned plan's bundle, tuned once for the module (each tuning takes ~8 s on 2 cores)."""
    path = tmp_path_factory.mktemp("bundle") / "src.sqlite"
    tune(other_cnn(), store=path, options=_opts(), registry=registry_with_fake())
    with PlanStore(path, readonly=True) as s:
        return s.export_plans()


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda b: [], "the bundle: expected a JSON object"),
        (lambda b: {**b, "format": "something"}, "not a plan bundle"),
        (lambda b: {**b, "version": 99}, "format version 99 is not supported (written by a newer"),
        (lambda b: {**b, "version": "1"}, '"version": expected an integer, received a string'),
        (lambda b: {**b, "plans": {}}, '"plans": expected an array of plans'),
        (lambda b: {**b, "plans": [{**b["plans"][0], "key": {**b["plans"][0]["key"], "hardware": []}}]},
         "plans[0].key.hardware: expected an object, received an array"),
        (lambda b: {**b, "plans": [{k: v for k, v in b["plans"][0].items() if k != "plan"}]},
         "plans[0].plan: expected a plan object, received nothing"),
        (lambda b: {**b, "plans": [{**b["plans"][0], "plan": {"steps": []}}]},
         "plans[0].plan: plan format version -1 is not supported"),
        (lambda b: {**b, "plans": [{**b["plans"][0],
                                    "key": {**b["plans"][0]["key"], "objective": "memory"}}]},
         "plans[0].key_digest does not match plans[0].key"),
        (lambda b: {**b, "plans": [b["plans"][0], b["plans"][0]]}, "plans[1] has the same key as plans[0]"),
        (lambda b: {**b, "plans": [{**b["plans"][0], "latency_ms": "fast"}]}, "plans[0].latency_ms"),
        (lambda b: {**b, "plans": [{**b["plans"][0], "created_at": "yesterday"}]}, "plans[0].created_at"),
    ],
)
def test_malformed_bundles_are_refused_whole(tmp_path, good_bundle, edit, message):
    bundle = copy.deepcopy(good_bundle)
    with PlanStore(tmp_path / "dst.sqlite") as dst:
        with pytest.raises(BundleError) as info:
            dst.import_plans(edit(bundle))
        assert message in str(info.value)
        assert dst.all_plans() == []


def test_prune_removes_stale_and_old_plans_only(tmp_path, reg, tuned_stores):
    from datetime import datetime, timedelta, timezone

    path = tmp_path / "plans.sqlite"
    _copy(tuned_stores, "small_cnn", path)
    stale_id = _tamper_software(path)
    fresh = tune(other_cnn(), store=path, options=_opts(), registry=reg)
    with PlanStore(path) as s:
        dry = s.prune_plans(stale=lambda p: stale_reasons(p, reg), dry_run=True)
        assert [r.plan.id for r in dry] == [stale_id] and len(s.all_plans()) == 2
        (gone,) = s.prune_plans(stale=lambda p: stale_reasons(p, reg))
        assert gone.plan.id == stale_id and gone.reasons[0].startswith("numpy: 0.0.1 -> ")
        assert [p.id for p in s.all_plans()] == [fresh.plan_id]
        assert s.prune_plans(older_than_days=30) == []
        later = datetime.now(timezone.utc) + timedelta(days=45)
        (old,) = s.prune_plans(older_than_days=30, now=later)
        assert old.plan.id == fresh.plan_id and "older than 30" in old.reasons[0]
        assert s.all_plans() == []


# ------------------------------------------------------------------------------------------
# several processes
# ------------------------------------------------------------------------------------------


def _tuner_process(path: str, model_bytes: bytes) -> None:
    tune(model_bytes, store=path, options=_opts(), registry=registry_with_fake())


def _reader_process(path: str, models: list[bytes], deadline_s: float) -> None:
    """Read the store in a loop (plans, measurements, Sessions) until a Session finds the
    stored plan of every model; any error ends the process with a non-zero exit code."""
    reg = registry_with_fake()
    deadline = time.monotonic() + deadline_s
    rounds = 0
    while True:
        rounds += 1
        with PlanStore(path, readonly=True) as s:
            s.all_plans()
            s.count_measurements()
            s.runs()
        sources = []
        for model in models:
            sess = Session(model, registry=reg, store=path)
            assert "not used" not in sess.plan_note, sess.plan_note
            sources.append(sess.plan_source)
        if sources == ["store"] * len(models):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"after {rounds} rounds the plans are still missing: {sources}")


def test_two_tuners_and_a_reader_share_one_store(tmp_path, reg):
    path = str(tmp_path / "shared.sqlite")
    PlanStore(path).close()  # created and migrated, so that the reader can open it at once
    models = [small_cnn().SerializeToString(), other_cnn().SerializeToString()]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_tuner_process, args=(path, m)) for m in models]
    procs.append(ctx.Process(target=_reader_process, args=(path, models, 240.0)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    with PlanStore(path, readonly=True) as s:
        plans = s.all_plans()
        assert len(plans) == 2 and len({p.key.model for p in plans}) == 2
        assert [r.status for r in s.runs()] == ["finished", "finished"]
    for model in (small_cnn(), other_cnn()):
        assert Session(model, registry=reg, store=path, require_plan=True).plan_source == "store"


def test_a_session_says_where_its_start_up_went(tmp_path, reg, tuned_stores):
    """``Session.startup`` splits the creation time into stages, for a stored plan (lookup and
    executor build apart) and for the untuned one; figures are not judged, only accounted."""
    store = tmp_path / "plans.sqlite"
    _copy(tuned_stores, "small_cnn", store)
    for kwargs, source in ((dict(store=store), "store"), (dict(store=False), "heuristic")):
        sess = Session(small_cnn(), registry=reg, **kwargs)
        assert sess.plan_source == source, sess.plan_note
        assert list(sess.startup) == ["backends", "import", "simplify", "plan", "build"]
        assert all(v >= 0 for v in sess.startup.values()), sess.startup
        assert sum(sess.startup.values()) <= sess.load_seconds + 1e-6
