"""numpy references of onnxruntime's contrib activations (domain ``com.microsoft``, issue 52):
Gelu, FastGelu, BiasGelu, QuickGelu and BiasSplitGelu, as onnxruntime's ContribOperators.md
defines them (schemas: :mod:`dispatch.contrib_schemas`).

- ``Gelu(X) = 0.5 * X * (1 + erf(X / sqrt(2)))``;
- ``FastGelu(X, bias) = 0.5 * Z * (1 + tanh(sqrt(2 / pi) * (Z + 0.044715 * Z^3)))``, ``Z = X + bias``
  (bias optional, 1-D of X's last dimension);
- ``BiasGelu(A, B) = Gelu(A + B)``, B 1-D of A's last dimension;
- ``QuickGelu(X) = X * sigmoid(alpha * X)``, alpha 1.702 by default;
- ``BiasSplitGelu(X, bias)``: ``Z = X + bias`` split in two halves of its last dimension,
  ``Y = left * Gelu(right)`` (onnxruntime runs it on CUDA only).

float16 is computed in float32 (as onnxruntime does), float32 and float64 in their own type.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.misc import FLOAT_TYPES, as_std, check_dtypes, first_reason
from impls.numpy.table import impls

Kernel = Callable[..., Any]

#: onnxruntime's contrib domain (dispatch.contrib_schemas.MS_DOMAIN, not imported from there:
#: that module imports onnx, which a session started from a stored plan never loads)
MS_DOMAIN = "com.microsoft"

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715
#: QuickGelu's default alpha (1.702 as the float32 onnxruntime stores)
QUICK_GELU_ALPHA = float(np.float32(1.702))


def _compute(x: np.ndarray) -> np.ndarray:
    """``x`` in the type the formula runs in: float32 for float16, else its own."""
    return x.astype(np.float32) if x.dtype == np.float16 else x


def _erf(x: np.ndarray) -> np.ndarray:
    """scipy.special.erf, imported on first use (scipy.special is slow to import)."""
    from scipy.special import erf

    return erf(x)


def gelu(z: np.ndarray) -> np.ndarray:
    """GELU by erf, in ``z``'s dtype."""
    t = z.dtype.type
    return t(0.5) * z * (t(1) + _erf(z * t(1 / math.sqrt(2))))


def gelu_tanh(z: np.ndarray) -> np.ndarray:
    """GELU by the tanh approximation, in ``z``'s dtype."""
    t = z.dtype.type
    return t(0.5) * z * (t(1) + np.tanh(t(SQRT_2_OVER_PI) * (z + t(CUBIC) * z * z * z)))


def _biased(x: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    z = _compute(x)
    return z if bias is None else z + _compute(bias).astype(z.dtype, copy=False)


def _bias_reason(node: Node, k: int) -> str | None:
    """Why input ``k`` (a bias) does not fit: onnxruntime wants it 1-D of X's last dimension."""
    x, b = node.input(0), node.input(k)
    if b is None or b.shape is None or x is None or x.shape is None:
        return None
    if len(b.shape) != 1 or not x.shape or b.shape[0] != x.shape[-1]:
        return (f"the bias must be 1-D of X's last dimension ({list(x.shape)}); received shape "
                f"{list(b.shape)}")
    return None


def _supports(inputs: tuple[int, ...], bias: int | None = None) -> Callable[[Node], str | None]:
    def supports(node: Node) -> str | None:
        return first_reason(check_dtypes(node, FLOAT_TYPES, inputs, same=True),
                            None if bias is None else _bias_reason(node, bias))

    return supports


@impls.register("Gelu", "ms_erf", domain=MS_DOMAIN, priority=Priority.DEFAULT, supports=_supports((0,)))
def ms_gelu(node: Node) -> Kernel:
    """com.microsoft Gelu: 0.5 x (1 + erf(x / sqrt 2))."""

    def run(x: np.ndarray) -> np.ndarray:
        return as_std(gelu(_compute(x)), x.dtype)

    return run


@impls.register("FastGelu", "ms_tanh", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_supports((0, 1), bias=1))
def ms_fast_gelu(node: Node) -> Kernel:
    """com.microsoft FastGelu: the tanh approximation of GELU of X + bias (bias optional)."""

    def run(x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        return as_std(gelu_tanh(_biased(x, bias)), x.dtype)

    return run


@impls.register("BiasGelu", "ms_erf", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_supports((0, 1), bias=1))
def ms_bias_gelu(node: Node) -> Kernel:
    """com.microsoft BiasGelu: Gelu (erf) of A + B."""

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return as_std(gelu(_biased(a, b)), a.dtype)

    return run


@impls.register("QuickGelu", "ms_sigmoid", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_supports((0,)))
def ms_quick_gelu(node: Node) -> Kernel:
    """com.microsoft QuickGelu: x * sigmoid(alpha * x), alpha 1.702 by default."""
    alpha = float(node.attr("alpha", QUICK_GELU_ALPHA))

    def run(x: np.ndarray) -> np.ndarray:
        from scipy.special import expit

        z = _compute(x)
        return as_std(z * expit(z * z.dtype.type(alpha)), x.dtype)

    return run


def _supports_split(node: Node) -> str | None:
    x = node.input(0)
    if x is not None and x.shape is not None and (len(x.shape) != 3 or x.shape[-1] % 2):
        return f"BiasSplitGelu needs X 3-D with an even last dimension; received {list(x.shape)}"
    return _supports((0, 1), bias=1)(node)


@impls.register("BiasSplitGelu", "ms_halves", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_supports_split)
def ms_bias_split_gelu(node: Node) -> Kernel:
    """com.microsoft BiasSplitGelu: X + bias split in halves of the last dimension, left *
    Gelu(right)."""

    def run(x: np.ndarray, bias: np.ndarray) -> np.ndarray:
        z = _biased(x, bias)
        half = z.shape[-1] // 2
        return as_std(z[..., :half] * gelu(z[..., half:]), x.dtype)

    return run
