"""numpy LpNormalization, MeanVarianceNormalization and EyeLike (issue 14's extra operators)
against onnx's reference evaluator, plus the values the evaluator does not give right: its L1
normalisation sums the signed values (``x ** 1``), not their absolute values."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto

from impls.numpy.backend import MODULES
from impls.numpy.table import impls
from tests.numpy.test_exporter_index_ops import assert_same
from tests.support import make_node, reference_outputs, run_impl

for _mod in MODULES:
    importlib.import_module(f"impls.numpy.{_mod}")

RNG = np.random.default_rng(22)
OPS = ("LpNormalization", "MeanVarianceNormalization", "EyeLike")


def f32(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


#: (op, name, inputs, attrs, opset)
CASES: list[tuple[str, str, list[np.ndarray], dict, int]] = [
    ("LpNormalization", "l2_last", [f32(3, 4)], {}, 22),
    ("LpNormalization", "l2_axis0", [f32(3, 4, 2)], {"axis": 0}, 22),
    ("LpNormalization", "l2_axis1_4d", [f32(2, 3, 4, 5)], {"axis": 1, "p": 2}, 1),
    ("LpNormalization", "l1_positive", [np.abs(f32(3, 5)) + 0.1], {"p": 1}, 22),
    ("LpNormalization", "zero_rows", [np.array([[0.0, 0.0], [3.0, 4.0]], np.float32)], {}, 22),
    ("LpNormalization", "float64", [f32(3, 4, dtype=np.float64)], {"axis": -2}, 22),
    ("LpNormalization", "float16", [f32(3, 4, dtype=np.float16)], {}, 22),
    ("MeanVarianceNormalization", "default_axes", [f32(2, 3, 4, 5) * 2 + 1], {}, 13),
    ("MeanVarianceNormalization", "axes_2_3", [f32(2, 3, 4, 5)], {"axes": [2, 3]}, 13),
    ("MeanVarianceNormalization", "axes_1", [f32(2, 3, 4)], {"axes": [1]}, 9),
    ("MeanVarianceNormalization", "axes_neg", [f32(2, 3, 4)], {"axes": [-1]}, 13),
    ("EyeLike", "square", [f32(4, 4)], {}, 22),
    ("EyeLike", "wide_k1", [f32(3, 5)], {"k": 1}, 22),
    ("EyeLike", "tall_k_neg2", [f32(5, 3)], {"k": -2}, 9),
    ("EyeLike", "k_out_of_range", [f32(3, 3)], {"k": 5}, 22),
    ("EyeLike", "dtype_int64", [f32(3, 4)], {"dtype": TensorProto.INT64}, 22),
    ("EyeLike", "int32_in", [np.zeros((2, 3), np.int32)], {"k": -1}, 22),
    ("EyeLike", "bool_out", [f32(3, 3)], {"dtype": TensorProto.BOOL}, 22),
]

PARAMS = [
    pytest.param(i, c, id=f"{i.name}-{c[1]}-opset{c[4]}")
    for c in CASES
    for i in impls
    if i.op == c[0] and i.supports(make_node(c[0], c[2], c[3], opset=c[4])[0]) is None
]


@pytest.mark.parametrize(("impl", "c"), PARAMS)
def test_matches_reference(impl: Any, c: tuple) -> None:
    op, name, inputs, attrs, opset = c
    node, proto = make_node(op, inputs, attrs, opset=opset)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = reference_outputs(proto, inputs, opset)
    (got,) = run_impl(impl, node, inputs)
    assert_same(got, want[0], f"{impl.name} {name}")


def test_every_case_runs_and_every_implementation_is_exercised() -> None:
    assert {c[0] for c in CASES} == set(OPS)
    ran = {p.values[0].name for p in PARAMS}
    assert {i.name for i in impls if i.op in OPS} <= ran
    assert len(PARAMS) >= len(CASES)


def _run(op: str, inputs: list, attrs: dict | None = None, **kw: Any) -> np.ndarray:
    node, _ = make_node(op, inputs, attrs, **kw)
    (impl,) = [i for i in impls if i.op == op]
    assert impl.supports(node) is None, impl.supports(node)
    return run_impl(impl, node, inputs)[0]


def test_l1_normalization_divides_by_the_sum_of_absolute_values() -> None:
    x = np.array([[1.0, -3.0], [0.0, 0.0]], np.float32)
    y = _run("LpNormalization", [x], {"p": 1})
    np.testing.assert_array_equal(y, [[0.25, -0.75], [0.0, 0.0]])


def test_mvn_of_a_constant_channel_is_zero() -> None:
    """The two-pass variance of a constant is exactly 0 (E[x^2] - E[x]^2 may round below 0
    and give NaN)."""
    x = np.full((1, 2, 3, 3), 0.1, np.float32)
    np.testing.assert_array_equal(_run("MeanVarianceNormalization", [x]), np.zeros_like(x))


def test_mvn_float64_by_the_formula() -> None:
    """float64 (the evaluator's function body adds a float32 epsilon to it and fails)."""
    x = f32(2, 3, 4, 2, dtype=np.float64)
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    std = np.sqrt(((x - mean) ** 2).mean(axis=(0, 2, 3), keepdims=True))
    y = _run("MeanVarianceNormalization", [x])
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, (x - mean) / (std + 1e-9), rtol=1e-12)


def test_refusals() -> None:
    node, _ = make_node("LpNormalization", [f32(3, 4)], {"p": 3})
    (lp,) = [i for i in impls if i.op == "LpNormalization"]
    assert "p must be 1 or 2" in lp.supports(node)
    node, _ = make_node("EyeLike", [f32(2, 3, 4)])
    (eye,) = [i for i in impls if i.op == "EyeLike"]
    assert "rank-2" in eye.supports(node)
    node, _ = make_node("MeanVarianceNormalization", [f32(2, 3)], {"axes": [0, 2]})
    (mvn,) = [i for i in impls if i.op == "MeanVarianceNormalization"]
    assert "out of range" in mvn.supports(node)


def test_region_backends_refuse_what_they_compute_differently() -> None:
    """onnxruntime's MVN has no epsilon, OpenVINO's LpNormalization adds one, onnxruntime has
    no bool EyeLike (measured; impls/region_quirks.py, impls/openvino/region.py)."""
    from impls.openvino.region import UNSUPPORTED_OPS
    from impls.region_quirks import onnxruntime_reason

    node, _ = make_node("MeanVarianceNormalization", [f32(1, 2, 3, 3)], opset=13)
    assert "epsilon" in onnxruntime_reason(node)
    assert "epsilon" in UNSUPPORTED_OPS["LpNormalization"]
    node, _ = make_node("EyeLike", [f32(3, 3)], {"dtype": TensorProto.BOOL},
                        output_dtypes=[np.dtype(bool)])
    assert "bool" in onnxruntime_reason(node)
    node, _ = make_node("EyeLike", [f32(3, 3)], output_dtypes=[np.dtype(np.float32)])
    assert onnxruntime_reason(node) is None
