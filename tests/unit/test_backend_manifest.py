"""Deferred backend registration (dispatch.backend_manifest): a registry made from the
manifest of the last full registration keys plans and answers every lookup as a fully
registered one does, registers a backend only when something needs it, and never trusts a
stale or damaged manifest."""

from __future__ import annotations

import json
import threading

import numpy as np
import onnx
import pytest

from dispatch import Session, backend, backend_manifest
from dispatch.heuristic import heuristic_plan
from tests.builders import small_cnn
from tuner.fingerprint import software_fingerprint

ORDER = ("onnxruntime", "native", "numpy")
X = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)


def _eager():
    return backend.load_registry(fresh=True, order=ORDER)


def _from_manifest(folder):
    """A registry that wrote the manifest, then one made from it."""
    first = backend.load_registry(fresh=True, order=ORDER, manifest_dir=folder)
    assert not first.deferred
    second = backend.load_registry(fresh=True, order=ORDER, manifest_dir=folder)
    return first, second


def _manifest_file(folder):
    files = list((folder / backend_manifest.FOLDER).glob("*.json"))
    assert len(files) == 1, files
    return files[0]


def test_a_registry_from_the_manifest_defers_every_backend_and_keys_plans_alike(tmp_path):
    eager, lazy = _from_manifest(tmp_path)
    available = eager.available_backends()
    assert lazy.deferred == [b for b in eager._order if b in available]
    for name, st in eager.backends.items():
        other = lazy.backends[name]
        assert (other.available, other.version, other.implementations, other.layouts) == (
            st.available, st.version, st.implementations, st.layouts), name
    assert software_fingerprint(lazy, available) == software_fingerprint(eager, available)
    assert lazy.deferred  # computing the key registered nothing
    for op in ("Conv", "Relu", "MatMul"):
        assert lazy.has_op(op) and lazy.op_backends(op) == eager.op_backends(op)


def test_looking_up_an_implementation_registers_its_backend_and_what_that_needs(tmp_path):
    eager, lazy = _from_manifest(tmp_path)
    numpy_impl = next(i.name for i in eager._by_name.values() if i.backend == "numpy")
    assert lazy.impl(numpy_impl).name == numpy_impl
    assert "numpy" not in lazy.deferred and lazy.backends["numpy"].available
    assert [b for b in lazy.deferred] == [b for b in eager._order
                                         if b in eager.available_backends() and b != "numpy"]
    if "onednn" in lazy.deferred and "native" in lazy.deferred:
        onednn_impl = next(i.name for i in eager._by_name.values() if i.backend == "onednn")
        lazy.impl(onednn_impl)
        assert "onednn" not in lazy.deferred and "native" not in lazy.deferred


def test_completed_in_any_order_the_registry_equals_a_full_registration(tmp_path):
    eager, lazy = _from_manifest(tmp_path)
    for name in reversed(lazy.deferred):  # the last backend first
        lazy.complete([name])
    assert not lazy.deferred
    assert [i.name for i in lazy.implementations] == [i.name for i in eager.implementations]
    for op in eager.ops:
        assert [i.name for i in lazy.impls_for(op)] == [i.name for i in eager.impls_for(op)], op
    assert list(lazy.layouts.layouts) == list(eager.layouts.layouts)
    assert {k: [c.name for c in v] for k, v in lazy.layouts.converters.items()} == {
        k: [c.name for c in v] for k, v in eager.layouts.converters.items()}


def test_lookups_from_several_threads_wait_for_the_registrations_they_need(tmp_path):
    eager, lazy = _from_manifest(tmp_path)
    names = [i.name for i in eager.implementations]
    errors: list[BaseException] = []

    def look(chunk):
        try:
            for name in chunk:
                assert lazy.impl(name).name == name
            for op in eager.ops[:20]:
                assert lazy.impls_for(op)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=look, args=(names[k::4],)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert not lazy.deferred
    assert [i.name for i in lazy.implementations] == names


def test_listing_layouts_or_converters_registers_every_backend(tmp_path):
    eager, lazy = _from_manifest(tmp_path)
    assert set(lazy.layouts.layouts) == set(eager.layouts.layouts)
    assert not lazy.deferred


def test_a_layout_lookup_registers_only_the_backend_that_brings_it(tmp_path):
    eager, lazy = _from_manifest(tmp_path)
    owned = [(lay.name, lay.backend) for lay in eager.layouts.layouts.values()
             if lay.backend in lazy.deferred and lay.backend != "numpy"]
    if not owned:
        pytest.skip("no backend with layouts of its own is available here")
    name, owner = owned[0]
    assert lazy.layouts.layout(name).backend == owner
    assert owner not in lazy.deferred and "numpy" in lazy.deferred


@pytest.mark.parametrize("damage", ["stamp", "json", "format", "backends"])
def test_a_stale_or_damaged_manifest_registers_everything_and_is_rewritten(tmp_path, damage):
    backend.load_registry(fresh=True, order=ORDER, manifest_dir=tmp_path)
    path = _manifest_file(tmp_path)
    data = json.loads(path.read_text())
    if damage == "stamp":  # a module file changed since
        some = next(iter(data["stamps"]))
        data["stamps"][some] = [1, 1]
        path.write_text(json.dumps(data))
    elif damage == "json":
        path.write_text(path.read_text()[:100])
    elif damage == "format":
        data["format"] = backend_manifest.MANIFEST_FORMAT + 1
        path.write_text(json.dumps(data))
    else:  # another set of winners: recorded with a backend that is not here
        data["backends"].append(dict(data["backends"][0], name="gone"))
        path.write_text(json.dumps(data))
    if damage != "backends":
        assert backend_manifest.read(tmp_path, data.get("context", "")) is None
    again = backend.load_registry(fresh=True, order=ORDER, manifest_dir=tmp_path)
    assert not again.deferred
    assert backend.load_registry(fresh=True, order=ORDER, manifest_dir=tmp_path).deferred


def test_another_context_has_its_own_manifest(tmp_path, monkeypatch):
    backend.load_registry(fresh=True, order=ORDER, manifest_dir=tmp_path)
    monkeypatch.setenv("OPDISPATCH_THREADS", "1")
    assert not backend.load_registry(fresh=True, order=ORDER, manifest_dir=tmp_path).deferred
    assert len(list((tmp_path / backend_manifest.FOLDER).glob("*.json"))) == 2


def test_a_session_from_the_store_registers_only_what_its_plan_runs(tmp_path, monkeypatch):
    from tuner.store import PlanStore
    from tuner.tune import TuneOptions, tune

    path = tmp_path / "model.onnx"
    onnx.save(small_cnn(seed=3), str(path))
    cache = tmp_path / "graphs"
    monkeypatch.setenv("OPDISPATCH_GRAPH_CACHE", str(cache))
    store = PlanStore(str(tmp_path / "plans.db"))
    tune(str(path), store=store, options=TuneOptions(budget_s=10, top_k=1, validate_runs=2,
                                                      backends=["numpy"]))
    expected = Session(str(path), store=False, backends=["numpy"]).run(None, {"x": X})[0]
    monkeypatch.setattr(backend, "_REGISTRIES", {})  # a fresh process: writes the manifest
    first = Session(str(path), store=store.path, backends=["numpy"], require_plan=True)
    assert first.plan_source == "store" and not first.registry.deferred
    monkeypatch.setattr(backend, "_REGISTRIES", {})  # the next process reads it
    sess = Session(str(path), store=store.path, backends=["numpy"], require_plan=True)
    assert sess.plan_source == "store", sess.plan_note
    assert sess.plan_key == first.plan_key
    others = [b for b in sess.registry.available_backends() if b != "numpy"]
    assert set(sess.registry.deferred) == set(others)
    np.testing.assert_array_equal(sess.run(None, {"x": X})[0], expected)
    # an untuned plan over every backend still sees every implementation
    plan = heuristic_plan(sess.graph, sess.registry, list(ORDER))
    assert plan.steps


def test_a_plugin_with_custom_operators_registers_at_once(tmp_path):
    from tests.plugins.plugin_support import EXAMPLE_DIR

    folder = str(EXAMPLE_DIR)  # the example plugin brings com.example's FastGelu
    backend.load_registry(folder, fresh=True, order=ORDER, manifest_dir=tmp_path)
    lazy = backend.load_registry(folder, fresh=True, order=ORDER, manifest_dir=tmp_path)
    with_ops = [n for n, st in lazy.backends.items() if st.custom_ops]
    assert with_ops and not set(with_ops) & set(lazy.deferred)
    assert lazy.custom_ops and lazy.deferred
    eager = backend.load_registry(folder, fresh=True, order=ORDER)
    available = eager.available_backends()
    assert software_fingerprint(lazy, available) == software_fingerprint(eager, available)
    lazy.complete()
    assert [i.name for i in lazy.implementations] == [i.name for i in eager.implementations]
    assert list(lazy.layouts.layouts) == list(eager.layouts.layouts)
