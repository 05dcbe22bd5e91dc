"""bench/models/symbolic_batch.py: a batch-1 model made to take a symbolic batch is accepted
only when it computes each sample of a batch as the batch-1 model computes it alone; a graph
that bakes the batch size into a Reshape is refused and nothing is written."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bench.models.symbolic_batch import BATCH, main, symbolic_batch

pytest.importorskip("onnxruntime")


def _cnn(path, flatten_as_reshape: bool) -> None:
    """Conv -> Relu -> GlobalAveragePool -> (Flatten | Reshape to [1, -1]) -> Gemm, batch 1."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    fc = numpy_helper.from_array(rng.standard_normal((5, 4)).astype(np.float32), "fc")
    shape = numpy_helper.from_array(np.array([1, -1], dtype=np.int64), "shape")
    flat = (helper.make_node("Reshape", ["p", "shape"], ["f"]) if flatten_as_reshape
            else helper.make_node("Flatten", ["p"], ["f"], axis=1))
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("GlobalAveragePool", ["r"], ["p"]), flat,
         helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1)],
        "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], [w, fc, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(onnx.shape_inference.infer_shapes(model), str(path))


def test_a_model_that_batches_is_written_with_a_symbolic_first_dimension(tmp_path):
    _cnn(tmp_path / "cnn.onnx", flatten_as_reshape=False)
    assert main([str(tmp_path / "cnn.onnx"), str(tmp_path / "out.onnx"), "--check", "3"]) == 0
    model = onnx.load(str(tmp_path / "out.onnx"))
    for v in [*model.graph.input, *model.graph.output]:
        assert v.type.tensor_type.shape.dim[0].dim_param == BATCH
        assert [d.dim_value for d in v.type.tensor_type.shape.dim[1:]] == (
            [3, 8, 8] if v.name == "x" else [5])
    assert not model.graph.value_info


def test_a_graph_with_the_batch_in_a_reshape_is_refused_and_nothing_is_written(tmp_path, capsys):
    _cnn(tmp_path / "cnn.onnx", flatten_as_reshape=True)
    assert main([str(tmp_path / "cnn.onnx"), str(tmp_path / "out.onnx")]) == 1
    assert "cannot take a symbolic batch" in capsys.readouterr().err
    assert not list(tmp_path.glob("out.onnx*"))


def test_a_first_dimension_other_than_one_is_named():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    with pytest.raises(ValueError, match="x: the first dimension must be 1 .* received 2"):
        symbolic_batch(helper.make_model(graph))
