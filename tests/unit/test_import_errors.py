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


# -- hostile models (issue #7): each gets a clean error saying what was received ------------

F32 = onnx.TensorProto.FLOAT


def _model(nodes, inputs, outputs=("y",), inits=(), opset=17):
    from onnx import helper

    graph = helper.make_graph(
        nodes, "hostile", [helper.make_tensor_value_info(n, F32, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F32, None) for n in outputs], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _node(op, ins, outs, name=None, **attrs):
    return onnx.helper.make_node(op, ins, outs, name=name or f"{op}_node", **attrs)


def _const(name, arr):
    return onnx.numpy_helper.from_array(np.asarray(arr), name)


@pytest.fixture(scope="module")
def registry():
    from dispatch.backend import load_registry

    return load_registry()


def _session(model, registry, **kw):
    from dispatch.session import Session

    return Session(model, registry=registry, store=False, **kw)


def test_enormous_declared_input_is_refused_before_anything_is_allocated(registry):
    from dispatch.errors import TensorTooLargeError

    model = _model([_node("Relu", ["x"], ["y"])], [("x", [2**40, 3, 224, 224])])
    with pytest.raises(TensorTooLargeError, match=(
            r"value 'x' \(a graph input\) has shape \[1099511627776, 3, 224, 224\] \(float32\): "
            r"588.0 PiB .*more than the .* a tensor may take on this machine")):
        _session(model, registry)
    model = _model([_node("Relu", ["x"], ["y"])], [("x", [2**62, 2**62])])  # overflows int64
    with pytest.raises(TensorTooLargeError, match=r"\[4611686018427387904, 4611686018427387904\]"):
        import_model(model)


def test_the_tensor_limit_can_be_set(monkeypatch):
    import dispatch.graph
    from dispatch.errors import TensorTooLargeError

    monkeypatch.setattr(dispatch.graph, "MAX_TENSOR_BYTES", 1000)
    with pytest.raises(TensorTooLargeError, match=r"value 'x' .*\[16, 16\] .*1.0 KiB \(1024 bytes\)"):
        import_model(_model([_node("Relu", ["x"], ["y"])], [("x", [16, 16])]))
    import_model(_model([_node("Relu", ["x"], ["y"])], [("x", [10, 25])]))


@pytest.mark.parametrize("op, extra, inits", [
    ("Reshape", ["s"], [_const("s", np.array([2**20, 2**20, 2**10], np.int64))]),
    ("Expand", ["s"], [_const("s", np.array([2**20, 2**20, 2**10], np.int64))]),
    ("Tile", ["s"], [_const("s", np.array([2**40], np.int64))]),
])
def test_huge_shapes_from_constants_are_refused(registry, op, extra, inits):
    from dispatch.errors import TensorTooLargeError

    shape = [1, 2] if op == "Reshape" else [1]
    model = _model([_node(op, ["x", *extra], ["y"])], [("x", shape)], inits=inits)
    with pytest.raises(TensorTooLargeError, match=r"value 'y' has shape \[.*\] \(float32\): .* (TiB|PiB)"):
        _session(model, registry)


def test_huge_constant_of_shape_and_range_are_refused_without_materialising(registry):
    """onnx's data propagation would build these in memory (a Range of 2**40 elements
    feeding a Cast): it is skipped for large constants, and the size check refuses them."""
    from dispatch.errors import TensorTooLargeError

    cos = _model([_node("ConstantOfShape", ["s"], ["c"]), _node("Add", ["x", "c"], ["y"])],
                 [("x", [1])], inits=[_const("s", np.array([2**20, 2**20, 2**10], np.int64))])
    with pytest.raises(TensorTooLargeError, match=r"value 'c' has shape \[1048576, 1048576, 1024\]"):
        _session(cos, registry)
    rng = _model([_node("Range", ["a", "b", "d"], ["r"]), _node("Cast", ["r"], ["y"], to=F32)],
                 [("x", [1])], inits=[_const("a", np.array(0, np.int64)),
                                      _const("b", np.array(2**40, np.int64)),
                                      _const("d", np.array(1, np.int64))])
    with pytest.raises(TensorTooLargeError, match=r"value 'r' has shape \[1099511627776\] \(int64\)"):
        _session(rng, registry)


def test_a_constant_node_that_fails_on_its_constants(registry):
    model = _model([_node("ConstantOfShape", ["s"], ["c"]), _node("Add", ["x", "c"], ["y"])],
                   [("x", [1])], inits=[_const("s", np.array([-5, 3], np.int64))])
    with pytest.raises(ModelLoadError, match=(
            r"node 'ConstantOfShape_node' \(ConstantOfShape\) fails on its constant inputs "
            r"\(s=\[-5, 3\]\): ValueError: .*negative dimension")):
        _session(model, registry)


def test_initializer_claiming_huge_dims_with_little_data():
    t = onnx.TensorProto(name="W", data_type=F32, dims=[2**20, 2**20], raw_data=b"\0" * 16)
    model = _model([_node("Add", ["x", "W"], ["y"])], [("x", [1])], inits=[t])
    with pytest.raises(ModelLoadError, match=r"raw_data size \(16 bytes\) is too small"):
        import_model(model)


def test_negative_inferred_dimension_names_the_node():
    w = _const("W", np.ones((4, 3, 3, 3), np.float32))
    model = _model([_node("Conv", ["x", "W"], ["y"])], [("x", [1, 3, 0, 0])], inits=[w])
    with pytest.raises(ShapeInferenceError, match=(
            r"node 'Conv_node' \(Conv\) would produce 'y' with shape \[1, 4, -2, -2\]: a negative "
            r"dimension \(inputs: x \[1, 3, 0, 0\], W \[4, 3, 3, 3\]\)")):
        import_model(model)


@pytest.mark.parametrize("attrs, w_shape, pattern", [
    ({"group": 0}, (4, 3, 3, 3), r"group must be an integer >= 1, received 0"),
    ({"group": 5}, (4, 3, 3, 3), r"W \[4, 3, 3, 3\] has 4 output channels, not divisible by group=5"),
    ({}, (4, 5, 3, 3), r"X \[1, 3, 8, 8\] has 3 channels, W \[4, 5, 3, 3\] expects 5 per group x group=1"),
    ({}, (4, 3, 3),
     r"W must have the rank of X \(4: M, C/group, kernel...\), received 'W' of shape \[4, 3, 3\]"),
    ({"kernel_shape": [5, 5]}, (4, 3, 3, 3),
     r"kernel_shape \[5, 5\] does not match W's spatial shape \[3, 3\]"),
    ({"auto_pad": "WHAT"}, (4, 3, 3, 3),
     r"auto_pad must be one of NOTSET, SAME_UPPER, SAME_LOWER, VALID, received 'WHAT'"),
    ({"pads": [1, 1]}, (4, 3, 3, 3), r"pads needs 4 values for 2 spatial axes, received \[1, 1\]"),
])
def test_malformed_conv_is_refused_at_load(registry, attrs, w_shape, pattern):
    """Before: onnxruntime (which accepts any ONNX node) was planned and failed at run time."""
    model = _model([_node("Conv", ["x", "W"], ["y"], **attrs)], [("x", [1, 3, 8, 8])],
                   inits=[_const("W", np.ones(w_shape, np.float32))])
    with pytest.raises(ModelLoadError, match=r"node 'Conv_node' \(Conv\): " + pattern):
        _session(model, registry)


@pytest.mark.parametrize("value, pattern", [
    ([1.5, 1.5], r"Mismatched attribute type in 'Conv_node : strides'. Expected: 'INTS', actual: 'FLOATS'"),
    ("ab", r"Mismatched attribute type in 'Conv_node : strides'. Expected: 'INTS', actual: 'STRING'"),
])
def test_wrong_attribute_types(value, pattern):
    model = _model([_node("Conv", ["x", "W"], ["y"], strides=value)], [("x", [1, 3, 8, 8])],
                   inits=[_const("W", np.ones((4, 3, 3, 3), np.float32))])
    with pytest.raises(ModelLoadError, match="the model is not valid ONNX: " + pattern):
        import_model(model)


def test_declared_output_type_that_the_graph_does_not_compute():
    from onnx import helper

    model = _model([_node("Relu", ["x"], ["y"])], [("x", [2, 3])])
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", F32, [5, 7]))
    with pytest.raises(ShapeInferenceError, match=(
            r"graph output 'y' is declared with shape \[5, 7\], but the model computes shape "
            r"\[2, 3\] there")):
        import_model(model)
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", onnx.TensorProto.INT64, [2, 3]))
    with pytest.raises(ShapeInferenceError, match=(
            r"graph output 'y' is declared tensor\(int64\), but the model computes tensor\(float\)")):
        import_model(model)


@pytest.mark.parametrize("nodes, pattern", [
    ([_node("Relu", ["b"], ["a"], name="A"), _node("Relu", ["a"], ["b"], name="B"),
      _node("Add", ["x", "a"], ["y"])],
     "however input 'b' .*; the graph has a cycle: nodes A, B, Add_node each wait for another's output"),
    ([_node("Add", ["x", "y"], ["y"])], "however input 'y' .*; the graph has a cycle: nodes Add_node"),
    ([_node("Relu", ["nowhere"], ["y"])],
     r"'nowhere' \(read by Relu_node\) is neither a graph input, an initializer nor a node output"),
    ([_node("Conv", ["x", "W"], ["y"])],
     r"'W' \(read by Conv_node\) is neither .*: a missing initializer or input\?"),
    ([_node("Frobnicate", ["x"], ["y"])], "No Op registered for Frobnicate"),
    ([_node("Relu", ["x"], ["y"]), _node("Sigmoid", ["x"], ["y"])], r"single static assignment \(SSA\)"),
])
def test_graph_structure_errors(nodes, pattern):
    with pytest.raises(ModelLoadError, match="the model is not valid ONNX: .*" + pattern):
        import_model(_model(nodes, [("x", [1])]))


def test_unknown_domain_and_duplicate_names():
    model = _model([onnx.helper.make_node("Relu", ["x"], ["y"], domain="com.evil", name="r")], [("x", [1])])
    with pytest.raises(ModelLoadError,
                       match="is of domain 'com.evil', which the model's opset_import does not list"):
        import_model(model)
    dup = _model([_node("Relu", ["x"], ["y"])], [("x", [1]), ("x", [2])])
    with pytest.raises(ModelLoadError, match=r"'x' has been used as graph input names multiple times"):
        import_model(dup)
    inits = [_const("W", np.ones(3, np.float32)), _const("W", np.ones(2, np.float32))]
    with pytest.raises(ModelLoadError, match="W initializer name is not unique"):
        import_model(_model([_node("Add", ["x", "W"], ["y"])], [("x", [3])], inits=inits))


def test_empty_graphs():
    with pytest.raises(ModelLoadError, match="the model has no graph"):
        import_model(_model([], [], outputs=()))
    with pytest.raises(ModelLoadError, match=(
            r"the model's graph has 1 node\(s\) but declares no graph outputs; expected at least one")):
        import_model(_model([_node("Relu", ["x"], ["y"])], [("x", [1])], outputs=()))
    with pytest.raises(ModelLoadError, match="the model has no graph"):
        import_model(b"")


@pytest.mark.parametrize("opset", [-1, 0, 6, 10**6])
def test_opsets_out_of_range(opset):
    with pytest.raises(ModelLoadError, match=rf"default-domain opset {opset}; supported: 7 to \d+"):
        import_model(_model([_node("Relu", ["x"], ["y"])], [("x", [1])], opset=opset))


@pytest.mark.parametrize("elem, pattern", [
    (0, r"input 'x' declares no element type; expected a tensor type such as tensor\(float\)"),
    (999, r"input 'x': tensor element type 999 is not supported"),
])
def test_input_element_types(elem, pattern):
    model = _model([_node("Relu", ["x"], ["y"])], [("x", [1])])
    model.graph.input[0].type.tensor_type.elem_type = elem
    with pytest.raises(ModelLoadError, match=pattern):
        import_model(model)


def test_value_nbytes_does_not_wrap_around():
    from dispatch.graph import Value

    v = Value("v", (2**62, 2**62), np.dtype(np.float32))
    assert v.nbytes == 2**124 * 4


def test_reshape_to_another_number_of_elements_is_refused_at_load(registry):
    """onnx's inference takes a Reshape's target as given; before, the plan failed at run time."""
    model = _model([_node("Reshape", ["x", "s"], ["y"])], [("x", [2, 3])],
                   inits=[_const("s", np.array([5, 7], np.int64))])
    with pytest.raises(ModelLoadError, match=(
            r"node 'Reshape_node' \(Reshape\): cannot turn 'x' of shape \[2, 3\] \(6 elements\) "
            r"into shape \[5, 7\] \(35 elements\) \(shape input \[5, 7\]\); expected a shape "
            r"with 6 elements")):
        _session(model, registry)
    ok = _model([_node("Reshape", ["x", "s"], ["y"])], [("x", [2, 3])],
                inits=[_const("s", np.array([3, -1], np.int64))])
    assert _session(ok, registry).graph.outputs[0].shape == (3, 2)


def test_names_that_are_not_utf8_are_refused():
    """Found by fuzzing: protobuf hands out bytes for a name that is not valid UTF-8, and the
    planner failed joining node names (TypeError)."""
    data = bytearray(_model([_node("Relu", ["x"], ["y"], name="Relu_2")], [("x", [1])])
                     .SerializeToString())
    k = data.index(b"Relu_2")
    data[k + 3] = 0x80
    with pytest.raises(ModelLoadError, match=(
            r"the name of node 0 \('Relu'\) is not valid UTF-8 text: received b'Rel\\x80_2'")):
        import_model(bytes(data))


def test_zero_size_shape_whose_other_dimensions_overflow():
    """Found by fuzzing: [0, 0, 2**31, 2**31] holds no elements, but numpy cannot make an
    array of that shape, so no feed could ever be given."""
    from dispatch.errors import TensorTooLargeError

    model = _model([_node("Relu", ["x"], ["y"])], [("x", [0, 0, 2**31, 2**31])])
    with pytest.raises(TensorTooLargeError, match=(
            r"value 'x' \(a graph input\) has shape \[0, 0, 2147483648, 2147483648\]: even with no "
            r"elements, numpy cannot hold an array of this shape")):
        import_model(model)
    assert (import_model(_model([_node("Relu", ["x"], ["y"])], [("x", [0, 2**20])])).inputs[0].shape
            == (0, 2**20))


def test_gemm_bias_that_does_not_broadcast_is_refused_at_load(registry):
    """Found by fuzzing: onnx's inference does not check C; the plan failed at run time."""
    inits = [_const("B", np.ones((2, 3), np.float32)), _const("C", np.ones(4, np.float32))]
    model = _model([_node("Gemm", ["x", "B", "C"], ["y"], transB=1)], [("x", [2, 3])], inits=inits)
    with pytest.raises(ModelLoadError, match=(
            r"node 'Gemm_node' \(Gemm\): bias C 'C' of shape \[4\] does not broadcast to the "
            r"output shape \[2, 2\] \(M, N\); expected a shape such as \[2\], \[2, 1\] or \[2, 2\]")):
        _session(model, registry)
    for shape in [(2,), (1, 2), (2, 1), (2, 2), (1,), ()]:
        inits[1] = _const("C", np.ones(shape, np.float32))
        model = _model([_node("Gemm", ["x", "B", "C"], ["y"], transB=1)], [("x", [2, 3])], inits=inits)
        assert _session(model, registry).graph.outputs[0].shape == (2, 2)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_ceil_mode_window_in_the_padding_is_refused_at_load(registry, op):
    """Found by fuzzing: onnx's inference counts a last window that starts in the end padding,
    the implementations drop it; the plan failed at run time on the output shape."""
    model = _model([_node(op, ["x"], ["y"], ceil_mode=1, kernel_shape=[3, 3], pads=[3, 3, 3, 3])],
                   [("x", [1, 5, 12, 5])])
    with pytest.raises(ModelLoadError, match=(
            rf"node '{op}_node' \({op}\): with ceil_mode=1 the last window along spatial axis 0 "
            r"would start in the end padding \(input \[1, 5, 12, 5\], pads \[3, 3, 3, 3\], strides "
            r"\[1, 1\], output \[1, 5, 16, 9\] by onnx's inference\)")):
        _session(model, registry)
    ok = _model([_node(op, ["x"], ["y"], ceil_mode=1, kernel_shape=[3, 3], strides=[2, 2],
                       pads=[1, 1, 1, 1])], [("x", [1, 5, 12, 5])])
    assert (_session(ok, registry).run(None, {"x": np.ones((1, 5, 12, 5), np.float32)})[0].shape
            == (1, 5, 7, 3))


@pytest.mark.parametrize("op, attrs, x_shape, pattern", [
    ("Conv", {"auto_pad": "SAME_UPPER", "pads": [1, 1, 1, 1]}, [1, 3, 8, 8],
     r"auto_pad=SAME_UPPER and pads=\[1, 1, 1, 1\] are both set; ONNX allows pads only with auto_pad=NOTSET"),
    ("Conv", {"auto_pad": "SAME_LOWER", "pads": [0, 0, 0, 0]}, [1, 3, 5, 5],
     r"auto_pad=SAME_LOWER and pads=\[0, 0, 0, 0\] are both set"),
    ("Conv", {"dilations": [3, 3], "pads": [1, 1, 1, 1]}, [1, 3, 4, 4],
     r"its window spans 7 elements along spatial axis 0 \(kernel \[3, 3\], dilations \[3, 3\]\) but the "
     r"padded input has 6 there \(input \[1, 3, 4, 4\], pads \[1, 1, 1, 1\]\)"),
    ("AveragePool", {"kernel_shape": [5, 5], "strides": [3, 3]}, [1, 3, 3, 1],
     r"its window spans 5 elements along spatial axis 0 .* padded input has 3 there"),
])
def test_windows_onnx_and_the_kernels_size_differently_are_refused(registry, op, attrs, x_shape, pattern):
    """Found by fuzzing: onnx's inference rounds a negative output size toward zero (one
    output) and ignores pads next to auto_pad; the implementations did not agree at run time."""
    inits = [_const("W", np.ones((4, 3, 3, 3), np.float32))] if op == "Conv" else []
    ins = ["x", "W"] if op == "Conv" else ["x"]
    model = _model([_node(op, ins, ["y"], **attrs)], [("x", x_shape)], inits=inits)
    with pytest.raises(ModelLoadError, match=rf"node '{op}_node' \({op}\): " + pattern):
        _session(model, registry)


def test_transpose_perm_that_is_no_permutation_is_refused_at_load(registry):
    """Found by fuzzing: onnxruntime was planned for it and failed at run time."""
    model = _model([_node("Transpose", ["x"], ["y"], perm=[0])], [("x", [1, 2, 3, 4])])
    with pytest.raises(ModelLoadError, match=r"node 'Transpose_node' \(Transpose\): perm \[0\] is not "
                                             r"a permutation of the 4 axes of 'x'"):
        _session(model, registry)


def test_gemm_inner_dimensions_and_pool_ranks_are_checked_at_load(registry):
    """Found by fuzzing: onnxruntime accepted these when planned and failed at run time."""
    gemm = _model([_node("Gemm", ["x", "B"], ["y"], transB=1)], [("x", [2, 1])],
                  inits=[_const("B", np.ones((4, 8), np.float32))])
    with pytest.raises(ModelLoadError, match=(
            r"node 'Gemm_node' \(Gemm\): inner dimensions differ: A \[2, 1\] \(transA=0\) has "
            r"K=1, B \[4, 8\] \(transB=1\) has K=8; expected equal K")):
        _session(gemm, registry, backends=["onnxruntime", "numpy"])
    pool = _model([_node("GlobalAveragePool", ["x"], ["y"])], [("x", [2, 3])])
    with pytest.raises(ModelLoadError, match=(
            r"node 'GlobalAveragePool_node' \(GlobalAveragePool\): X must have rank >= 3 "
            r"\(N, C, spatial...\), received 'x' of shape \[2, 3\]")):
        _session(pool, registry, backends=["onnxruntime", "numpy"])
