"""The range a model implies (tuner/shapes/default_range.py): a transformer's sequence axis is
bounded by its position-embedding table; ``opdispatch tune MODEL`` without ``--shape`` tunes it."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dispatch.input_shapes import declared_inputs
from tuner.cli import main
from tuner.shapes.default_range import position_table, range_from_model

pytest.importorskip("onnxruntime")


def _embedder(path, positions: bool = True) -> str:
    """input_ids: int64 [batch, seq] -> word embedding (100 x 8) + position embedding (32 x 8,
    indexed by Range(0, seq)): a small model shaped like a transformer's embeddings."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((100, 8)).astype(np.float32), "words"),
             numpy_helper.from_array(rng.standard_normal((32, 8)).astype(np.float32), "pos"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(1, np.int64), "one")]
    nodes = [helper.make_node("Gather", ["words", "input_ids"], ["w"])]
    if positions:
        nodes += [helper.make_node("Shape", ["input_ids"], ["shape"], start=1, end=2),
                  helper.make_node("Squeeze", ["shape"], ["seq"]),
                  helper.make_node("Range", ["zero", "seq", "one"], ["ids"]),
                  helper.make_node("Gather", ["pos", "ids"], ["p"]),
                  helper.make_node("Add", ["w", "p"], ["y"])]
    else:
        nodes += [helper.make_node("Identity", ["w"], ["y"])]
    graph = helper.make_graph(
        nodes, "embedder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    out = str(path / "embedder.onnx")
    onnx.save(model, out)
    return out


def test_the_position_table_bounds_the_sequence(tmp_path):
    proto = onnx.load(_embedder(tmp_path))
    assert position_table(proto) == ("pos", 32)
    found = range_from_model(proto, declared_inputs(proto))
    assert found.spec == {"input_ids": [1, "1..32"]}
    assert "'pos' (32 rows)" in found.source


def test_the_vocabulary_is_no_position_table(tmp_path):
    proto = onnx.load(_embedder(tmp_path, positions=False))
    assert position_table(proto) is None
    assert range_from_model(proto, declared_inputs(proto)) is None


def test_tune_without_shape_tunes_the_range_the_model_implies(tmp_path, capsys):
    model = _embedder(tmp_path)
    store = str(tmp_path / "plans.sqlite")
    assert main(["tune", model, "--budget", "2", "--store", store, "--backends",
                 "onnxruntime,numpy"]) == 0
    out = capsys.readouterr().out
    assert "no --shape given: tuning the range read from the position-embedding table 'pos'" in out
    assert "input_ids=1x1..32" in out
    assert main(["report", model, "--store", store, "--format", "json"]) == 0
    (rep,) = json.loads(capsys.readouterr().out)
    assert rep["range"] == "input_ids=1x1..32" and "'pos' (32 rows)" in rep["notes"]["range_from"]


def test_a_model_that_implies_no_range_still_asks_for_shapes(tmp_path, capsys):
    model = _embedder(tmp_path, positions=False)
    assert main(["tune", model, "--budget", "2", "--store", str(tmp_path / "p.sqlite")]) == 2
    assert "--shape input_ids=" in capsys.readouterr().err
