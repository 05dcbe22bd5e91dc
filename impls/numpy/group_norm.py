"""numpy reference kernels for InstanceNormalization and GroupNormalization.

Both normalise each (instance, group of channels) to zero mean and unit variance with a
two-pass variance (the mean, then the mean of the squared deviations), then scale and shift:

- InstanceNormalization: one group per channel, ``scale`` and ``B`` per channel; computed in
  float32 for float16 and float32 inputs, float64 for float64;
- GroupNormalization opsets 18 to 20: ``num_groups`` groups, ``scale`` and ``bias`` per
  *group* (the form opset 21 replaced); computed in the input type (float16 in float32);
- GroupNormalization from opset 21: ``scale`` and ``bias`` per *channel*; the normalisation
  runs in ``stash_type`` (float32 by default, as the spec says, float64 inputs included), the
  scale and shift in the input type (float16 in float32).

ONNX's function bodies compute the variance as E[x^2] - E[x]^2; the two-pass form gives the
same values without its cancellation (where x^2 overflows, e.g. |x| > 1.8e19 in float32, it
gives an infinite variance and so ``bias`` where the function body gives inf - inf = NaN).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.conv import compute_dtype
from impls.numpy.misc import FLOAT_TYPES, check_dtypes, first_reason
from impls.numpy.table import impls

Kernel = Callable[..., Any]


def _needs(node: Node, count: int) -> str | None:
    missing = [i for i in range(count) if node.input(i) is None]
    if missing:
        return f"{node.op_type} needs {count} inputs; input {missing[0]} is absent"
    return None


def _param_reason(node: Node, count: int, what: str) -> str | None:
    """Why inputs 1 and 2 are not 1-D of ``count`` values (``what`` names the count)."""
    for i, name in ((1, "scale"), (2, "bias")):
        v = node.input(i)
        if v is not None and v.shape is not None and tuple(v.shape) != (count,):
            return f"{node.op_type} {name} must have shape ({count},) ({what}); received {v.shape}"
    return None


def normalize_groups(x: np.ndarray, groups: int, eps: float, ct: np.dtype) -> np.ndarray:
    """``x`` (N, C, ...) normalised per (instance, group of C / groups channels), in ``ct``,
    shaped (N, groups, C / groups, prod(spatial))."""
    n, c = x.shape[:2]
    if c % groups:
        raise ValueError(f"the {c} channels of {x.shape} are not divisible into {groups} groups")
    xg = x.astype(ct, copy=True).reshape(n, groups, c // groups, -1)
    axes = (2, 3)
    if xg.shape[2] * xg.shape[3] == 0:
        return xg
    with np.errstate(all="ignore"):  # IEEE: squares overflow to inf, inf - inf = NaN
        xg -= xg.mean(axis=axes, keepdims=True)
        var = np.mean(np.square(xg), axis=axes, keepdims=True)
        xg /= np.sqrt(var + ct.type(eps))
    return xg


# -- InstanceNormalization -------------------------------------------------------------------


def _supports_instance_norm(node: Node) -> str | None:
    reason = first_reason(_needs(node, 3), check_dtypes(node, FLOAT_TYPES, (0, 1, 2), same=True))
    if reason:
        return reason
    xs = node.input(0).shape
    if xs is None:
        return None
    if len(xs) < 2:
        return f"InstanceNormalization needs X of rank >= 2 (N, C, ...); received shape {xs}"
    return _param_reason(node, xs[1], "one value per channel")


@impls.register(
    "InstanceNormalization", "twopass", priority=Priority.DEFAULT, supports=_supports_instance_norm
)
def instance_norm_twopass(node: Node) -> Kernel:
    """InstanceNormalization: per (instance, channel) two-pass mean and variance."""
    eps = float(node.attr("epsilon", 1e-5))

    def run(x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
        ct = compute_dtype(x.dtype)
        n, c = x.shape[:2]
        y = normalize_groups(x, c, eps, ct).reshape(n, c, -1)
        y *= scale.astype(ct, copy=False).reshape(1, c, 1)
        y += bias.astype(ct, copy=False).reshape(1, c, 1)
        return np.asarray(y.reshape(x.shape), dtype=x.dtype, order="C")

    return run


# -- GroupNormalization ----------------------------------------------------------------------


def _stash(node: Node) -> np.dtype | None:
    code = int(node.attr("stash_type", 1))
    try:
        dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code))
    except (KeyError, TypeError, ValueError):
        return None
    return dt if dt.kind == "f" else None


def _supports_group_norm(node: Node) -> str | None:
    reason = first_reason(_needs(node, 3), check_dtypes(node, FLOAT_TYPES, (0, 1, 2), same=True))
    if reason:
        return reason
    groups = node.attr("num_groups")
    if groups is None or int(groups) < 1:
        return f"GroupNormalization needs a num_groups attribute >= 1; received {groups!r}"
    groups = int(groups)
    if node.opset >= 21 and _stash(node) is None:
        return (f"GroupNormalization stash_type={node.attr('stash_type')} "
                "is not a floating-point type numpy has")
    xs = node.input(0).shape
    if xs is None:
        return None
    if len(xs) < 2:
        return f"GroupNormalization needs X of rank >= 2 (N, C, ...); received shape {xs}"
    if xs[1] % groups:
        return f"GroupNormalization channels {xs[1]} are not divisible by num_groups={groups}"
    if node.opset >= 21:
        return _param_reason(node, xs[1], "one value per channel from opset 21")
    return _param_reason(node, groups, "one value per group before opset 21")


@impls.register(
    "GroupNormalization", "twopass", priority=Priority.DEFAULT, supports=_supports_group_norm
)
def group_norm_twopass(node: Node) -> Kernel:
    """GroupNormalization: per (instance, group) two-pass statistics; scale and bias per group
    (opsets 18-20) or per channel (21, with stash_type)."""
    eps = float(node.attr("epsilon", 1e-5))
    groups = int(node.attr("num_groups"))
    per_channel = node.opset >= 21
    stash = _stash(node) if per_channel else None

    def run(x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
        ct = compute_dtype(x.dtype)
        _n, c = x.shape[:2]
        y = normalize_groups(x, groups, eps, stash or ct)
        y = y.astype(ct, copy=False)
        shape = (1, groups, c // groups, 1) if per_channel else (1, groups, 1, 1)
        y = y * scale.astype(ct, copy=False).reshape(shape)
        y += bias.astype(ct, copy=False).reshape(shape)
        return np.asarray(y.reshape(x.shape), dtype=x.dtype, order="C")

    return run
