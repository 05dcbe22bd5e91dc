"""The command line: user errors exit non-zero with one clear line and no traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.builders import small_cnn


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("m") / "small.onnx"
    p.write_bytes(small_cnn().SerializeToString())
    return p


def test_backends_lists_numpy_and_native():
    res = cli("backends", "-v")
    assert res.returncode == 0, res.stderr
    assert "numpy" in res.stdout and "native" in res.stdout
    assert "Conv.numpy.im2col" in res.stdout


def test_ops_lists_every_operator_with_its_backends():
    from dispatch.backend import load_registry

    res = cli("ops")
    assert res.returncode == 0, res.stderr
    listed = {line.split()[0] for line in res.stdout.splitlines()[2:] if line and line[0].isalpha()}
    ops = {i.op for i in load_registry().implementations if i.op != "Region" and "+" not in i.op}
    assert ops <= listed, sorted(ops - listed)
    conv = next(line for line in res.stdout.splitlines() if line.startswith("Conv "))
    assert "numpy:" in conv and "native:" in conv
    assert "opsets 7 to" in res.stdout
    one = cli("ops", "relu")
    assert one.returncode == 0 and one.stdout.splitlines()[2].startswith("Relu")
    bad = cli("ops", "NoSuchOp")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "no backend implements NoSuchOp; implemented: Abs" in bad.stderr


def test_run_and_tune_a_model_with_symbolic_inputs(tmp_path):
    from tests.unit.test_shape_sessions import dynamic_model

    path = tmp_path / "dyn.onnx"
    path.write_bytes(dynamic_model().SerializeToString())
    store = tmp_path / "plans.db"
    res = cli("run", str(path), "--untuned", "--repeat", "1")
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "give its shape with --shape x=NxNx8" in res.stderr
    res = cli("tune", str(path), "--shape", "x=1,2x16x8", "--store", str(store), "--budget", "20",
              "--backends", "numpy", "--no-progress")
    assert res.returncode == 0, res.stderr
    assert "10 s for each of 2 input shapes" in res.stdout
    assert "[2/2] input shapes x[2,16,8]" in res.stdout  # mask sized from x
    listed = cli("plans", "list", "--store", str(store), "--model", str(path))
    assert listed.returncode == 0, listed.stderr
    assert "x:float32[1,16,8];mask:float32[1,16]" in listed.stdout
    assert "x:float32[2,16,8];mask:float32[2,16]" in listed.stdout
    res = cli("run", str(path), "--shape", "x=2x16x8", "--store", str(store), "--require-plan",
              "--repeat", "1", "--backends", "numpy")
    assert res.returncode == 0, res.stderr
    res = cli("run", str(path), "--shape", "x=3x16x8", "--store", str(store), "--require-plan",
              "--repeat", "1", "--backends", "numpy")
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "at input shapes x[3,16,8], mask[3,16]" in res.stderr


def test_run_prints_what_ran_where(model_path, tmp_path):
    res = cli("run", str(model_path), "--output", str(tmp_path / "out"), "--repeat", "2")
    assert res.returncode == 0, res.stderr
    assert "run median" in res.stdout
    # where the start-up went
    assert all(f"{stage} " in res.stdout for stage in ("backends", "import", "simplify", "plan", "build"))
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["steps"], plan
    for step in plan["steps"]:  # every step of the plan that ran is shown with its backend
        assert step["impl"] in res.stdout and step["backend"] in res.stdout


def test_run_with_input_file(model_path, tmp_path):
    x = np.zeros((1, 3, 16, 16), np.float32)
    np.save(tmp_path / "x.npy", x)
    res = cli("run", str(model_path), "--input", f"x={tmp_path / 'x.npy'}", "--repeat", "1")
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "/nonexistent/model.onnx"], "does not exist"),
        (["run", "{garbage}"], "not a valid ONNX model"),
        (["run", "{model}", "--shape", "x=1xthree"], "dimensions must be integers"),
        (["run", "{model}", "--input", "x=/nope.npy"], "does not exist"),
        (["run", "{model}", "--input", "y={npy}"], "not inputs of the model"),
        (["run", "{model}", "--input", "x={badnpy}"], "received shape [2, 2], expected [1, 3, 16, 16]"),
        (["run", "{model}", "--backends", "nosuch"], "not known"),
        (["example", "nosuch"], "invalid choice"),
    ],
)
def test_user_errors_are_one_line_without_traceback(model_path, tmp_path, args, message):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08\x07garbage" * 20)
    np.save(tmp_path / "ok.npy", np.zeros((1, 3, 16, 16), np.float32))
    np.save(tmp_path / "bad.npy", np.zeros((2, 2), np.float32))
    subs = {"{model}": str(model_path), "{garbage}": str(garbage), "{npy}": str(tmp_path / "ok.npy"),
            "{badnpy}": str(tmp_path / "bad.npy")}
    args = [subs.get(a, a) for a in args]
    args = [a.replace("{npy}", subs["{npy}"]).replace("{badnpy}", subs["{badnpy}"]) for a in args]
    res = cli(*args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert message in res.stderr
    assert "Traceback" not in res.stderr


def test_config_shows_sources(tmp_path):
    import os

    env = dict(os.environ, OPDISPATCH_THREADS="1", OPDISPATCH_CONFIG=str(tmp_path / "none.toml"))
    res = subprocess.run([sys.executable, "-m", "tuner.cli", "config"], capture_output=True, text=True,
                         env=env)
    assert res.returncode == 0, res.stderr
    assert "environment OPDISPATCH_THREADS" in res.stdout


def test_example_writes_a_loadable_model(tmp_path):
    res = cli("example", "squeezenet", "-o", str(tmp_path / "sq.onnx"))
    assert res.returncode == 0, res.stderr
    import onnx

    m = onnx.load(str(tmp_path / "sq.onnx"))
    assert not any(n.op_type == "ConstantOfShape" for n in m.graph.node)
