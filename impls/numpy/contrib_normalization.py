"""numpy references of onnxruntime's contrib normalizations (issue 52): ``com.microsoft``'s
SkipLayerNormalization and SkipSimplifiedLayerNormalization, and SimplifiedLayerNormalization,
which onnxruntime registers in ONNX's default domain (schemas: :mod:`dispatch.contrib_schemas`).

- ``SkipLayerNormalization(input, skip, gamma, beta?, bias?)``: ``s = input + skip (+ bias)``
  (skip of the input's shape, or broadcast over the batch: (1, S, H) or (S, H)), normalized
  over its last dimension, ``(s - mean) / sqrt(var + epsilon) * gamma (+ beta)``; outputs
  ``output``, ``mean`` and ``inv_std_var`` (float32, last dimension 1) and
  ``input_skip_bias_sum`` (``s``), the three last optional; epsilon 1e-12 by default.
- ``SkipSimplifiedLayerNormalization(input, skip, gamma, bias?)``: the same with the root mean
  square, ``s / sqrt(mean(s^2) + epsilon) * gamma``; its ``mean`` output is zeros (what
  onnxruntime 1.32 writes there: the simplified form computes no mean).
- ``SimplifiedLayerNormalization(X, scale)`` (default domain): ``X / sqrt(mean(X^2) + epsilon)
  * scale`` over the axes from ``axis`` (-1) to the last, epsilon 1e-5; Y has scale's type,
  ``inv_std_var`` is float32 (``stash_type`` 1) or float64 (11).

Statistics are computed in float64 and the results rounded to the output types.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.contrib_activations import MS_DOMAIN
from impls.numpy.misc import FLOAT_TYPES, check_dtypes, first_reason
from impls.numpy.table import impls

Kernel = Callable[..., Any]

#: onnxruntime's default epsilon of the skip normalizations (1e-12 as a float32)
SKIP_EPSILON = float(np.float32(1e-12))
#: SimplifiedLayerNormalization's default epsilon (1e-5 as a float32)
SIMPLIFIED_EPSILON = float(np.float32(1e-5))


def _shape(node: Node, k: int) -> tuple[int, ...] | None:
    v = node.input(k)
    return None if v is None or v.shape is None else tuple(v.shape)


def _skip_reason(node: Node) -> str | None:
    """Why the shapes of a skip normalization do not fit onnxruntime's rules, or ``None``."""
    x, skip = _shape(node, 0), _shape(node, 1)
    if x is None:
        return None
    if len(x) not in (2, 3):
        return f"the input must be 2-D or 3-D; received shape {list(x)}"
    if skip is not None and skip != x and not (
            len(skip) in (2, 3) and skip[-2:] == x[-2:] and (len(skip) == 2 or skip[0] == 1)):
        return (f"skip must have the input's shape {list(x)}, or (1, S, H) or (S, H) of it; "
                f"received shape {list(skip)}")
    for k in range(2, len(node.inputs)):
        v = _shape(node, k)
        if v is not None and v != x[-1:]:
            return f"input {k} must be 1-D of the hidden size {x[-1]}; received shape {list(v)}"
    return None


def _supports_skip(node: Node) -> str | None:
    return first_reason(check_dtypes(node, FLOAT_TYPES, range(len(node.inputs)), same=True),
                        _skip_reason(node))


def _skip_kernel(node: Node, simplified: bool) -> Kernel:
    eps = float(node.attr("epsilon", SKIP_EPSILON))
    n_out = len(node.outputs)
    # SkipLayerNormalization: input, skip, gamma, beta?, bias?; the simplified one has no beta
    bias_at = 3 if simplified else 4

    def run(x: np.ndarray, skip: np.ndarray, gamma: np.ndarray, *rest: np.ndarray | None) -> Any:
        opt = list(rest) + [None] * (bias_at - 2 - len(rest))
        beta = None if simplified else opt[0]
        bias = opt[bias_at - 3]
        s = x.astype(np.float64) + skip.astype(np.float64)
        if bias is not None:
            s = s + bias.astype(np.float64)
        if simplified:
            mean = np.zeros((*s.shape[:-1], 1))
            inv = 1.0 / np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + eps)
            y = s * inv * gamma.astype(np.float64)
        else:
            mean = np.mean(s, axis=-1, keepdims=True)
            centred = s - mean
            inv = 1.0 / np.sqrt(np.mean(centred * centred, axis=-1, keepdims=True) + eps)
            y = centred * inv * gamma.astype(np.float64)
            if beta is not None:
                y = y + beta.astype(np.float64)
        outs = (np.ascontiguousarray(y.astype(x.dtype)),
                np.ascontiguousarray(mean.astype(np.float32)),
                np.ascontiguousarray(inv.astype(np.float32)),
                np.ascontiguousarray(s.astype(x.dtype)))
        return outs[0] if n_out == 1 else outs[:n_out]

    return run


@impls.register("SkipLayerNormalization", "ms_float64", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_supports_skip)
def ms_skip_layer_norm(node: Node) -> Kernel:
    """com.microsoft SkipLayerNormalization: LayerNormalization of input + skip (+ bias)."""
    return _skip_kernel(node, simplified=False)


@impls.register("SkipSimplifiedLayerNormalization", "ms_float64", domain=MS_DOMAIN,
                priority=Priority.DEFAULT, supports=_supports_skip)
def ms_skip_simplified_layer_norm(node: Node) -> Kernel:
    """com.microsoft SkipSimplifiedLayerNormalization: RMS normalization of input + skip (+ bias)."""
    return _skip_kernel(node, simplified=True)


def _supports_simplified(node: Node) -> str | None:
    reason = first_reason(check_dtypes(node, FLOAT_TYPES, (0, 1)))
    if reason:
        return reason
    x, scale = _shape(node, 0), _shape(node, 1)
    stash = int(node.attr("stash_type", 1))
    if stash not in (1, 11):
        return f"stash_type must be 1 (float) or 11 (double); received {stash}"
    if x is None:
        return None
    axis = int(node.attr("axis", -1))
    if not -len(x) <= axis < len(x):
        return f"axis {axis} is out of range for X of rank {len(x)}"
    normalized = x[axis % len(x):]
    if scale is not None and (len(scale) > len(normalized) or any(
            s not in (1, n) for s, n in zip(scale[::-1], normalized[::-1]))):
        return (f"scale of shape {list(scale)} does not broadcast to the normalized dimensions "
                f"{list(normalized)}")
    return None


@impls.register("SimplifiedLayerNormalization", "float64", priority=Priority.DEFAULT,
                supports=_supports_simplified)
def simplified_layer_norm(node: Node) -> Kernel:
    """SimplifiedLayerNormalization (onnxruntime, default domain): RMS normalization times scale."""
    eps = float(node.attr("epsilon", SIMPLIFIED_EPSILON))
    axis = int(node.attr("axis", -1))
    stash = np.float64 if int(node.attr("stash_type", 1)) == 11 else np.float32
    n_out = len(node.outputs)

    def run(x: np.ndarray, scale: np.ndarray) -> Any:
        z = x.astype(np.float64)
        axes = tuple(range(axis % x.ndim, x.ndim))
        inv = 1.0 / np.sqrt(np.mean(z * z, axis=axes, keepdims=True) + eps)
        y = np.ascontiguousarray((z * inv * scale.astype(np.float64)).astype(scale.dtype))
        if n_out == 1:
            return y
        return y, np.ascontiguousarray(inv.astype(stash))

    return run
