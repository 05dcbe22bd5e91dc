"""Implementation and backend registries: naming rules, lookups that list what exists,
discovery through entry points and plugin folders, broken and conflicting backends."""

from __future__ import annotations

import textwrap

import pytest

from dispatch.backend import load_registry
from dispatch.errors import RegistryError
from dispatch.registry import ImplTable, Priority


def test_duplicate_name_raises():
    table = ImplTable("t")

    @table.register("Relu", "a")
    def _a(node):
        return lambda x: x

    with pytest.raises(RegistryError, match="duplicate implementation name 'Relu.t.a'"):

        @table.register("Relu", "a")
        def _b(node):
            return lambda x: x


def test_duplicate_across_backends_names_both():
    reg = load_registry(fresh=True)
    impl = reg.impls_for("Relu")[0]
    with pytest.raises(RegistryError, match=f"already registered by backend '{impl.backend}'"):
        reg.add_impl(impl)


def test_unknown_op_lists_known_ops():
    reg = load_registry()
    with pytest.raises(RegistryError, match=r"'FancyOp'; known operators: .*Conv.*Relu"):
        reg.impls_for("FancyOp")


def test_unknown_implementation_lists_known():
    reg = load_registry()
    with pytest.raises(RegistryError, match="unknown implementation 'Conv.numpy.magic'; known:"):
        reg.impl("Conv.numpy.magic")


def test_builtin_backends_are_found():
    reg = load_registry()
    assert reg.backends["numpy"].available, reg.backends["numpy"].reason
    assert reg.backends["numpy"].implementations > 40
    names = {i.name for i in reg.impls_for("Conv")}
    assert {"Conv.numpy.im2col"} <= names
    assert len([i for i in reg.impls_for("Conv") if i.backend == "numpy"]) >= 2
    assert len([i for i in reg.impls_for("Gemm") if i.backend == "numpy"]) >= 2
    assert len([i for i in reg.impls_for("MatMul") if i.backend == "numpy"]) >= 2


def test_priorities_are_named_levels():
    reg = load_registry()
    levels = {int(p) for p in Priority}
    assert all(i.priority in levels for i in reg.implementations)


def _write(folder, name, text):
    (folder / name).write_text(textwrap.dedent(text))


GOOD_PLUGIN = """
    import numpy as np
    from dispatch.backend import Backend
    from dispatch.registry import ImplTable, Priority

    table = ImplTable("tinyplug")

    @table.register("Relu", "clip", priority=Priority.FALLBACK)
    def relu(node):
        '''Relu by np.clip.'''
        return lambda x: np.clip(x, 0, None)

    class TinyPlug(Backend):
        name = "tinyplug"
        def version(self):
            return "tinyplug 0.1"
        def register(self, registry):
            registry.add_table(table)

    OPDISPATCH_BACKENDS = [TinyPlug]
"""


def test_plugin_folder_and_broken_plugins(tmp_path):
    _write(tmp_path, "good_plugin.py", GOOD_PLUGIN)
    _write(tmp_path, "broken_plugin.py", "import this_module_does_not_exist\n")
    _write(tmp_path, "empty_plugin.py", "X = 1\n")
    _write(tmp_path, "raising_plugin.py", """
        from dispatch.backend import Backend
        class Bad(Backend):
            name = "bad"
            def register(self, registry):
                registry.layouts.add_layout(None)
        OPDISPATCH_BACKENDS = [Bad]
    """)
    reg = load_registry(str(tmp_path), fresh=True)
    st = reg.backends
    assert st["tinyplug"].available and st["tinyplug"].version == "tinyplug 0.1"
    assert "Relu.tinyplug.clip" in {i.name for i in reg.impls_for("Relu")}
    assert not st["broken_plugin"].available
    assert "ModuleNotFoundError" in st["broken_plugin"].reason
    assert "OPDISPATCH_BACKENDS" in st["empty_plugin"].reason
    assert not st["bad"].available and "register() failed" in st["bad"].reason
    # the others still work
    assert st["numpy"].available


def test_conflicting_backends_only_first_is_active(tmp_path):
    _write(tmp_path, "a_first.py", """
        from dispatch.backend import Backend
        class First(Backend):
            name = "first"
            def register(self, registry):
                pass
        OPDISPATCH_BACKENDS = [First]
    """)
    _write(tmp_path, "b_second.py", """
        from dispatch.backend import Backend
        class Second(Backend):
            name = "second"
            conflicts = ("first",)
            def register(self, registry):
                pass
        OPDISPATCH_BACKENDS = [Second]
    """)
    reg = load_registry(str(tmp_path), fresh=True)
    assert reg.backends["first"].available
    assert not reg.backends["second"].available
    assert "conflicts with active backend 'first'" in reg.backends["second"].reason


def test_unavailable_backend_reports_reason(tmp_path):
    _write(tmp_path, "gone.py", """
        from dispatch.backend import Backend
        class Gone(Backend):
            name = "gone"
            def availability(self):
                return "libgone.so is not installed"
            def register(self, registry):
                raise AssertionError("must not be called")
        OPDISPATCH_BACKENDS = [Gone]
    """)
    reg = load_registry(str(tmp_path), fresh=True)
    assert reg.backends["gone"].reason == "libgone.so is not installed"
