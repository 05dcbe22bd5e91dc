"""The compiled cache of OpenVINO regions (impls/openvino/compiled_cache.py): a region is
written once per digest (structure, weights, OpenVINO, settings) with its weights external,
compiled through OpenVINO's blob cache, reused by the next build, rebuilt when damaged or
unsafe, keyed so that changed weights miss, and pruned by size. Outputs are compared with the
numpy reference; nothing is timed."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("openvino", reason="openvino is not installed (pip install 'opdispatch[openvino]')")

from dispatch import Session
from dispatch.backend import load_registry
from dispatch.config import Config
from dispatch.fusion import REGION_OP, FusedNode
from dispatch.zoo import light_model
from impls.openvino import compiled_cache
from impls.openvino.region import compile_config, core


@pytest.fixture(scope="module")
def graph():
    reg = load_registry()
    return Session(light_model("squeezenet", seed=0), backends=["numpy"], registry=reg, store=False).graph


def _whole(graph, upto: int | None = None) -> FusedNode:
    """The whole graph as one region, or its first ``upto`` nodes (a chain from the input)."""
    nodes = list(graph.nodes if upto is None else graph.nodes[:upto])
    outputs = list(graph.outputs if upto is None else nodes[-1].outputs)
    return FusedNode(name="whole", op_type=REGION_OP, inputs=list(graph.inputs),
                     outputs=outputs, attrs={}, domain="", opset=nodes[0].opset, nodes=nodes)


def _run(compiled, x: np.ndarray) -> np.ndarray:
    return np.asarray(compiled.create_infer_request().infer([x])[0]).copy()


@pytest.fixture(scope="module")
def reference(graph):
    x = np.random.default_rng(0).standard_normal(tuple(graph.inputs[0].shape)).astype(np.float32)
    sess = Session(light_model("squeezenet", seed=0), backends=["numpy"], store=False)
    return x, sess.run(None, {graph.inputs[0].name: x})[0]


def _entries(folder) -> list:
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def test_an_entry_is_written_once_and_reused(tmp_path, graph, reference):
    x, want = reference
    first = compiled_cache.compile_region(core(), _whole(graph), compile_config(), str(tmp_path))
    (entry,) = _entries(tmp_path)
    assert {p.name for p in entry.iterdir()} >= {"model.onnx", "weights.bin", "blobs"}
    assert any((entry / "blobs").iterdir()), "OpenVINO wrote no compiled blob"
    stamp = (entry / "weights.bin").stat().st_mtime_ns
    again = compiled_cache.compile_region(core(), _whole(graph), compile_config(), str(tmp_path))
    assert _entries(tmp_path) == [entry] and (entry / "weights.bin").stat().st_mtime_ns == stamp
    for compiled in (first, again):
        np.testing.assert_allclose(_run(compiled, x), want, rtol=1e-4, atol=1e-5)


def test_changed_weights_or_settings_miss(tmp_path, graph):
    compiled_cache.compile_region(core(), _whole(graph), compile_config(), str(tmp_path))
    conv = next(n for n in graph.nodes if n.op_type == "Conv")
    w = conv.inputs[1]
    old = w.const
    try:
        w.const = old.copy()
        w.const.flat[0] += 1.0
        compiled_cache.compile_region(core(), _whole(graph), compile_config(), str(tmp_path))
    finally:
        w.const = old
    assert len(_entries(tmp_path)) == 2
    other = dict(compile_config(), INFERENCE_NUM_THREADS=1)
    compiled_cache.compile_region(core(), _whole(graph), other, str(tmp_path))
    assert len(_entries(tmp_path)) == 3


@pytest.mark.parametrize("damage", ["truncated model", "missing weights", "group-writable"])
def test_a_damaged_or_unsafe_entry_is_rebuilt(tmp_path, graph, reference, damage):
    x, want = reference
    compiled_cache.compile_region(core(), _whole(graph), compile_config(), str(tmp_path))
    (entry,) = _entries(tmp_path)
    if damage == "truncated model":
        (entry / "model.onnx").write_bytes((entry / "model.onnx").read_bytes()[:100])
    elif damage == "missing weights":
        os.unlink(entry / "weights.bin")
    else:
        os.chmod(entry, 0o775)
    compiled = compiled_cache.compile_region(core(), _whole(graph), compile_config(), str(tmp_path))
    np.testing.assert_allclose(_run(compiled, x), want, rtol=1e-4, atol=1e-5)
    (again,) = _entries(tmp_path)
    assert (again / "weights.bin").is_file() and not os.stat(again).st_mode & 0o020


def test_the_cache_is_pruned_by_size(tmp_path, graph):
    compiled_cache.compile_region(core(), _whole(graph), compile_config(), str(tmp_path))
    compiled_cache.compile_region(core(), _whole(graph, 2), compile_config(), str(tmp_path))
    assert len(_entries(tmp_path)) == 2
    newest = max(_entries(tmp_path), key=lambda p: p.stat().st_mtime)
    assert compiled_cache.prune(tmp_path, max_bytes=sum(
        f.stat().st_size for f in newest.rglob("*") if f.is_file())) == 1
    assert _entries(tmp_path) == [newest]


def test_off_compiles_without_a_cache(tmp_path, graph, reference):
    x, want = reference
    compiled = compiled_cache.compile_region(core(), _whole(graph), compile_config(), "off")
    np.testing.assert_allclose(_run(compiled, x), want, rtol=1e-4, atol=1e-5)
    assert compiled_cache.cache_dir("off") is None and compiled_cache.cache_dir("") is None


def test_a_session_uses_the_configured_cache(tmp_path, reference):
    x, want = reference
    config = Config.load({"compiled_cache": str(tmp_path / "compiled")})
    for _ in range(2):
        sess = Session(light_model("squeezenet", seed=0), backends=["openvino", "numpy"], config=config,
                       store=False)
        np.testing.assert_allclose(sess.run(None, {sess.get_inputs()[0].name: x})[0], want,
                                   rtol=1e-4, atol=1e-5)
    assert len(_entries(tmp_path / "compiled")) == 1


def test_a_hit_does_not_build_the_regions_model(tmp_path, graph, reference, monkeypatch):
    """A process starting from a stored plan finds its entry by the region's digest alone:
    the region is not converted to ONNX and checked again."""
    x, want = reference
    compiled_cache.compile_region(core(), _whole(graph), compile_config(), str(tmp_path))

    def refuse(*_a, **_k):
        raise AssertionError("region_model called on a cache hit")

    monkeypatch.setattr(compiled_cache, "region_model", refuse)
    compiled = compiled_cache.compile_region(core(), _whole(graph), compile_config(), str(tmp_path))
    np.testing.assert_allclose(_run(compiled, x), want, rtol=1e-4, atol=1e-5)
    assert len(_entries(tmp_path)) == 1


def _digest(region) -> str:
    return compiled_cache.region_digest(region, compile_config(), "v")


def test_the_digest_covers_what_the_model_is_built_from(graph):
    """Every input of :func:`impls.regions.region_model` names another entry: an attribute,
    a small constant's value, a region boundary, the version and the settings."""
    base = _digest(_whole(graph))
    assert _digest(_whole(graph)) == base  # deterministic
    assert _digest(_whole(graph, upto=5)) != base
    assert compiled_cache.region_digest(_whole(graph), compile_config(), "w") != base
    assert compiled_cache.region_digest(_whole(graph), dict(compile_config(), X=1), "v") != base
    conv = next(n for n in graph.nodes if n.op_type == "Conv")
    old_attrs = dict(conv.attrs)
    try:
        conv.attrs["pads"] = [9, 9, 9, 9]
        assert _digest(_whole(graph)) != base
    finally:
        conv.attrs.clear()
        conv.attrs.update(old_attrs)
    bias = conv.inputs[2]
    old = bias.const
    try:
        bias.const = old.copy()
        bias.const.flat[0] += 1.0
        assert _digest(_whole(graph)) != base
    finally:
        bias.const = old
    assert _digest(_whole(graph)) == base
