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


# -- operators of custom domains (a plugin's com.example.FastGelu) ---------------------------


@pytest.fixture(scope="module")
def example_plugin(tmp_path_factory):
    """A registry with the example plugin, whose backend registers com.example.FastGelu."""
    from dispatch.backend import load_registry
    from tests.plugins.plugin_support import copy_plugin

    reg = load_registry(str(copy_plugin(tmp_path_factory.mktemp("plugins"))), fresh=True)
    assert reg.backends["example"].available, reg.backends["example"].reason
    return reg


def test_custom_op_bias_of_the_wrong_size(example_plugin):
    from tests.plugins.plugin_support import fast_gelu_model

    model, _ = fast_gelu_model((2, 64), bias_len=7)
    with pytest.raises(ShapeInferenceError, match=(
            r"shape inference of a custom operator failed: node 'gelu' \(com.example::FastGelu, "
            r"registered by backend 'example'\): bias has 7 elements, expected 64 \(X's last "
            r"dimension; X has shape \[2, 64\]\)")):
        import_model(model)


def test_custom_domain_missing_from_opset_import(example_plugin):
    from tests.plugins.plugin_support import fast_gelu_model

    model, _ = fast_gelu_model((2, 8), import_domain=False)
    with pytest.raises(ModelLoadError, match=(
            r"node 'gelu' \(FastGelu\) is of domain 'com.example', which the model's opset_import "
            r"does not list \(it lists \[''\]\); add onnx.helper.make_opsetid\('com.example', VERSION\)")):
        import_model(model)


def test_custom_op_checked_against_its_schema(example_plugin):
    from tests.plugins.plugin_support import fast_gelu_model

    model, _ = fast_gelu_model((2, 8))
    model.graph.node[0].input.append("x")  # a third input: the schema allows two
    with pytest.raises(ModelLoadError, match="the model is not valid ONNX: .*FastGelu"):
        import_model(model)
    model, _ = fast_gelu_model((2, 8), bias=False, dtype=np.int32)  # T is float only
    with pytest.raises((ModelLoadError, ShapeInferenceError), match="FastGelu|tensor\\(int32\\)"):
        import_model(model)


def test_unknown_custom_op_imports_and_the_session_names_it(example_plugin):
    from dispatch.errors import UnsupportedOpError
    from dispatch.session import Session

    b = ModelBuilder()
    x = b.input("x", [2, 3])
    b.nodes.append(onnx.helper.make_node("Mystery", [x], ["m"], domain="com.nobody", name="mystery"))
    b.output("m")
    model = b.build()
    model.opset_import.append(onnx.helper.make_opsetid("com.nobody", 1))
    graph = import_model(model)  # onnx knows nothing of it: its output shape stays unknown
    assert graph.nodes[0].key_op == "com.nobody::Mystery"
    with pytest.raises(UnsupportedOpError, match=r"com.nobody::Mystery \(nodes: mystery\)"):
        Session(model, registry=example_plugin, store=False)


def test_a_crashing_custom_shape_function_is_an_error_not_a_crash(tmp_path):
    from onnx.defs import OpSchema

    from dispatch.backend import Backend, _activate, load_registry

    def buggy(inputs, attrs):
        return [inputs[5]]  # IndexError: a bug in the plugin

    class Buggy(Backend):
        name = "buggy"

        def register(self, registry):
            p = OpSchema.FormalParameter
            schema = OpSchema("Buggy", "com.buggy.test", 1, "", inputs=[p("X", "T")],
                              outputs=[p("Y", "T")], type_constraints=[("T", ["tensor(float)"], "")])
            registry.add_op_schema(schema, backend=self.name, infer=buggy)

    reg = load_registry(fresh=True)
    _activate(reg, Buggy, "tests")
    assert reg.backends["buggy"].available, reg.backends["buggy"].reason
    b = ModelBuilder()
    x = b.input("x", [2, 3])
    b.nodes.append(onnx.helper.make_node("Buggy", [x], ["y"], domain="com.buggy.test", name="bug"))
    b.output("y")
    model = b.build()
    model.opset_import.append(onnx.helper.make_opsetid("com.buggy.test", 1))
    with pytest.raises(ShapeInferenceError, match=(
            r"node 'bug' \(com.buggy.test::Buggy, registered by backend 'buggy'\): list index out of range")):
        import_model(model)
