"""numpy references of onnxruntime's contrib attention operators (domain ``com.microsoft``,
issue 52): RotaryEmbedding, MultiHeadAttention and Attention; GroupQueryAttention is in
:mod:`impls.numpy.contrib_gqa` (schemas: :mod:`dispatch.contrib_schemas_attention`). What
onnxruntime 1.32's CPU provider computes is the truth; a form not covered here is refused by
the kernel's ``supports`` with the attribute or shape received and what is covered, so that
the dispatcher runs the node on onnxruntime.

The math, in (batch B, heads N, sequence S, head size H) layout:

- ``rotate(x, cos, sin)`` rotates the first ``rotary_dim`` features of every head by the angle
  of its position: pairs (x[2i], x[2i+1]) when interleaved, else (x[i], x[i + rotary_dim / 2]):
  ``(a, b) -> (a cos - b sin, a sin + b cos)``; the other features pass through.
- ``attend(q, k, v)`` is ``softmax(q k^T * scale + bias) v``, ``scale`` 1 / sqrt(H) unless
  given; masked keys get ``mask_filter_value`` (-10000) added to their scores, in float32 as
  onnxruntime does (a row whose keys are all masked is the softmax of its scores rounded at
  that magnitude, not a uniform row nor NaN); a causal (unidirectional) mask excludes the
  future keys outright (onnxruntime adds float32's lowest value), whatever the other masks.

Everything is computed in float64 and rounded to the input's type.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.contrib_activations import MS_DOMAIN
from impls.numpy.misc import check_dtypes, first_reason
from impls.numpy.table import impls

Kernel = Callable[..., Any]

#: the float types the attention references handle (bfloat16 has no numpy type)
ATTENTION_TYPES = frozenset({"float16", "float32"})
#: onnxruntime's default mask_filter_value (what a masked key's score gets added)
MASK_FILTER_VALUE = -10000.0


# -- the math ------------------------------------------------------------------------------------


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """(B, S, N * H) -> (B, N, S, H)."""
    b, s, d = x.shape
    return x.reshape(b, s, num_heads, d // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, N, S, H) -> (B, S, N * H)."""
    b, n, s, h = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, n * h)


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """``x`` (..., S, H) with its first ``2 * cos.shape[-1]`` features rotated by the angles whose
    cosines and sines are ``cos`` / ``sin`` (broadcast to (..., S, rotary_dim / 2))."""
    half = cos.shape[-1]
    out = x.copy()
    if interleaved:
        a, b = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        out[..., 0:2 * half:2] = a * cos - b * sin
        out[..., 1:2 * half:2] = a * sin + b * cos
    else:
        a, b = x[..., :half], x[..., half:2 * half]
        out[..., :half] = a * cos - b * sin
        out[..., half:2 * half] = a * sin + b * cos
    return out


def softmax(z: np.ndarray) -> np.ndarray:
    """Softmax over the last axis."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def masked_scores(scores: np.ndarray, keep: np.ndarray | None, filter_value: float) -> np.ndarray:
    """``scores`` with ``filter_value`` added where ``keep`` is false, the sum rounded to float32
    as onnxruntime computes it."""
    if keep is None:
        return scores
    added = scores.astype(np.float32) + np.where(keep, np.float32(0), np.float32(filter_value))
    return added.astype(np.float64)


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, bias: np.ndarray | None = None,
           keep: np.ndarray | None = None, filter_value: float = MASK_FILTER_VALUE,
           visible: np.ndarray | None = None) -> np.ndarray:
    """``softmax(q k^T * scale + bias (+ filter_value where not keep)) v`` over the ``visible``
    keys (a causal mask: the others are excluded, not filtered): q (B, N, S, H), k (B, N, T, H),
    v (B, N, T, Hv); ``bias``, ``keep`` and ``visible`` broadcast to (B, N, S, T)."""
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if bias is not None:
        scores = scores + bias
    if scores.size == 0:
        return np.zeros((*scores.shape[:-1], v.shape[-1]))
    scores = masked_scores(scores, keep, filter_value)
    if visible is not None:
        scores = np.where(visible, scores, -np.inf)
    return np.matmul(softmax(scores), v)


def causal(s: int, t: int) -> np.ndarray:
    """(S, T) keep mask of a causal attention whose S queries are the last of T positions."""
    return np.arange(t)[None, :] <= np.arange(s)[:, None] + (t - s)


def padding_keep(mask: np.ndarray, batch: int, s: int, t: int) -> np.ndarray:
    """A key padding mask as a keep mask broadcast to (B, 1, S, T): (B,) the number of valid
    keys of each batch (the first ones); (B, T) or (B, S, T) raw, 1 to keep."""
    if mask.ndim == 1:
        return (np.arange(t)[None, :] < mask[:, None])[:, None, None, :]
    if mask.ndim == 2:
        return (mask != 0)[:, None, None, :]
    return (mask != 0)[:, None, :, :]


# -- helpers of the kernels -----------------------------------------------------------------------


def _shape(node: Node, k: int) -> tuple[int, ...] | None:
    v = node.input(k)
    return None if v is None or v.shape is None else tuple(v.shape)


def _given(node: Node, k: int) -> bool:
    return node.input(k) is not None


def wants_output(node: Node, k: int) -> bool:
    """Whether the node's output ``k`` is named (not omitted)."""
    return len(node.outputs) > k and "__unused_" not in node.outputs[k].name


def _scale(node: Node, head_size: int) -> float:
    scale = float(node.attr("scale", 0.0))
    return scale if scale != 0.0 else 1.0 / math.sqrt(head_size)


def _as(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.ascontiguousarray(x.astype(dtype))


def _f64(x: np.ndarray | None) -> np.ndarray | None:
    return None if x is None else x.astype(np.float64)


# -- RotaryEmbedding -------------------------------------------------------------------------------


def rotary_layout(x: tuple[int, ...], cos: tuple[int, ...], heads: int, rdim: int) -> tuple[int, int] | str:
    """(num_heads, rotary_dim) of a RotaryEmbedding of input shape ``x`` and cache shape ``cos``
    with attributes ``num_heads`` and ``rotary_embedding_dim``, or why it is refused."""
    if len(x) not in (3, 4) or len(cos) != 2:
        return (f"RotaryEmbedding takes input (B, S, hidden) or (B, N, S, H) and cos_cache (positions, "
                f"rotary_dim / 2); received shapes {list(x)} and {list(cos)}")
    if rdim and not heads and len(x) == 3:
        return (f"RotaryEmbedding with rotary_embedding_dim={rdim} and no num_heads: onnxruntime "
                f"refuses it (num_heads must be given with a partial rotary dimension)")
    if rdim and 2 * cos[1] != rdim:
        return (f"RotaryEmbedding with rotary_embedding_dim={rdim} and cos_cache of {cos[1]} columns: "
                f"supported when the cache has rotary_embedding_dim / 2 columns (onnxruntime 1.32 reads "
                f"a wider cache with a row stride of rotary_embedding_dim / 2, not its own width)")
    head = x[3] if len(x) == 4 else (x[2] // heads if heads else 2 * cos[1])
    n = x[1] if len(x) == 4 else x[2] // max(head, 1)
    rdim = rdim or 2 * cos[1]
    if (len(x) == 3 and n * head != x[2]) or rdim > head:
        return (f"RotaryEmbedding: input {list(x)} with num_heads={heads} and a rotary dimension {rdim} "
                f"do not make whole heads of at least the rotary dimension")
    return n, rdim


def _rotary_attrs(node: Node) -> tuple[int, int]:
    return int(node.attr("num_heads", 0)), int(node.attr("rotary_embedding_dim", 0))


def _supports_rotary(node: Node) -> str | None:
    x, cos, pos = _shape(node, 0), _shape(node, 2), _shape(node, 1)
    reason = None
    if x is not None and cos is not None:
        layout = rotary_layout(x, cos, *_rotary_attrs(node))
        reason = layout if isinstance(layout, str) else None
    elif int(node.attr("rotary_embedding_dim", 0)) and not int(node.attr("num_heads", 0)):
        reason = "RotaryEmbedding with rotary_embedding_dim and no num_heads: onnxruntime refuses it"
    if pos is not None and not ((len(pos) <= 1 and math.prod(pos) == 1) or len(pos) == 2):
        reason = reason or (f"RotaryEmbedding's position_ids must be one offset (1 element) or (B, S); "
                            f"received shape {list(pos)}")
    return first_reason(check_dtypes(node, ATTENTION_TYPES, (0, 2, 3), same=True), reason)


def positions(pos: np.ndarray, batch: int, seq: int) -> np.ndarray:
    """(B, S) positions: ``pos`` itself (B, S), or one offset followed by the next ones."""
    if pos.ndim == 2:
        return pos.astype(np.int64)
    return np.broadcast_to(int(pos.reshape(-1)[0]) + np.arange(seq), (batch, seq))


def cache_rows(cache: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """``cache``'s rows at positions ``pos``, refusing positions outside the cache."""
    if pos.size and (pos.min() < 0 or pos.max() >= cache.shape[0]):
        raise ValueError(f"position ids range over [{pos.min()}, {pos.max()}], outside the cos/sin "
                         f"cache's {cache.shape[0]} positions")
    return cache[pos].astype(np.float64)


@impls.register("RotaryEmbedding", "ms_float64", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_supports_rotary)
def ms_rotary_embedding(node: Node) -> Kernel:
    """com.microsoft RotaryEmbedding: the first rotary_dim features of each head rotated by the
    angle of its position (``scale`` and ``is_packed_batching`` are ignored, as onnxruntime's CPU
    kernel ignores them)."""
    interleaved = bool(int(node.attr("interleaved", 0)))

    def run(x: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        layout = rotary_layout(x.shape, cos.shape, *_rotary_attrs(node))
        if isinstance(layout, str):  # shapes were unknown when the node was offered
            raise ValueError(layout)
        heads, rdim = layout
        b = x.shape[0]
        x4 = split_heads(x, heads) if x.ndim == 3 else x
        p = positions(pos, b, x4.shape[2])
        c, s = cache_rows(cos, p)[:, None, :, : rdim // 2], cache_rows(sin, p)[:, None, :, : rdim // 2]
        y = rotate(x4.astype(np.float64), c, s, interleaved)
        return _as(merge_heads(y) if x.ndim == 3 else y, x.dtype)

    return run


# -- MultiHeadAttention ----------------------------------------------------------------------------


def _mha_reason(node: Node) -> str | None:
    """Why a MultiHeadAttention node is outside the covered forms, or ``None``."""
    q, k, v, mask = _shape(node, 0), _shape(node, 1), _shape(node, 2), _shape(node, 4)
    if not (_given(node, 1) and _given(node, 2)):
        return ("MultiHeadAttention without key or value (packed QKV in query, packed KV in key): "
                "supported are separate 3-D query, key and value")
    for name, shape in (("query", q), ("key", k), ("value", v)):
        if shape is not None and len(shape) != 3:
            return (f"MultiHeadAttention with {name} of shape {list(shape)}: supported are 3-D (B, S, D) "
                    f"query, key and value (packed or BNSH forms are not)")
    for k_in, name in ((8, "past_sequence_length"), (9, "cache_indirection")):
        if _given(node, k_in):
            return f"MultiHeadAttention with input {name}: not supported (shared buffers, beam search)"
    if _given(node, 6) != _given(node, 7):
        return "MultiHeadAttention needs both past_key and past_value, or neither"
    if wants_output(node, 3):
        return "MultiHeadAttention's qk output: not supported"
    if mask is not None and len(mask) == 1 and q is not None and mask[0] != q[0]:
        return (f"MultiHeadAttention with a 1-D key_padding_mask of {mask[0]} elements: supported are (B,) "
                f"key lengths, (B, T) and (B, S, T) masks (B is {q[0]})")
    if mask is not None and len(mask) not in (1, 2, 3):
        return (f"MultiHeadAttention with key_padding_mask of shape {list(mask)}: supported are (B,), (B, T) "
                f"and (B, S, T)")
    uni = int(node.attr("unidirectional", 0))
    if uni and (q is None or k is None or q[1] != k[1]):
        return (f"MultiHeadAttention with unidirectional={uni} and query / key sequence lengths "
                f"{None if q is None else q[1]} / {None if k is None else k[1]}: supported when they are "
                f"known and equal (onnxruntime 1.32's causal mask of other lengths follows no documented "
                f"rule)")
    return None


def _supports_mha(node: Node) -> str | None:
    return first_reason(check_dtypes(node, ATTENTION_TYPES, (0, 1, 2, 3, 5, 6, 7), same=True),
                        _mha_reason(node))


@impls.register("MultiHeadAttention", "ms_float64", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_supports_mha)
def ms_multi_head_attention(node: Node) -> Kernel:
    """com.microsoft MultiHeadAttention of separate query, key and value: optional packed bias,
    key padding mask, attention bias, past key / value (present = past then the new keys),
    unidirectional (causal) self attention."""
    heads = int(node.attr("num_heads"))
    filter_value = float(node.attr("mask_filter_value", MASK_FILTER_VALUE))
    uni = bool(int(node.attr("unidirectional", 0)))
    n_out = len(node.outputs)

    def run(query: np.ndarray, key: np.ndarray, value: np.ndarray, bias: np.ndarray | None = None,
            mask: np.ndarray | None = None, attn_bias: np.ndarray | None = None,
            past_key: np.ndarray | None = None, past_value: np.ndarray | None = None, *_: Any) -> Any:
        q, k, v = _f64(query), _f64(key), _f64(value)
        if bias is not None:
            dq, dk = q.shape[2], k.shape[2]
            b64 = bias.astype(np.float64)
            q, k, v = q + b64[:dq], k + b64[dq:dq + dk], v + b64[dq + dk:]
        qh, kh, vh = split_heads(q, heads), split_heads(k, heads), split_heads(v, heads)
        if past_key is not None and past_value is not None:
            kh = np.concatenate([past_key.astype(np.float64), kh], axis=2)
            vh = np.concatenate([past_value.astype(np.float64), vh], axis=2)
        batch, _, s, head = qh.shape
        t = kh.shape[2]
        keep = None if mask is None else padding_keep(mask, batch, s, t)
        visible = causal(s, t) if uni else None
        y = attend(qh, kh, vh, _scale(node, head), _f64(attn_bias), keep, filter_value, visible)
        outs = (_as(merge_heads(y), query.dtype), _as(kh, query.dtype), _as(vh, query.dtype))
        return outs[0] if n_out == 1 else outs[:n_out]

    return run


# -- Attention --------------------------------------------------------------------------------------


def attention_sizes(node: Node, weights_cols: int) -> tuple[int, int, int]:
    """(Dq, Dk, Dv) of an Attention node: ``qkv_hidden_sizes`` or thirds of the weights' columns."""
    sizes = [int(d) for d in node.attr("qkv_hidden_sizes", []) or []]
    return (sizes[0], sizes[1], sizes[2]) if len(sizes) == 3 else (weights_cols // 3,) * 3


def mask_index_keep(mask: np.ndarray, batch: int, s: int, t: int) -> np.ndarray:
    """Attention's mask_index as a keep mask broadcast to (B, 1, S, T): (B,) valid lengths,
    (2B,) ends then starts of the valid keys, (B, T) or (B, S, T) raw masks (1 to keep)."""
    if mask.ndim == 1 and mask.shape[0] == 2 * batch:
        j = np.arange(t)[None, :]
        return ((j < mask[:batch, None]) & (j >= mask[batch:, None]))[:, None, None, :]
    return padding_keep(mask, batch, s, t)


def _attention_reason(node: Node) -> str | None:
    """Why an Attention node is outside the covered forms, or ``None``."""
    x, w, mask, past = _shape(node, 0), _shape(node, 1), _shape(node, 3), _shape(node, 4)
    for name in ("do_rotary", "past_present_share_buffer"):
        if int(node.attr(name, 0)):
            return f"Attention with {name}={int(node.attr(name))}: supported is 0"
    if _given(node, 6):
        return "Attention with input past_sequence_length (a shared past buffer): not supported"
    sizes = node.attr("qkv_hidden_sizes", []) or []
    if sizes and (len(sizes) != 3 or sizes[0] != sizes[1]):
        return (f"Attention with qkv_hidden_sizes={list(sizes)}: supported are three sizes with Q's equal "
                f"to K's")
    if x is not None and len(x) != 3:
        return f"Attention with input of shape {list(x)}: supported is 3-D (B, S, input hidden)"
    if sizes and _given(node, 4) and sizes[1] != sizes[2]:
        return f"Attention with past and qkv_hidden_sizes={list(sizes)}: past needs K's size equal to V's"
    if mask is not None and x is not None:
        b = x[0]
        if not ((len(mask) == 1 and mask[0] in (b, 2 * b)) or len(mask) in (2, 3)):
            return (f"Attention with mask_index of shape {list(mask)}: supported are (B,), (2B,), (B, T) "
                    f"and (B, S, T) (B is {b}; the (B, 1, M, M) and (3B + 2,) forms are not)")
    if past is not None and len(past) != 5:
        return f"Attention with past of shape {list(past)}: supported is (2, B, N, P, H)"
    if w is not None and len(w) != 2:
        return f"Attention with weights of shape {list(w)}: supported is 2-D"
    return None


def _supports_attention(node: Node) -> str | None:
    return first_reason(check_dtypes(node, ATTENTION_TYPES, (0, 1, 2, 4, 5), same=True),
                        _attention_reason(node))


@impls.register("Attention", "ms_float64", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_supports_attention)
def ms_attention(node: Node) -> Kernel:
    """com.microsoft Attention: Q, K, V = input @ weights + bias split by qkv_hidden_sizes (thirds
    by default), multi-head attention with mask_index, attention_bias, unidirectional (causal)
    and past (present = past then the new keys and values, stacked as (2, B, N, P + S, H))."""
    heads = int(node.attr("num_heads"))
    filter_value = float(node.attr("mask_filter_value", MASK_FILTER_VALUE))
    uni = bool(int(node.attr("unidirectional", 0)))
    n_out = len(node.outputs)

    def run(x: np.ndarray, weights: np.ndarray, bias: np.ndarray | None = None,
            mask: np.ndarray | None = None, past: np.ndarray | None = None,
            attn_bias: np.ndarray | None = None, *_: Any) -> Any:
        dq, dk, _dv = attention_sizes(node, weights.shape[1])
        qkv = np.matmul(x.astype(np.float64), weights.astype(np.float64))
        if bias is not None:
            qkv = qkv + bias.astype(np.float64)
        q = split_heads(qkv[..., :dq], heads)
        k = split_heads(qkv[..., dq:dq + dk], heads)
        v = split_heads(qkv[..., dq + dk:], heads)
        if past is not None:
            k = np.concatenate([past[0].astype(np.float64), k], axis=2)
            v = np.concatenate([past[1].astype(np.float64), v], axis=2)
        batch, _, s, head = q.shape
        t = k.shape[2]
        keep = None if mask is None else mask_index_keep(mask, batch, s, t)
        visible = causal(s, t) if uni else None
        y = attend(q, k, v, _scale(node, head), _f64(attn_bias), keep, filter_value, visible)
        y = _as(merge_heads(y), x.dtype)
        return y if n_out == 1 else (y, _as(np.stack([k, v]), x.dtype))

    return run
