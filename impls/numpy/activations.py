"""numpy reference kernels for the activation functions the PyTorch / transformers exporters
emit (issue 14): Softplus, HardSigmoid, PRelu, Selu, Celu, Softsign, ThresholdedRelu, Mish and
Shrink.

Each follows the ONNX formula in the input's dtype (attributes cast to it first), with the
numerically safe form where the naive one overflows: Softplus is ``np.logaddexp(0, x)``, so
log(1 + exp(x)) of x = 100 is 100, not inf. NaN propagates except where the formula selects
a constant on a comparison (ThresholdedRelu and Shrink give 0 for NaN, as onnx's reference).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.misc import (
    FLOAT_TYPES,
    NUMERIC_TYPES,
    as_std,
    check_dtypes,
    first_reason,
)
from impls.numpy.table import impls

Kernel = Callable[..., Any]

#: PRelu's T from opset 9 (floats before): floats and the 32/64-bit integers
PRELU_TYPES = FLOAT_TYPES | frozenset({"int32", "int64", "uint32", "uint64"})
#: HardSigmoid's defaults as the float32 attributes ONNX stores (0.2 is 0.200000003: a
#: float64 input is computed with the float32 value, as onnx's reference and onnxruntime do)
HARD_SIGMOID_ALPHA = float(np.float32(0.2))
HARD_SIGMOID_BETA = float(np.float32(0.5))
#: Selu's defaults (the constants of Klambauer et al., as float32 values)
SELU_ALPHA = 1.67326319217681884765625
SELU_GAMMA = 1.05070102214813232421875


def _supports_float(node: Node) -> str | None:
    return check_dtypes(node, FLOAT_TYPES)


def _softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)) without overflow: log(exp(0) + exp(x)) by np.logaddexp."""
    return np.logaddexp(x.dtype.type(0), x)


@impls.register("Softplus", "logaddexp", priority=Priority.DEFAULT, supports=_supports_float)
def softplus_logaddexp(node: Node) -> Kernel:
    """Softplus: log(1 + exp(x)) as np.logaddexp(0, x) (no overflow for large x)."""

    def run(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return as_std(_softplus(x), x.dtype)

    return run


@impls.register("HardSigmoid", "clip", priority=Priority.DEFAULT, supports=_supports_float)
def hard_sigmoid_clip(node: Node) -> Kernel:
    """HardSigmoid: max(0, min(1, alpha * x + beta)), alpha 0.2 and beta 0.5 by default."""
    alpha = float(node.attr("alpha", HARD_SIGMOID_ALPHA))
    beta = float(node.attr("beta", HARD_SIGMOID_BETA))

    def run(x: np.ndarray) -> np.ndarray:
        t = x.dtype.type
        with np.errstate(all="ignore"):
            y = np.maximum(t(0), np.minimum(t(1), x * t(alpha) + t(beta)))
        return as_std(y, x.dtype)

    return run


# -- PRelu -----------------------------------------------------------------------------------


def _unidirectional(x_shape: tuple[int, ...], s_shape: tuple[int, ...]) -> bool:
    """Whether a tensor of ``s_shape`` broadcasts to ``x_shape`` without changing it."""
    try:
        return np.broadcast_shapes(x_shape, s_shape) == tuple(x_shape)
    except ValueError:
        return False


def _supports_prelu(node: Node) -> str | None:
    x, s = node.input(0), node.input(1)
    if s is None:
        return "PRelu needs the slope input"
    reason = check_dtypes(node, PRELU_TYPES, (0, 1), same=True)
    if reason:
        return reason
    known = x is not None and x.shape is not None and s.shape is not None
    if known and not _unidirectional(tuple(x.shape), tuple(s.shape)):
        return (f"PRelu slope of shape {list(s.shape)} does not broadcast (unidirectionally) "
                f"to X of shape {list(x.shape)}")
    return None


@impls.register("PRelu", "where", priority=Priority.DEFAULT, supports=_supports_prelu)
def prelu_where(node: Node) -> Kernel:
    """PRelu: x where x > 0, else slope * x; slope broadcasts unidirectionally to X."""

    def run(x: np.ndarray, slope: np.ndarray) -> np.ndarray:
        if not _unidirectional(x.shape, slope.shape):
            raise ValueError(f"PRelu slope of shape {slope.shape} does not broadcast to X of "
                             f"shape {x.shape}")
        with np.errstate(all="ignore"):
            return as_std(np.where(x > 0, x, x * slope), x.dtype)

    return run


# -- exponential-linear family ---------------------------------------------------------------


@impls.register("Selu", "expm1", priority=Priority.DEFAULT, supports=_supports_float)
def selu_expm1(node: Node) -> Kernel:
    """Selu: gamma * (x where x > 0, else alpha * (exp(x) - 1)), with np.expm1; alpha and
    gamma default to 1.6732632 and 1.0507010."""
    alpha = float(node.attr("alpha", SELU_ALPHA))
    gamma = float(node.attr("gamma", SELU_GAMMA))

    def run(x: np.ndarray) -> np.ndarray:
        t = x.dtype.type
        with np.errstate(all="ignore"):
            y = np.where(x > 0, x, t(alpha) * np.expm1(x)) * t(gamma)
        return as_std(y, x.dtype)

    return run


def _supports_celu(node: Node) -> str | None:
    alpha = float(node.attr("alpha", 1.0))
    if alpha == 0:
        return "Celu alpha must be nonzero (the formula divides by it)"
    return check_dtypes(node, FLOAT_TYPES)


@impls.register("Celu", "expm1", priority=Priority.DEFAULT, supports=_supports_celu)
def celu_expm1(node: Node) -> Kernel:
    """Celu: max(0, x) + min(0, alpha * (exp(x / alpha) - 1)), alpha 1 by default."""
    alpha = float(node.attr("alpha", 1.0))

    def run(x: np.ndarray) -> np.ndarray:
        t = x.dtype.type
        with np.errstate(all="ignore"):
            neg = np.minimum(t(0), t(alpha) * np.expm1(x / t(alpha)))
            return as_std(np.maximum(t(0), x) + neg, x.dtype)

    return run


@impls.register("Softsign", "formula", priority=Priority.DEFAULT, supports=_supports_float)
def softsign_formula(node: Node) -> Kernel:
    """Softsign: x / (1 + |x|) (NaN at +-inf, as the formula and onnx's reference give)."""

    def run(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return as_std(x / (np.abs(x) + x.dtype.type(1)), x.dtype)

    return run


@impls.register("ThresholdedRelu", "where", priority=Priority.DEFAULT, supports=_supports_float)
def thresholded_relu_where(node: Node) -> Kernel:
    """ThresholdedRelu: x where x > alpha (default 1), else 0 (NaN gives 0)."""
    alpha = float(node.attr("alpha", 1.0))

    def run(x: np.ndarray) -> np.ndarray:
        t = x.dtype.type
        return as_std(np.where(x > t(alpha), x, t(0)), x.dtype)

    return run


@impls.register("Mish", "formula", priority=Priority.DEFAULT, supports=_supports_float)
def mish_formula(node: Node) -> Kernel:
    """Mish: x * tanh(softplus(x)), softplus by np.logaddexp (-inf gives NaN: -inf * 0)."""

    def run(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return as_std(x * np.tanh(_softplus(x)), x.dtype)

    return run


# -- Shrink ----------------------------------------------------------------------------------


def _supports_shrink(node: Node) -> str | None:
    return first_reason(check_dtypes(node, NUMERIC_TYPES))


@impls.register("Shrink", "where", priority=Priority.DEFAULT, supports=_supports_shrink)
def shrink_where(node: Node) -> Kernel:
    """Shrink: x + bias where x < -lambd, x - bias where x > lambd, else 0 (lambd 0.5, bias 0
    by default). Integer inputs are computed in float64 and truncated back, as onnx's
    reference does."""
    lambd, bias = float(node.attr("lambd", 0.5)), float(node.attr("bias", 0.0))

    def run(x: np.ndarray) -> np.ndarray:
        v = x.astype(np.float64) if x.dtype.kind in "iu" else x
        t = v.dtype.type
        with np.errstate(all="ignore"):
            y = np.where(v < t(-lambd), v + t(bias), np.where(v > t(lambd), v - t(bias), t(0)))
            return as_std(y.astype(x.dtype), x.dtype)

    return run
