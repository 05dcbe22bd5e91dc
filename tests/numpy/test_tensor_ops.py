"""numpy elementwise / reduce / shape / misc kernels against onnx's reference evaluator.

Every case runs on every registered implementation of its op that supports the node, so a new
variant is tested automatically; ``test_every_implementation_is_exercised`` fails when a
registered implementation supports none of the cases.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from dataclasses import dataclass, field
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from dispatch.graph import Node, Value
from impls.numpy.backend import MODULES
from impls.numpy.table import impls
from tests.support import make_node, reference_outputs, run_impl

# Importing a module registers its kernels; the backend's other modules may register more
# variants of these ops, which are then tested too.
for _mod in MODULES:
    if importlib.util.find_spec(f"impls.numpy.{_mod}") is not None:
        importlib.import_module(f"impls.numpy.{_mod}")

RNG = np.random.default_rng(1234)
I64_MAX = np.iinfo(np.int64).max
I64_MIN = np.iinfo(np.int64).min


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def pos(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return RNG.uniform(0.5, 2.0, shape).astype(dtype)


def ints(*shape: int, dtype: Any = np.int32, lo: int = -9, hi: int = 10) -> np.ndarray:
    return RNG.integers(lo, hi, shape).astype(dtype)


def bools(*shape: int) -> np.ndarray:
    return RNG.integers(0, 2, shape).astype(bool)


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


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


# -- binary arithmetic -----------------------------------------------------------------------
for _op in ("Add", "Sub", "Mul", "Div"):
    case(_op, "f32", [f32(3, 4), pos(3, 4)])
    case(_op, "bcast", [f32(3, 1, 4), pos(1, 5, 1)])
    case(_op, "scalar", [f32(2, 3), pos()])
    case(_op, "rank_bcast", [f32(4), pos(2, 3, 4)], opset=7)
    case(_op, "f16", [f32(3, 4).astype(np.float16), pos(3, 4, dtype=np.float16)])
    case(_op, "f64", [f32(3, 4).astype(np.float64), pos(4, dtype=np.float64)])
    case(_op, "zero_size", [f32(0, 3), pos(1, 3)])
    for _dt in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64):
        _lo = 0 if np.dtype(_dt).kind == "u" else -20
        case(
            _op,
            np.dtype(_dt).name,
            [ints(3, 4, dtype=_dt, lo=_lo, hi=20), ints(4, dtype=_dt, lo=1, hi=7)],
            opset=14,
        )
case("Div", "int_trunc_negative", [i64(7, -7, 7, -7, 0, -1), i64(2, 2, -2, -2, 3, 5)])
case(
    "Div",
    "int32_trunc",
    [ints(4, 5, lo=-50, hi=50), ints(5, lo=1, hi=9) * np.array([1, -1, 1, -1, 1], np.int32)],
)

# -- Pow -------------------------------------------------------------------------------------
case("Pow", "f32", [pos(3, 4), f32(3, 4)])
case("Pow", "bcast", [pos(2, 3, 4), f32(4)])
case("Pow", "f32_int64", [f32(3, 4), i64(0, 1, 2, 3)], opset=12)
case("Pow", "f32_int32", [f32(3), np.array([2, 3, 0], np.int32)], opset=15)
case("Pow", "int64_int64", [ints(3, dtype=np.int64), i64(0, 2, 3)], opset=15)
case("Pow", "int32_int32", [ints(2, 3), np.array([1, 2, 3], np.int32)])
case("Pow", "int32_f32", [np.array([1, 2, 3], np.int32), np.array([2.0, 1.5, 0.5], np.float32)])
case("Pow", "int64_f32", [i64(1, 2, 3), np.array([3.0, 2.0, 0.5], np.float32)])
case("Pow", "f16", [pos(3, 4, dtype=np.float16), pos(4, dtype=np.float16)])
for _e in (2.0, 3.0, 0.5, 1.0, -1.0):
    case("Pow", f"const_{_e}", [pos(2, 3), np.array(_e, np.float32)], const=(1,))
case("Pow", "const_2_rank_up", [f32(2, 3), np.full((1, 1, 1), 2.0, np.float32)], const=(1,))
case("Pow", "const_2_int_exponent", [f32(5), i64(2)], const=(1,))

# -- unary -----------------------------------------------------------------------------------
for _dt in (np.float32, np.float16, np.float64):
    case("Sqrt", _dt.__name__, [pos(3, 4, dtype=_dt)])
    case("Exp", _dt.__name__, [f32(3, 4).astype(_dt)])
    case("Log", _dt.__name__, [pos(3, 4, dtype=_dt)])
    case("Tanh", _dt.__name__, [f32(3, 4).astype(_dt)])
    case("Erf", _dt.__name__, [f32(3, 4).astype(_dt)])
    case("Sigmoid", _dt.__name__, [(f32(3, 4) * 4).astype(_dt)])
    case("Neg", _dt.__name__, [f32(3, 4).astype(_dt)])
    case("Abs", _dt.__name__, [f32(3, 4).astype(_dt)])
    case("Reciprocal", _dt.__name__, [pos(3, 4, dtype=_dt)])
    case("Relu", _dt.__name__, [f32(3, 4).astype(_dt)])
case("Sigmoid", "extreme", [np.array([-1000, -90, -20, 0, 20, 90, 1000], np.float32)])
case("Sigmoid", "zero_size", [f32(0, 4)])
case("Exp", "scalar", [f32()])
case("Erf", "int32", [ints(5)])
for _dt in (np.int8, np.int32, np.int64):
    case("Neg", np.dtype(_dt).name, [ints(3, 4, dtype=_dt)])
    case("Relu", np.dtype(_dt).name, [ints(3, 4, dtype=_dt)], opset=14)
for _dt in (np.int8, np.int64, np.uint8, np.uint32):
    _lo = 0 if np.dtype(_dt).kind == "u" else -9
    case("Abs", np.dtype(_dt).name, [ints(3, 4, dtype=_dt, lo=_lo)])
case("Relu", "opset7", [f32(2, 5)], opset=7)
for _approx in ("none", "tanh"):
    case("Gelu", _approx, [f32(3, 4) * 3], {"approximate": _approx}, opset=20)
    case(
        "Gelu",
        f"{_approx}_f16",
        [(f32(3, 4) * 3).astype(np.float16)],
        {"approximate": _approx},
        opset=20,
    )
    case(
        "Gelu",
        f"{_approx}_f64",
        [(f32(3, 4) * 3).astype(np.float64)],
        {"approximate": _approx},
        opset=20,
    )
case("Gelu", "default", [f32(2, 7)], opset=20)

# -- Clip ------------------------------------------------------------------------------------
case("Clip", "attr_both", [f32(3, 4)], {"min": -0.5, "max": 0.5}, opset=7)
case("Clip", "attr_min", [f32(3, 4)], {"min": -0.2}, opset=10)
case("Clip", "attr_max", [f32(3, 4)], {"max": 0.1}, opset=10)
case("Clip", "attr_none", [f32(3, 4)], opset=10)
case("Clip", "attr_f16", [f32(3, 4).astype(np.float16)], {"min": -0.5, "max": 0.5}, opset=9)
case("Clip", "inputs", [f32(3, 4), np.float32(-0.5), np.float32(0.5)], opset=11)
case("Clip", "inputs_min_only", [f32(3, 4), np.float32(-0.5)], opset=12)
case("Clip", "inputs_max_only", [f32(3, 4), None, np.float32(0.3)], opset=13)
case("Clip", "no_bounds", [f32(3, 4)], opset=13)
case("Clip", "min_gt_max", [f32(3, 4), np.float32(1.0), np.float32(-1.0)], opset=13)
case("Clip", "int32", [ints(3, 4), np.int32(-3), np.int32(4)], opset=12)
case("Clip", "int8_min", [ints(3, 4, dtype=np.int8), np.int8(0)], opset=13)
case("Clip", "uint8", [ints(3, 4, dtype=np.uint8, lo=0, hi=200), None, np.uint8(100)], opset=13)
case(
    "Clip",
    "f64_const",
    [f32(5).astype(np.float64), np.float64(-0.1), np.float64(0.1)],
    const=(1, 2),
)

# -- variadic --------------------------------------------------------------------------------
for _op in ("Sum", "Min", "Max"):
    case(_op, "one", [f32(3, 4)])
    case(_op, "two", [f32(3, 4), f32(3, 4)])
    case(_op, "three_bcast", [f32(3, 1), f32(1, 4), f32(4)])
    case(_op, "f16", [f32(2, 3).astype(np.float16), f32(3).astype(np.float16)])
    case(_op, "f64_opset7", [f32(2, 3).astype(np.float64), f32(2, 3).astype(np.float64)], opset=7)
    case(_op, "int32", [ints(2, 3), ints(3)], opset=13)
    case(_op, "zero_size", [f32(0, 3), f32(1, 3)])
for _dt in (np.int8, np.uint8, np.int64, np.uint64):
    case("Max", np.dtype(_dt).name, [ints(4, dtype=_dt, lo=0), ints(4, dtype=_dt, lo=0)], opset=12)
    case("Min", np.dtype(_dt).name, [ints(4, dtype=_dt, lo=0), ints(4, dtype=_dt, lo=0)], opset=12)

# -- comparisons, logic, Where ---------------------------------------------------------------
for _op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
    _opset = 12 if "Or" in _op else 13
    case(_op, "f32", [f32(3, 4), f32(3, 4)], opset=_opset)
    case(_op, "bcast", [ints(3, 1, 4), ints(5, 1)], opset=_opset)
    case(_op, "f16", [f32(3).astype(np.float16), f32(3).astype(np.float16)], opset=_opset)
    case(
        _op,
        "int64",
        [ints(3, 4, dtype=np.int64, lo=-2, hi=2), ints(4, dtype=np.int64, lo=-2, hi=2)],
        opset=_opset,
    )
    case(
        _op,
        "uint16",
        [ints(6, dtype=np.uint16, lo=0, hi=3), ints(6, dtype=np.uint16, lo=0, hi=3)],
        opset=_opset,
    )
    case(_op, "zero_size", [f32(0, 2), f32(2)], opset=_opset)
case("Equal", "bool", [bools(3, 4), bools(4)], opset=11)
case("Equal", "int32_opset7", [ints(3, 4, lo=0, hi=3), ints(4, lo=0, hi=3)], opset=7)
case(
    "Equal",
    "string",
    [np.array(["a", "b", "c"], dtype=object), np.array(["a", "x", "c"], dtype=object)],
    opset=19,
)
case("Less", "f32_opset7", [f32(3, 4), f32(4)], opset=7)
case("Greater", "f32_opset7", [f32(3, 4), f32(4)], opset=7)
for _op in ("And", "Or", "Xor"):
    case(_op, "same", [bools(3, 4), bools(3, 4)])
    case(_op, "bcast", [bools(2, 3, 4), bools(4)], opset=7)
    case(_op, "zero_size", [bools(0, 4), bools(1, 4)])
case("Not", "2d", [bools(3, 4)])
case("Not", "scalar", [np.array(True)])
case("Where", "f32", [bools(3, 4), f32(3, 4), f32(3, 4)], opset=9)
case("Where", "bcast", [bools(3, 1), f32(1, 4), f32(4)], opset=16)
case("Where", "int64", [bools(5), ints(5, dtype=np.int64), ints(1, dtype=np.int64)])
case(
    "Where", "uint8", [bools(2, 2), ints(2, 2, dtype=np.uint8, lo=0), ints(2, dtype=np.uint8, lo=0)]
)
case("Where", "bool_values", [bools(4), bools(4), bools(4)])
case("Where", "zero_size", [bools(0, 3), f32(1, 3), f32(3)])

# -- Cast ------------------------------------------------------------------------------------
_FRACTIONS = np.array([-2.75, -1.5, -0.5, 0.0, 0.25, 1.5, 2.999, 100.7], np.float32)
_CASTS = [
    (_FRACTIONS, TensorProto.INT32),
    (_FRACTIONS, TensorProto.INT64),
    (_FRACTIONS, TensorProto.INT8),
    (np.abs(_FRACTIONS), TensorProto.UINT8),
    (_FRACTIONS, TensorProto.FLOAT16),
    (_FRACTIONS, TensorProto.DOUBLE),
    (_FRACTIONS, TensorProto.BOOL),
    (_FRACTIONS, TensorProto.FLOAT),
    (f32(3, 4).astype(np.float64), TensorProto.FLOAT),
    (f32(3, 4).astype(np.float16), TensorProto.FLOAT),
    (ints(3, 4, dtype=np.int64), TensorProto.FLOAT),
    (ints(3, 4, dtype=np.int64, lo=-300, hi=300), TensorProto.INT8),
    (ints(3, 4, dtype=np.uint8, lo=0, hi=255), TensorProto.INT64),
    (ints(3, 4, dtype=np.int32), TensorProto.UINT16),
    (bools(3, 4), TensorProto.FLOAT),
    (bools(3, 4), TensorProto.INT32),
    (f32(0, 3), TensorProto.INT64),
]
for _x, _to in _CASTS:
    _name = f"{_x.dtype.name}_to_{TensorProto.DataType.Name(_to)}"
    case("Cast", _name, [_x], {"to": _to}, opset=13)
case("Cast", "opset7", [_FRACTIONS], {"to": TensorProto.INT32}, opset=7)
case("Cast", "opset19_saturate", [_FRACTIONS], {"to": TensorProto.FLOAT16, "saturate": 0}, opset=19)
case("Cast", "opset21", [ints(4, dtype=np.int16)], {"to": TensorProto.DOUBLE}, opset=21)

# -- reductions ------------------------------------------------------------------------------
_REDUCE_OPS = (
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceSumSquare",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
)
for _op in _REDUCE_OPS:
    _new = 13 if _op == "ReduceSum" else 18
    _x = pos(2, 3, 4)
    case(_op, "attr_axis1", [_x], {"axes": [1]}, opset=11)
    case(_op, "attr_neg_nokeep", [_x], {"axes": [-1, 0], "keepdims": 0}, opset=11)
    case(_op, "attr_all", [_x], opset=11)
    case(_op, "attr_all_nokeep", [_x], {"keepdims": 0}, opset=7)
    case(_op, "input_axes", [_x, i64(0, 2)], opset=_new)
    case(_op, "input_axes_const", [_x, i64(-2)], {"keepdims": 0}, opset=_new, const=(1,))
    case(_op, "input_none", [_x], opset=_new)
    case(_op, "input_empty", [_x, i64()], opset=_new)
    case(_op, "input_empty_noop", [_x, i64()], {"noop_with_empty_axes": 1}, opset=_new)
    case(_op, "input_none_noop", [_x], {"noop_with_empty_axes": 1}, opset=_new)
    case(_op, "f16", [_x.astype(np.float16), i64(1)], opset=_new)
    case(_op, "f64", [_x.astype(np.float64), i64(2)], {"keepdims": 0}, opset=_new)
    if _op != "ReduceLogSumExp":  # the reference fails on rank 0
        case(_op, "scalar_in", [pos()], opset=_new)
    if _op not in ("ReduceLogSum", "ReduceLogSumExp"):
        # the reference's ReduceSumSquare promotes int32 to int64 (ONNX keeps T)
        _dt = np.int64 if _op == "ReduceSumSquare" else np.int32
        case(_op, "int32", [ints(3, 4, lo=1, hi=5, dtype=_dt), i64(1)], opset=_new)
        case(_op, "int64_attr", [ints(3, 4, dtype=np.int64, lo=1, hi=5)], {"axes": [0]}, opset=11)
    if _op != "ReduceMean":  # numpy's mean warns on empty slices inside the reference
        case(_op, "empty_set", [f32(2, 0, 4), i64(1)], opset=_new)
    case(_op, "empty_non_reduced", [f32(2, 0, 4), i64(2)], opset=_new)
for _op in ("ReduceMax", "ReduceMin"):
    case(_op, "bool", [bools(3, 4), i64(1)], {"keepdims": 0}, opset=20)
    case(_op, "empty_bool", [np.zeros((2, 0), bool), i64(1)], opset=20)
    case(_op, "int8", [ints(3, 4, dtype=np.int8), i64(0)], opset=18)
    case(_op, "empty_int", [np.zeros((2, 0), np.int32), i64(1)], opset=18)
case(
    "ReduceLogSumExp",
    "large",
    [np.array([[1000.0, 1000.0], [-1000.0, 3.0]], np.float32)],
    {"axes": [1]},
    opset=13,
)
case("ReduceMax", "nan", [np.array([1.0, np.nan, 3.0], np.float32)], opset=18)

# -- Reshape / Flatten / Transpose -----------------------------------------------------------
_X = f32(2, 3, 4)
case("Reshape", "basic", [_X, i64(4, 6)], opset=5)
case("Reshape", "minus_one", [_X, i64(-1, 2)], opset=13)
case("Reshape", "zero_copies", [_X, i64(0, -1)], opset=13)
case("Reshape", "zero_copies_mid", [_X, i64(0, 3, 0)], opset=21)
case("Reshape", "flat", [_X, i64(-1)], opset=14)
case("Reshape", "extend", [_X, i64(2, 1, 3, 1, 4)], const=(1,))
case("Reshape", "allowzero", [f32(0, 3), i64(3, 0)], {"allowzero": 1}, opset=14)
case("Reshape", "allowzero_no_zero", [_X, i64(6, -1)], {"allowzero": 1}, opset=14)
case("Reshape", "zero_size", [f32(0, 3), i64(0, 3, 1)], opset=14)
case("Reshape", "scalar", [f32(1, 1), i64()], opset=14)
case("Reshape", "string", [np.array(["a", "b", "c", "d"], dtype=object), i64(2, 2)], opset=14)
for _ax in (0, 1, 2, 3, -1, -2, -4):
    case("Flatten", f"axis{_ax}", [f32(2, 3, 4, 5)], {"axis": _ax}, opset=13 if _ax < 0 else 9)
case("Flatten", "default", [f32(2, 3, 4)])
case("Flatten", "zero_size", [f32(2, 3, 0)], {"axis": 1})
case("Flatten", "int", [ints(3, 2, dtype=np.int64)], {"axis": 1})
case("Transpose", "default", [_X])
case("Transpose", "perm", [_X], {"perm": [1, 2, 0]})
case("Transpose", "perm4", [f32(2, 3, 4, 5)], {"perm": [0, 2, 3, 1]}, opset=7)
case("Transpose", "1d", [f32(5)])
case("Transpose", "bool", [bools(2, 3)], {"perm": [1, 0]})
case("Transpose", "zero_size", [f32(0, 3)])
case("Transpose", "scalar", [f32()])

# -- Squeeze / Unsqueeze ---------------------------------------------------------------------
_S = f32(1, 3, 1, 4)
case("Squeeze", "attr", [_S], {"axes": [0, 2]}, opset=11)
case("Squeeze", "attr_negative", [_S], {"axes": [-2]}, opset=11)
case("Squeeze", "attr_none", [_S], opset=7)
case("Squeeze", "input", [_S, i64(0, -2)], opset=13)
case("Squeeze", "input_const", [_S, i64(2)], opset=13, const=(1,))
case("Squeeze", "input_none", [_S], opset=13)
case("Squeeze", "to_scalar", [f32(1, 1)], opset=21)
case("Squeeze", "zero_size", [f32(0, 1, 3), i64(1)], opset=21)
case("Unsqueeze", "attr", [f32(3, 4)], {"axes": [0, 3]}, opset=11)
case("Unsqueeze", "attr_negative", [f32(3, 4)], {"axes": [-1]}, opset=11)
case("Unsqueeze", "attr_opset7", [f32(3, 4)], {"axes": [1]}, opset=7)
case("Unsqueeze", "input", [f32(3, 4), i64(1)], opset=13)
case("Unsqueeze", "input_unsorted", [f32(3, 4, 5), i64(5, 4, 2)], opset=13)
case("Unsqueeze", "input_negative", [f32(3, 4), i64(-1, 0)], opset=13, const=(1,))
case("Unsqueeze", "scalar", [f32(), i64(0)], opset=21)
case("Unsqueeze", "zero_size", [f32(0, 2), i64(1)], opset=21)

# -- Concat / Split --------------------------------------------------------------------------
for _ax in (0, 1, -1, -3):
    case(
        "Concat",
        f"axis{_ax}",
        [f32(2, 3, 4), f32(2, 3, 4)],
        {"axis": _ax},
        opset=11 if _ax < 0 else 7,
    )
case("Concat", "three", [f32(2, 1), f32(2, 3), f32(2, 2)], {"axis": 1}, opset=13)
case("Concat", "one", [f32(2, 3)], {"axis": 0})
case("Concat", "zero_size", [f32(0, 3), f32(2, 3)], {"axis": 0})
case("Concat", "int64", [ints(3, dtype=np.int64), ints(2, dtype=np.int64)], {"axis": 0})
case("Concat", "bool", [bools(2, 2), bools(2, 1)], {"axis": -1})
_T6 = f32(2, 6)
case("Split", "attr_split", [_T6], {"axis": 1, "split": [2, 4]}, opset=11, n_outputs=2)
case("Split", "attr_equal", [_T6], {"axis": 1}, opset=11, n_outputs=3)
case("Split", "attr_default_axis", [f32(4, 3)], opset=7, n_outputs=2)
case("Split", "attr_negative_axis", [_T6], {"axis": -1, "split": [1, 5]}, opset=11, n_outputs=2)
case("Split", "input_split", [_T6, i64(3, 1, 2)], {"axis": 1}, opset=13, n_outputs=3)
case("Split", "input_equal", [_T6], {"axis": -1}, opset=13, n_outputs=2)
case("Split", "zero_size_splits", [_T6, i64(0, 6)], {"axis": 1}, opset=13, n_outputs=2)
case("Split", "num_outputs_uneven", [f32(7, 2)], {"num_outputs": 3}, opset=18, n_outputs=3)
case("Split", "num_outputs_empty_last", [f32(4)], {"num_outputs": 3}, opset=18, n_outputs=3)
case("Split", "num_outputs_even", [f32(2, 8)], {"axis": 1, "num_outputs": 4}, opset=18, n_outputs=4)
case("Split", "input_split_18", [f32(5), i64(2, 3)], opset=18, n_outputs=2)
case("Split", "int32", [ints(6)], opset=18, n_outputs=3, attrs={"num_outputs": 3})

# -- Slice -----------------------------------------------------------------------------------
_L = f32(5, 6, 7)
case("Slice", "attr", [_L], {"starts": [1, 0], "ends": [3, 4], "axes": [0, 2]}, opset=9)
case("Slice", "attr_no_axes", [_L], {"starts": [1, 2], "ends": [-1, 1000]}, opset=7)
case("Slice", "attr_negative", [_L], {"starts": [-3], "ends": [I64_MAX], "axes": [-1]}, opset=9)
case("Slice", "inputs", [_L, i64(1, 0), i64(3, 4), i64(0, 2)], opset=10)
case("Slice", "steps", [_L, i64(0, 1), i64(5, 6), i64(0, 1), i64(2, 3)], opset=13)
case("Slice", "neg_steps", [_L, i64(-1, 5), i64(I64_MIN, 0), i64(1, 2), i64(-1, -2)], opset=13)
case("Slice", "neg_step_to_start", [f32(10), i64(20), i64(-1000), i64(0), i64(-3)], opset=13)
case("Slice", "default_axes_steps", [_L, i64(1, 2, 3), i64(4, 5, 6)], opset=13)
case("Slice", "omitted_axes", [_L, i64(1), i64(3), None, i64(1)], opset=13)
case("Slice", "out_of_bounds", [_L, i64(1000), i64(1001), i64(1)], opset=13)
case("Slice", "end_oob", [_L, i64(1), i64(1000), i64(-2)], opset=13)
case("Slice", "negative_axes", [_L, i64(0, 1), i64(2, 3), i64(-1, -3)], opset=13)
case("Slice", "int32_indices", [_L, np.array([1], np.int32), np.array([-1], np.int32)], opset=13)
case("Slice", "const_inputs", [_L, i64(0), i64(-1), i64(1), i64(2)], opset=13, const=(1, 2, 3, 4))
case("Slice", "empty_result", [_L, i64(3), i64(1), i64(0)], opset=13)
case("Slice", "zero_size", [f32(0, 4), i64(1), i64(3), i64(1)], opset=13)

# -- Gather ----------------------------------------------------------------------------------
_G = f32(5, 4, 3)
case("Gather", "axis0", [_G, i64(0, 2, 4)], opset=7)
case("Gather", "axis1_2d", [_G, np.array([[0, 1], [3, 2]], np.int64)], {"axis": 1})
case("Gather", "axis_negative", [_G, i64(2, 0)], {"axis": -1}, opset=11)
case("Gather", "negative_indices", [_G, i64(-1, -5, 0)], opset=13)
case("Gather", "scalar_index", [_G, np.array(1, np.int64)], {"axis": 1})
case("Gather", "int32_indices", [_G, np.array([1, 0], np.int32)])
case("Gather", "empty_indices", [_G, np.zeros((0,), np.int64)], {"axis": 2})
case("Gather", "int_data", [ints(4, 2, dtype=np.int64), i64(3, 3)])
case("Gather", "const_indices", [_G, i64(1)], const=(1,))

# -- Shape / Size / Expand / Tile ------------------------------------------------------------
case("Shape", "opset13", [_G], opset=13)
case("Shape", "scalar", [f32()], opset=13)
for _kw in (
    {"start": 1},
    {"end": 1},
    {"start": -1},
    {"end": -1},
    {"start": 1, "end": -1},
    {"start": -10},
    {"end": 10},
    {"start": 2, "end": 1},
):
    case("Shape", "_".join(f"{k}{v}" for k, v in _kw.items()), [_G], _kw, opset=15)
case("Size", "basic", [_G])
case("Size", "scalar", [f32()], opset=13)
case("Size", "zero_size", [f32(0, 5)])
case("Expand", "dim_changed", [f32(3, 1), i64(2, 1, 6)], opset=8)
case("Expand", "dim_unchanged", [f32(3, 1), i64(3, 4)])
case("Expand", "bidirectional", [f32(3, 4), i64(1)], opset=13)
case("Expand", "int", [ints(1, 3, dtype=np.int64), i64(2, 1, 3)])
case("Expand", "zero_size", [f32(1, 3), i64(0, 3)])
case("Expand", "scalar", [f32(), i64(2, 2)], const=(1,))
case("Tile", "basic", [f32(2, 3), i64(2, 2)])
case("Tile", "precomputed", [f32(2, 3, 4), i64(1, 3, 1)], opset=6, const=(1,))
case("Tile", "zero", [ints(2, 2), i64(0, 2)])

# -- Pad -------------------------------------------------------------------------------------
_P = f32(3, 4)
case("Pad", "attr_constant", [_P], {"pads": [0, 2, 0, 1], "value": 1.5}, opset=2)
case("Pad", "attr_reflect", [_P], {"pads": [1, 1, 1, 2], "mode": "reflect"}, opset=10)
case("Pad", "attr_edge", [_P], {"pads": [2, 0, 1, 0], "mode": "edge"}, opset=7)
case("Pad", "input_constant", [_P, i64(1, 0, 0, 3), np.float32(-2.0)], opset=11)
case("Pad", "input_constant_default", [_P, i64(1, 2, 3, 4)], opset=13)
case("Pad", "input_reflect", [_P, i64(2, 1, 2, 3)], {"mode": "reflect"}, opset=13)
case("Pad", "input_edge", [_P, i64(0, 3, 2, 0)], {"mode": "edge"}, opset=18)
case("Pad", "axes", [f32(2, 3, 4), i64(1, 0, 2, 1), np.float32(7.0), i64(0, 2)], opset=18)
case("Pad", "axes_negative", [f32(2, 3, 4), i64(1, 0), None, i64(-1)], opset=18)
case("Pad", "wrap", [_P, i64(1, 3, 2, 2)], {"mode": "wrap"}, opset=19)
case("Pad", "int", [ints(3, 4, dtype=np.int64), i64(1, 1, 1, 1), i64(9)], opset=13)
case("Pad", "const_pads", [_P, i64(0, 1, 0, 1)], opset=21, const=(1,))

# -- misc ------------------------------------------------------------------------------------
case("Identity", "f32", [_P])
case("Identity", "int_opset7", [ints(3)], opset=7)
case("Identity", "bool_scalar", [np.array(False)])
case("Identity", "string", [np.array(["x", "y"], dtype=object)])
case("Dropout", "opset7_ratio", [_P], {"ratio": 0.3}, opset=7)
case("Dropout", "opset10_mask", [_P], {"ratio": 0.2}, opset=10, n_outputs=2)
case("Dropout", "opset12", [_P], opset=12)
case("Dropout", "opset12_mask", [_P], opset=12, n_outputs=2)
case("Dropout", "opset13_ratio_input", [_P, np.float32(0.1)], opset=13, n_outputs=2)
case("Dropout", "training_false", [_P, np.float32(0.5), np.array(False)], opset=13, n_outputs=2)
case("Dropout", "training_zero_ratio", [_P, np.float32(0.0), np.array(True)], opset=13, n_outputs=2)
case("Dropout", "f16", [_P.astype(np.float16)], opset=13)
case(
    "Constant",
    "value",
    [],
    {"value": helper.make_tensor("v", TensorProto.FLOAT, [2, 2], [1, 2, 3, 4])},
    opset=9,
)
case(
    "Constant",
    "value_int64",
    [],
    {"value": helper.make_tensor("v", TensorProto.INT64, [3], [1, -2, 3])},
    opset=13,
)
case("Constant", "value_float", [], {"value_float": 2.5}, opset=12)
case("Constant", "value_floats", [], {"value_floats": [1.0, 2.0]}, opset=12)
case("Constant", "value_int", [], {"value_int": 7}, opset=13)
case("Constant", "value_ints", [], {"value_ints": [1, 2, 3]}, opset=21)
case("ConstantOfShape", "default", [i64(2, 3)], opset=9)
case(
    "ConstantOfShape",
    "float_ones",
    [i64(4, 3, 2)],
    {"value": helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])},
)
case(
    "ConstantOfShape",
    "int_zeros",
    [i64(10, 6)],
    {"value": helper.make_tensor("v", TensorProto.INT32, [1], [0])},
)
case(
    "ConstantOfShape",
    "int64_value",
    [i64(3)],
    {"value": helper.make_tensor("v", TensorProto.INT64, [1], [5])},
    opset=20,
)
case(
    "ConstantOfShape",
    "bool_value",
    [i64(2)],
    {"value": helper.make_tensor("v", TensorProto.BOOL, [1], [True])},
)
case(
    "ConstantOfShape",
    "zero_dim",
    [i64(0, 3)],
    {"value": helper.make_tensor("v", TensorProto.INT32, [1], [1])},
)
case(
    "ConstantOfShape",
    "scalar",
    [i64()],
    {"value": helper.make_tensor("v", TensorProto.FLOAT16, [1], [3.0])},
    const=(0,),
)


# -- the generic comparison ------------------------------------------------------------------


def _build(c: Case) -> tuple[Node, Any]:
    return make_node(
        c.op, c.inputs, c.attrs, n_outputs=c.n_outputs, opset=c.opset, const_inputs=c.const
    )


def _reference(proto: Any, inputs: list, opset: int) -> list[np.ndarray]:
    """The reference evaluator's outputs; its own numpy warnings are not ours to police."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return reference_outputs(proto, inputs, opset)


def _tolerance(dtype: np.dtype) -> dict[str, float]:
    if dtype == np.float16:
        return {"rtol": 2e-3, "atol": 2e-3}
    if dtype == np.float32:
        return {"rtol": 1e-4, "atol": 1e-5}
    return {"rtol": 1e-6, "atol": 1e-7}  # some reference kernels compute float64 in float32


def assert_same(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    """Same type, dtype, shape and (within float tolerance) values; NaN equals NaN."""
    want = np.asarray(want)
    assert isinstance(got, np.ndarray), f"{what}: kernel returned {type(got).__name__}, not ndarray"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got, want, equal_nan=True, err_msg=what, **_tolerance(got.dtype))
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
def test_every_case_supported_by_default_impl(op: str) -> None:
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


def test_outputs_are_contiguous_arrays() -> None:
    """Row-major contiguous ndarray outputs (the standard layout), never numpy scalars."""
    for p in PARAMS:
        impl, c = p.values
        node, _ = _build(c)
        for k, y in enumerate(run_impl(impl, node, c.inputs)):
            assert isinstance(y, np.ndarray), (impl.name, c.name, k)
            assert y.flags.c_contiguous, (impl.name, c.name, k)


# -- targeted behaviour the reference does not cover -----------------------------------------


def impls_of(op: str) -> list[Any]:
    return [pytest.param(i, id=i.name) for i in impls if i.op == op]


def impls_supporting(op: str, inputs: list, attrs: dict | None = None, **kw: Any) -> list[Any]:
    """The implementations of ``op`` that accept this node (chosen at collection time)."""
    node, _ = make_node(op, inputs, attrs, **kw)
    return [pytest.param(i, id=i.name) for i in impls if i.op == op and i.supports(node) is None]


def _run(
    impl: Any, op: str, inputs: list, attrs: dict | None = None, **kw: Any
) -> list[np.ndarray]:
    node, _ = make_node(op, inputs, attrs, **kw)
    reason = impl.supports(node)
    assert reason is None, reason
    return run_impl(impl, node, inputs)


@pytest.mark.parametrize("impl", impls_of("Div"))
def test_div_by_zero_is_silent(impl: Any) -> None:
    x = np.array([1.0, -1.0, 0.0], np.float32)
    (y,) = _run(impl, "Div", [x, np.zeros(3, np.float32)])
    assert np.isposinf(y[0]) and np.isneginf(y[1]) and np.isnan(y[2])
    (yi,) = _run(impl, "Div", [i64(5, I64_MIN), i64(0, -1)])
    assert yi.dtype == np.int64


@pytest.mark.parametrize("impl", impls_of("Div"))
def test_div_int_truncates_toward_zero(impl: Any) -> None:
    (y,) = _run(impl, "Div", [np.array([-7, 7, -1, -9], np.int8), np.array([2, -2, 3, 4], np.int8)])
    np.testing.assert_array_equal(y, np.array([-3, -3, 0, -2], np.int8))


_POW_NEG = [np.array([2, 1, -1, 4], np.int32), np.array([-1, -2, -3, 2], np.int32)]


@pytest.mark.parametrize("impl", impls_supporting("Pow", _POW_NEG))
def test_pow_int_negative_exponent(impl: Any) -> None:
    (y,) = _run(impl, "Pow", _POW_NEG)
    np.testing.assert_array_equal(y, np.array([0, 1, -1, 16], np.int32))
    assert y.dtype == np.int32


@pytest.mark.parametrize("impl", impls_of("Pow"))
def test_pow_overflow_is_silent(impl: Any) -> None:
    (y,) = _run(
        impl,
        "Pow",
        [np.array([1e30, -8.0], np.float32), np.array(2.0, np.float32)],
        const_inputs=(1,),
    )
    assert np.isposinf(y[0]) and y.dtype == np.float32


@pytest.mark.parametrize(
    "impl", impls_of("Log") + impls_of("Exp") + impls_of("Sqrt") + impls_of("Reciprocal")
)
def test_unary_edge_values_are_silent(impl: Any) -> None:
    x = np.array([0.0, -1.0, 1e4, -1e4, np.inf, np.nan], np.float32)
    (y,) = _run(impl, impl.op, [x])
    assert y.dtype == np.float32 and y.shape == x.shape


@pytest.mark.parametrize("impl", impls_of("Sigmoid"))
def test_sigmoid_extremes(impl: Any) -> None:
    (y,) = _run(impl, "Sigmoid", [np.array([-1e4, 1e4, 0.0], np.float16)])
    np.testing.assert_array_equal(y, np.array([0.0, 1.0, 0.5], np.float16))


@pytest.mark.parametrize("impl", impls_of("ReduceMean"))
def test_reduce_mean_empty_set_is_nan(impl: Any) -> None:
    (y,) = _run(impl, "ReduceMean", [f32(2, 0, 3), i64(1)], opset=18)
    assert y.shape == (2, 1, 3) and np.isnan(y).all()


@pytest.mark.parametrize("impl", impls_of("ReduceMean"))
def test_reduce_mean_int_truncates(impl: Any) -> None:
    (y,) = _run(
        impl,
        "ReduceMean",
        [np.array([[1, 2], [3, 3]], np.int32)],
        {"axes": [1], "keepdims": 0},
        opset=13,
    )
    np.testing.assert_array_equal(y, np.array([1, 3], np.int32))


@pytest.mark.parametrize("impl", impls_of("ReduceSum"))
def test_reduce_sum_axes_input_before_opset13_is_rejected(impl: Any) -> None:
    node, _ = make_node("ReduceSum", [f32(2, 3), i64(1)], opset=11)
    assert "attribute" in impl.supports(node)


@pytest.mark.parametrize("impl", impls_of("ReduceSum"))
def test_reduce_sum_bad_axis_raises(impl: Any) -> None:
    with pytest.raises(ValueError, match="out of range"):
        _run(impl, "ReduceSum", [f32(2, 3), i64(2)], opset=13)
    with pytest.raises(ValueError, match="repeat"):
        _run(impl, "ReduceSum", [f32(2, 3), i64(1, -1)], opset=13)


@pytest.mark.parametrize("impl", impls_of("Squeeze"))
def test_squeeze_non_unit_axis_raises(impl: Any) -> None:
    with pytest.raises(ValueError, match="size 1"):
        _run(impl, "Squeeze", [f32(2, 1), i64(0)], opset=13)


@pytest.mark.parametrize("impl", impls_of("Reshape"))
def test_reshape_errors(impl: Any) -> None:
    with pytest.raises(ValueError):
        _run(impl, "Reshape", [f32(2, 3), i64(-1, -1)])
    with pytest.raises(ValueError):
        _run(impl, "Reshape", [f32(2, 3), i64(4, -1)])
    with pytest.raises(ValueError):
        _run(impl, "Reshape", [f32(0, 3), i64(0, -1)], {"allowzero": 1})


@pytest.mark.parametrize("impl", impls_of("Reshape"))
def test_reshape_allowzero_ignored_before_opset14(impl: Any) -> None:
    (y,) = _run(impl, "Reshape", [f32(2, 3), i64(0, 3)], {"allowzero": 1}, opset=13)
    assert y.shape == (2, 3)


@pytest.mark.parametrize("impl", impls_of("Split"))
def test_split_bad_sizes_raise(impl: Any) -> None:
    with pytest.raises(ValueError, match="add up"):
        _run(impl, "Split", [f32(6), i64(2, 2)], n_outputs=2, opset=13)
    with pytest.raises(ValueError, match="cannot cut"):  # chunks of 2 leave -1 (as onnxruntime)
        _run(impl, "Split", [f32(5)], {"num_outputs": 4}, n_outputs=4, opset=18)


@pytest.mark.parametrize("impl", impls_of("Slice"))
def test_slice_zero_step_raises(impl: Any) -> None:
    with pytest.raises(ValueError, match="step"):
        _run(impl, "Slice", [f32(4), i64(0), i64(3), i64(0), i64(0)], opset=13)


@pytest.mark.parametrize("impl", impls_of("Gather"))
def test_gather_out_of_range_raises(impl: Any) -> None:
    with pytest.raises(IndexError):
        _run(impl, "Gather", [f32(3, 2), i64(3)])
    with pytest.raises(IndexError):
        _run(impl, "Gather", [f32(3, 2), i64(-4)])


@pytest.mark.parametrize("impl", impls_of("Pad"))
def test_pad_negative_pads_crop(impl: Any) -> None:
    x = f32(4, 5)
    (y,) = _run(impl, "Pad", [x, i64(-1, 2, 1, -2)], opset=13)
    want = np.pad(x[1:, :3], [(0, 1), (2, 0)])
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("impl", impls_of("Pad"))
def test_pad_wrap_rejected_before_opset19(impl: Any) -> None:
    node, _ = make_node("Pad", [f32(2, 2), i64(1, 1, 1, 1)], {"mode": "wrap"}, opset=18)
    assert "wrap" in impl.supports(node)


@pytest.mark.parametrize("impl", impls_of("Dropout"))
def test_dropout_opset7_mask_has_data_type(impl: Any) -> None:
    x = f32(2, 3)
    y, mask = _run(impl, "Dropout", [x], {"ratio": 0.5}, opset=7, n_outputs=2)
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == np.float32 and (mask == 1).all()


@pytest.mark.parametrize("impl", impls_of("Dropout"))
def test_dropout_training_mode_rejected(impl: Any) -> None:
    x = f32(2, 3)
    node, _ = make_node(
        "Dropout", [x, np.float32(0.5), np.array(True)], opset=13, const_inputs=(1, 2)
    )
    assert "training_mode" in impl.supports(node)
    node, _ = make_node("Dropout", [x, None, np.array(True)], opset=13, const_inputs=(2,))
    assert "training_mode" in impl.supports(node)
    node, _ = make_node("Dropout", [x, np.float32(0.5), np.array(True)], opset=13)
    assert impl.supports(node) is None  # not constant: decided when it runs
    with pytest.raises(ValueError, match="training_mode"):
        run_impl(impl, node, [x, np.float32(0.5), np.array(True)])


@pytest.mark.parametrize("impl", impls_of("Cast"))
@pytest.mark.parametrize(
    ("to", "word"),
    [
        (TensorProto.STRING, "STRING"),
        (TensorProto.FLOAT8E4M3FN, "FLOAT8E4M3FN"),
        (TensorProto.FLOAT8E5M2, "FLOAT8E5M2"),
        (TensorProto.BFLOAT16, "BFLOAT16"),
        (TensorProto.INT4, "INT4"),
    ],
)
def test_cast_unsupported_targets_rejected(impl: Any, to: int, word: str) -> None:
    node, _ = make_node("Cast", [f32(2)], {"to": to, "saturate": 1}, opset=19)
    reason = impl.supports(node)
    assert reason is not None and word in reason


@pytest.mark.parametrize("impl", impls_of("Cast"))
def test_cast_from_string_rejected(impl: Any) -> None:
    node, _ = make_node("Cast", [np.array(["1"], dtype=object)], {"to": TensorProto.FLOAT})
    assert "STRING" in impl.supports(node)


@pytest.mark.parametrize("impl", impls_of("Cast"))
def test_cast_out_of_range_is_silent(impl: Any) -> None:
    (y,) = _run(
        impl, "Cast", [np.array([np.nan, 1e20, 7e4], np.float32)], {"to": TensorProto.INT32}
    )
    assert y.dtype == np.int32
    (h,) = _run(impl, "Cast", [np.array([1e6], np.float64)], {"to": TensorProto.FLOAT16})
    assert np.isposinf(h[0])


@pytest.mark.parametrize("impl", impls_of("Constant"))
def test_constant_sparse_and_string_rejected(impl: Any) -> None:
    node = Node("c", "Constant", [], [Value("y", None, None)], {"sparse_value": object()}, "", 13)
    assert "sparse" in impl.supports(node)
    node = Node("c", "Constant", [], [Value("y", None, None)], {"value_string": "hi"}, "", 13)
    assert "string" in impl.supports(node)


@pytest.mark.parametrize("impl", impls_of("Constant"))
def test_constant_returns_fresh_arrays(impl: Any) -> None:
    node, _ = make_node("Constant", [], {"value_ints": [1, 2]})
    kernel = impl.build(node)
    a = kernel()
    a[0] = 99
    np.testing.assert_array_equal(kernel(), i64(1, 2))


@pytest.mark.parametrize("impl", impls_of("Clip"))
def test_clip_attr_on_float16_with_default_bounds(impl: Any) -> None:
    x = np.array([-6e4, 0.5, 6e4], np.float16)
    (y,) = _run(impl, "Clip", [x], {"min": -3.4e38}, opset=10)
    np.testing.assert_array_equal(y, x)


def test_supports_rejects_unhandled_dtypes() -> None:
    checks = [
        ("Add", [bools(2), bools(2)], {}),
        ("Sqrt", [ints(2)], {}),
        ("And", [f32(2), f32(2)], {}),
        ("Add", [f32(2), f32(2).astype(np.float64)], {}),
        ("Gelu", [f32(2)], {"approximate": "erf"}),
    ]
    for op, inputs, attrs in checks:
        node, _ = make_node(op, inputs, attrs)
        for impl in (i for i in impls if i.op == op):
            assert impl.supports(node), (
                f"{impl.name} should reject {op} {[a.dtype for a in inputs]}"
            )


@pytest.mark.parametrize("impl", impls_of("ReduceSumSquare") + impls_of("ReduceSum"))
def test_reduce_int32_keeps_dtype(impl: Any) -> None:
    x = np.array([[1, 2], [3, 4]], np.int32)
    (y,) = _run(impl, impl.op, [x, i64(1)], opset=18)
    want = (x * x if impl.op == "ReduceSumSquare" else x).sum(axis=1, keepdims=True)
    np.testing.assert_array_equal(y, want.astype(np.int32))
    assert y.dtype == np.int32


@pytest.mark.parametrize("impl", impls_of("ReduceLogSumExp"))
def test_reduce_log_sum_exp_scalar(impl: Any) -> None:
    (y,) = _run(impl, "ReduceLogSumExp", [np.array(2.0, np.float32)], opset=18)
    assert y.shape == () and y.dtype == np.float32
    np.testing.assert_allclose(y, 2.0)


@pytest.mark.parametrize("impl", impls_of("Flatten"))
def test_flatten_zero_size_leading(impl: Any) -> None:
    (y,) = _run(impl, "Flatten", [f32(2, 0, 4)], {"axis": 2})
    assert y.shape == (0, 4)


# -- properties ------------------------------------------------------------------------------

_BINARY_OPS = ("Add", "Sub", "Mul", "Div", "Equal", "Less", "Greater")
_FLOATS = st.floats(-100, 100, width=32, allow_nan=False)


@settings(max_examples=50, deadline=None)
@given(
    data=st.data(),
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4),
    op=st.sampled_from(_BINARY_OPS),
)
def test_binary_broadcasting_property(data: Any, shapes: Any, op: str) -> None:
    a_shape, b_shape = shapes.input_shapes
    a = data.draw(hnp.arrays(np.float32, a_shape, elements=_FLOATS))
    b = data.draw(hnp.arrays(np.float32, b_shape, elements=st.floats(0.5, 50, width=32)))
    node, proto = make_node(op, [a, b], opset=13)
    want = _reference(proto, [a, b], 13)
    for impl in (i for i in impls if i.op == op):
        (got,) = run_impl(impl, node, [a, b])
        assert got.shape == shapes.result_shape
        assert_same(got, want[0], impl.name)


def _spec_slice(x: np.ndarray, starts: list, ends: list, axes: list, steps: list) -> np.ndarray:
    """ONNX Slice transcribed literally from the operator's documentation (an oracle)."""
    idx = [np.arange(d) for d in x.shape]
    for a, s, e, step in zip(axes, starts, ends, steps, strict=True):
        dim = x.shape[a]
        s, e = (s + dim if s < 0 else s), (e + dim if e < 0 else e)
        if step > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
        else:
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
        idx[a] = np.array(list(range(s, e, step)), dtype=np.int64)
    return x[np.ix_(*idx)] if x.ndim else x


@settings(max_examples=50, deadline=None)
@given(
    data=st.data(),
    shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=6),
)
def test_slice_property(data: Any, shape: tuple[int, ...]) -> None:
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    n = data.draw(st.integers(1, len(shape)))
    axes = data.draw(st.permutations(range(len(shape))))[:n]
    signed_axes = [a - len(shape) if data.draw(st.booleans()) else a for a in axes]
    bound = st.one_of(st.integers(-9, 9), st.sampled_from([I64_MIN, I64_MAX]))
    starts = [data.draw(bound) for _ in axes]
    ends = [data.draw(bound) for _ in axes]
    steps = [data.draw(st.sampled_from([-3, -2, -1, 1, 2, 3])) for _ in axes]
    inputs = [x, i64(*starts), i64(*ends), i64(*signed_axes), i64(*steps)]
    want = _spec_slice(x, starts, ends, axes, steps)
    node, proto = make_node("Slice", inputs, opset=13)
    # onnx's reference slices with Python semantics, which differ from the spec only for a
    # negative step with start < -dim (see test_slice_negative_step_start_before_beginning)
    if not any(st_ < 0 and s < -x.shape[a] for a, s, st_ in zip(axes, starts, steps, strict=True)):
        assert_same(_reference(proto, inputs, 13)[0], want, "reference vs spec")
    for impl in (i for i in impls if i.op == "Slice"):
        (got,) = run_impl(impl, node, inputs)
        assert_same(got, want, impl.name)


@pytest.mark.parametrize("impl", impls_of("Slice"))
def test_slice_negative_step_start_before_beginning(impl: Any) -> None:
    """start < -dim with a negative step clamps to 0 (ONNX spec, shape inference and
    onnxruntime agree; onnx's Python reference returns an empty slice)."""
    x = np.arange(4, dtype=np.float32)
    (y,) = _run(impl, "Slice", [x, i64(-1000), i64(-1000), i64(0), i64(-1)], opset=13)
    np.testing.assert_array_equal(y, np.array([0.0], np.float32))
    (y,) = _run(impl, "Slice", [x, i64(8), i64(I64_MAX), i64(0), i64(-1)], opset=13)
    assert y.shape == (0,)
