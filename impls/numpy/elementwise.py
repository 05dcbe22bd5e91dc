"""numpy reference kernels for elementwise operators.

Binary arithmetic and comparisons use multidirectional (numpy) broadcasting; variadic Sum /
Min / Max fold their inputs pairwise. Every kernel keeps the ONNX output dtype (no silent
upcasting) and runs under ``np.errstate`` where ONNX lets values overflow or divide by zero.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.misc import (
    BOOL_TYPES,
    FLOAT_TYPES,
    NUMERIC_TYPES,
    PLAIN_TYPES,
    SIGNED_TYPES,
    STRING_TYPES,
    as_std,
    check_dtypes,
    first_reason,
)
from impls.numpy.table import impls

Kernel = Callable[..., Any]
Ufunc = Callable[..., Any]


def _dtype_supports(allowed: frozenset[str], n_inputs: int | None = None) -> Callable:
    """A ``supports()`` accepting ``allowed`` dtypes on all inputs (which share one type)."""

    def supports(node: Node) -> str | None:
        n = len(node.inputs) if n_inputs is None else n_inputs
        if n_inputs is not None and len([v for v in node.inputs if v is not None]) < n:
            return f"{node.op_type} needs {n} inputs; received {len(node.inputs)}"
        return check_dtypes(node, allowed, range(n), same=True)

    return supports


# -- binary arithmetic, comparison and logic ------------------------------------------------


def _register_binary(op: str, ufunc: Ufunc, allowed: frozenset[str], doc: str) -> None:
    """Register ``op`` as the broadcasting numpy ``ufunc`` (variant ``ufunc``)."""

    def build(node: Node) -> Kernel:
        def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            with np.errstate(all="ignore"):
                return as_std(ufunc(a, b))

        return run

    build.__doc__ = doc
    build.__name__ = f"{op.lower()}_ufunc"
    impls.register(op, "ufunc", priority=Priority.DEFAULT, supports=_dtype_supports(allowed, 2))(
        build
    )


def _cmp(ufunc: Ufunc) -> Ufunc:
    """A comparison that always yields a bool array (also for object/string inputs)."""

    def f(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.asarray(ufunc(a, b), dtype=bool)

    return f


_BINARY: tuple[tuple[str, Ufunc, frozenset[str], str], ...] = (
    ("Add", np.add, NUMERIC_TYPES, "Add: broadcasting np.add (ints wrap on overflow)."),
    ("Sub", np.subtract, NUMERIC_TYPES, "Sub: broadcasting np.subtract."),
    ("Mul", np.multiply, NUMERIC_TYPES, "Mul: broadcasting np.multiply."),
    ("Equal", _cmp(np.equal), PLAIN_TYPES | STRING_TYPES, "Equal: broadcasting ==, bool out."),
    ("Less", _cmp(np.less), NUMERIC_TYPES, "Less: broadcasting <, bool out."),
    ("Greater", _cmp(np.greater), NUMERIC_TYPES, "Greater: broadcasting >, bool out."),
    ("LessOrEqual", _cmp(np.less_equal), NUMERIC_TYPES, "LessOrEqual: broadcasting <=."),
    ("GreaterOrEqual", _cmp(np.greater_equal), NUMERIC_TYPES, "GreaterOrEqual: broadcasting >=."),
    ("And", np.logical_and, BOOL_TYPES, "And: broadcasting logical and."),
    ("Or", np.logical_or, BOOL_TYPES, "Or: broadcasting logical or."),
    ("Xor", np.logical_xor, BOOL_TYPES, "Xor: broadcasting logical xor."),
)

for _op, _fn, _types, _doc in _BINARY:
    _register_binary(_op, _fn, _types, _doc)


def _int_div_trunc(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero (C semantics), in integer arithmetic."""
    q = np.floor_divide(a, b)
    if a.dtype.kind == "u" and b.dtype.kind == "u":
        return q
    r = np.remainder(a, b)
    adjust = (r != 0) & ((a < 0) ^ (b < 0))
    return q + adjust.astype(q.dtype)


@impls.register(
    "Div", "ufunc", priority=Priority.DEFAULT, supports=_dtype_supports(NUMERIC_TYPES, 2)
)
def div_ufunc(node: Node) -> Kernel:
    """Div: np.divide for floats, truncation toward zero for integers."""

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            if a.dtype.kind in "iu":
                return as_std(_int_div_trunc(a, b), a.dtype)
            return as_std(np.divide(a, b), a.dtype)

    return run


# -- Pow -------------------------------------------------------------------------------------


def _supports_pow(node: Node) -> str | None:
    if node.input(1) is None:
        return "Pow needs two inputs"
    return first_reason(
        check_dtypes(node, NUMERIC_TYPES, (0,)), check_dtypes(node, NUMERIC_TYPES, (1,))
    )


def _pow_int_base(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer base: exact integer power for non-negative integer exponents, else through
    float64 with truncation toward zero (as C ``(T)pow(double, double)``)."""
    if b.dtype.kind in "iu" and not np.any(b < 0):
        wide = np.int64 if a.dtype.kind == "i" else np.uint64
        return np.power(a.astype(wide), b.astype(wide)).astype(a.dtype)
    return np.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)


@impls.register("Pow", "ufunc", priority=Priority.DEFAULT, supports=_supports_pow)
def pow_ufunc(node: Node) -> Kernel:
    """Pow: np.power; the result has the base's dtype for any exponent dtype."""

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            if a.dtype.kind in "iu":
                return as_std(_pow_int_base(a, b))
            if b.dtype.kind in "iu":
                b = b.astype(a.dtype)  # exact for every exponent a float base can survive
            return as_std(np.power(a, b), a.dtype)

    return run


#: exponent -> function of the base, for the constant-exponent special cases
_POW_SPECIAL: dict[float, Callable[[np.ndarray], np.ndarray]] = {
    1.0: lambda x: x.copy(),
    2.0: lambda x: x * x,
    3.0: lambda x: x * x * x,
    0.5: np.sqrt,
    -1.0: lambda x: np.reciprocal(x),
}


def _const_exponent(node: Node) -> float | None:
    c = node.const_input(1)
    if c is None or np.asarray(c).size != 1:
        return None
    return float(np.asarray(c).reshape(()))


def _supports_pow_const(node: Node) -> str | None:
    reason = first_reason(_supports_pow(node), check_dtypes(node, FLOAT_TYPES, (0,)))
    if reason:
        return reason
    e = _const_exponent(node)
    if e is None:
        return "Pow.numpy.const_exponent needs a constant one-element exponent"
    if e not in _POW_SPECIAL:
        return f"exponent {e} is not one of the special cases {sorted(_POW_SPECIAL)}"
    return None


@impls.register("Pow", "const_exponent", priority=Priority.PREFERRED, supports=_supports_pow_const)
def pow_const_exponent(node: Node) -> Kernel:
    """Pow with a constant exponent in {-1, 0.5, 1, 2, 3}: multiplications / sqrt, no pow()."""
    fn = _POW_SPECIAL[_const_exponent(node)]  # type: ignore[index]

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            y = fn(a)
        if b.ndim > a.ndim:  # a one-element exponent of higher rank adds leading 1-dims
            y = y.reshape(np.broadcast_shapes(a.shape, b.shape))
        return as_std(y, a.dtype)

    return run


# -- unary -----------------------------------------------------------------------------------


def _register_unary(
    op: str,
    fn: Ufunc,
    allowed: frozenset[str],
    doc: str,
    variant: str,
    priority: int = Priority.DEFAULT,
) -> None:
    """Register ``op`` as ``fn(x)`` cast back to the input dtype."""

    def build(node: Node) -> Kernel:
        def run(x: np.ndarray) -> np.ndarray:
            with np.errstate(all="ignore"):
                return as_std(fn(x), x.dtype)

        return run

    build.__doc__ = doc
    build.__name__ = f"{op.lower()}_{variant}"
    impls.register(op, variant, priority=priority, supports=_dtype_supports(allowed, 1))(build)


def _in_float32(fn: Ufunc) -> Ufunc:
    """Run ``fn`` in float32 for float16 and integer inputs (as onnx's reference does)."""

    def f(x: np.ndarray) -> np.ndarray:
        if x.dtype == np.float16 or x.dtype.kind in "iub":
            return fn(x.astype(np.float32))
        return fn(x)

    return f


def _erf(x: np.ndarray) -> np.ndarray:
    """scipy.special.erf, imported on first use: scipy.special costs ~0.1 s to import, which a
    production Session would otherwise pay at start-up for a kernel most plans never run."""
    from scipy.special import erf

    return erf(x)


def _expit(x: np.ndarray) -> np.ndarray:
    """scipy.special.expit, imported on first use (see :func:`_erf`)."""
    from scipy.special import expit

    return expit(x)


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, x.dtype.type(0))


def _sigmoid_stable(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) without overflow: exp only ever sees non-positive arguments."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


_UNARY: tuple[tuple[str, Ufunc, frozenset[str], str, str], ...] = (
    ("Sqrt", np.sqrt, FLOAT_TYPES, "Sqrt: np.sqrt (NaN below zero).", "ufunc"),
    ("Exp", np.exp, FLOAT_TYPES, "Exp: np.exp.", "ufunc"),
    ("Log", np.log, FLOAT_TYPES, "Log: np.log (-inf at zero, NaN below).", "ufunc"),
    ("Tanh", np.tanh, FLOAT_TYPES, "Tanh: np.tanh.", "ufunc"),
    ("Neg", np.negative, FLOAT_TYPES | SIGNED_TYPES, "Neg: np.negative.", "ufunc"),
    ("Abs", np.abs, NUMERIC_TYPES, "Abs: np.abs.", "ufunc"),
    ("Reciprocal", np.reciprocal, FLOAT_TYPES, "Reciprocal: np.reciprocal.", "ufunc"),
    ("Relu", _relu, FLOAT_TYPES | SIGNED_TYPES, "Relu: np.maximum(x, 0).", "maximum"),
    ("Erf", _in_float32(_erf), NUMERIC_TYPES, "Erf: scipy.special.erf.", "scipy"),
    (
        "Sigmoid",
        _in_float32(_sigmoid_stable),
        FLOAT_TYPES,
        "Sigmoid: overflow-free two-branch logistic with exp(-|x|).",
        "stable",
    ),
)

for _op, _fn, _types, _doc, _variant in _UNARY:
    _register_unary(_op, _fn, _types, _doc, _variant)
_register_unary(
    "Sigmoid",
    _in_float32(_expit),
    FLOAT_TYPES,
    "Sigmoid: scipy.special.expit (one C ufunc pass).",
    "expit",
    Priority.FALLBACK,
)


# -- Gelu ------------------------------------------------------------------------------------


def _supports_gelu(node: Node) -> str | None:
    approx = node.attr("approximate", "none")
    if approx not in ("none", "tanh"):
        return f"Gelu approximate must be 'none' or 'tanh'; received {approx!r}"
    return check_dtypes(node, FLOAT_TYPES)


def _gelu_erf(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + _erf(x * x.dtype.type(1 / math.sqrt(2))))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    t = x.dtype.type
    inner = t(math.sqrt(2 / math.pi)) * (x + t(0.044715) * x * x * x)
    return t(0.5) * x * (1 + np.tanh(inner))


@impls.register("Gelu", "formula", priority=Priority.DEFAULT, supports=_supports_gelu)
def gelu_formula(node: Node) -> Kernel:
    """Gelu: 0.5 x (1 + erf(x / sqrt 2)), or the tanh approximation."""
    fn = _in_float32(_gelu_tanh if node.attr("approximate", "none") == "tanh" else _gelu_erf)

    def run(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return as_std(fn(x), x.dtype)

    return run


# -- parametric activations -----------------------------------------------------------------
# Reference semantics for the activations other backends implement (oneDNN's eltwise), so
# that the tuner can check those candidates and build a whole-model reference plan.


def _supports_float(node: Node) -> str | None:
    return check_dtypes(node, FLOAT_TYPES)


@impls.register("LeakyRelu", "where", priority=Priority.DEFAULT, supports=_supports_float)
def leaky_relu_where(node: Node) -> Kernel:
    """LeakyRelu: x where x >= 0, else alpha * x (alpha defaults to 0.01)."""
    alpha = float(node.attr("alpha", 0.01))

    def run(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return as_std(np.where(x >= 0, x, x * x.dtype.type(alpha)), x.dtype)

    return run


@impls.register("Elu", "expm1", priority=Priority.DEFAULT, supports=_supports_float)
def elu_expm1(node: Node) -> Kernel:
    """Elu: x where x > 0, else alpha * (exp(x) - 1) (alpha defaults to 1), with np.expm1."""
    alpha = float(node.attr("alpha", 1.0))

    def run(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            neg = x.dtype.type(alpha) * np.expm1(np.minimum(x, x.dtype.type(0)))
            return as_std(np.where(x > 0, x, neg), x.dtype)

    return run


@impls.register("HardSwish", "formula", priority=Priority.DEFAULT, supports=_supports_float)
def hard_swish_formula(node: Node) -> Kernel:
    """HardSwish: x * max(0, min(1, x / 6 + 1 / 2))."""

    def run(x: np.ndarray) -> np.ndarray:
        t = x.dtype.type
        with np.errstate(all="ignore"):
            return as_std(x * np.clip(x * t(1 / 6) + t(0.5), t(0), t(1)), x.dtype)

    return run


# -- Clip ------------------------------------------------------------------------------------


def _supports_clip(node: Node) -> str | None:
    if node.opset < 11:
        return check_dtypes(node, FLOAT_TYPES)
    return check_dtypes(node, NUMERIC_TYPES, range(len(node.inputs)), same=True)


def _bound(v: Any, dtype: np.dtype) -> np.ndarray | None:
    """A min/max bound as a 0-d array of ``dtype`` (``None`` when absent)."""
    if v is None:
        return None
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError(f"Clip min/max must be scalars; received shape {a.shape}")
    with np.errstate(all="ignore"):
        return a.reshape(()).astype(dtype)


def _clip(x: np.ndarray, lo: np.ndarray | None, hi: np.ndarray | None) -> np.ndarray:
    """max(x, lo) then min(., hi): with lo > hi every element becomes hi, as ONNX says."""
    y = x
    if lo is not None:
        y = np.maximum(y, lo)
    if hi is not None:
        y = np.minimum(y, hi)
    return as_std(y, x.dtype) if y is not x else x


@impls.register("Clip", "minmax", priority=Priority.DEFAULT, supports=_supports_clip)
def clip_minmax(node: Node) -> Kernel:
    """Clip: np.maximum / np.minimum with attribute (opset < 11) or input bounds."""
    if node.opset < 11:
        attr_lo, attr_hi = node.attr("min"), node.attr("max")

        def run_attr(x: np.ndarray) -> np.ndarray:
            return _clip(x, _bound(attr_lo, x.dtype), _bound(attr_hi, x.dtype))

        return run_attr

    def run(
        x: np.ndarray, lo: np.ndarray | None = None, hi: np.ndarray | None = None
    ) -> np.ndarray:
        return _clip(x, _bound(lo, x.dtype), _bound(hi, x.dtype))

    return run


# -- variadic --------------------------------------------------------------------------------


def _register_variadic(op: str, ufunc: Ufunc, allowed: frozenset[str], doc: str) -> None:
    """Register variadic ``op`` as a left fold of the broadcasting ``ufunc``."""

    def build(node: Node) -> Kernel:
        def run(*xs: np.ndarray) -> np.ndarray:
            if not xs:
                raise ValueError(f"{op} needs at least one input")
            with np.errstate(all="ignore"):
                return as_std(functools.reduce(ufunc, xs), xs[0].dtype)

        return run

    def supports(node: Node) -> str | None:
        if not node.inputs or any(v is None for v in node.inputs):
            return f"{op} needs one or more (non-omitted) inputs"
        return check_dtypes(node, allowed, range(len(node.inputs)), same=True)

    build.__doc__ = doc
    build.__name__ = f"{op.lower()}_fold"
    impls.register(op, "fold", priority=Priority.DEFAULT, supports=supports)(build)


_register_variadic("Sum", np.add, NUMERIC_TYPES, "Sum: broadcasting np.add over all inputs.")
_register_variadic("Min", np.minimum, NUMERIC_TYPES, "Min: broadcasting np.minimum (NaN wins).")
_register_variadic("Max", np.maximum, NUMERIC_TYPES, "Max: broadcasting np.maximum (NaN wins).")


# -- Where, Not ------------------------------------------------------------------------------


def _supports_where(node: Node) -> str | None:
    if len(node.inputs) != 3 or any(v is None for v in node.inputs):
        return "Where needs three inputs (condition, X, Y)"
    return first_reason(
        check_dtypes(node, BOOL_TYPES, (0,)),
        check_dtypes(node, PLAIN_TYPES | STRING_TYPES, (1, 2), same=True),
    )


@impls.register("Where", "select", priority=Priority.DEFAULT, supports=_supports_where)
def where_select(node: Node) -> Kernel:
    """Where: np.where(condition, X, Y) with three-way broadcasting."""

    def run(cond: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return as_std(np.where(cond.astype(bool, copy=False), x, y), x.dtype)

    return run


@impls.register("Not", "ufunc", priority=Priority.DEFAULT, supports=_dtype_supports(BOOL_TYPES, 1))
def not_ufunc(node: Node) -> Kernel:
    """Not: np.logical_not."""

    def run(x: np.ndarray) -> np.ndarray:
        return as_std(np.logical_not(x))

    return run


# -- Cast ------------------------------------------------------------------------------------

_T = onnx.TensorProto
#: ONNX element type -> numpy dtype for the casts this kernel performs.
_CAST_TARGETS: dict[int, np.dtype] = {
    _T.FLOAT: np.dtype(np.float32),
    _T.DOUBLE: np.dtype(np.float64),
    _T.FLOAT16: np.dtype(np.float16),
    _T.INT8: np.dtype(np.int8),
    _T.INT16: np.dtype(np.int16),
    _T.INT32: np.dtype(np.int32),
    _T.INT64: np.dtype(np.int64),
    _T.UINT8: np.dtype(np.uint8),
    _T.UINT16: np.dtype(np.uint16),
    _T.UINT32: np.dtype(np.uint32),
    _T.UINT64: np.dtype(np.uint64),
    _T.BOOL: np.dtype(np.bool_),
}


def _type_name(to: int) -> str:
    try:
        return _T.DataType.Name(to)
    except ValueError:
        return f"element type {to}"


def _cast_reason(to: Any) -> str | None:
    if to is None:
        return "Cast needs the 'to' attribute"
    to = int(to)
    if to in _CAST_TARGETS:
        return None
    name = _type_name(to)
    if to == _T.STRING:
        return "Cast to STRING is not supported (string casts are out of scope)"
    if "FLOAT8" in name or "FLOAT4" in name:
        return f"Cast to {name} (8-bit / 4-bit floats, saturate attribute) is not supported"
    targets = ", ".join(sorted(d.name for d in _CAST_TARGETS.values()))
    return f"Cast to {name} is not supported; targets: {targets}"


def _supports_cast(node: Node) -> str | None:
    reason = _cast_reason(node.attr("to"))
    if reason:
        return reason
    v = node.input(0)
    if v is not None and v.dtype is not None and np.dtype(v.dtype).name not in PLAIN_TYPES:
        what = "STRING" if np.dtype(v.dtype).kind in "OUS" else np.dtype(v.dtype).name
        return f"Cast from {what} is not supported (the input must be a numeric or bool tensor)"
    return None


@impls.register("Cast", "astype", priority=Priority.DEFAULT, supports=_supports_cast)
def cast_astype(node: Node) -> Kernel:
    """Cast: ndarray.astype to the 'to' type (float to int truncates toward zero)."""
    target = _CAST_TARGETS[int(node.attr("to"))]

    def run(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return as_std(x.astype(target, copy=False))

    return run


def _supports_castlike(node: Node) -> str | None:
    src, like = node.input(0), node.input(1)
    for what, v in (("input", src), ("target_type", like)):
        if v is not None and v.dtype is not None and np.dtype(v.dtype).name not in PLAIN_TYPES:
            kind = "STRING" if np.dtype(v.dtype).kind in "OUS" else np.dtype(v.dtype).name
            return (f"CastLike {what} of type {kind} is not supported (numeric or bool tensors: "
                    f"{', '.join(sorted(PLAIN_TYPES))})")
    return None


@impls.register("CastLike", "astype", priority=Priority.DEFAULT, supports=_supports_castlike)
def castlike_astype(node: Node) -> Kernel:
    """CastLike: ndarray.astype to the dtype of the second input (as Cast)."""

    def run(x: np.ndarray, like: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return as_std(x.astype(like.dtype, copy=False))

    return run
