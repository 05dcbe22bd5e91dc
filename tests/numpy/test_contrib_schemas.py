"""onnxruntime's contrib operators known to the import (issue 52): the schemas of
dispatch.contrib_schemas agree with onnxruntime's own, the import checks and infers contrib
nodes and keeps their domain apart, a default Session runs a model of them as onnxruntime does,
and an operator nobody implements still gets the clear error."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from dispatch.contrib_schemas import MS_DOMAIN, SCHEMAS, NoDefault, register_all, uses_contrib
from dispatch.onnx_import import import_model
from tests.numpy.contrib_support import OPSETS, one_node_model, run_ors_or_skip, run_ours

RNG = np.random.default_rng(52000)


def rand(*shape: int) -> np.ndarray:
    return np.asarray(RNG.standard_normal(shape), dtype=np.float32)


def _ort_schemas() -> dict[tuple[str, str], object]:
    pybind = pytest.importorskip("onnxruntime.capi.onnxruntime_pybind11_state")
    found: dict[tuple[str, str], object] = {}
    for s in pybind.get_all_operator_schema():
        key = (s.domain, s.name)
        if key not in found or s.since_version > found[key].since_version:
            found[key] = s
    return found


@pytest.mark.parametrize("spec", SCHEMAS, ids=lambda s: f"{s.domain or 'default'}-{s.name}")
def test_the_schemas_agree_with_onnxruntimes(spec):
    theirs = _ort_schemas().get((spec.domain, spec.name))
    assert theirs is not None, f"onnxruntime registers no {spec.domain}::{spec.name}"
    assert theirs.since_version == spec.since_version
    optional = theirs.FormalParameterOption.Optional

    def params(ps):
        return [(p.name, p.typeStr, p.option == optional) for p in ps]

    assert params(theirs.inputs) == [(p.name, p.type_str, p.optional) for p in spec.inputs]
    assert params(theirs.outputs) == [(p.name, p.type_str, p.optional) for p in spec.outputs]
    defaults, typed = {}, {}
    for name, attr in theirs.attributes.items():
        proto = onnx.AttributeProto()
        proto.ParseFromString(attr._default_value)
        if proto.type == onnx.AttributeProto.UNDEFINED:  # no default
            typed[name] = NoDefault(attr.type.name, bool(attr.required))
        else:
            value = helper.get_attribute_value(proto)
            defaults[name] = value.decode() if isinstance(value, bytes) else value
    assert defaults == pytest.approx({n: d for n, d in spec.attributes if not isinstance(d, NoDefault)})
    assert typed == {n: d for n, d in spec.attributes if isinstance(d, NoDefault)}
    assert {t.type_param_str: set(t.allowed_type_strs) for t in theirs.type_constraints} == {
        t: set(allowed) for t, allowed in spec.types}


def test_the_import_keeps_domains_and_versions_apart():
    b = helper
    x = b.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8])
    nodes = [b.make_node("Gelu", ["x"], ["g"], name="onnx_gelu"),  # ONNX's Gelu (opset 20)
             b.make_node("Gelu", ["g"], ["m"], domain=MS_DOMAIN, name="ms_gelu"),
             b.make_node("FusedMatMul", ["m", "x"], ["y"], domain=MS_DOMAIN, name="mm", transB=1)]
    graph = b.make_graph(nodes, "g", [x], [b.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = b.make_model(graph, opset_imports=[b.make_opsetid("", 20), b.make_opsetid(MS_DOMAIN, 1)])
    imported = import_model(model)
    keys = [(n.key_op, n.domain, n.opset) for n in imported.nodes]
    assert keys == [("Gelu", "", 20), (f"{MS_DOMAIN}::Gelu", MS_DOMAIN, 1),
                    (f"{MS_DOMAIN}::FusedMatMul", MS_DOMAIN, 1)]
    assert imported.values["y"].shape == (2, 2)  # the contrib shape function ran
    assert imported.values["y"].dtype == np.float32


def test_shape_inference_of_the_optional_outputs():
    inputs = [("input", rand(2, 3, 8)), ("skip", rand(3, 8)), ("gamma", rand(8))]
    model = one_node_model("SkipLayerNormalization", inputs, ["out", "", "inv", "sum"])
    g = import_model(model)
    assert [(g.values[n].shape, g.values[n].dtype) for n in ("out", "inv", "sum")] == [
        ((2, 3, 8), np.float32), ((2, 3, 1), np.float32), ((2, 3, 8), np.float32)]


@pytest.mark.parametrize("case,match", [
    ("int_input", "FastGelu|tensor\\(int32\\)"),
    ("three_inputs", "FastGelu"),
    ("bad_attribute", "QuickGelu|beta"),
])
def test_the_checker_checks_contrib_nodes(case, match):
    from dispatch.errors import OpDispatchError

    if case == "int_input":
        model = one_node_model("FastGelu", [("X", np.ones((2, 3), np.int32))], ["Y"])
    elif case == "three_inputs":
        model = one_node_model("FastGelu", [("X", rand(2, 3)), ("b", rand(3)), ("c", rand(3))], ["Y"])
    else:
        model = one_node_model("QuickGelu", [("X", rand(2, 3))], ["Y"], {"beta": 1.0})
    with pytest.raises(OpDispatchError, match=match):
        import_model(model)


def test_uses_contrib():
    assert uses_contrib(one_node_model("Gelu", [("X", rand(2))], ["Y"]))
    plain = one_node_model("Relu", [("X", rand(2))], ["Y"], domain="", opsets={"": 17})
    assert not uses_contrib(plain)
    simplified = one_node_model("SimplifiedLayerNormalization", [("X", rand(2)), ("s", rand(2))], ["Y"],
                                domain="", opsets={"": 17})
    assert uses_contrib(simplified)
    assert set(register_all()) == {(s.domain, s.name) for s in SCHEMAS}


def bert_block() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A BERT-like block as onnxruntime's transformers optimizer writes it: FusedMatMul,
    SkipLayerNormalization (all four outputs used), BiasGelu, FastGelu, QuickGelu, Gelu,
    SkipSimplifiedLayerNormalization and SimplifiedLayerNormalization, between standard ops."""
    h = 16
    w = {"w1": rand(h, h), "w2": rand(4 * h, h), "gamma": rand(h), "beta": rand(h), "b1": rand(h),
         "b2": rand(4 * h), "w3": rand(4 * h, h), "scale": rand(h)}
    n = helper.make_node
    nodes = [
        n("FusedMatMul", ["x", "w1"], ["q"], domain=MS_DOMAIN, alpha=0.25),
        n("SkipLayerNormalization", ["q", "x", "gamma", "beta", "b1"], ["ln", "mean", "inv", "sum"],
          domain=MS_DOMAIN, epsilon=1e-5),
        n("FusedMatMul", ["ln", "w2"], ["up"], domain=MS_DOMAIN, transB=1),
        n("BiasGelu", ["up", "b2"], ["act"], domain=MS_DOMAIN),
        n("FastGelu", ["act"], ["act2"], domain=MS_DOMAIN),
        n("QuickGelu", ["act2"], ["act3"], domain=MS_DOMAIN, alpha=1.5),
        n("Gelu", ["act3"], ["act4"], domain=MS_DOMAIN),
        n("MatMul", ["act4", "w3"], ["down"]),
        n("SkipSimplifiedLayerNormalization", ["down", "sum", "gamma"], ["rms", "", "", "sum2"],
          domain=MS_DOMAIN),
        n("Add", ["rms", "sum2"], ["res"]),
        n("SimplifiedLayerNormalization", ["res", "scale"], ["y"], epsilon=1e-6),
        n("Mul", ["mean", "inv"], ["stats"]),
    ]
    inits = [onnx.numpy_helper.from_array(v, k) for k, v in w.items()]
    f = onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "bert_block", [helper.make_tensor_value_info("x", f, [2, 5, h])],
        [helper.make_tensor_value_info("y", f, None), helper.make_tensor_value_info("stats", f, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in OPSETS.items()])
    return model, {"x": rand(2, 5, h)}


@pytest.mark.parametrize("backends", [None, ["numpy"]], ids=["default", "numpy"])
def test_a_model_of_contrib_ops_runs_as_onnxruntime_runs_it(backends):
    model, feeds = bert_block()
    ours = run_ours(model, feeds, backends)
    theirs = run_ors_or_skip(model, feeds)
    for o, t in zip(ours, theirs):
        assert o.shape == t.shape and o.dtype == t.dtype
        np.testing.assert_allclose(o, t, rtol=1e-4, atol=1e-4)


def test_an_unknown_custom_domain_still_gets_the_clear_error():
    from dispatch.errors import UnsupportedOpError

    x = rand(2, 8)
    n = helper.make_node
    graph = helper.make_graph(
        [n("FastGelu", ["x"], ["a"], domain=MS_DOMAIN, name="known"),
         n("Mystery", ["a"], ["b"], domain="com.nobody", name="mystery"),
         n("QOrderedMatMul", ["b"], ["y"], domain=MS_DOMAIN, name="attention")],
        "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    opsets = [helper.make_opsetid(d, 1) for d in (MS_DOMAIN, "com.nobody")]
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), *opsets])
    with pytest.raises(UnsupportedOpError, match=r"2 operator\(s\) that no allowed backend implements: "
                       r"com.microsoft::QOrderedMatMul \(nodes: attention\); "
                       r"com.nobody::Mystery \(nodes: mystery\)"):
        run_ours(model, {"x": x}, backends=None)


def test_onnx_reference_imports_after_the_contrib_schemas():
    """onnx.reference builds its schema table on first import and fails on one name in two
    domains (com.microsoft::Gelu beside ONNX's Gelu): registering must not break it."""
    import subprocess
    import sys

    code = ("from dispatch.contrib_schemas import register_all; register_all(); "
            "from onnx.reference import ReferenceEvaluator; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.parametrize("op,inputs,outputs,attrs,want", [
    ("MultiHeadAttention", [("q", rand(2, 3, 16)), ("k", rand(2, 4, 16)), ("v", rand(2, 4, 8)), ("b", None),
                            ("m", None), ("ab", None), ("pk", rand(2, 2, 5, 8)), ("pv", rand(2, 2, 5, 4))],
     ["y", "pk_out", "pv_out"], {"num_heads": 2}, [(2, 3, 8), (2, 2, 9, 8), (2, 2, 9, 4)]),
    ("Attention", [("x", rand(2, 3, 12)), ("w", rand(12, 48)), ("b", rand(48)), ("m", None),
                   ("past", rand(2, 2, 2, 5, 8))], ["y", "present"], {"num_heads": 2},
     [(2, 3, 16), (2, 2, 2, 8, 8)]),
    ("Attention", [("x", rand(2, 3, 12)), ("w", rand(12, 40))], ["y"],
     {"num_heads": 2, "qkv_hidden_sizes": [16, 16, 8]}, [(2, 3, 8)]),
    ("GroupQueryAttention", [("q", rand(2, 3, 64)), ("k", None), ("v", None), ("pk", None), ("pv", None),
                             ("s", np.array([2, 2], np.int32)), ("t", np.array(3, np.int32))],
     ["y", "pk_out"], {"num_heads": 2, "kv_num_heads": 1}, [(2, 3, 32), (2, 1, None, 16)]),
    ("MatMulNBits", [("a", rand(2, 5, 64)), ("b", np.zeros((24, 2, 16), np.uint8)), ("s", rand(48))], ["y"],
     {"K": 64, "N": 24, "block_size": 32}, [(2, 5, 24)]),
])
def test_shape_inference_of_the_attention_and_quantized_schemas(op, inputs, outputs, attrs, want):
    g = import_model(one_node_model(op, inputs, outputs, attrs))
    for o, expected in zip(outputs, want):
        shape = g.values[o].shape
        if None in expected:  # known only when the model runs (total_sequence_length's value)
            assert shape is None or all(e is None or d == e for d, e in zip(shape, expected)), (o, shape)
        else:
            assert shape == expected, (o, shape)
