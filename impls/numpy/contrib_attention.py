"""numpy references of onnxruntime's contrib attention operators (domain ``com.microsoft``,
issue 52): RotaryEmbedding, MultiHeadAttention, Attention and GroupQueryAttention (schemas:
:mod:`dispatch.contrib_schemas_attention`). What
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


def softmax(z: np.ndarray, sink: np.ndarray | None = None) -> np.ndarray:
    """Softmax over the last axis; with ``sink`` (broadcast to z's shape without its last axis)
    one more logit joins the denominator only: ``exp(z_i) / (exp(sink) + sum_j exp(z_j))``."""
    top = z.max(axis=-1, keepdims=True)
    if sink is not None:
        top = np.maximum(top, sink[..., None])
    e = np.exp(z - top)
    total = e.sum(axis=-1, keepdims=True)
    if sink is not None:
        total = total + np.exp(sink[..., None] - top)
    return e / total


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
    bnsh = k is not None and v is not None and len(k) == 4 and len(v) == 4
    for name, shape in (("query", q), ("key", k), ("value", v)):
        if shape is not None and len(shape) != 3 and not (bnsh and name != "query"):
            return (f"MultiHeadAttention with {name} of shape {list(shape)}: supported are 3-D (B, S, D) "
                    f"query, key and value, or key and value both (B, N, L, H) (packed forms are not)")
    if bnsh and _given(node, 6):
        return "MultiHeadAttention with (B, N, L, H) key and value and a past: not supported"
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
    """com.microsoft MultiHeadAttention of separate query, key and value (3-D, or key and value
    already as heads (B, N, L, H): a cross attention's cached keys, which get no bias): optional
    packed bias, key padding mask, attention bias, past key / value (present = past then the new
    keys), unidirectional (causal) self attention."""
    heads = int(node.attr("num_heads"))
    filter_value = float(node.attr("mask_filter_value", MASK_FILTER_VALUE))
    uni = bool(int(node.attr("unidirectional", 0)))
    n_out = len(node.outputs)

    def run(query: np.ndarray, key: np.ndarray, value: np.ndarray, bias: np.ndarray | None = None,
            mask: np.ndarray | None = None, attn_bias: np.ndarray | None = None,
            past_key: np.ndarray | None = None, past_value: np.ndarray | None = None, *_: Any) -> Any:
        q, k, v = _f64(query), _f64(key), _f64(value)
        if bias is not None:
            dq, dk = q.shape[2], k.shape[1] * k.shape[3] if k.ndim == 4 else k.shape[2]
            b64 = bias.astype(np.float64)
            q = q + b64[:dq]
            if k.ndim == 3:  # onnxruntime adds no bias to keys and values given as heads
                k, v = k + b64[dq:dq + dk], v + b64[dq + dk:]
        qh = split_heads(q, heads)
        kh, vh = (k, v) if k.ndim == 4 else (split_heads(k, heads), split_heads(v, heads))
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


# -- GroupQueryAttention ----------------------------------------------------------------------------

#: GroupQueryAttention inputs the reference does not take, by index
_GQA_UNSUPPORTED_INPUTS = {12: "k_scale", 13: "v_scale", 14: "q_norm_weight",
                           15: "k_norm_weight", 16: "query_seqlens"}
#: GroupQueryAttention attributes the reference takes only at their default
_GQA_DEFAULT_ONLY = {"k_quant_type": "NONE", "v_quant_type": "NONE", "kv_cache_bit_width": 0,
                     "sliding_window_cache": 0, "qk_output": 0}


def _gqa_reason(node: Node) -> str | None:
    """Why a GroupQueryAttention node is outside the covered forms, or ``None``."""
    for k, name in _GQA_UNSUPPORTED_INPUTS.items():
        if _given(node, k):
            return f"GroupQueryAttention with input {name}: not supported"
    for name, default in _GQA_DEFAULT_ONLY.items():
        value = node.attr(name, default)
        value = value.decode() if isinstance(value, bytes) else value
        if value != default:
            return f"GroupQueryAttention with {name}={value!r}: supported is {default!r}"
    if wants_output(node, 3):
        return "GroupQueryAttention's output_qk: not supported"
    if _given(node, 1) != _given(node, 2) or _given(node, 3) != _given(node, 4):
        return "GroupQueryAttention needs key and value (past_key and past_value) both or neither"
    heads, kv_heads = int(node.attr("num_heads", 0)), int(node.attr("kv_num_heads", 0))
    if kv_heads <= 0 or heads % kv_heads:
        return (f"GroupQueryAttention with num_heads={heads} and kv_num_heads={kv_heads}: num_heads must be "
                f"a positive multiple of kv_num_heads")
    if int(node.attr("do_rotary", 0)) and not (_given(node, 7) and _given(node, 8)):
        return "GroupQueryAttention with do_rotary=1 needs cos_cache and sin_cache"
    window, softcap = int(node.attr("local_window_size", -1)), float(node.attr("softcap", 0.0))
    if window > 0 and softcap > 0:
        return (f"GroupQueryAttention with local_window_size={window} and softcap={softcap} together: "
                f"supported is one or the other (onnxruntime 1.32's prompt kernel combines them by no "
                f"documented rule)")
    q = _shape(node, 0)
    if _given(node, 9) and int(node.attr("do_rotary", 0)) and (q is None or (q[0] > 1 and q[1] > 1)):
        return (f"GroupQueryAttention with position_ids and query of shape {None if q is None else list(q)}: "
                f"supported with batch 1 or one new position (onnxruntime 1.32 rotates every batch of a "
                f"longer step at batch 0's position ids)")
    if q is not None and len(q) != 3:
        return f"GroupQueryAttention with query of shape {list(q)}: supported is 3-D (B, S, D)"
    return None


def _supports_gqa(node: Node) -> str | None:
    return first_reason(check_dtypes(node, ATTENTION_TYPES, (0, 1, 2, 3, 4, 7, 8, 10, 11), same=True),
                        _gqa_reason(node))


def gqa_split(query: np.ndarray, key: np.ndarray | None, value: np.ndarray | None, heads: int,
              kv_heads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B, N, S, H) query and (B, Nkv, S, H) new keys and values, from separate inputs or from
    a query packing them ((B, S, (N + 2 Nkv) H))."""
    q = query.astype(np.float64)
    if key is None or value is None:
        head = q.shape[2] // (heads + 2 * kv_heads)
        q, key, value = (q[..., : heads * head], q[..., heads * head:(heads + kv_heads) * head],
                         q[..., (heads + kv_heads) * head:])
    return (split_heads(q, heads), split_heads(key.astype(np.float64), kv_heads),
            split_heads(value.astype(np.float64), kv_heads))


def gqa_visible(past: int, s: int, t: int, valid: int, is_causal: bool, window: int) -> np.ndarray:
    """(S, T) keys query i (position past + i) sees: the first ``valid``, not after itself when
    causal, and within the last ``window`` positions when window > 0."""
    j, i = np.arange(t)[None, :], past + np.arange(s)[:, None]
    seen = np.broadcast_to(j < valid, (s, t))
    if is_causal:
        seen = seen & (j <= i)
    if window > 0:
        seen = seen & (j > i - window)
    return seen


@impls.register("GroupQueryAttention", "ms_float64", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_supports_gqa)
def ms_group_query_attention(node: Node) -> Kernel:
    """com.microsoft GroupQueryAttention: each of kv_num_heads key / value heads serves
    num_heads / kv_num_heads query heads. Batch b holds ``seqlens_k[b] + 1`` valid positions
    after this step; its S new keys go at positions ``seqlens_k[b] + 1 - S`` on (0 on the first
    prompt, when ``total_sequence_length`` equals S: a right-padded prompt). present_key /
    present_value are (B, Nkv, max(past buffer, total_sequence_length), H): past's valid
    positions, then the new ones, zeros after (onnxruntime, given separate buffers, writes zeros
    there; where present shares past's buffer those positions keep past's values, which no
    query reads). Optional: rotary embedding of q and k at their positions (do_rotary,
    rotary_interleaved; position_ids (B, S) where given, else past + i), softcap,
    local_window_size, attention_bias over the first total_sequence_length keys, smooth_softmax
    and head_sink, causal=0."""
    heads, kv_heads = int(node.attr("num_heads")), int(node.attr("kv_num_heads"))
    is_causal = bool(int(node.attr("causal", 1)))
    window = int(node.attr("local_window_size", -1))
    softcap = float(node.attr("softcap", 0.0))
    rotary = bool(int(node.attr("do_rotary", 0)))
    interleaved = bool(int(node.attr("rotary_interleaved", 0)))
    smooth = int(node.attr("smooth_softmax", -1)) > 0
    n_out = len(node.outputs)

    def run(query: np.ndarray, key: np.ndarray | None, value: np.ndarray | None,
            past_key: np.ndarray | None, past_value: np.ndarray | None, seqlens_k: np.ndarray,
            total_length: np.ndarray, cos: np.ndarray | None = None, sin: np.ndarray | None = None,
            position_ids: np.ndarray | None = None, attn_bias: np.ndarray | None = None,
            head_sink: np.ndarray | None = None, *_: Any) -> Any:
        q, k, v = gqa_split(query, key, value, heads, kv_heads)
        batch, _, s, head = q.shape
        total = int(np.asarray(total_length).reshape(-1)[0])
        if total < max(s, 1):  # (also what tells load-time shape filling that present's length is data)
            raise ValueError(f"GroupQueryAttention: total_sequence_length {total} is below the {s} new "
                             f"positions (it must be positive)")
        buffer = 0 if past_key is None else past_key.shape[2]
        t = max(buffer, total)
        first_prompt = past_key is None or total == s
        present_k, present_v = np.zeros((batch, kv_heads, t, head)), np.zeros((batch, kv_heads, t, head))
        out = np.zeros((batch, heads, s, v.shape[-1]))
        scale = _scale(node, head)
        for b in range(batch):
            valid = int(seqlens_k[b]) + 1
            past = 0 if first_prompt else valid - s
            if past < 0 or past + s > t:
                raise ValueError(f"GroupQueryAttention: seqlens_k[{b}] = {valid - 1} with {s} new positions "
                                 f"and a cache of {t} positions places them outside the cache")
            qb, kb = q[b], k[b]
            if rotary:
                rows = np.arange(past, past + s) if position_ids is None else position_ids[b]
                c, sn = cache_rows(cos, rows), cache_rows(sin, rows)
                qb, kb = rotate(qb, c, sn, interleaved), rotate(kb, c, sn, interleaved)
            if past_key is not None and past_value is not None:
                present_k[b, :, :past] = past_key[b, :, :past]
                present_v[b, :, :past] = past_value[b, :, :past]
            present_k[b, :, past:past + s], present_v[b, :, past:past + s] = kb, v[b]
            group = heads // kv_heads
            keys, values = np.repeat(present_k[b], group, axis=0), np.repeat(present_v[b], group, axis=0)
            scores = np.matmul(qb, np.swapaxes(keys, -1, -2)) * scale
            if softcap > 0:
                scores = softcap * np.tanh(scores / softcap)
            if attn_bias is not None:
                scores[..., : attn_bias.shape[-1]] += attn_bias[b if attn_bias.shape[0] > 1 else 0]
            scores = np.where(gqa_visible(past, s, t, valid, is_causal, window), scores, -np.inf)
            sink = None
            if head_sink is not None:
                sink = np.broadcast_to(head_sink.astype(np.float64)[:, None], (heads, s))
            elif smooth:
                sink = np.zeros((heads, s))
            if s:
                out[b] = np.matmul(softmax(scores, sink), values)
        cache_type = query.dtype if past_key is None else past_key.dtype
        outs = (_as(merge_heads(out), query.dtype), _as(present_k, cache_type), _as(present_v, cache_type))
        return outs[0] if n_out == 1 else outs[:n_out]

    return run
