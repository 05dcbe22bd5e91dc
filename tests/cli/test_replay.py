"""``opdispatch run MODEL --data REQUESTS``: mixed-shape traffic replayed one request at a time,
twice, for the plan and for plain libraries (issue 51's yardstick). Checked: what was replayed
(requests, distinct shapes, passes), that every request ran, and that bad requests get a clear
error before anything is timed. Nothing is timed here."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from dispatch.errors import OpDispatchError
from dispatch.input_shapes import declared_inputs
from tests.builders import ModelBuilder
from tuner.cli import main
from tuner.replay import read_requests, replay

LENGTHS = (5, 9, 17)


def _model(path):
    """x: float32 [batch, seq, 4] -> MatMul(4x3) -> Relu: any batch and sequence length."""
    b = ModelBuilder(17, "seq_model")
    x = b.input("x", ["batch", "seq", 4])
    w = b.const(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32))
    b.output(b.op("Relu", [b.op("MatMul", [x, w])]))
    onnx.save(b.build(), path)
    return path


def _requests(folder, lengths=LENGTHS, per_file=2):
    """One .npz per length, ``per_file`` requests each, without the batch axis."""
    folder.mkdir()
    rng = np.random.default_rng(1)
    for n in lengths:
        np.savez(folder / f"len{n:03d}.npz",
                 x=rng.standard_normal((per_file, n, 4)).astype(np.float32))
    return folder


@pytest.mark.parametrize("library", [None, "onnxruntime", "openvino-latency"])
def test_mixed_lengths_are_replayed_twice_one_request_at_a_time(tmp_path, library, capsys):
    model = _model(tmp_path / "m.onnx")
    data = _requests(tmp_path / "requests")
    out = tmp_path / "replay.json"
    args = ["run", str(model), "--data", str(data), "--json", str(out), "--store",
            str(tmp_path / "plans.sqlite")]
    if library:
        args += ["--library", library]
    assert main(args) == 0, capsys.readouterr().err
    got = json.loads(out.read_text())
    assert [p["requests"] for p in got["passes"]] == [6, 6]
    assert [p["shapes"] for p in got["passes"]] == [3, 3]
    assert [p["errors"] for p in got["passes"]] == [0, 0]
    assert got["passes"][0]["label"].startswith("first pass")
    assert (library or "plan (") in got["what"]
    text = capsys.readouterr().out
    assert "6 requests of 3 shape(s)" in text and "p99" in text


def test_requests_are_split_per_sample_and_given_a_batch_of_one(tmp_path):
    model = _model(tmp_path / "m.onnx")
    data = _requests(tmp_path / "requests", lengths=(3, 7), per_file=3)
    requests = read_requests(data, declared_inputs(onnx.load(model)))
    assert [r["x"].shape for r in requests] == [(1, 3, 4)] * 3 + [(1, 7, 4)] * 3
    calls = []
    (first, second) = replay(calls.append, requests)
    assert len(calls) == 12 and first.requests == second.requests == 6 and first.shapes == 2


def test_a_failing_request_is_counted_and_the_replay_goes_on(tmp_path):
    model = _model(tmp_path / "m.onnx")
    requests = read_requests(_requests(tmp_path / "requests"), declared_inputs(onnx.load(model)))

    def call(feeds):
        if feeds["x"].shape[1] == 9:
            raise ValueError("length 9 refused")

    passes = replay(call, requests)
    assert [(p.requests, p.errors) for p in passes] == [(4, 2), (4, 2)]
    assert "length 9 refused" in passes[0].error


@pytest.mark.parametrize(("arrays", "says"), [
    ({"y": np.zeros((2, 5, 4), np.float32)}, "the model's inputs are x: float32 [batch, seq, 4]"),
    ({"x": np.zeros((2, 5, 3), np.float32)}, "request 0"),
    ({"x": np.zeros((2, 5, 4), np.int64)}, "request 0"),
    ({"x": np.zeros((0, 5, 4), np.float32)}, "at least 1"),
])
def test_requests_that_do_not_fit_the_model_say_why(tmp_path, arrays, says):
    model = _model(tmp_path / "m.onnx")
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(OpDispatchError) as err:
        read_requests(tmp_path / "bad.npz", declared_inputs(onnx.load(model)))
    assert says in str(err.value)


def test_the_command_line_refuses_bad_replays_without_a_traceback(tmp_path, capsys):
    model = _model(tmp_path / "m.onnx")
    data = _requests(tmp_path / "requests")
    for extra, says in [(["--concurrency", "2"], "--data replays its requests one at a time"),
                        (["--library", "openvino-throughput"], "unknown --library"),
                        ([], "does not exist")]:
        where = str(data) if extra else str(tmp_path / "missing.npz")
        assert main(["run", str(model), "--data", where, "--store", str(tmp_path / "p.db"),
                     *extra]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err


def test_a_range_is_tuned_from_the_requests_and_replayed_on_its_plan(tmp_path, capsys):
    model = _model(tmp_path / "m.onnx")
    data = _requests(tmp_path / "requests")
    store = str(tmp_path / "plans.sqlite")
    assert main(["tune", str(model), "--shape", "x=1..2x1..32x4", "--budget", "3", "--store",
                 store, "--data", str(data), "--backends", "onnxruntime,numpy"]) == 0
    out = capsys.readouterr().out
    assert "range plan" in out and "(batch 1..2, seq 1..32)" in out and "stored (id" in out
    assert "x[1,9,4]" in out  # a request's shape is one of the samples
    report = tmp_path / "replay.json"
    assert main(["run", str(model), "--data", str(data), "--json", str(report), "--store",
                 store, "--backends", "onnxruntime,numpy"]) == 0
    got = json.loads(report.read_text())
    assert "range plan" in got["what"] and got["load_s"] > 0
    assert [p["errors"] for p in got["passes"]] == [0, 0]


@pytest.mark.parametrize("shape, says", [
    ("x=1x5..2x4", "LO..HI"),
    ("x=1x1..8x4,5", "no lists or steps"),
    ("y=1x1..8", "not inputs of the model"),
])
def test_a_bad_range_is_a_usage_error(tmp_path, capsys, shape, says):
    model = _model(tmp_path / "m.onnx")
    code = main(["tune", str(model), "--shape", shape, "--budget", "1", "--store",
                 str(tmp_path / "p.sqlite")])
    err = capsys.readouterr().err
    assert code == 2 and says in err and "Traceback" not in err
