"""The custom operator ``com.example.FastGelu``: its schema, shape function, reference and
implementations.

``Y = 0.5 * Z * (1 + tanh(sqrt(2 / pi) * (Z + 0.044715 * Z**3)))`` with ``Z = X + bias``
(``Z = X`` without bias): the tanh approximation of GELU. ``bias`` is optional, 1-D, of the
size of X's last dimension. X and bias are float16, float32 or float64; Y has X's shape and
dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from onnx.defs import OpSchema

from dispatch.graph import Node
from dispatch.onnx_import import TensorInfo
from dispatch.registry import Priority

from .layouts import COLMAJOR
from .table import impls, reference

DOMAIN = "com.example"
OP = "FastGelu"
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715
FLOATS = ("float16", "float32", "float64")

_Param = OpSchema.FormalParameter
FAST_GELU_SCHEMA = OpSchema(
    OP, DOMAIN, 1,
    "GELU, tanh approximation, with an optional bias added to X first: "
    "Y = 0.5 * Z * (1 + tanh(sqrt(2/pi) * (Z + 0.044715 * Z^3))), Z = X + bias.",
    inputs=[
        _Param("X", "T", "input tensor"),
        _Param("bias", "T", "1-D bias of the size of X's last dimension, added to X first",
               param_option=OpSchema.FormalParameterOption.Optional),
    ],
    outputs=[_Param("Y", "T", "output tensor, of X's shape and type")],
    type_constraints=[("T", ["tensor(float16)", "tensor(float)", "tensor(double)"],
                       "floating-point tensors")],
)


def fast_gelu(x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """The operator's semantics (computed in float64, returned in X's dtype)."""
    z = np.asarray(x, np.float64)
    if bias is not None:
        z = z + np.asarray(bias, np.float64)
    y = 0.5 * z * (1.0 + np.tanh(SQRT_2_OVER_PI * (z + CUBIC * z**3)))
    return y.astype(np.asarray(x).dtype)


def fast_gelu_shapes(
    inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
) -> list[TensorInfo | None]:
    """Shape function: Y has X's dtype and shape; a bias must be 1-D of X's last dimension."""
    x = inputs[0] if inputs else None
    bias = inputs[1] if len(inputs) > 1 else None
    if x is None:
        return [None]
    if bias is not None and bias.shape is not None:
        if len(bias.shape) != 1:
            raise ValueError(f"bias must be 1-D, received shape {list(bias.shape)}")
        if x.shape is not None:
            if len(x.shape) == 0:
                raise ValueError("X is a scalar; a bias needs X to have a last dimension")
            last, size = x.shape[-1], bias.shape[0]
            if isinstance(last, int) and isinstance(size, int) and last != size:
                raise ValueError(
                    f"bias has {size} elements, expected {last} (X's last dimension; X has "
                    f"shape {list(x.shape)})"
                )
    return [TensorInfo(x.dtype, x.shape)]


def _supports(dtypes: Sequence[str]) -> Callable[[Node], str | None]:
    def supports(node: Node) -> str | None:
        x, bias = node.input(0), node.input(1)
        if x is None or x.shape is None or x.dtype is None:
            return f"needs X of static shape and dtype, received {x!r}"
        if np.dtype(x.dtype).name not in dtypes:
            return f"handles {'/'.join(dtypes)} X, received {np.dtype(x.dtype).name}"
        if bias is not None:
            if bias.shape is None or len(bias.shape) != 1 or not x.shape:
                return f"needs a 1-D bias and X of rank >= 1, received bias {bias!r}, X {x!r}"
            if bias.shape[0] != x.shape[-1]:
                return f"bias has {bias.shape[0]} elements, X's last dimension is {x.shape[-1]}"
            if bias.dtype != x.dtype:
                return f"bias dtype {bias.dtype} differs from X's {x.dtype}"
        return None

    return supports


@reference.register(OP, "reference", domain=DOMAIN, priority=Priority.FALLBACK,
                    supports=_supports(FLOATS))
def fast_gelu_reference(node: Node) -> Callable[..., np.ndarray]:
    """FastGelu reference: the formula in float64 (the semantics the others are checked against)."""
    return lambda x, bias=None: fast_gelu(x, bias)


def _gelu_inplace(z: np.ndarray) -> np.ndarray:
    """``z`` (a fresh float32 array) -> FastGelu(z), with two temporaries at most."""
    u = z * z
    u *= CUBIC
    u += 1.0
    u *= z
    u *= SQRT_2_OVER_PI
    np.tanh(u, out=u)
    u += 1.0
    u *= z
    u *= 0.5
    return u


@impls.register(OP, "tanh", domain=DOMAIN, priority=Priority.PREFERRED,
                supports=_supports(("float32",)))
def fast_gelu_tanh(node: Node) -> Callable[..., np.ndarray]:
    """FastGelu in float32, in place on one temporary (no float64 round trip)."""
    has_bias = node.input(1) is not None

    def run(x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        z = np.add(x, bias) if has_bias else np.array(x, np.float32, copy=True)
        return _gelu_inplace(z)

    return run


@impls.register(OP, "colmajor", domain=DOMAIN, priority=Priority.FALLBACK,
                supports=_supports(("float32",)), layouts_in=(COLMAJOR,),
                layouts_out=(COLMAJOR,))
def fast_gelu_colmajor(node: Node) -> Callable[..., np.ndarray]:
    """FastGelu in float32 on a column-major X (the bias runs along the stored array's first axis)."""
    has_bias = node.input(1) is not None

    def run(x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        if has_bias:
            assert bias is not None
            z = np.add(x, bias.reshape((-1,) + (1,) * (x.ndim - 1)))
        else:
            z = np.array(x, np.float32, copy=True)
        return _gelu_inplace(z)

    return run
