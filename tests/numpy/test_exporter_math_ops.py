"""numpy kernels of the exporters' math, activation, ordering and index operators (issue 14)
against onnx's reference evaluator, and their ONNX semantics against hand-computed values.

Every case runs on every registered implementation of its op that supports the node, so a new
variant is tested automatically; ``test_every_implementation_is_exercised`` fails when a
registered implementation of these ops supports none of the cases.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto

from impls.numpy.backend import MODULES
from impls.numpy.table import impls
from tests.support import make_node, reference_outputs, run_impl

for _mod in MODULES:
    importlib.import_module(f"impls.numpy.{_mod}")

RNG = np.random.default_rng(14)
NAN, INF = np.nan, np.inf


def f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def ints(*shape: int, dtype: Any = np.int32, lo: int = -9, hi: int = 10) -> np.ndarray:
    return RNG.integers(lo, hi, shape).astype(dtype)


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def cast(x: Any, dtype: Any) -> np.ndarray:
    """``x`` as ``dtype``, values beyond its range becoming +-inf (float16) silently."""
    with np.errstate(over="ignore"):
        return np.asarray(x).astype(dtype)


def scalar(v: Any, dtype: Any) -> np.ndarray:
    return np.array(v, dtype=dtype)


@dataclass
class Case:
    op: str
    name: str
    inputs: list[np.ndarray | None]
    attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 21
    n_outputs: int = 1
    const: tuple[int, ...] = ()


CASES: list[Case] = []


def case(op: str, name: str, inputs: list, attrs: dict | None = None, **kw: Any) -> None:
    CASES.append(Case(op, name, list(inputs), attrs or {}, **kw))


SPECIAL = np.array([0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1e-40, 3e38, -3e38, INF, -INF, NAN],
                   np.float32)
FLOATS = (np.float16, np.float32, np.float64)

# -- elementwise math ------------------------------------------------------------------------
for _dt in FLOATS:
    _n = np.dtype(_dt).name
    for _op in ("IsNaN", "IsInf", "Sin", "Cos", "Tan", "Atan", "Sinh", "Cosh", "Asinh", "Floor",
                "Ceil", "Round", "Sign"):
        case(_op, _n, [cast(np.concatenate([SPECIAL, f32(11, scale=3)]), _dt)])
    case("Asin", _n, [np.concatenate([f32(9).clip(-1, 1), [1.0, -1.0, 1.5, NAN]]).astype(_dt)])
    case("Acos", _n, [np.concatenate([f32(9).clip(-1, 1), [1.0, -1.0, -1.5, NAN]]).astype(_dt)])
    case("Acosh", _n, [np.concatenate([np.abs(f32(9)) + 1, [1.0, 0.5, INF, NAN]]).astype(_dt)])
    case("Atanh", _n, [np.concatenate([f32(9).clip(-0.99, 0.99), [1.0, -1.0, 2.0]]).astype(_dt)])
for _det in ((0, 1), (1, 0), (0, 0)):
    case("IsInf", f"detect_neg{_det[0]}_pos{_det[1]}", [SPECIAL],
         {"detect_negative": _det[0], "detect_positive": _det[1]})
case("IsInf", "opset10", [SPECIAL], opset=10)
case("IsNaN", "opset13", [SPECIAL], opset=13)
case("Round", "halves", [np.arange(-4.5, 5.0, 0.5).astype(np.float32)], opset=11)
case("Floor", "rank3", [f32(2, 3, 4, scale=5)], opset=13)
for _dt in (np.int8, np.int32, np.int64, np.uint8, np.uint64):
    _lo = 0 if np.dtype(_dt).kind == "u" else -5
    case("Sign", np.dtype(_dt).name, [ints(3, 5, dtype=_dt, lo=_lo, hi=5)], opset=13)

# Mod: fmod 0 (Python's %, the divisor's sign) and 1 (C fmod); ints and floats, broadcasting
_A = np.array([-7, -4, -1, 0, 1, 4, 7, 9], np.int64)
_B = np.array([3, -3, 2, -2, 5, -5, 3, -4], np.int64)
for _dt in (np.int8, np.int16, np.int32, np.int64):
    for _f in (0, 1):
        case("Mod", f"{np.dtype(_dt).name}_fmod{_f}", [_A.astype(_dt), _B.astype(_dt)], {"fmod": _f})
for _dt in (np.uint8, np.uint32, np.uint64):
    case("Mod", np.dtype(_dt).name, [np.array([7, 4, 1, 0, 9], _dt), np.array([3, 5, 2, 4, 9], _dt)])
for _dt in FLOATS:
    _x = np.array([-4.5, 4.5, -0.0, 0.0, 3.0, INF, -INF, NAN, 2.0, -2.0, 1.5], _dt)
    _y = np.array([2.0, -2.0, 3.0, -3.0, 0.0, 2.0, 2.0, 1.0, INF, INF, -INF], _dt)
    for _f in (0, 1):
        case("Mod", f"{np.dtype(_dt).name}_fmod{_f}", [_x, _y], {"fmod": _f})
case("Mod", "bcast", [f32(2, 3, 4, scale=10), np.array([1.5, -2.5, 3.0, 7.0], np.float32)],
     {"fmod": 1}, opset=13)
case("Mod", "opset10", [_A.astype(np.int32), _B.astype(np.int32)], opset=10)

# BitShift: unsigned and signed (onnx 1.23), amounts outside [0, bits)
for _dt in (np.uint8, np.uint16, np.uint32, np.uint64):
    for _d in ("LEFT", "RIGHT"):
        case("BitShift", f"{np.dtype(_dt).name}_{_d}",
             [np.array([16, 4, 1, 255, 7], _dt), np.array([1, 2, 3, 8, 70], _dt)], {"direction": _d})
for _dt in (np.int8, np.int32, np.int64):
    for _d in ("LEFT", "RIGHT"):
        case("BitShift", f"{np.dtype(_dt).name}_{_d}",
             [np.array([-16, 4, -1, 100, -7, 3], _dt), np.array([1, 2, 3, 7, -1, 64], _dt)],
             {"direction": _d})
case("BitShift", "bcast", [np.array([[1], [2]], np.uint32), np.array([0, 1, 2], np.uint32)],
     {"direction": "LEFT"})

for _dt in FLOATS:
    case("Mean", np.dtype(_dt).name, [f32(3, 4).astype(_dt), f32(4).astype(_dt), f32(1, 1).astype(_dt)])
case("Mean", "one", [f32(2, 3)])
case("Mean", "opset8_bcast", [f32(2, 3), f32(3)], opset=8)
case("Mean", "nonfinite", [np.array([INF, NAN, 1.0], np.float32), np.array([-INF, 1.0, 3e38], np.float32)])

# -- activations -----------------------------------------------------------------------------
_ACT = np.concatenate([SPECIAL, [100.0, -100.0, 20.0, -20.0]]).astype(np.float32)
for _dt in FLOATS:
    _n = np.dtype(_dt).name
    _x = cast(np.concatenate([_ACT, f32(9, scale=3)]), _dt)
    for _op in ("Softplus", "HardSigmoid", "Selu", "Celu", "Softsign", "ThresholdedRelu", "Mish",
                "Shrink"):
        case(_op, _n, [_x], opset=18 if _op == "Mish" else 21)
case("HardSigmoid", "attrs", [f32(3, 4, scale=4)], {"alpha": 0.5, "beta": 0.6}, opset=6)
case("Selu", "attrs", [f32(3, 4)], {"alpha": 2.0, "gamma": 3.0})
case("Celu", "alpha", [f32(3, 4, scale=3)], {"alpha": 2.0}, opset=12)
case("ThresholdedRelu", "alpha", [f32(3, 4)], {"alpha": 0.5}, opset=10)
case("Shrink", "attrs", [f32(3, 4)], {"lambd": 1.0, "bias": 0.5}, opset=9)
for _dt in (np.int32, np.int8, np.int64):
    case("Shrink", np.dtype(_dt).name, [ints(3, 5, dtype=_dt)], {"lambd": 1.5, "bias": 1.5}, opset=9)
case("Softplus", "opset1", [f32(5)], opset=7)
case("PRelu", "channel", [f32(2, 3, 4, 4), f32(3, 1, 1)], opset=16)
case("PRelu", "scalar", [f32(2, 5), np.array([0.25], np.float32)], opset=9)
case("PRelu", "last_axis", [f32(2, 3, 4), f32(4)], opset=7)
case("PRelu", "same", [_ACT, np.full(_ACT.shape, -0.5, np.float32)])
case("PRelu", "f16", [f32(3, 4).astype(np.float16), f32(4).astype(np.float16)])
case("PRelu", "int32", [ints(3, 4), ints(4)], opset=9)
case("PRelu", "int64", [ints(3, 4, dtype=np.int64), ints(1, 4, dtype=np.int64)], opset=16)

# -- ordering ---------------------------------------------------------------------------------
_TIES = np.array([[3.0, 1.0, 3.0, 2.0, 1.0], [0.0, -0.0, 5.0, 5.0, -1.0]], np.float32)
_NANS = np.array([[1.0, NAN, 3.0, NAN], [-INF, 2.0, INF, 0.0]], np.float32)
for _op in ("ArgMax", "ArgMin"):
    for _axis in (0, 1, -1):
        for _keep in (0, 1):
            for _last in (0, 1):
                case(_op, f"ties_a{_axis}_k{_keep}_l{_last}", [_TIES],
                     {"axis": _axis, "keepdims": _keep, "select_last_index": _last}, opset=13)
    case(_op, "nan", [_NANS], {"axis": 1})
    case(_op, "nan_last", [_NANS], {"axis": 1, "select_last_index": 1}, opset=12)
    case(_op, "default_axis", [f32(3, 4, 5)], opset=11)
    case(_op, "rank4_neg", [f32(2, 3, 4, 5)], {"axis": -2, "keepdims": 0})
    for _dt in (np.int8, np.int32, np.int64, np.uint8, np.uint64, np.float16, np.float64):
        case(_op, np.dtype(_dt).name, [ints(4, 6, dtype=_dt, lo=0, hi=4)], {"axis": 1})

_K = [(1, 0), (3, 1), (5, 1), (0, 1)]
for _largest in (0, 1):
    for _k, _axis in _K:
        case("TopK", f"ties_k{_k}_a{_axis}_l{_largest}", [_TIES, i64(_k)],
             {"axis": _axis, "largest": _largest}, n_outputs=2, const=(1,))
    case("TopK", f"nan_l{_largest}", [_NANS, i64(3)], {"largest": _largest}, n_outputs=2)
    case("TopK", f"rank3_l{_largest}", [f32(2, 7, 3), i64(4)], {"axis": 1, "largest": _largest},
         n_outputs=2)
    for _dt in (np.int8, np.int32, np.int64, np.uint64, np.float16, np.float64):
        case("TopK", f"{np.dtype(_dt).name}_l{_largest}", [ints(3, 8, dtype=_dt, lo=0, hi=5), i64(3)],
             {"largest": _largest}, n_outputs=2)
case("TopK", "unsorted", [f32(4, 6), i64(2)], {"sorted": 0}, n_outputs=2)
case("TopK", "k_scalar_shape", [f32(4, 6), i64(2).reshape(1)], {"axis": -2}, n_outputs=2)
case("TopK", "opset10", [f32(4, 6), i64(3)], n_outputs=2, opset=10)
case("TopK", "opset1_attr", [f32(4, 6)], {"k": 2, "axis": 0}, n_outputs=2, opset=7)

_HM = np.array([[[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]], [[NAN, 1.0, NAN], [-INF, -INF, -INF]]],
               np.float32)
for _axis in (0, 1, 2, -1):
    case("Hardmax", f"axis{_axis}", [_HM], {"axis": _axis}, opset=13)
case("Hardmax", "default", [f32(2, 3, 4)])
case("Hardmax", "f16", [f32(3, 5).astype(np.float16)])

# -- index operators --------------------------------------------------------------------------
for _ax_dt in (np.int32, np.int64):
    for _ex in (0, 1):
        for _rev in (0, 1):
            case("CumSum", f"{np.dtype(_ax_dt).name}_ex{_ex}_rev{_rev}",
                 [f32(3, 4, 5), scalar(1, _ax_dt)], {"exclusive": _ex, "reverse": _rev})
case("CumSum", "neg_axis", [f32(3, 4, 5), scalar(-1, np.int64)], {"reverse": 1}, opset=11)
case("CumSum", "axis0_const", [f32(3, 4), scalar(0, np.int64)], {"exclusive": 1}, const=(1,))
case("CumSum", "nonfinite", [np.array([1.0, INF, -INF, 2.0, NAN, 3.0], np.float32), scalar(0, np.int32)])
for _dt in (np.int32, np.int64, np.uint32, np.uint64, np.float64, np.float16):
    case("CumSum", np.dtype(_dt).name, [ints(4, 6, dtype=_dt, lo=0), scalar(1, np.int64)], opset=14)

for _upper in (0, 1):
    for _k in (None, 0, 1, -1, 3, -4, 100, -100):
        ins = [f32(2, 3, 4, 5)] + ([] if _k is None else [scalar(_k, np.int64)])
        case("Trilu", f"u{_upper}_k{_k}", ins, {"upper": _upper}, opset=14)
    case("Trilu", f"u{_upper}_rank2", [f32(6, 3), scalar(1, np.int64)], {"upper": _upper})
    case("Trilu", f"u{_upper}_bool", [np.ones((4, 4), bool)], {"upper": _upper})
    case("Trilu", f"u{_upper}_int8", [ints(2, 3, 3, dtype=np.int8)], {"upper": _upper})
    case("Trilu", f"u{_upper}_empty", [f32(2, 0, 3)], {"upper": _upper})

for _dt in (np.float32, np.float64, np.float16):
    _n = np.dtype(_dt).name
    case("Range", f"{_n}_pos", [scalar(1.0, _dt), scalar(5.0, _dt), scalar(0.5, _dt)])
    case("Range", f"{_n}_neg", [scalar(10.0, _dt), scalar(-3.0, _dt), scalar(-1.5, _dt)])
    case("Range", f"{_n}_fraction", [scalar(0.1, _dt), scalar(1.0, _dt), scalar(0.3, _dt)])
    case("Range", f"{_n}_empty", [scalar(5.0, _dt), scalar(1.0, _dt), scalar(1.0, _dt)])
for _dt in (np.int16, np.int32, np.int64):
    _n = np.dtype(_dt).name
    case("Range", f"{_n}_pos", [scalar(3, _dt), scalar(9, _dt), scalar(3, _dt)])
    case("Range", f"{_n}_neg", [scalar(10, _dt), scalar(4, _dt), scalar(-2, _dt)])
    case("Range", f"{_n}_uneven", [scalar(-7, _dt), scalar(8, _dt), scalar(4, _dt)])
    case("Range", f"{_n}_empty", [scalar(1, _dt), scalar(5, _dt), scalar(-1, _dt)])
case("Range", "const", [scalar(0, np.int64), scalar(6, np.int64), scalar(1, np.int64)],
     const=(0, 1, 2))

# onnx's reference takes a 0-d depth only (a one-element depth: test_onehot_...)
_IDX = np.array([[0, 2, -1], [5, -4, 1]], np.int64)
for _axis in (-1, 0, 1, 2, -3):
    case("OneHot", f"axis{_axis}", [_IDX, scalar(4, np.int64), np.array([0.0, 1.0], np.float32)],
         {"axis": _axis})
case("OneHot", "default_axis", [_IDX, scalar(3, np.int64), np.array([-2, 7], np.int32)], opset=11)
case("OneHot", "opset9", [np.abs(_IDX), scalar(3, np.int64), np.array([-2, 7], np.int32)], opset=9)
case("OneHot", "float_inputs", [_IDX.astype(np.float32), np.array(5.0, np.float32),
                                np.array([1.0, 0.0], np.float64)], opset=11)
case("OneHot", "int32_indices", [_IDX.astype(np.int32), np.array(4, np.int32),
                                 np.array([3, 4], np.uint16)], {"axis": 0})
case("OneHot", "uint8_indices", [np.array([0, 3, 9], np.uint8), np.array(4, np.int64),
                                 np.array([3, 5], np.int64)])
case("OneHot", "scalar_indices", [np.array(2, np.int64), scalar(4, np.int64),
                                  np.array([0.0, 1.0], np.float32)])


# -- the generic comparison ------------------------------------------------------------------


def _build(c: Case) -> tuple[Any, Any]:
    return make_node(c.op, c.inputs, c.attrs, n_outputs=c.n_outputs, opset=c.opset,
                     const_inputs=c.const)


def _reference(proto: Any, inputs: list, opset: int) -> list[np.ndarray]:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return reference_outputs(proto, inputs, opset)


def _tolerance(dtype: np.dtype) -> dict[str, float]:
    if dtype == np.float16:
        return {"rtol": 2e-3, "atol": 2e-3}
    if dtype == np.float32:
        return {"rtol": 1e-5, "atol": 1e-6}
    return {"rtol": 1e-12, "atol": 1e-14}


def assert_same(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    """Same type, dtype, shape, values (floats within tolerance; NaN and +-inf exactly)."""
    want = np.asarray(want)
    assert isinstance(got, np.ndarray), f"{what}: kernel returned {type(got).__name__}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    assert got.flags.c_contiguous, f"{what}: not row-major contiguous"
    if got.dtype.kind == "f":
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=what)
        np.testing.assert_allclose(got, want, equal_nan=True, err_msg=what,
                                   **_tolerance(got.dtype))
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def _params() -> list[Any]:
    out = []
    for c in CASES:
        node, _ = _build(c)
        for impl in impls:
            if impl.op == c.op and impl.supports(node) is None:
                out.append(pytest.param(impl, c, id=f"{impl.name}-{c.name}-opset{c.opset}"))
    return out


PARAMS = _params()
OPS_UNDER_TEST = sorted({c.op for c in CASES})


@pytest.mark.parametrize(("impl", "c"), PARAMS)
def test_matches_reference(impl: Any, c: Case) -> None:
    node, proto = _build(c)
    want = _reference(proto, c.inputs, c.opset)
    got = run_impl(impl, node, c.inputs)
    assert len(got) == len(want), f"{len(got)} outputs, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same(g, w, f"{impl.name} output {k}")


@pytest.mark.parametrize("op", OPS_UNDER_TEST)
def test_every_case_is_supported(op: str) -> None:
    """Each case is run by at least one implementation (none is silently filtered out)."""
    candidates = [i for i in impls if i.op == op]
    assert candidates, f"no implementation registered for {op}"
    for c in (c for c in CASES if c.op == op):
        node, _ = _build(c)
        reasons = [i.supports(node) for i in candidates]
        assert any(r is None for r in reasons), f"{op} case {c.name}: {reasons}"


def test_every_implementation_is_exercised() -> None:
    tested = {p.values[0].name for p in PARAMS}
    mine = {i.name for i in impls if i.op in OPS_UNDER_TEST}
    assert mine - tested == set()


# -- semantics against hand-computed values ---------------------------------------------------


def run(op: str, inputs: list, attrs: dict | None = None, **kw: Any) -> list[np.ndarray]:
    """Run the implementation of ``op`` that supports the node (exactly one must)."""
    node, _ = make_node(op, inputs, attrs, **kw)
    found = [i for i in impls if i.op == op and i.supports(node) is None]
    assert len(found) == 1, [i.name for i in impls if i.op == op]
    return run_impl(found[0], node, inputs)


def refusal(op: str, inputs: list, attrs: dict | None = None, **kw: Any) -> str:
    node, _ = make_node(op, inputs, attrs, **kw)
    reasons = [i.supports(node) for i in impls if i.op == op]
    assert reasons and all(reasons), reasons
    return " ".join(reasons)


def test_mod_signs_follow_the_divisor_or_the_dividend():
    a, b = np.array([-7, 7, -7, 7], np.int32), np.array([3, -3, -3, 3], np.int32)
    np.testing.assert_array_equal(run("Mod", [a, b])[0], [2, -2, -1, 1])
    np.testing.assert_array_equal(run("Mod", [a, b], {"fmod": 1})[0], [-1, 1, -1, 1])
    x = np.array([-7.5, 7.5, 5.0, 1.0, -1.0, INF], np.float32)
    y = np.array([2.0, -2.0, 0.0, -INF, -INF, 2.0], np.float32)
    np.testing.assert_array_equal(run("Mod", [x, y])[0], [0.5, -0.5, NAN, -INF, -1.0, NAN])
    np.testing.assert_array_equal(run("Mod", [x, y], {"fmod": 1})[0], [-1.5, 1.5, NAN, 1.0, -1.0, NAN])
    assert np.signbit(run("Mod", [np.float32([0.0]), np.float32([-3.0])])[0][0])
    assert "fmod" in refusal("Mod", [x, y], {"fmod": 2})


def test_integer_mod_by_zero_is_silent():
    y = run("Mod", [np.array([5, -5], np.int64), np.array([0, 0], np.int64)])[0]
    assert y.dtype == np.int64 and y.shape == (2,)


def test_round_is_half_to_even_and_sign_keeps_nan():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997], np.float32)
    np.testing.assert_array_equal(run("Round", [x])[0], [0, 2, 2, -0.0, -2, -2, 0])
    s = run("Sign", [np.array([-3.0, -0.0, 0.0, 2.0, NAN, -INF], np.float32)])[0]
    np.testing.assert_array_equal(s, [-1, 0, 0, 1, NAN, -1])
    assert s.dtype == np.float32
    u = run("Sign", [np.array([0, 7], np.uint8)])[0]
    assert u.dtype == np.uint8 and u.tolist() == [0, 1]


def test_isinf_detect_flags():
    x = np.array([INF, -INF, NAN, 1.0], np.float32)
    assert run("IsInf", [x])[0].tolist() == [True, True, False, False]
    assert run("IsInf", [x], {"detect_negative": 0})[0].tolist() == [True, False, False, False]
    assert run("IsInf", [x], {"detect_positive": 0})[0].tolist() == [False, True, False, False]
    assert run("IsNaN", [x])[0].tolist() == [False, False, True, False]


def test_softplus_does_not_overflow_and_hardsigmoid_defaults():
    y = run("Softplus", [np.array([100.0, -100.0, 0.0, 1e30], np.float32)])[0]
    np.testing.assert_allclose(y, [100.0, np.exp(-100.0), np.log(2.0), 1e30], rtol=1e-6,
                               atol=1e-44)  # exp(-100) is a float32 denormal
    assert y[1] > 0
    h = run("Softplus", [np.array([20.0, -20.0], np.float16)])[0]
    assert h.dtype == np.float16 and np.isfinite(h).all() and h[0] == 20
    hs = run("HardSigmoid", [np.array([-3.0, -2.5, 0.0, 1.0, 2.5, 9.0, NAN], np.float32)])[0]
    np.testing.assert_allclose(hs, [0.0, 0.0, 0.5, 0.7, 1.0, 1.0, NAN], rtol=1e-6)


def test_prelu_slope_broadcasts_to_x_only():
    x = np.array([[-2.0, 3.0], [-4.0, -0.0]], np.float32)
    y = run("PRelu", [x, np.array([[0.5], [0.25]], np.float32)])[0]
    np.testing.assert_array_equal(y, [[-1.0, 3.0], [-1.0, 0.0]])
    assert "broadcast" in refusal("PRelu", [np.zeros(3, np.float32), np.zeros((2, 3), np.float32)])


def test_activations_at_the_extremes():
    x = np.array([-INF, INF, NAN], np.float32)
    np.testing.assert_allclose(run("Selu", [x])[0], [-1.6732632 * 1.050701, INF, NAN], rtol=1e-6)
    np.testing.assert_array_equal(run("Celu", [x])[0], [-1.0, INF, NAN])
    np.testing.assert_array_equal(run("Softsign", [np.float32([3.0, -1.0])])[0], [0.75, -0.5])
    np.testing.assert_array_equal(run("ThresholdedRelu", [x])[0], [0.0, INF, 0.0])
    np.testing.assert_array_equal(run("Shrink", [np.float32([-2.0, 0.2, 2.0, NAN])], {"bias": 1.0})[0],
                                  [-1.0, 0.0, 1.0, 0.0])
    np.testing.assert_allclose(run("Mish", [np.float32([100.0, 0.0, 1.0])], opset=18)[0],
                               [100.0, 0.0, 1.0 * np.tanh(np.log1p(np.e))], rtol=1e-6)


def test_hardmax_before_opset_13_coerces_to_2d_as_onnxruntime():
    """onnx's reference evaluator ignores the 2-D coercion of Hardmax-1/11 (it takes the
    maximum along the axis alone); onnxruntime implements the specification."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import helper

    x = np.array([[[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]], [[5.0, 1.0, 4.0], [-INF, -INF, -INF]]],
                 np.float32)
    for axis in (0, 1, 2, -1, -3):
        _, proto = make_node("Hardmax", [x], {"axis": axis}, opset=11)
        graph = helper.make_graph(
            [proto], "g", [helper.make_tensor_value_info("in0", TensorProto.FLOAT, x.shape)],
            [helper.make_tensor_value_info("out0", TensorProto.FLOAT, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=8)
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        want = sess.run(None, {"in0": x})[0]
        got = run("Hardmax", [x], {"axis": axis}, opset=11)[0]
        np.testing.assert_array_equal(got, want, err_msg=f"axis {axis}")
    flat = run("Hardmax", [x], opset=11)[0].reshape(2, 6)  # default axis 1: rows of 6
    np.testing.assert_array_equal(flat.argmax(axis=1), [1, 0])


def test_trilu_batches_and_k():
    x = np.arange(1, 13, dtype=np.float32).reshape(1, 3, 4)
    up = run("Trilu", [x, scalar(1, np.int64)])[0]
    np.testing.assert_array_equal(up[0], [[0, 2, 3, 4], [0, 0, 7, 8], [0, 0, 0, 12]])
    low = run("Trilu", [x], {"upper": 0})[0]
    np.testing.assert_array_equal(low[0], [[1, 0, 0, 0], [5, 6, 0, 0], [9, 10, 11, 0]])
    assert "rank 2" in refusal("Trilu", [np.zeros(3, np.float32)])


def test_cumsum_exclusive_and_reverse():
    x = np.array([1.0, 2.0, 3.0], np.float32)
    want = {(0, 0): [1, 3, 6], (1, 0): [0, 1, 3], (0, 1): [6, 5, 3], (1, 1): [5, 3, 0]}
    for (ex, rev), w in want.items():
        for axis in (scalar(0, np.int32), scalar(-1, np.int64), np.array([0], np.int64)):
            y = run("CumSum", [x, axis], {"exclusive": ex, "reverse": rev})[0]
            np.testing.assert_array_equal(y, w)


def test_onehot_negative_and_out_of_range_indices():
    idx = np.array([1, -1, 3, -4, 7], np.int64)
    y = run("OneHot", [idx, np.float32(3.7), np.array([0, 5], np.int32)])[0]
    assert y.dtype == np.int32 and y.shape == (5, 3)
    np.testing.assert_array_equal(y, [[0, 5, 0], [0, 0, 5], [0, 0, 0], [0, 0, 0], [0, 0, 0]])
    y0 = run("OneHot", [idx, i64(3), np.float32([0, 1])], {"axis": 0})[0]
    np.testing.assert_array_equal(y0, y.T / 5)
    assert "axis" in refusal("OneHot", [idx, i64(3), np.float32([0, 1])], {"axis": 2})
    # OneHot-9 takes non-negative indices: outside [0, depth) every one gives an all-off row
    y9 = run("OneHot", [idx, i64(3), np.float32([0, 1])], opset=9)[0]
    np.testing.assert_array_equal(y9, [[0, 1, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]])


def test_argmax_argmin_nan_ties_and_last_index():
    x = np.array([[1.0, 5.0, 5.0, NAN, 0.0], [2.0, 2.0, -1.0, -1.0, 0.0]], np.float32)
    assert run("ArgMax", [x], {"axis": 1})[0].tolist() == [[3], [0]]
    assert run("ArgMin", [x], {"axis": 1, "keepdims": 0})[0].tolist() == [3, 2]
    last = run("ArgMax", [x[1:]], {"axis": 1, "select_last_index": 1, "keepdims": 0})[0]
    assert last.tolist() == [1] and last.dtype == np.int64
    assert "size 0" in refusal("ArgMax", [np.zeros((2, 0), np.float32)], {"axis": 1})


def test_topk_ties_take_the_lower_index_first():
    x = np.array([[3.0, 1.0, 3.0, NAN, 1.0]], np.float32)
    v, i = run("TopK", [x, i64(4)], n_outputs=2)
    assert i.tolist() == [[3, 0, 2, 1]] and i.dtype == np.int64
    np.testing.assert_array_equal(v, [[NAN, 3.0, 3.0, 1.0]])
    v, i = run("TopK", [x, i64(3)], {"largest": 0}, n_outputs=2)
    assert i.tolist() == [[1, 4, 0]]
    u = np.array([2**63 + 5, 1, 2**63 + 5, 0], np.uint64)
    v, i = run("TopK", [u, i64(2)], n_outputs=2)
    assert i.tolist() == [0, 2] and v.dtype == np.uint64 and v.tolist() == [2**63 + 5] * 2
    v, i = run("TopK", [x, i64(0)], n_outputs=2)
    assert v.shape == (1, 0) and i.shape == (1, 0)
    node, _ = make_node("TopK", [x, i64(6)], n_outputs=2)
    impl = next(i for i in impls if i.op == "TopK")
    with pytest.raises(ValueError, match="outside"):
        run_impl(impl, node, [x, i64(6)])
    assert "one element" in refusal("TopK", [x, i64(1, 2)], n_outputs=2)


def test_hardmax_marks_the_first_maximum():
    x = np.array([[1.0, 3.0, 3.0], [NAN, 0.0, NAN]], np.float32)
    np.testing.assert_array_equal(run("Hardmax", [x])[0], [[0, 1, 0], [1, 0, 0]])


def test_range_lengths_and_values():
    (y,) = run("Range", [scalar(10, np.int32), scalar(4, np.int32), scalar(-2, np.int32)])
    assert y.tolist() == [10, 8, 6] and y.dtype == np.int32
    (y,) = run("Range", [scalar(1.0, np.float32), scalar(2.0, np.float32), scalar(0.25, np.float32)])
    assert y.tolist() == [1.0, 1.25, 1.5, 1.75] and y.dtype == np.float32
    (y,) = run("Range", [scalar(0, np.int64), scalar(-3, np.int64), scalar(1, np.int64)])
    assert y.shape == (0,) and y.dtype == np.int64
    big = scalar(2**62, np.int64)
    (y,) = run("Range", [big, scalar(2**62 + 3, np.int64), scalar(1, np.int64)])
    assert y.tolist() == [2**62, 2**62 + 1, 2**62 + 2]
    node, _ = make_node("Range", [big, big, scalar(0, np.int64)])
    impl = next(i for i in impls if i.op == "Range")
    with pytest.raises(ValueError, match="delta"):
        run_impl(impl, node, [big, big, scalar(0, np.int64)])
    assert "stash_type" in refusal("Range", [scalar(1.0, np.float16)] * 3,
                                   {"stash_type": TensorProto.INT32})


def test_bitshift_out_of_range_amounts_give_the_sign_fill():
    x = np.array([-8, 8, -8, 8], np.int8)
    y = np.array([8, 8, -1, 3], np.int8)
    assert run("BitShift", [x, y], {"direction": "RIGHT"})[0].tolist() == [-1, 0, -1, 1]
    assert run("BitShift", [x, y], {"direction": "LEFT"})[0].tolist() == [0, 0, 0, 64]
    assert "direction" in refusal("BitShift", [x, y], {"direction": "UP"})
