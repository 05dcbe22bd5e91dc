"""numpy reference kernels for the elementwise math operators the PyTorch / transformers
exporters emit (issue 14): IsNaN, IsInf, Mod, the trigonometric and hyperbolic functions,
Floor, Ceil, Round, Sign, BitShift and Mean.

Every kernel keeps the ONNX output dtype (no silent upcasting) and follows onnx's reference
evaluator where the specification leaves a value open (Sign of NaN is NaN, an integer Mod by
zero is 0). Inputs outside a function's domain give NaN (asin(2), acosh(0.5)), overflow gives
+-inf (sinh(100) in float32), never an error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.elementwise import _dtype_supports, _register_unary
from impls.numpy.misc import (
    FLOAT_TYPES,
    INT_TYPES,
    NUMERIC_TYPES,
    as_std,
    check_dtypes,
)
from impls.numpy.table import impls

Kernel = Callable[..., Any]

# -- IsNaN / IsInf ---------------------------------------------------------------------------


@impls.register(
    "IsNaN", "ufunc", priority=Priority.DEFAULT, supports=_dtype_supports(FLOAT_TYPES, 1)
)
def isnan_ufunc(node: Node) -> Kernel:
    """IsNaN: np.isnan, a bool tensor of the input's shape."""

    def run(x: np.ndarray) -> np.ndarray:
        return as_std(np.isnan(x), bool)

    return run


@impls.register(
    "IsInf", "ufunc", priority=Priority.DEFAULT, supports=_dtype_supports(FLOAT_TYPES, 1)
)
def isinf_ufunc(node: Node) -> Kernel:
    """IsInf: +inf where detect_positive (default 1), -inf where detect_negative (default 1);
    with both off every element is false."""
    pos = bool(node.attr("detect_positive", 1))
    neg = bool(node.attr("detect_negative", 1))

    def run(x: np.ndarray) -> np.ndarray:
        if pos and neg:
            y = np.isinf(x)
        elif pos:
            y = np.isposinf(x)
        elif neg:
            y = np.isneginf(x)
        else:
            y = np.zeros(x.shape, dtype=bool)
        return as_std(y, bool)

    return run


# -- Mod -------------------------------------------------------------------------------------


def _supports_mod(node: Node) -> str | None:
    fmod = node.attr("fmod", 0)
    if fmod not in (0, 1):
        return f"Mod fmod must be 0 or 1; received {fmod!r}"
    if node.input(1) is None:
        return "Mod needs two inputs"
    return check_dtypes(node, NUMERIC_TYPES, (0, 1), same=True)


@impls.register("Mod", "ufunc", priority=Priority.DEFAULT, supports=_supports_mod)
def mod_ufunc(node: Node) -> Kernel:
    """Mod: fmod=0 is np.mod (A - floor(A / B) * B, the divisor's sign: Python's %), fmod=1 is
    np.fmod (C fmod, A - trunc(A / B) * B, the dividend's sign). Broadcasting; a float
    modulo by 0 is NaN, an integer one 0 (ONNX leaves it undefined)."""
    fn = np.fmod if int(node.attr("fmod", 0)) else np.mod

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return as_std(fn(a, b), a.dtype)

    return run


# -- unary math ------------------------------------------------------------------------------

_UNARY_MATH: tuple[tuple[str, Callable[..., Any], frozenset[str], str, str], ...] = (
    ("Sin", np.sin, FLOAT_TYPES, "Sin: np.sin.", "ufunc"),
    ("Cos", np.cos, FLOAT_TYPES, "Cos: np.cos.", "ufunc"),
    ("Tan", np.tan, FLOAT_TYPES, "Tan: np.tan.", "ufunc"),
    ("Asin", np.arcsin, FLOAT_TYPES, "Asin: np.arcsin (NaN outside [-1, 1]).", "ufunc"),
    ("Acos", np.arccos, FLOAT_TYPES, "Acos: np.arccos (NaN outside [-1, 1]).", "ufunc"),
    ("Atan", np.arctan, FLOAT_TYPES, "Atan: np.arctan.", "ufunc"),
    ("Sinh", np.sinh, FLOAT_TYPES, "Sinh: np.sinh (+-inf on overflow).", "ufunc"),
    ("Cosh", np.cosh, FLOAT_TYPES, "Cosh: np.cosh (+inf on overflow).", "ufunc"),
    ("Asinh", np.arcsinh, FLOAT_TYPES, "Asinh: np.arcsinh.", "ufunc"),
    ("Acosh", np.arccosh, FLOAT_TYPES, "Acosh: np.arccosh (NaN below 1).", "ufunc"),
    ("Atanh", np.arctanh, FLOAT_TYPES, "Atanh: np.arctanh (+-inf at +-1, NaN outside).", "ufunc"),
    ("Floor", np.floor, FLOAT_TYPES, "Floor: np.floor.", "ufunc"),
    ("Ceil", np.ceil, FLOAT_TYPES, "Ceil: np.ceil.", "ufunc"),
    ("Round", np.round, FLOAT_TYPES, "Round: np.round, halves to even (2.5 -> 2).", "half_even"),
    (
        "Sign",
        np.sign,
        NUMERIC_TYPES,
        "Sign: np.sign (-1, 0 or 1 in the input's dtype; NaN stays NaN).",
        "ufunc",
    ),
)

for _op, _fn, _types, _doc, _variant in _UNARY_MATH:
    _register_unary(_op, _fn, _types, _doc, _variant)


# -- BitShift --------------------------------------------------------------------------------


def _supports_bitshift(node: Node) -> str | None:
    direction = node.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        return f"BitShift direction must be 'LEFT' or 'RIGHT'; received {direction!r}"
    if node.input(1) is None:
        return "BitShift needs two inputs"
    return check_dtypes(node, INT_TYPES, (0, 1), same=True)


def _shift(x: np.ndarray, y: np.ndarray, left: bool) -> np.ndarray:
    """``x`` shifted by ``y`` bits; shifts outside [0, bits) give the sign fill alone (-1 for
    a right shift of a negative ``x``, else 0); a signed left shift discards the bits pushed
    past the sign bit (done on the unsigned view)."""
    x, y = np.broadcast_arrays(x, y)
    bits = np.iinfo(x.dtype).bits
    valid = (y >= 0) & (y < bits)
    amount = np.where(valid, y, 0).astype(np.uint64 if x.dtype.kind == "u" else np.int64)
    if left:
        unsigned = np.dtype(f"u{x.dtype.itemsize}")
        shifted = np.left_shift(x.view(unsigned) if x.dtype.kind == "i" else x,
                                amount.astype(unsigned)).view(x.dtype)
        return np.where(valid, shifted, x.dtype.type(0))
    shifted = np.right_shift(x, amount.astype(x.dtype))
    fill = np.where(x < 0, x.dtype.type(-1), x.dtype.type(0)) if x.dtype.kind == "i" else 0
    return np.where(valid, shifted, fill)


@impls.register("BitShift", "ufunc", priority=Priority.DEFAULT, supports=_supports_bitshift)
def bitshift_ufunc(node: Node) -> Kernel:
    """BitShift: broadcasting left / right shift (arithmetic for signed types); amounts that
    are negative or at least the bit width give 0 (-1 for a right shift of a negative value)."""
    left = node.attr("direction") == "LEFT"

    def run(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return as_std(_shift(x, y, left), x.dtype)

    return run


# -- Mean ------------------------------------------------------------------------------------


def _supports_mean(node: Node) -> str | None:
    if not node.inputs or any(v is None for v in node.inputs):
        return "Mean needs one or more (non-omitted) inputs"
    return check_dtypes(node, FLOAT_TYPES, range(len(node.inputs)), same=True)


@impls.register("Mean", "fold", priority=Priority.DEFAULT, supports=_supports_mean)
def mean_fold(node: Node) -> Kernel:
    """Mean: the broadcasting sum of the inputs (a left fold in the inputs' dtype) divided by
    their count."""

    def run(*xs: np.ndarray) -> np.ndarray:
        if not xs:
            raise ValueError("Mean needs at least one input")
        dt = xs[0].dtype
        with np.errstate(all="ignore"):
            total = functools.reduce(np.add, xs)
            return as_std(total / dt.type(len(xs)), dt)

    return run
