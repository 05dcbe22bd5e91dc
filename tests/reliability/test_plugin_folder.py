"""A plugin folder (``OPDISPATCH_PLUGIN_PATH``) with broken content: every broken entry is
reported with its reason, never stops the other backends, and sessions still run.

Complements tests/plugins/test_plugin_broken.py (modules raising at import, SystemExit,
syntax errors, wrong OPDISPATCH_BACKENDS, broken packages, raising backend methods) with
what concerns the folder itself: files that are not Python, undecodable and null-byte
sources, dangling links, unreadable files and folders, a folder that does not exist, a path
entry that is a file, and the environment variable as the only configuration.
"""

from __future__ import annotations

import importlib.machinery
import os
from pathlib import Path

import numpy as np
import pytest

from dispatch.backend import load_registry
from dispatch.session import Session
from tests.builders import ModelBuilder
from tests.plugins.plugin_support import (
    copy_plugin,
    fast_gelu_formula,
    fast_gelu_model,
    write_module,
)
from tuner.cli import main

BUILTINS = ("numpy", "native")


def _relu_model():
    b = ModelBuilder(name="relu")
    x = b.input("x", [2, 3])
    b.output(b.op("Relu", [x]))
    return b.build()


def _broken_folder(folder: Path) -> Path:
    """The example plugin plus every kind of broken entry."""
    copy_plugin(folder)
    write_module(folder, "syntax_error.py", "def broken(:\n")
    write_module(folder, "raises_at_import.py", "raise RuntimeError('needs a driver')\n")
    (folder / "null_bytes.py").write_bytes(b"x = 1\x00\n")
    (folder / "not_utf8.py").write_bytes(b"\xff\xfe x = 1\n")
    (folder / "dangling.py").symlink_to(folder / "moved_away.py")
    (folder / "README.txt").write_text("not python")
    (folder / "cached.pyc").write_bytes(b"\x00\x01")
    (folder / "native_lib.so").write_bytes(b"\x7fELF")
    (folder / "settings.json").write_text("{}")
    (folder / "no_init_dir").mkdir()
    write_module(folder / "no_init_dir", "mod.py", "raise RuntimeError('never imported')\n")
    (folder / "dir_named.py").mkdir()
    return folder


def _unavailable(reg) -> dict[str, str]:
    return {k: s.reason or "" for k, s in reg.backends.items() if not s.available}


def test_a_folder_of_broken_entries_through_the_environment(tmp_path, monkeypatch):
    folder = _broken_folder(tmp_path / "plugins")
    monkeypatch.setenv("OPDISPATCH_PLUGIN_PATH", str(folder))
    model, bias = fast_gelu_model((2, 8))
    sess = Session(model, backends=["example", "numpy"], store=False)
    x = np.ones((2, 8), np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], fast_gelu_formula(x, bias), rtol=1e-5)
    bad = _unavailable(sess.registry)
    assert "SyntaxError" in bad["syntax_error"]
    assert bad["raises_at_import"] == (
        "failed to import: RuntimeError: needs a driver (at raises_at_import.py:1)")
    assert "SyntaxError: source code string cannot contain null bytes" in bad["null_bytes"]
    assert "SyntaxError" in bad["not_utf8"] and "utf-8" in bad["not_utf8"]
    assert bad["dangling"].endswith(
        f"plugin module {folder / 'dangling.py'} is not a readable file (a symbolic link to a "
        f"missing file)")
    # files that are not Python modules, and folders that are not packages, are not plugins
    for name in ("README", "cached", "native_lib", "settings", "no_init_dir", "mod", "dir_named"):
        assert name not in sess.registry.backends, name
    for name in BUILTINS:
        assert sess.registry.backends[name].available
    # the built-ins run a plain model in the same environment
    relu = Session(_relu_model(), store=False)
    assert relu.run(None, {"x": -np.ones((2, 3), np.float32)})[0].max() == 0


def test_the_cli_lists_the_broken_entries_and_succeeds(tmp_path, monkeypatch, capsys):
    folder = _broken_folder(tmp_path / "plugins")
    monkeypatch.setenv("OPDISPATCH_PLUGIN_PATH", str(folder))
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    for name in ("syntax_error", "raises_at_import", "null_bytes", "not_utf8", "dangling"):
        row = next(line for line in out.splitlines() if line.startswith(name))
        assert "unavailable" in row or "failed" in row, row
    assert next(line for line in out.splitlines() if line.startswith("example ")).count("unavailable") == 0


def test_an_unreadable_module(tmp_path, monkeypatch):
    """A module that cannot be read (simulated: the tests may run as root, who reads anything)."""
    folder = copy_plugin(tmp_path / "plugins")
    locked = write_module(folder, "locked.py", "OPDISPATCH_BACKENDS = []\n")
    real = importlib.machinery.SourceFileLoader.get_data

    def get_data(self, path):
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real(self, path)

    monkeypatch.setattr(importlib.machinery.SourceFileLoader, "get_data", get_data)
    reg = load_registry(str(folder), fresh=True)
    assert reg.backends["locked"].reason.startswith(
        "failed to import: PermissionError: [Errno 13] Permission denied")
    assert reg.backends["example"].available


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="file permissions do not stop root")
def test_an_unreadable_module_for_real(tmp_path):
    folder = copy_plugin(tmp_path / "plugins")
    locked = write_module(folder, "locked.py", "OPDISPATCH_BACKENDS = []\n")
    locked.chmod(0)
    try:
        reg = load_registry(str(folder), fresh=True)
    finally:
        locked.chmod(0o644)
    assert "PermissionError" in reg.backends["locked"].reason
    assert reg.backends["example"].available


def test_an_unreadable_folder(tmp_path, monkeypatch):
    """A folder that cannot be listed (simulated, as above): reported, the others load."""
    locked = tmp_path / "locked"
    locked.mkdir()
    good = copy_plugin(tmp_path / "good")
    real = Path.iterdir

    def iterdir(self):
        if self == locked:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    reg = load_registry(os.pathsep.join([str(locked), str(good)]), fresh=True)
    reason = reg.backends[f"<unreadable folder {locked}>"].reason
    assert reason == (f"failed to import: RegistryError: plugin folder {locked} cannot be listed "
                      f"(PermissionError: [Errno 13] Permission denied: '{locked}')")
    assert reg.backends["example"].available and reg.backends["numpy"].available


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="folder permissions do not stop root")
def test_an_unreadable_folder_for_real(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        reg = load_registry(str(locked), fresh=True)
    finally:
        locked.chmod(0o755)
    assert "cannot be listed" in reg.backends[f"<unreadable folder {locked}>"].reason
    assert reg.backends["numpy"].available


def test_a_folder_that_does_not_exist_through_the_environment(tmp_path, monkeypatch):
    missing = tmp_path / "no-such-folder"
    monkeypatch.setenv("OPDISPATCH_PLUGIN_PATH", str(missing))
    sess = Session(_relu_model(), store=False)
    assert sess.registry.backends[f"<missing folder {missing}>"].reason == (
        f"failed to import: RegistryError: plugin folder {missing} does not exist")
    assert sess.run(None, {"x": np.ones((2, 3), np.float32)})[0].shape == (2, 3)


def test_a_path_entry_that_is_a_file(tmp_path):
    """Listing the module itself instead of its folder is refused with the fix to make."""
    module = write_module(tmp_path, "my_plugin.py", "raise RuntimeError('must not be imported')\n")
    reg = load_registry(str(module), fresh=True)
    reason = reg.backends[f"<not a folder {module}>"].reason
    assert reason.startswith(
        f"failed to import: RegistryError: plugin path entry {module} is a file, not a folder")
    assert "put the module in a folder and list the folder" in reason
    assert "must not be imported" not in reason
    assert reg.backends["numpy"].available


def test_an_empty_folder_and_empty_path_entries(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    reg = load_registry(os.pathsep.join(["", str(empty), "", ""]), fresh=True)
    assert not [k for k in reg.backends if k.startswith("<")]
    assert all(reg.backends[name].available for name in BUILTINS)
