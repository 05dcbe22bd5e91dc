"""The example plugin (examples/plugin_backend): its layout and converters, its custom operator
com.example.FastGelu (schema, shape inference, reference), every implementation checked
against the formula, and a model using it imported, tuned and run through a Session."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch.backend import Backend, _activate
from dispatch.onnx_import import import_model
from dispatch.registry import ImplTable, Priority
from dispatch.session import Session
from tests.plugins.plugin_support import FAST_GELU_IMPLS, fast_gelu_formula, fast_gelu_model
from tuner.tune import TuneOptions, tune

OP = "com.example::FastGelu"


def test_backend_brings_layout_implementations_and_custom_op(example_registry):
    reg = example_registry
    st = reg.backends["example"]
    assert st.origin.startswith("plugin ") and st.version.startswith("example-plugin 0.1.0")
    assert st.layouts == ["ex_colmajor"]
    assert st.custom_ops == [OP]
    assert {i.name for i in reg.impls_for(OP)} == set(FAST_GELU_IMPLS)
    assert "Relu.example.colmajor" in {i.name for i in reg.impls_for("Relu")}
    for src, dst in (("ex_colmajor", "std"), ("std", "ex_colmajor")):
        (conv,) = reg.layouts.converters[(src, dst)]
        assert conv.backend == "example" and not conv.direct
    custom = reg.custom_ops[OP]
    assert (custom.domain, custom.op_type, custom.since_version, custom.backend) == (
        "com.example", "FastGelu", 1, "example")
    assert "shape function" in custom.shape_inference


@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 3, 4), (2, 3, 4, 5)])
def test_colmajor_converters_round_trip(example_registry, shape):
    layouts = example_registry.layouts
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    if shape:
        (to,) = layouts.path("std", "ex_colmajor", shape, x.dtype)
        stored = to(x, shape)
        assert stored.shape == layouts.layout("ex_colmajor").stored_shape(shape) == shape[::-1]
        np.testing.assert_array_equal(stored, x.transpose())
        (back,) = layouts.path("ex_colmajor", "std", shape, x.dtype)
        np.testing.assert_array_equal(back(stored, shape), x)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_model_with_custom_op_imports_with_static_shapes(example_registry, bias, dtype):
    model, _ = fast_gelu_model((4, 6, 8), bias=bias, relu=True, dtype=dtype)
    graph = import_model(model)
    gelu = next(n for n in graph.nodes if n.name == "gelu")
    assert (gelu.domain, gelu.op_type, gelu.key_op, gelu.opset) == ("com.example", "FastGelu", OP, 1)
    # onnx's shape inference ran the plugin's shape function, and went on past it to Relu
    for node in graph.nodes:
        (out,) = node.outputs
        assert out.shape == (4, 6, 8) and out.dtype == np.dtype(dtype), node


@pytest.mark.parametrize("impl", FAST_GELU_IMPLS)
@pytest.mark.parametrize("bias", [True, False])
def test_every_fast_gelu_implementation_matches_the_formula(example_registry, impl, bias):
    model, b = fast_gelu_model((16, 48), bias=bias, seed=3)
    sess = Session(model, registry=example_registry, overrides={"gelu": impl}, store=False)
    assert sess.plan.steps[0].impl == impl
    x = np.random.default_rng(4).standard_normal((16, 48)).astype(np.float32) * 3
    (y,) = sess.run(None, {"x": x})
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_allclose(y, fast_gelu_formula(x, b), rtol=1e-5, atol=1e-6)


def test_reference_handles_float64_and_the_float32_kernels_decline_it(example_registry):
    model, b = fast_gelu_model((3, 5), dtype=np.float64)
    sess = Session(model, registry=example_registry, store=False)
    assert sess.plan.steps[0].impl == "FastGelu.numpy.reference"
    x = np.linspace(-4, 4, 15).reshape(3, 5)
    (y,) = sess.run(None, {"x": x})
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, fast_gelu_formula(x, b), rtol=1e-12)
    node = sess.graph.nodes[0]
    reason = example_registry.impl("FastGelu.example.tanh").supports(node)
    assert reason == "handles float32 X, received float64"


def test_plugin_layout_in_a_plan_with_conversions(example_registry):
    model, b = fast_gelu_model((8, 24), relu=True)
    sess = Session(model, registry=example_registry, store=False,
                   overrides={"gelu": "FastGelu.example.colmajor", "relu": "Relu.example.colmajor"})
    assert [s.impl for s in sess.plan.steps] == ["FastGelu.example.colmajor", "Relu.example.colmajor"]
    assert {tuple(c.chain) for c in sess.plan.conversions} == {
        ("std->ex_colmajor.example",), ("ex_colmajor->std.example",)}
    x = np.random.default_rng(5).standard_normal((8, 24)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, np.maximum(fast_gelu_formula(x, b), 0), rtol=1e-5, atol=1e-6)


def test_untuned_session_restricted_to_the_plugin(example_registry):
    model, b = fast_gelu_model((8, 24))
    sess = Session(model, registry=example_registry, backends=["example"], store=False)
    assert [s.impl for s in sess.plan.steps] == ["FastGelu.example.tanh"]
    x = np.random.default_rng(6).standard_normal((8, 24)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], fast_gelu_formula(x, b),
                               rtol=1e-5, atol=1e-6)


def test_tune_then_session_runs_the_plugin_implementation(example_registry, tmp_path):
    model, b = fast_gelu_model((64, 256), relu=True)
    store = tmp_path / "plans.sqlite"
    result = tune(model, store=store, registry=example_registry,
                  options=TuneOptions(budget_s=30, progress=False, validate_runs=5))
    # no FastGelu candidate is wrong (oneDNN's and OpenVINO's Relu are: Relu(NaN) = 0, found by
    # the tuner's non-finite check)
    import sqlite3

    with sqlite3.connect(store) as con:
        wrong = [c for (c,) in con.execute("SELECT candidate FROM measurements WHERE error IS NOT NULL")]
    assert not [c for c in wrong if c.startswith("FastGelu.")], wrong
    gelu_step = next(s for s in result.plan.steps if "gelu" in s.nodes)
    # the float32 kernel beats the float64 reference by a wide margin on 16k elements
    assert gelu_step.impl.startswith("FastGelu.example."), result.summary()
    sess = Session(model, registry=example_registry, store=store)
    assert sess.plan_source == "store"
    assert any(s.impl.startswith("FastGelu.example.") for s in sess.plan.steps)
    x = np.random.default_rng(7).standard_normal((64, 256)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, np.maximum(fast_gelu_formula(x, b), 0), rtol=1e-5, atol=1e-6)


wrong_table = ImplTable("wronggelu")


@wrong_table.register("FastGelu", "identity", domain="com.example", priority=Priority.PREFERRED)
def _wrong_gelu(node):
    """FastGelu that forgets the GELU (a test double the tuner must reject)."""
    return lambda x, bias=None: x + (0 if bias is None else bias)


class WrongGeluBackend(Backend):
    """A backend whose only FastGelu is wrong."""

    name = "wronggelu"

    def register(self, registry):
        registry.add_table(wrong_table)


def test_tuner_checks_candidates_against_the_plugin_reference(tmp_path):
    from dispatch.backend import load_registry
    from tests.plugins.plugin_support import copy_plugin

    reg = load_registry(str(copy_plugin(tmp_path / "plugins")), fresh=True)
    _activate(reg, WrongGeluBackend, "tests.plugins")
    assert reg.backends["wronggelu"].available
    model, _ = fast_gelu_model((16, 32))
    result = tune(model, store=tmp_path / "plans.sqlite", registry=reg,
                  options=TuneOptions(budget_s=30, progress=False, validate_runs=3))
    assert result.stats["wrong"] >= 1
    assert all(s.impl != "FastGelu.wronggelu.identity" for s in result.plan.steps)


def test_custom_op_imports_with_an_onnx_that_cannot_register_schemas(monkeypatch):
    """With onnx < 1.16 (no onnx.defs.register_schema) the schema is only recorded; the
    operator's output shapes then come from running its reference implementation."""
    import onnx
    from onnx import helper

    from dispatch.backend import load_registry
    from dispatch.registry import REFERENCE_BACKEND

    monkeypatch.delattr(onnx.defs, "register_schema")
    reference = ImplTable(REFERENCE_BACKEND)

    @reference.register("Double", "reference", domain="com.degraded.test")
    def _double(node):
        """Double: 2 * X."""
        return lambda x: 2 * x

    class Degraded(Backend):
        name = "degraded"

        def register(self, registry):
            p = onnx.defs.OpSchema.FormalParameter
            schema = onnx.defs.OpSchema("Double", "com.degraded.test", 1, "", inputs=[p("X", "T")],
                                        outputs=[p("Y", "T")],
                                        type_constraints=[("T", ["tensor(float)"], "")])
            registry.add_op_schema(schema, backend=self.name, infer=lambda ins, attrs: [ins[0]])
            registry.add_table(reference)

    reg = load_registry(fresh=True)
    _activate(reg, Degraded, "tests.plugins")
    st = reg.backends["degraded"]
    assert st.available and st.custom_ops == ["com.degraded.test::Double"], st.reason
    assert reg.custom_ops["com.degraded.test::Double"].shape_inference.startswith(
        f"not registered with onnx {onnx.__version__} (needs onnx >= 1.16)")
    nodes = [helper.make_node("Double", ["x"], ["d"], domain="com.degraded.test", name="double"),
             helper.make_node("Relu", ["d"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2, 3])],
                              [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.degraded.test", 1)])
    assert import_model(model).nodes[0].outputs[0].shape is None  # onnx cannot tell
    sess = Session(model, registry=reg, store=False)
    assert sess.graph.nodes[0].outputs[0].shape == (2, 3)  # filled by the reference
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(2 * x, 0))
