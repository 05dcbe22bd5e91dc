"""Small gaps of the command line (issue 18): ``profile`` without ``-o``, a shape error that
gives the command-line option, an unavailable backend named with its reason, tables laid out
by tabulate."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from dispatch.backend import load_registry
from tests.builders import small_cnn
from tuner.cli.args import table
from tuner.tune import TuneOptions, TuningError, tune


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


@pytest.fixture()
def model(tmp_path):
    p = tmp_path / "small.onnx"
    p.write_bytes(small_cnn().SerializeToString())
    return p


def test_profile_writes_next_to_the_current_folder_without_o(model, tmp_path):
    res = cli("profile", str(model), "--untuned", "--store", str(tmp_path / "none.sqlite"),
              "--runs", "1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "small.trace.json").is_file()
    assert "small.trace.json" in res.stdout


def test_a_shape_error_gives_the_command_line_option(model, tmp_path):
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((2, 3, 16, 16), np.float32))
    res = cli("run", str(model), "--untuned", "--input", f"x={x}")
    assert res.returncode == 2, res.stderr
    assert "--shape x=2x3x16x16" in res.stderr and "Traceback" not in res.stderr


def test_an_unavailable_backend_is_named_with_its_reason(tmp_path):
    reg = load_registry()  # the process's shared registry: restored below
    name = next(n for n in reg.available_backends() if n != "numpy")
    status = reg.backends[name]
    reg.backends[name] = dataclasses.replace(status, available=False,
                                             reason="its library failed to load (test)")
    try:
        with pytest.raises(TuningError) as info:
            tune(small_cnn(), store=str(tmp_path / "p.sqlite"), registry=reg,
                 options=TuneOptions(budget_s=1, backends=[name], progress=False))
    finally:
        reg.backends[name] = status
    assert "its library failed to load (test)" in str(info.value)
    with pytest.raises(TuningError) as info:
        tune(small_cnn(), store=str(tmp_path / "p.sqlite"), registry=load_registry(),
             options=TuneOptions(budget_s=1, backends=["nosuch"], progress=False))
    assert "nosuch: no such backend" in str(info.value)


def test_tables_are_laid_out_by_tabulate_and_say_where_they_cut():
    text = table([("name", "value"), ("a", "x" * 80), ("bb", "short")], max_width=20)
    lines = text.splitlines()
    assert lines[1].split() == ["----", "-" * 80]  # the last column is whole
    text = table([("name", "value", "z"), ("a" * 30, "x", "y")], max_width=20)
    assert "a" * 19 + "…" in text
