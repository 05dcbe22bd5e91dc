"""numpy reference of onnxruntime's ``QAttention`` (domain ``com.microsoft``, issue 52): the
quantized Attention that ``quantize_dynamic`` writes for a BERT-style model's Attention node
(its input quantized as it runs by a DynamicQuantizeLinear, uint8; the packed Q, K, V weight
int8 or uint8; schema: :mod:`dispatch.contrib_schemas_quantized`).

``QKV = (input - input_zero_point) @ (weight - weight_zero_point) * (input_scale * weight_scale)
+ bias``, an exact integer product rescaled (weight_scale and weight_zero_point per tensor or per
column of the weight), then Attention's multi-head attention of
:mod:`impls.numpy.contrib_attention` (mask_index, unidirectional, past / present), in float64
and rounded to input_scale's type. onnxruntime accumulates in int32 and rescales in float32
(the tolerance of Attention covers the difference).

Not covered (refused, so that the node runs on onnxruntime): ``do_rotary``,
``past_present_share_buffer``, a weight other than 2-D (input hidden, 3 * hidden), an input
scale or zero point other than per tensor, a mask_index of another form than Attention's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.contrib_activations import MS_DOMAIN
from impls.numpy.contrib_attention import (
    MASK_FILTER_VALUE,
    attend,
    causal,
    mask_index_keep,
    merge_heads,
    split_heads,
)
from impls.numpy.misc import check_dtypes, first_reason
from impls.numpy.table import impls

Kernel = Callable[..., Any]

QTYPES = frozenset({"uint8", "int8"})


def _shape(node: Node, k: int) -> tuple[int, ...] | None:
    v = node.input(k)
    return None if v is None or v.shape is None else tuple(v.shape)


def _count(shape: tuple[Any, ...]) -> int | None:
    return math.prod(shape) if all(isinstance(d, int) for d in shape) else None


def _qattention_reason(node: Node) -> str | None:
    """Why a QAttention node is outside the covered forms, or ``None``."""
    for name in ("do_rotary", "past_present_share_buffer"):
        if int(node.attr(name, 0) or 0):
            return f"QAttention with {name}={int(node.attr(name))}: supported is 0"
    x, w, mask, past = _shape(node, 0), _shape(node, 1), _shape(node, 5), _shape(node, 8)
    if x is not None and len(x) != 3:
        return f"QAttention with input of shape {list(x)}: supported is 3-D (B, S, input hidden)"
    if w is not None and len(w) != 2:
        return f"QAttention with weight of shape {list(w)}: supported is 2-D (input hidden, 3 * hidden)"
    cols = w[1] if w is not None and isinstance(w[1], int) else None
    for k, name in ((3, "input_scale"), (6, "input_zero_point")):
        s = _shape(node, k)
        if s is not None and _count(s) not in (1, None):
            return f"QAttention with {name} of shape {list(s)}: supported is one value (per tensor)"
    for k, name in ((4, "weight_scale"), (7, "weight_zero_point")):
        s = _shape(node, k)
        if s is None:
            continue
        n = _count(s)
        if n is not None and n != 1 and not (len(s) == 1 and cols is not None and n == cols):
            return (f"QAttention with {name} of shape {list(s)}: supported are one value or one per "
                    f"column of the weight ({cols})")
    if mask is not None and x is not None:
        b = x[0]
        if not ((len(mask) == 1 and mask[0] in (b, 2 * b)) or len(mask) in (2, 3)):
            return (f"QAttention with mask_index of shape {list(mask)}: supported are (B,), (2B,), (B, T) "
                    f"and (B, S, T) (B is {b})")
    if past is not None and len(past) != 5:
        return f"QAttention with past of shape {list(past)}: supported is (2, B, N, P, H)"
    return None


def _supports_qattention(node: Node) -> str | None:
    return first_reason(check_dtypes(node, QTYPES, (0, 6), same=True),
                        check_dtypes(node, QTYPES, (1, 7), same=True),
                        check_dtypes(node, frozenset({"float32", "float16"}), (2, 3, 4, 8), same=True),
                        _qattention_reason(node))


def dequantized_product(x: np.ndarray, x_zero: np.ndarray | None, w: np.ndarray, w_zero: np.ndarray | None,
                        x_scale: np.ndarray, w_scale: np.ndarray) -> np.ndarray:
    """``(x - x_zero) @ (w - w_zero) * x_scale * w_scale`` in float64 (the integer product exact),
    w_zero and w_scale one value or one per column of w."""
    xz = 0 if x_zero is None else int(np.asarray(x_zero).reshape(-1)[0])
    wz = 0 if w_zero is None else np.asarray(w_zero).astype(np.int64).reshape(-1)
    acc = np.matmul(x.astype(np.int64) - xz, w.astype(np.int64) - wz).astype(np.float64)
    scale = float(np.asarray(x_scale).reshape(-1)[0]) * np.asarray(w_scale).astype(np.float64).reshape(-1)
    return acc * scale


@impls.register("QAttention", "ms_float64", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_supports_qattention)
def ms_qattention(node: Node) -> Kernel:
    """com.microsoft QAttention: the dequantized integer product of input and weight plus bias,
    split in thirds (Q, K, V), then Attention's multi-head attention."""
    heads = int(node.attr("num_heads"))
    filter_value = float(node.attr("mask_filter_value", MASK_FILTER_VALUE) or MASK_FILTER_VALUE)
    uni = bool(int(node.attr("unidirectional", 0)))
    given_scale = float(node.attr("scale", 0.0) or 0.0)
    n_out = len(node.outputs)

    def run(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, x_scale: np.ndarray, w_scale: np.ndarray,
            mask: np.ndarray | None = None, x_zero: np.ndarray | None = None,
            w_zero: np.ndarray | None = None, past: np.ndarray | None = None) -> Any:
        dtype = x_scale.dtype
        qkv = dequantized_product(x, x_zero, weight, w_zero, x_scale, w_scale) + bias.astype(np.float64)
        d = weight.shape[1] // 3
        q, k, v = (split_heads(qkv[..., j * d:(j + 1) * d], heads) for j in range(3))
        if past is not None:
            k = np.concatenate([past[0].astype(np.float64), k], axis=2)
            v = np.concatenate([past[1].astype(np.float64), v], axis=2)
        batch, _, s, head = q.shape
        t = k.shape[2]
        keep = None if mask is None else mask_index_keep(mask, batch, s, t)
        scale = given_scale if given_scale != 0.0 else 1.0 / math.sqrt(head)
        y = attend(q, k, v, scale, None, keep, filter_value, causal(s, t) if uni else None)
        y = np.ascontiguousarray(merge_heads(y).astype(dtype))
        return y if n_out == 1 else (y, np.ascontiguousarray(np.stack([k, v]).astype(dtype)))

    return run
