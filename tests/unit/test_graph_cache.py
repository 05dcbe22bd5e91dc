"""The graph cache (dispatch.graph_cache): a Session of a model file reuses the graph it
imported and simplified last time, and never a stale, damaged or unsafe one."""

from __future__ import annotations

import os
import stat
import time

import numpy as np
import onnx
import pytest

from dispatch import Session, graph_cache
from tests.builders import ModelBuilder, small_cnn

X = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "graphs"
    monkeypatch.setenv("OPDISPATCH_GRAPH_CACHE", str(folder))
    return folder


def _model(tmp_path, seed=0):
    path = tmp_path / "model.onnx"
    onnx.save(small_cnn(seed=seed), str(path))
    return path


def _session(path, **kw):
    return Session(str(path), store=False, backends=["numpy"], **kw)


def test_the_second_session_takes_the_graph_from_the_cache(tmp_path, cache):
    path = _model(tmp_path)
    first = _session(path)
    assert not first.graph_cached
    assert len(list(cache.glob("*.pkl"))) == 1
    second = _session(path)
    assert second.graph_cached
    assert [n.name for n in second.graph.nodes] == [n.name for n in first.graph.nodes]
    assert second.simplify_stats == first.simplify_stats
    np.testing.assert_array_equal(second.run(None, {"x": X})[0], first.run(None, {"x": X})[0])


def test_a_changed_file_or_other_input_shapes_miss(tmp_path, cache):
    path = _model(tmp_path, seed=0)
    before = _session(path).run(None, {"x": X})[0]
    time.sleep(0.01)
    onnx.save(small_cnn(seed=1), str(path))  # other weights
    os.utime(path, ns=(time.time_ns(), time.time_ns()))
    changed = _session(path)
    assert not changed.graph_cached
    expected = Session(small_cnn(seed=1), store=False, backends=["numpy"]).run(None, {"x": X})[0]
    np.testing.assert_array_equal(changed.run(None, {"x": X})[0], expected)
    assert not np.array_equal(expected, before)
    assert not _session(path, input_shapes={"x": [1, 3, 16, 16]}).graph_cached  # given: another key


@pytest.mark.parametrize("damage", ["garbage", "truncated", "not a graph", "other format", "a plain pickle",
                                    "group writable"])
def test_a_damaged_or_unsafe_entry_is_ignored_and_replaced(tmp_path, cache, damage):
    import pickle

    path = _model(tmp_path)
    _session(path)
    (entry,) = cache.glob("*.pkl")
    assert stat.S_IMODE(entry.stat().st_mode) == 0o400  # written read-only: readers map it
    good = entry.read_bytes()
    os.chmod(entry, 0o600)  # as another program (or the user) would, to damage it
    if damage == "garbage":
        entry.write_bytes(b"\x00not a pickle")
    elif damage == "truncated":
        entry.write_bytes(good[: len(good) // 2])
    elif damage == "not a graph":
        with open(entry, "wb") as f:
            graph_cache.write_entry(f, (graph_cache.CACHE_FORMAT, "graph", {}))
    elif damage in ("other format", "a plain pickle"):
        # written beside and renamed over: the entry read is mapped from the file, which an
        # in-place rewrite would pull from under it (see graph_cache.read_entry)
        old = graph_cache.read_entry(entry)
        beside = entry.with_suffix(".new")
        with open(beside, "wb") as f:
            if damage == "other format":
                graph_cache.write_entry(f, (graph_cache.CACHE_FORMAT + 1, *old[1:]))
            else:  # the layout of CACHE_FORMAT 4 and before
                f.write(pickle.dumps(old, protocol=5))
        os.replace(beside, entry)
    else:
        os.chmod(entry, 0o664)
    again = _session(path)
    assert not again.graph_cached
    np.testing.assert_allclose(again.run(None, {"x": X})[0],
                               Session(small_cnn(), store=False, backends=["numpy"]).run(None, {"x": X})[0])
    if damage != "group writable":  # replaced by a good one
        assert _session(path).graph_cached


def test_models_that_are_not_files_and_the_off_setting_are_not_cached(tmp_path, cache, monkeypatch):
    assert not Session(small_cnn(), store=False, backends=["numpy"]).graph_cached
    assert not cache.exists()
    monkeypatch.setenv("OPDISPATCH_GRAPH_CACHE", "off")
    path = _model(tmp_path)
    _session(path)
    assert not _session(path).graph_cached
    assert not cache.exists()


def test_an_unwritable_cache_folder_is_no_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("OPDISPATCH_GRAPH_CACHE", str(blocker / "graphs"))
    path = _model(tmp_path)
    assert not _session(path).graph_cached
    assert not _session(path).graph_cached


def test_prune_keeps_the_most_recently_used(tmp_path):
    folder = tmp_path / "graphs"
    folder.mkdir()
    for k in range(5):
        entry = folder / f"{k}.pkl"
        entry.write_bytes(b"x" * 100)
        os.utime(entry, (1000 + k, 1000 + k))
    assert graph_cache.prune(folder, max_entries=3) == 2
    assert sorted(p.name for p in folder.glob("*.pkl")) == ["2.pkl", "3.pkl", "4.pkl"]
    assert graph_cache.prune(folder, max_entries=10, max_bytes=250) == 1
    assert sorted(p.name for p in folder.glob("*.pkl")) == ["3.pkl", "4.pkl"]


def test_the_tuner_and_a_session_share_the_cached_graph_and_its_plan_key(tmp_path, cache):
    """A plan tuned from a cached graph is found by a Session whose graph came from the cache
    (the key is computed from the same graph either way)."""
    from tuner.tune import TuneOptions, tune

    path = _model(tmp_path)
    store = tmp_path / "plans.sqlite"
    tune(str(path), store=store, options=TuneOptions(budget_s=10, top_k=1, validate_runs=2,
                                                     per_candidate_cap_s=0.02, progress=False,
                                                     backends=["numpy"]))
    assert len(list(cache.glob("*.pkl"))) == 1  # written by the tuner's import
    sess = Session(str(path), store=store, backends=["numpy"])
    assert sess.graph_cached and sess.plan_source == "store", sess.plan_note


def test_a_cached_graph_brings_its_model_fingerprint(tmp_path, cache):
    """The entry keeps the plan key's model fingerprint: a restarting process does not walk
    the graph again to find its plan, and the kept value is the one computed from the graph."""
    from tuner.fingerprint import CACHED_MODEL_FINGERPRINT, _computed_fingerprint, model_fingerprint

    path = _model(tmp_path)
    _session(path)
    second = _session(path)
    assert second.graph_cached
    kept = graph_cache.known_fingerprint(second.graph, CACHED_MODEL_FINGERPRINT)
    assert kept is not None and kept == _computed_fingerprint(second.graph)
    assert model_fingerprint(second.graph) == kept
    (tmp_path / "other").mkdir()
    other = _session(_model(tmp_path / "other", seed=1))  # a miss: kept as the entry is written
    assert (graph_cache.known_fingerprint(other.graph, CACHED_MODEL_FINGERPRINT)
            == _computed_fingerprint(other.graph))


def test_entry_arrays_come_back_equal_and_writable(tmp_path):
    """An entry's arrays come back equal, in every dtype and memory order, writable, and a
    write changes neither the file nor a second load."""
    arrays = {
        "f32": np.arange(1000, dtype=np.float32).reshape(10, 100),
        "fortran": np.asfortranarray(np.arange(60, dtype=np.float64).reshape(6, 10)),
        "strided": np.arange(100, dtype=np.int64)[::3],  # not contiguous: pickled in band
        "empty": np.zeros((0, 4), np.float32),
        "bool": np.array([True, False, True]),
        "f16": np.linspace(0, 1, 7).astype(np.float16),
    }
    path = tmp_path / "e.pkl"
    with open(path, "wb") as f:
        graph_cache.write_entry(f, (1, arrays))
    _, back = graph_cache.read_entry(path)
    for name, arr in arrays.items():
        np.testing.assert_array_equal(back[name], arr)
        assert back[name].dtype == arr.dtype and back[name].shape == arr.shape
    assert back["fortran"].flags.f_contiguous
    assert back["f32"].flags.writeable
    back["f32"][0, 0] = -1.0
    assert graph_cache.read_entry(path)[1]["f32"][0, 0] == 0.0
    assert back["f32"].ctypes.data % graph_cache.ALIGN == 0


def test_arrays_read_from_an_entry_outlive_its_replacement_and_removal(tmp_path):
    """Entries are mapped, not read: what a loaded graph holds stays as it was when the file
    is replaced (by rename, as :func:`graph_cache.save` does) or pruned (unlinked)."""
    path = tmp_path / "e.pkl"
    for value in (1.0, 2.0):
        tmp = tmp_path / f"new{value}"
        with open(tmp, "wb") as f:
            graph_cache.write_entry(f, (1, {"w": np.full((256, 256), value, np.float32)}))
        if value == 1.0:
            os.replace(tmp, path)
            first = graph_cache.read_entry(path)[1]["w"]
        else:
            os.replace(tmp, path)  # a newer entry under the same name
    assert float(graph_cache.read_entry(path)[1]["w"][0, 0]) == 2.0
    path.unlink()
    assert first.shape == (256, 256) and float(first.sum()) == 256 * 256


def test_a_cut_short_entry_raises_value_error(tmp_path):
    path = tmp_path / "e.pkl"
    with open(path, "wb") as f:
        graph_cache.write_entry(f, (1, {"w": np.ones(4096, np.float32)}))
    good = path.read_bytes()
    path.write_bytes(good[:-100])
    with pytest.raises(ValueError, match="cut short"):
        graph_cache.read_entry(path)
    path.write_bytes(b"x" * 100)
    with pytest.raises(ValueError, match="not a graph-cache entry"):
        graph_cache.read_entry(path)


@pytest.mark.parametrize("backend", ["native", "onednn"])
def test_compiled_kernels_run_a_graph_from_the_cache(tmp_path, cache, backend):
    """A cached graph's weights are unpickled arrays, whose float32 dtype is not numpy's
    singleton: the C++ bindings once compared dtypes by identity and refused them ("expected a
    float32 array, received dtype float32"): oneDNN's grouped Conv, which takes its weights as
    loaded, failed in every process after the first (found on shufflenet). The native kernels
    pack their weights first, so their case passed even then; it is kept as the same check."""
    rng = np.random.default_rng(3)
    b = ModelBuilder(17, "grouped_conv_relu")  # a grouped Conv: its weights reach the kernel as loaded
    c = b.op("Conv", [b.input("x", [1, 8, 16, 16]),
                      b.const(rng.normal(0, 0.3, (16, 2, 1, 1)).astype(np.float32)),
                      b.const(rng.normal(0, 0.1, 16).astype(np.float32))], group=4)
    b.output(b.op("Relu", [c]))
    path = tmp_path / "grouped_conv_relu.onnx"
    onnx.save(b.build(), str(path))
    x = rng.standard_normal((1, 8, 16, 16)).astype(np.float32)
    want = _session(path).run(None, {"x": x})[0]
    second = Session(str(path), store=False, backends=[backend, "numpy"])
    assert second.graph_cached
    weights = [v.const for v in second.graph.values.values() if v.const is not None and v.const.ndim == 4]
    assert weights and all(w.dtype is not np.dtype(np.float32) for w in weights)  # the case in point
    assert backend in second.plan.backends_used()
    np.testing.assert_allclose(second.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)
