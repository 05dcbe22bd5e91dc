"""Broken plugins are reported with their error and never stop the others."""

from __future__ import annotations

import textwrap

import numpy as np
import onnx
import pytest

from dispatch.backend import load_registry
from dispatch.errors import RegistryError
from dispatch.session import Session
from tests.plugins.plugin_support import (
    copy_plugin,
    fast_gelu_formula,
    fast_gelu_model,
    write_module,
)


def _assert_the_others_work(reg):
    for name in ("numpy", "example"):
        assert reg.backends[name].available, reg.backends[name].reason
    model, b = fast_gelu_model((2, 4))
    sess = Session(model, registry=reg, backends=["example", "numpy"], store=False)
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], fast_gelu_formula(x, b), rtol=1e-5)


def test_broken_plugin_modules(tmp_path):
    folder = copy_plugin(tmp_path / "plugins")
    write_module(folder, "raises_on_import.py", """
        raise RuntimeError("this plugin needs a GPU driver")
    """)
    write_module(folder, "exits_on_import.py", "import sys\nsys.exit(3)\n")
    write_module(folder, "syntax_error.py", "def broken(:\n")
    write_module(folder, "not_a_list.py", "OPDISPATCH_BACKENDS = 42\n")
    write_module(folder, "not_a_backend.py", "import os\nOPDISPATCH_BACKENDS = [os, 'numpy']\n")
    (folder / "broken_pkg").mkdir()
    write_module(folder / "broken_pkg", "__init__.py", "from .missing import Backend\n")
    reg = load_registry(str(folder), fresh=True)
    st = reg.backends
    assert st["raises_on_import"].reason == (
        "failed to import: RuntimeError: this plugin needs a GPU driver (at raises_on_import.py:2)")
    assert st["exits_on_import"].reason.startswith("failed to import: SystemExit: 3")
    assert "SyntaxError" in st["syntax_error"].reason
    assert "OPDISPATCH_BACKENDS must be a list of Backend subclasses, received int" in st["not_a_list"].reason
    assert st["not_a_backend"].reason == (
        "RegistryError: expected a dispatch.backend.Backend subclass, received module 'os'")
    second = next(s for k, s in st.items() if k.startswith("not_a_backend (plugin "))
    assert second.reason.endswith("received str 'numpy'")
    assert st["numpy"].available and st["numpy"].origin != second.origin
    assert st["broken_pkg"].reason.startswith(
        "failed to import: ModuleNotFoundError: No module named 'opdispatch_plugin_broken_pkg.missing' "
        "(at __init__.py:1)")
    assert not any(s.available for s in st.values() if s.origin.startswith(f"plugin {folder}")
                   and s.name != "example")
    _assert_the_others_work(reg)


def test_backends_whose_methods_raise(tmp_path):
    folder = copy_plugin(tmp_path / "plugins")
    write_module(folder, "methods.py", """
        from dispatch.backend import Backend
        from layouts.registry import Layout

        class BadInit(Backend):
            name = "bad_init"
            def __init__(self):
                raise OSError("no such device")

        class BadVersion(Backend):
            name = "bad_version"
            def version(self):
                raise ValueError("version string missing")

        class BadAvailability(Backend):
            name = "bad_availability"
            def availability(self):
                raise KeyError("CUDA_HOME")

        class BadConflicts(Backend):
            name = "bad_conflicts"
            conflicts = 7

        class HalfRegistered(Backend):
            '''Adds a layout, an implementation and a custom op schema, then fails.'''
            name = "half"
            def register(self, registry):
                from onnx.defs import OpSchema
                from dispatch.registry import ImplTable
                t = ImplTable("half")
                t.register("Relu", "x")(lambda node: (lambda x: x))
                registry.add_table(t)
                registry.layouts.add_layout(
                    Layout("half_layout", "cpu", "half"),
                    to_standard=lambda x, s: x, from_standard=lambda x, s: x)
                schema = OpSchema("Half", "com.half", 1, "", inputs=[], outputs=[])
                registry.add_op_schema(schema, backend="half")
                raise RuntimeError("out of memory")

        class NoRegister(Backend):
            name = "no_register"

        OPDISPATCH_BACKENDS = [BadInit, BadVersion, BadAvailability, BadConflicts,
                               HalfRegistered, NoRegister]
    """)
    reg = load_registry(str(folder), fresh=True)
    st = reg.backends
    assert st["bad_init"].reason.startswith("OSError: no such device (at methods.py:")
    assert st["bad_version"].reason.startswith("version() failed: ValueError: version string missing")
    assert st["bad_availability"].reason.startswith("availability check failed: KeyError: 'CUDA_HOME'")
    assert "conflicts must be a tuple of backend names, received 7" in st["bad_conflicts"].reason
    assert st["half"].reason.startswith("register() failed: RuntimeError: out of memory")
    assert st["no_register"].reason.startswith("register() failed: NotImplementedError")
    # nothing of the half registration is left behind
    assert "half_layout" not in reg.layouts.layouts
    assert not any(i.backend == "half" for i in reg.implementations)
    assert "com.half::Half" not in reg.custom_ops
    assert all(not s.available for k, s in st.items() if k in (
        "bad_init", "bad_version", "bad_availability", "bad_conflicts", "half", "no_register"))
    _assert_the_others_work(reg)


def _fake_distribution(site, entry_points: str) -> None:
    dist = site / "broken_plugins-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugins\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent(entry_points))


def test_entry_points_that_name_nothing(tmp_path, monkeypatch):
    site = tmp_path / "site"
    _fake_distribution(site, """
        [opdispatch.backends]
        no_module = opdispatch_no_such_module:Backend
        no_attribute = dispatch.backend:NoSuchBackend
        not_a_class = dispatch.backend:ENTRY_POINT_GROUP
    """)
    monkeypatch.syspath_prepend(str(site))
    reg = load_registry(str(copy_plugin(tmp_path / "plugins")), fresh=True)
    st = reg.backends
    assert st["no_module"].reason.startswith(
        "failed to import: ModuleNotFoundError: No module named 'opdispatch_no_such_module'")
    assert st["no_module"].origin == (
        "entry point opdispatch_no_such_module:Backend of broken-plugins 0.1")
    assert st["no_attribute"].reason.startswith("failed to import: AttributeError:")
    assert "NoSuchBackend" in st["no_attribute"].reason
    bad = next(s for s in st.values() if "ENTRY_POINT_GROUP" in s.origin)
    assert not bad.available
    assert "expected a dispatch.backend.Backend subclass, received str 'opdispatch.backends'" in bad.reason
    _assert_the_others_work(reg)


def test_a_failing_plugin_named_like_a_builtin_does_not_hide_it(tmp_path):
    folder = copy_plugin(tmp_path / "plugins")
    write_module(folder, "numpy.py", "raise ImportError('shadowing numpy')\n")
    reg = load_registry(str(folder), fresh=True)
    assert reg.backends["numpy"].available
    failed = [s for s in reg.backends.values() if s.reason and "shadowing numpy" in s.reason]
    assert len(failed) == 1 and failed[0].origin.startswith("plugin ")


def test_custom_op_schema_errors(tmp_path):
    reg = load_registry(str(copy_plugin(tmp_path / "plugins")), fresh=True)
    from onnx.defs import OpSchema

    with pytest.raises(RegistryError,
                       match=r"ONNX's own domain ''; a custom operator needs a domain of its own"):
        reg.add_op_schema(OpSchema("MyRelu", "", 1, "", inputs=[], outputs=[]), backend="t")
    with pytest.raises(RegistryError, match="expects an onnx.defs.OpSchema, received str"):
        reg.add_op_schema("FastGelu", backend="t")
    with pytest.raises(RegistryError, match="duplicate custom operator 'com.example::FastGelu': "
                                            "already registered by backend 'example'"):
        reg.add_op_schema(OpSchema("FastGelu", "com.example", 1, "", inputs=[], outputs=[]), backend="t")
    outside = OpSchema("Outside", "com.outside.test", 1, "", inputs=[], outputs=[])
    onnx.defs.register_schema(outside)  # by another library, not through opdispatch
    try:
        with pytest.raises(RegistryError, match="'com.outside.test::Outside' version 1 is already "
                                                "defined in this process outside opdispatch"):
            reg.add_op_schema(OpSchema("Outside", "com.outside.test", 1, "", inputs=[], outputs=[]),
                              backend="t")
    finally:
        onnx.defs.deregister_schema("Outside", 1, "com.outside.test")
    with pytest.raises(RegistryError, match="must be callable, received int"):
        reg.add_op_schema(OpSchema("Other", "com.t", 1, "", inputs=[], outputs=[]), backend="t", infer=3)
