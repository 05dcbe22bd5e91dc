"""The example plugin loaded by dropping its package into a folder of OPDISPATCH_PLUGIN_PATH."""

from __future__ import annotations

import os

import numpy as np

from dispatch.backend import load_registry
from dispatch.config import Config
from dispatch.session import Session
from tests.plugins.plugin_support import copy_plugin, fast_gelu_formula, fast_gelu_model
from tuner.cli import main


def test_dropped_in_plugin_is_found_through_the_environment(tmp_path, monkeypatch):
    folder = copy_plugin(tmp_path / "plugins")
    monkeypatch.setenv("OPDISPATCH_PLUGIN_PATH", str(folder))
    cfg = Config.load()
    assert cfg.plugin_path == str(folder)
    assert cfg.origin["plugin_path"] == "environment OPDISPATCH_PLUGIN_PATH"
    # a Session given nothing but the environment finds the plugin and runs its operator
    model, b = fast_gelu_model((4, 16))
    sess = Session(model, backends=["example", "numpy"], store=False)
    st = sess.registry.backends["example"]
    assert st.available and st.origin == f"plugin {folder / 'opdispatch_example_plugin' / '__init__.py'}"
    assert sess.plan.steps[0].impl == "FastGelu.example.tanh"
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], fast_gelu_formula(x, b),
                               rtol=1e-5, atol=1e-6)


def test_cli_lists_the_dropped_in_plugin(tmp_path, monkeypatch, capsys):
    folder = copy_plugin(tmp_path / "plugins")
    monkeypatch.setenv("OPDISPATCH_PLUGIN_PATH", str(folder))
    assert main(["backends", "-v"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("example "))
    assert "available" in row and "ex_colmajor" in row and "unavailable" not in row
    for name in ("FastGelu.example.tanh", "FastGelu.example.colmajor", "Relu.example.colmajor",
                 "FastGelu.numpy.reference", "std->ex_colmajor.example", "ex_colmajor->std.example"):
        assert name in out


def test_several_folders_and_a_missing_one(tmp_path):
    folder = copy_plugin(tmp_path / "b")
    missing = tmp_path / "does-not-exist"
    reg = load_registry(os.pathsep.join([str(missing), "", str(folder)]), fresh=True)
    assert reg.backends["example"].available
    st = reg.backends[f"<missing folder {missing}>"]
    assert not st.available and "does not exist" in st.reason
    assert reg.backends["numpy"].available


def test_plugin_loaded_from_two_copies_in_one_process(tmp_path):
    """A plugin loaded anew (another folder, another module object) re-registers its schema."""
    first = load_registry(str(copy_plugin(tmp_path / "one")), fresh=True)
    second = load_registry(str(copy_plugin(tmp_path / "two")), fresh=True)
    for reg in (first, second):
        assert reg.backends["example"].available, reg.backends["example"].reason
    model, b = fast_gelu_model((2, 8))
    sess = Session(model, registry=second, backends=["example"], store=False)
    x = np.ones((2, 8), np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], fast_gelu_formula(x, b), rtol=1e-5)


def test_the_same_plugin_twice_on_the_path_keeps_the_first(tmp_path):
    one, two = copy_plugin(tmp_path / "one"), copy_plugin(tmp_path / "two")
    reg = load_registry(os.pathsep.join([str(one), str(two)]), fresh=True)
    assert reg.backends["example"].available
    assert str(one) in reg.backends["example"].origin
    dup = [s for k, s in reg.backends.items() if k != "example" and s.name == "example"]
    assert len(dup) == 1 and not dup[0].available
    assert "already registered from plugin" in dup[0].reason and str(two) in dup[0].origin
