"""Precision as a layout: the reduced-precision layouts' converters against numpy and ONNX's
reference, chains that never pass through a reduced precision, and plans that convert at a
precision boundary only where producer and consumer disagree (with the FAKE backend's
reduced-precision region of tests/fakes.py: numpy-implemented, no speed claims)."""

from __future__ import annotations

import pickle

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from dispatch.backend import load_registry
from dispatch.executor import Executor
from dispatch.fusion import REGION_OP, region_node
from dispatch.graph import Graph
from dispatch.onnx_import import import_model
from dispatch.plan import PlanStep
from layouts import STANDARD, Layout, LayoutRegistry, standard_layout
from layouts.precision import (
    QuantizedArray,
    dequantize_linear,
    from_u8,
    quantize_linear,
    register_precision_layouts,
    to_bf16,
    to_fp16,
    to_u8,
    widen,
)
from tests.fakes import from_tcl, registry_with_fake, to_tcl
from tuner.accuracy.blocks import assemble

RNG = np.random.default_rng(7)


def _special(n: int = 4096) -> np.ndarray:
    """Random floats of every magnitude, with the values rounding must get right."""
    x = (RNG.standard_normal(n) * np.exp2(RNG.integers(-130, 120, n))).astype(np.float32)
    return np.concatenate([x, np.array([0.0, -0.0, 1.0, 1.00390625, 1.01171875, 3.4e38, -3.4e38,
                                        1e-45, np.inf, -np.inf], np.float32)])


def _bf16_by_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits by integer arithmetic: round to nearest, ties to even."""
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def test_bf16_rounds_to_nearest_even_like_the_bit_arithmetic():
    x = _special()
    got = to_bf16(x, x.shape)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.view(np.uint16), _bf16_by_bits(x))
    back = widen(got, x.shape)
    assert back.dtype == np.float32
    finite = np.isfinite(x) & (np.abs(x) > 1e-37) & (np.abs(x) < 3e38)
    rel = np.abs(back[finite] - x[finite]) / np.abs(x[finite])
    assert rel.max() <= 2.0 ** -8  # half an ulp of an 8-bit significand
    nan = to_bf16(np.array([np.nan], np.float32), (1,))
    assert np.isnan(widen(nan, (1,))[0])


def test_fp16_is_the_nearest_half_and_saturates_to_inf():
    x = _special()
    got = to_fp16(x, x.shape)
    assert got.dtype == np.float16
    ok = np.isfinite(got)
    h = got[ok]
    err = np.abs(h.astype(np.float64) - x[ok])
    for toward in (np.inf, -np.inf):  # no neighbouring half is nearer
        other = np.nextafter(h, np.float16(toward)).astype(np.float64)
        assert np.all(err <= np.abs(other - x[ok]))
    assert np.all(np.abs(x[~ok]) >= 65520)  # only what rounds past the largest half is inf
    assert np.isinf(widen(to_fp16(np.array([7e4], np.float32), (1,)), (1,))[0])


def _onnx_run(node: onnx.NodeProto, feeds: dict[str, np.ndarray], outputs: list[str], opset: int = 21):
    ins = [helper.make_tensor_value_info(k, TensorProto.UNDEFINED, None) for k in feeds]
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs]
    graph = helper.make_graph([node], "g", ins, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, feeds)


@pytest.mark.parametrize("x", [RNG.standard_normal((2, 3, 5)).astype(np.float32) * 4,
                               np.abs(RNG.standard_normal((7,))).astype(np.float32),
                               -np.abs(RNG.standard_normal((3, 4))).astype(np.float32),
                               np.zeros((3,), np.float32)], ids=["mixed", "positive", "negative", "zeros"])
def test_u8_is_onnx_dynamic_quantize_linear_and_back(x):
    q = to_u8(x, x.shape)
    y, scale, zp = _onnx_run(helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"]), {"x": x},
                             ["y", "s", "z"])
    assert isinstance(q, QuantizedArray) and q.dtype == np.uint8
    np.testing.assert_array_equal(np.asarray(q), y)
    assert q.scale == scale and q.zero_point == zp
    (deq,) = _onnx_run(helper.make_node("DequantizeLinear", ["y", "s", "z"], ["out"]),
                       {"y": y, "s": scale, "z": zp}, ["out"])
    back = from_u8(q, x.shape)
    np.testing.assert_array_equal(back, deq)
    assert np.abs(back - x).max() <= scale / 2 + 1e-7  # within half a step


def test_u8_keeps_its_parameters_through_slices_copies_and_pickle():
    q = to_u8(np.linspace(-1, 3, 12, dtype=np.float32).reshape(3, 4), (3, 4))
    for other in (q[1:], q.copy(), pickle.loads(pickle.dumps(q))):
        assert other.scale == q.scale and other.zero_point == q.zero_point
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(q)), q)


def test_u8_refuses_a_plain_array_naming_what_it_received():
    with pytest.raises(TypeError, match="QuantizedArray.*received a ndarray of uint8"):
        from_u8(np.zeros(3, np.uint8), (3,))


@pytest.mark.parametrize("case", ["per-tensor", "per-axis", "blocked", "int8", "int16"])
def test_quantize_and_dequantize_linear_match_onnx_reference(case):
    x = (RNG.standard_normal((2, 6, 4)) * 3).astype(np.float32)
    attrs: dict = {}
    if case == "per-tensor":
        scale, zp = np.float32(0.05), np.uint8(128)
    elif case == "per-axis":
        scale, zp = np.linspace(0.01, 0.1, 6, dtype=np.float32), np.arange(6, dtype=np.uint8) * 20
    elif case == "blocked":
        scale, zp = RNG.uniform(0.01, 0.1, (2, 2, 4)).astype(np.float32), np.full((2, 2, 4), 7, np.int8)
        attrs = {"block_size": 3}
    elif case == "int8":
        scale, zp = np.float32(0.02), np.int8(-3)
    else:
        scale, zp = np.float32(1e-4), np.int16(100)
    (expect,) = _onnx_run(helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=1, **attrs),
                          {"x": x, "s": np.asarray(scale), "z": np.asarray(zp)}, ["y"])
    got = quantize_linear(x, np.asarray(scale), np.asarray(zp), axis=1, **attrs)
    assert got.dtype == expect.dtype
    np.testing.assert_array_equal(got, expect)
    (deq,) = _onnx_run(helper.make_node("DequantizeLinear", ["y", "s", "z"], ["out"], axis=1, **attrs),
                       {"y": expect, "s": np.asarray(scale), "z": np.asarray(zp)}, ["out"])
    np.testing.assert_array_equal(
        dequantize_linear(expect, np.asarray(scale), np.asarray(zp), axis=1, **attrs), deq)


def test_a_per_axis_scale_of_the_wrong_length_names_both():
    with pytest.raises(ValueError, match="needs 6 entries, received shape \\(5,\\)"):
        quantize_linear(np.zeros((2, 6), np.float32), np.ones(5, np.float32), axis=1)


def test_every_registry_has_the_precision_layouts():
    layouts = load_registry().layouts
    got = {n: (layouts.layout(n).precision, layouts.layout(n).stored_dtype) for n in ("bf16", "fp16", "u8")}
    assert got == {"bf16": ("bf16", "bfloat16"), "fp16": ("fp16", "float16"), "u8": ("int8", "uint8")}
    assert layouts.layout(STANDARD).precision is None
    reason = layouts.layout("bf16").applies((2, 3), np.dtype(np.int64))
    assert reason is not None and "float32" in reason and "int64" in reason


def test_a_chain_never_passes_through_a_reduced_precision():
    reg = LayoutRegistry()
    reg.add_layout(standard_layout())
    register_precision_layouts(reg)
    reg.add_layout(Layout("tcl", "cpu", "fake", rank=4), to_standard=from_tcl, from_standard=to_tcl)
    # a very cheap shortcut through bf16 and an expensive direct converter
    reg.add_converter("bf16", "tcl", lambda x, s: to_tcl(widen(x, s), s), backend="fake")
    reg.set_cost_model(lambda c, shape, dtype: 1000.0 if c.dst == "tcl" and c.src == STANDARD else 1.0)
    shape = (1, 3, 2, 2)
    assert [c.name for c in reg.path(STANDARD, "tcl", shape, np.float32)] == ["std->tcl.fake"]
    # from the reduced precision itself, the shortcut is the right chain
    assert [c.name for c in reg.path("bf16", "tcl", shape, np.float32)] == ["bf16->tcl.fake"]


# -- plans: the optimiser's conversions at a precision boundary ------------------------------


def _chain_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Sigmoid", ["x"], ["a"], name="n0"),
             helper.make_node("Relu", ["a"], ["b"], name="n1"),
             helper.make_node("Neg", ["b"], ["c"], name="n2"),
             helper.make_node("Relu", ["c"], ["d"], name="n3"),
             helper.make_node("Sigmoid", ["d"], ["y"], name="n4")]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _step(graph: Graph, reg, impl_name: str, names: list[str]) -> PlanStep:
    impl = reg.impl(impl_name)
    if impl.is_region:
        node = region_node(graph, names)
        return PlanStep(nodes=names, op=REGION_OP, impl=impl.name, backend=impl.backend,
                        layouts_in=list(impl.input_layouts(node)),
                        layouts_out=list(impl.output_layouts(node)),
                        precision={"dtype": impl.precision})
    node = graph.node(names[0])
    return PlanStep(nodes=names, op=node.op_type, impl=impl.name, backend=impl.backend,
                    layouts_in=list(impl.input_layouts(node)), layouts_out=list(impl.output_layouts(node)))


def test_plan_converts_only_where_producer_and_consumer_precisions_differ():
    reg = registry_with_fake()
    graph = import_model(_chain_model())
    bf16 = "Region.fake.bf16"
    steps = [_step(graph, reg, "Sigmoid.numpy.stable", ["n0"]), _step(graph, reg, bf16, ["n1", "n2"]),
             _step(graph, reg, bf16, ["n3"]), _step(graph, reg, "Sigmoid.numpy.stable", ["n4"])]
    plan = assemble(graph, reg, steps)
    got = sorted((c.value, c.src, c.dst) for c in plan.conversions)
    # into bf16 before the first region, back to float32 after the second; nothing between them
    assert got == [("a", STANDARD, "bf16"), ("d", "bf16", STANDARD)]
    assert all(c.cost_bytes > 0 for c in plan.conversions)
    assert plan.precisions() == {"float32": 2, "bf16": 3}
    assert "converted at the edges: a std->bf16, d bf16->std" in plan.describe()
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    (y,) = Executor(graph, plan, reg).run({"x": x})
    a = 1 / (1 + np.exp(-x))
    d = np.maximum(-np.maximum(widen(to_bf16(a, a.shape), a.shape), 0), 0)  # exact in bf16
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-d)), rtol=1e-6)  # (the fake region refuses
    # any input that is not bfloat16, so the run itself shows the conversions were made)


def test_a_float32_implementation_may_not_declare_a_reduced_layout():
    from dispatch.plan_assembly import layout_reason
    from dispatch.registry import Implementation

    reg = registry_with_fake()
    graph = import_model(_chain_model())
    sneaky = Implementation(name="Relu.fake.sneaky", op="Relu", backend="fake", build=lambda n: None,
                            layouts_in=("bf16",), layouts_out=("bf16",))
    reason = layout_reason(reg, sneaky, graph.node("n1"))
    assert reason is not None and "computes in float32 but declares layout 'bf16'" in reason
    # and the reduced-precision one may
    assert layout_reason(reg, reg.impl("Region.fake.bf16"), region_node(graph, ["n1"])) is None
