"""Bad models get clear errors that say what was received and what was expected."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from dispatch.errors import ModelLoadError, ShapeInferenceError
from dispatch.onnx_import import import_model
from tests.builders import ModelBuilder, small_cnn


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        import_model(tmp_path / "nope.onnx")


def test_directory_is_not_a_model(tmp_path):
    with pytest.raises(ModelLoadError, match="received the directory"):
        import_model(tmp_path)


def test_garbage_bytes(tmp_path):
    p = tmp_path / "garbage.onnx"
    p.write_bytes(b"\x00\xffthis is not a protobuf" * 10)
    with pytest.raises(ModelLoadError, match="garbage.onnx"):
        import_model(p)


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9])
def test_truncated_file(tmp_path, keep):
    data = small_cnn().SerializeToString()
    p = tmp_path / "cut.onnx"
    p.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelLoadError):
        import_model(p)


def test_wrong_type():
    with pytest.raises(ModelLoadError, match="received int"):
        import_model(42)  # type: ignore[arg-type]


def test_symbolic_input_needs_shape():
    b = ModelBuilder()
    x = b.input("pixels", ["N", 3, 8, 8])
    b.output(b.op("Relu", [x]))
    with pytest.raises(ShapeInferenceError, match=r"input 'pixels'.*input_shapes=.*--shape pixels="):
        import_model(b.build())
    g = import_model(b.build(), {"pixels": [2, 3, 8, 8]})
    assert g.inputs[0].shape == (2, 3, 8, 8)


def test_input_shapes_conflict_and_unknown_names():
    b = ModelBuilder()
    x = b.input("x", [1, 3])
    b.output(b.op("Relu", [x]))
    with pytest.raises(ShapeInferenceError, match="conflicts with the model's declared dimension 1 = 3"):
        import_model(b.build(), {"x": [1, 4]})
    with pytest.raises(ShapeInferenceError, match=r"not inputs of the model; its inputs are \['x'\]"):
        import_model(b.build(), {"y": [1, 3]})


def test_opset_out_of_range():
    b = ModelBuilder(opset=5)
    x = b.input("x", [1, 3])
    b.output(b.op("Relu", [x]))
    with pytest.raises(ModelLoadError, match="opset 5; supported: 7 to"):
        import_model(b.build())


def test_invalid_model_is_rejected_by_checker():
    b = ModelBuilder()
    x = b.input("x", [1, 3])
    b.output(b.op("Relu", ["does_not_exist"]))
    del x
    with pytest.raises(ModelLoadError):
        import_model(b.build())


def test_shapes_and_dtypes_are_static():
    g = import_model(small_cnn())
    for n in g.nodes:
        for v in n.outputs:
            assert v.shape is not None and v.dtype == np.float32, v
    assert g.opsets[""] == 17
    assert isinstance(onnx.__version__, str)
