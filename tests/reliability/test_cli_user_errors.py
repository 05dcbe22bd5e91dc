"""User-caused conditions are user errors (exit 2, one line saying what is wrong), never an
internal error (exit 70) nor a misleading message: a read-only store given to ``tune`` (with
and without a write-ahead log beside it, or in a read-only folder) is refused before any
tuning, naming the files it cannot write, not as "not readable" nor as a full disk; a model
whose external data points outside its folder is refused by ``run``."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.store.store_worker import tiny_model
from tuner.store import PlanStore

REPO = Path(__file__).resolve().parents[2]
_AS_USER = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all",
            "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]
READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH


def _prefix(probe_file: Path) -> list[str]:
    """The command prefix under which ``probe_file`` (a read-only file, or a new file in a
    read-only folder) really cannot be written (root drops CAP_DAC_OVERRIDE); skips the test
    when that cannot be arranged."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("run as root without setpriv: chmod cannot make a file read-only for root")
    probe = subprocess.run([*_AS_USER, sys.executable, "-c", f"open({str(probe_file)!r}, 'ab')"],
                           capture_output=True)
    if probe.returncode == 0:
        pytest.skip("setpriv could not drop root's CAP_DAC_OVERRIDE here")
    return _AS_USER


def _cli(prefix: list[str], *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPDISPATCH_STORE": str(cwd / "unused.sqlite")}
    return subprocess.run([*prefix, sys.executable, "-m", "tuner.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def stores(tmp_path) -> Iterator[Path]:
    folder = tmp_path / "stores"
    folder.mkdir()
    PlanStore(folder / "plain.sqlite").close()
    PlanStore(folder / "walled.sqlite").close()
    # a store whose write-ahead log holds a committed, not checkpointed transaction
    conn = sqlite3.connect(folder / "walled.sqlite", isolation_level=None)
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("INSERT INTO meta (key, value) VALUES ('x', 'y')")
    shutil.copy(folder / "walled.sqlite", folder / "copy.sqlite")
    shutil.copy(folder / "walled.sqlite-wal", folder / "copy.sqlite-wal")
    shutil.copy(folder / "walled.sqlite-shm", folder / "copy.sqlite-shm")
    conn.close()
    onnx.save(tiny_model(), tmp_path / "model.onnx")
    files = [p for p in folder.iterdir() if p.name.startswith(("plain", "copy"))]
    for p in files:
        p.chmod(READ_ONLY)
    try:
        yield folder
    finally:
        folder.chmod(stat.S_IRWXU)
        for p in folder.iterdir():
            p.chmod(stat.S_IRUSR | stat.S_IWUSR)


@pytest.mark.parametrize("name", ["plain.sqlite", "copy.sqlite"])
def test_tune_into_a_read_only_store_is_refused_before_tuning(stores, name):
    prefix = _prefix(stores / name)
    before = {p.name: p.read_bytes() for p in stores.iterdir()}
    t0 = time.monotonic()
    res = _cli(prefix, "tune", str(stores.parent / "model.onnx"), "--budget", "60",
               "--no-progress", "--store", str(stores / name), cwd=stores.parent)
    elapsed = time.monotonic() - t0
    assert res.returncode == 2, res.stderr
    assert "cannot be written by this process (no write permission on" in res.stderr, res.stderr
    assert "not a readable" not in res.stderr and "full disk" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert elapsed < 45, f"took {elapsed:.0f} s: it tuned before finding out"
    assert {p.name: p.read_bytes() for p in stores.iterdir()} == before
    # and it is still readable: production reads work
    res = _cli(prefix, "plans", "list", "--store", str(stores / name), cwd=stores.parent)
    assert res.returncode == 0 and "no plans in" in res.stdout, res.stderr


def test_tune_into_a_store_in_a_read_only_folder_names_the_folder(stores):
    target = stores / "walled.sqlite"
    stores.chmod(stat.S_IRUSR | stat.S_IXUSR)
    prefix = _prefix(stores / "probe")  # the file is writable, its folder (for -wal/-shm) is not
    res = _cli(prefix, "tune", str(stores.parent / "model.onnx"), "--budget", "60",
               "--no-progress", "--store", str(target), cwd=stores.parent)
    assert res.returncode == 2, res.stderr
    assert f"its folder {str(stores)!r}" in res.stderr, res.stderr


def test_a_model_whose_external_data_points_outside_its_folder_is_a_user_error(tmp_path):
    (tmp_path / "m").mkdir()
    np.zeros(16, np.float32).tofile(tmp_path / "outside.bin")
    w = numpy_helper.from_array(np.zeros((4, 4), np.float32), "w")
    w.data_location = TensorProto.EXTERNAL
    w.ClearField("raw_data")
    for key, value in {"location": "../outside.bin", "offset": "0", "length": "64"}.items():
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (tmp_path / "m" / "model.onnx").write_bytes(model.SerializeToString())
    for command in (["run", str(tmp_path / "m" / "model.onnx"), "--repeat", "1"],
                    ["tune", str(tmp_path / "m" / "model.onnx"), "--budget", "5",
                     "--no-progress", "--store", str(tmp_path / "s.sqlite")]):
        res = _cli([], *command, cwd=tmp_path)
        assert res.returncode == 2, res.stderr
        assert "its external data cannot be loaded" in res.stderr
        assert "points outside the directory" in res.stderr
        assert "internal error" not in res.stderr
