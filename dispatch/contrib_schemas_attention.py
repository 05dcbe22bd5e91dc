"""onnxruntime's contrib attention operators, rotary embedding and quantized matmuls (domain
``com.microsoft``, issue 52) as schema data: ``RotaryEmbedding``, ``MultiHeadAttention``,
``Attention``, ``GroupQueryAttention``, ``MatMulNBits``, ``DynamicQuantizeMatMul`` and
``MatMulIntegerToFloat``, as onnxruntime 1.32 registers them, each with a shape function.
:mod:`dispatch.contrib_schemas` holds them in its one registry (``SCHEMAS``);
``tests/numpy/test_contrib_schemas.py`` compares them with onnxruntime's own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dispatch.contrib_schema_base import MS_DOMAIN, ContribSchema, Dim, NoDefault, Param, arg, known, params
from dispatch.op_schema import TensorInfo

ATTENTION_FLOATS = ("tensor(bfloat16)", "tensor(float)", "tensor(float16)")
INT32 = ("tensor(int32)",)
INT8S = ("tensor(int8)", "tensor(uint8)")
INT = NoDefault("INT")
FLOAT = NoDefault("FLOAT")
Ins = Sequence[TensorInfo | None]
Outs = list[TensorInfo | None]


def _dims(t: TensorInfo | None) -> tuple[Dim, ...] | None:
    return None if t is None or t.shape is None else tuple(t.shape)


def _div(a: Dim, b: Dim) -> Dim:
    return a // b if known(a) and known(b) and b else None  # type: ignore[operator]


def _mul(a: Dim, b: Dim) -> Dim:
    return a * b if known(a) and known(b) else None  # type: ignore[operator]


def _add(a: Dim, b: Dim) -> Dim:
    return a + b if known(a) and known(b) else None  # type: ignore[operator]


def rotary_shapes(inputs: Ins, attrs: Mapping[str, Any]) -> Outs:
    """output has input's dtype and shape."""
    x = arg(inputs, 0)
    return [None if x is None else TensorInfo(x.dtype, x.shape)]


def mha_shapes(inputs: Ins, attrs: Mapping[str, Any]) -> Outs:
    """output (B, S, N * Hv); present_key / present_value (B, N, P + L, H); qk (B, N, S, P + L).
    Dimensions the inputs' forms do not give are left unknown."""
    q = arg(inputs, 0)
    if q is None:
        return [None] * 4
    n = int(attrs.get("num_heads", 0)) or None
    qs, ks, vs, pk = (_dims(arg(inputs, k)) for k in (0, 1, 2, 6))
    b = qs[0] if qs else None
    s = qs[1] if qs else None
    dv: Dim = None
    if vs is not None and len(vs) == 3:
        dv = vs[2]
    elif vs is not None and len(vs) == 4:
        dv = _mul(vs[1], vs[3])
    elif qs is not None and len(qs) == 5:
        dv = _mul(qs[2], qs[4])
    elif ks is not None and len(ks) == 5:
        dv = _mul(ks[2], ks[4])
    h = _div(qs[2], n) if qs is not None and len(qs) == 3 else None
    hv = _div(dv, n)
    length: Dim = None
    if ks is not None and len(ks) == 3:
        length = ks[1]
    elif qs is not None and len(qs) == 5:
        length = qs[1]
    total = _add(pk[2] if pk is not None and len(pk) == 4 else 0, length)
    out = None if qs is None else (b, s, dv)
    return [TensorInfo(q.dtype, out), TensorInfo(q.dtype, (b, n, total, h)),
            TensorInfo(q.dtype, (b, n, total, hv)), TensorInfo(q.dtype, (b, n, s, total))]


def attention_shapes(inputs: Ins, attrs: Mapping[str, Any]) -> Outs:
    """output (B, S, Dv) with Dv ``qkv_hidden_sizes[2]`` or a third of the weights' columns;
    present (2, B, N, P + S, Dk / N)."""
    x = arg(inputs, 0)
    if x is None:
        return [None, None]
    xs, ws, ps = (_dims(arg(inputs, k)) for k in (0, 1, 4))
    n = int(attrs.get("num_heads", 0)) or None
    sizes = list(attrs.get("qkv_hidden_sizes") or [])
    if len(sizes) == 3:
        dk, dv = sizes[1], sizes[2]
    else:
        dk = dv = _div(ws[1], 3) if ws is not None and len(ws) == 2 else None
    if xs is None or len(xs) != 3:
        return [TensorInfo(x.dtype, None), TensorInfo(x.dtype, None)]
    b, s = xs[0], xs[1]
    past = ps[3] if ps is not None and len(ps) == 5 else (0 if arg(inputs, 4) is None else None)
    return [TensorInfo(x.dtype, (b, s, dv)), TensorInfo(x.dtype, (2, b, n, _add(past, s), _div(dk, n)))]


def gqa_shapes(inputs: Ins, attrs: Mapping[str, Any]) -> Outs:
    """output (B, S, N * H); present_key / present_value (B, Nkv, T, H), T known only when the
    model runs (the larger of the past buffer and ``total_sequence_length``); output_qk
    (B, N, S, T)."""
    q = arg(inputs, 0)
    if q is None:
        return [None] * 4
    qs = _dims(q)
    n, nkv = int(attrs.get("num_heads", 0)), int(attrs.get("kv_num_heads", 0))
    if qs is None or len(qs) != 3:
        return [TensorInfo(q.dtype, None)] * 4
    b, s, d = qs
    h = _div(d, n) if arg(inputs, 1) is not None else _div(d, n + 2 * nkv)  # packed QKV without key
    past = arg(inputs, 3)
    cache = past.dtype if past is not None and past.dtype is not None else q.dtype
    present = TensorInfo(cache, (b, nkv or None, None, h))
    return [TensorInfo(q.dtype, (b, s, _mul(n, h))), present, present, TensorInfo(q.dtype, (b, n, s, None))]


def matmul_nbits_shapes(inputs: Ins, attrs: Mapping[str, Any]) -> Outs:
    """Y (..., N) of A (..., K), in A's dtype."""
    a = arg(inputs, 0)
    if a is None:
        return [None]
    n = int(attrs.get("N", 0))
    return [TensorInfo(a.dtype, None if a.shape is None else (*a.shape[:-1], n))]


def quantized_matmul_shapes(
    inputs: Ins, attrs: Mapping[str, Any], out_input: int) -> Outs:
    """Y (..., M, N) of A (..., M, K) and a 2-D B (K, N), in input ``out_input``'s dtype."""
    a, b, o = arg(inputs, 0), arg(inputs, 1), arg(inputs, out_input)
    dtype = o.dtype if o is not None and o.dtype is not None else np.dtype(np.float32)
    if a is None or b is None or a.shape is None or b.shape is None or len(b.shape) != 2 or not a.shape:
        return [TensorInfo(dtype, None)]
    return [TensorInfo(dtype, (*a.shape[:-1], b.shape[1]))]


def _dq_matmul_shapes(inputs: Ins, attrs: Mapping[str, Any]) -> Outs:
    return quantized_matmul_shapes(inputs, attrs, 2)


def _int_to_float_shapes(inputs: Ins, attrs: Mapping[str, Any]) -> Outs:
    return quantized_matmul_shapes(inputs, attrs, 3)


_MHA_INPUTS = (*params("query", "key", "value", "bias", optional=("key", "value", "bias")),
               Param("key_padding_mask", "M", True), Param("attention_bias", "T", True),
               Param("past_key", "T", True), Param("past_value", "T", True),
               Param("past_sequence_length", "M", True), Param("cache_indirection", "M", True))
_GQA_INPUTS = (*params("query", "key", "value", optional=("key", "value")),
               *params("past_key", "past_value", optional=("past_key", "past_value"), type_str="T_CACHE"),
               *params("seqlens_k", "total_sequence_length", type_str="M"),
               *params("cos_cache", "sin_cache", optional=("cos_cache", "sin_cache")),
               Param("position_ids", "tensor(int64)", True),
               *params("attention_bias", "head_sink", optional=("attention_bias", "head_sink")),
               *params("k_scale", "v_scale", optional=("k_scale", "v_scale"), type_str="T_KV_SCALE"),
               *params("q_norm_weight", "k_norm_weight", optional=("q_norm_weight", "k_norm_weight")),
               Param("query_seqlens", "M", True))

ATTENTION_SCHEMAS: tuple[ContribSchema, ...] = (
    ContribSchema("RotaryEmbedding", MS_DOMAIN,
                  "Rotary position embedding of input (B, S, hidden) or (B, N, S, H) at position_ids "
                  "(1-D: an offset; 2-D: (B, S)) with cos_cache / sin_cache (max positions, rotary dim / 2).",
                  (Param("input", "T"), Param("position_ids", "M"), Param("cos_cache", "T"),
                   Param("sin_cache", "T")), params("output"),
                  (("interleaved", INT), ("is_packed_batching", INT), ("num_heads", INT),
                   ("rotary_embedding_dim", INT), ("scale", FLOAT)),
                  (("T", ATTENTION_FLOATS), ("M", ("tensor(int64)",))), rotary_shapes),
    ContribSchema("MultiHeadAttention", MS_DOMAIN,
                  "Multi-head attention of separate or packed query, key and value, with key padding "
                  "mask, attention bias and past key / value.",
                  _MHA_INPUTS, (Param("output", "T"), *params("present_key", "present_value",
                                                              optional=("present_key", "present_value")),
                                Param("qk", "QK", True)),
                  (("mask_filter_value", FLOAT), ("num_heads", NoDefault("INT", True)), ("scale", FLOAT),
                   ("unidirectional", 0)),
                  (("T", ATTENTION_FLOATS), ("QK", ATTENTION_FLOATS), ("M", INT32)), mha_shapes),
    ContribSchema("Attention", MS_DOMAIN,
                  "Multi-head self attention with the Q, K, V projections packed in one weight and bias.",
                  (*params("input", "weights", "bias", optional=("bias",)), Param("mask_index", "M", True),
                   Param("past", "T", True), Param("attention_bias", "T", True),
                   Param("past_sequence_length", "M", True)),
                  (Param("output", "T"), Param("present", "T", True)),
                  (("do_rotary", INT), ("mask_filter_value", FLOAT), ("num_heads", NoDefault("INT", True)),
                   ("past_present_share_buffer", INT), ("qkv_hidden_sizes", NoDefault("INTS")),
                   ("rotary_embedding_dim", INT), ("scale", FLOAT), ("unidirectional", 0)),
                  (("T", ATTENTION_FLOATS), ("M", INT32)), attention_shapes),
    ContribSchema("GroupQueryAttention", MS_DOMAIN,
                  "Grouped-query attention (kv_num_heads key / value heads shared by num_heads query "
                  "heads) with a key / value cache, rotary embedding and a local window.",
                  _GQA_INPUTS, (Param("output", "T"), *params("present_key", "present_value",
                                                              optional=("present_key", "present_value"),
                                                              type_str="T_CACHE"),
                                Param("output_qk", "T", True)),
                  (("causal", 1), ("do_rotary", INT), ("k_norm_epsilon", FLOAT), ("k_quant_type", "NONE"),
                   ("kv_cache_bit_width", INT), ("kv_num_heads", NoDefault("INT", True)),
                   ("local_window_size", -1), ("num_heads", NoDefault("INT", True)),
                   ("q_norm_epsilon", FLOAT), ("qk_norm_epsilon", float(np.float32(1e-6))), ("qk_output", 0),
                   ("rotary_interleaved", INT), ("scale", FLOAT), ("sliding_window_cache", 0),
                   ("smooth_softmax", -1), ("softcap", FLOAT), ("v_quant_type", "NONE")),
                  (("T", ATTENTION_FLOATS),
                   ("T_CACHE", (*ATTENTION_FLOATS, "tensor(float8e4m3fn)", *INT8S)),
                   ("T_KV_SCALE", ("tensor(float)",)), ("M", INT32)), gqa_shapes),
    ContribSchema("MatMulNBits", MS_DOMAIN,
                  "A times B^T, B (N, K) quantized to `bits` bits in blocks of block_size along K, with "
                  "scales, optional zero points, g_idx and bias.",
                  (Param("A", "T1"), Param("B", "T2"), Param("scales", "T1"),
                   Param("zero_points", "T3", True), Param("g_idx", "T4", True), Param("bias", "T1", True)),
                  (Param("Y", "T1"),),
                  (("K", NoDefault("INT", True)), ("N", NoDefault("INT", True)), ("accuracy_level", 0),
                   ("bits", 4), ("block_size", NoDefault("INT", True)), ("weight_prepacked", 0)),
                  (("T1", ATTENTION_FLOATS), ("T2", ("tensor(uint8)",)),
                   ("T3", (*ATTENTION_FLOATS, "tensor(uint8)")), ("T4", INT32)), matmul_nbits_shapes),
    ContribSchema("DynamicQuantizeMatMul", MS_DOMAIN,
                  "A quantized to uint8 per tensor as it runs, times the quantized B, dequantized (+ bias).",
                  (Param("A", "T1"), Param("B", "T2"), Param("b_scale", "T1"),
                   Param("b_zero_point", "T2", True), Param("bias", "T1", True)), (Param("Y", "T1"),), (),
                  (("T1", ("tensor(float)",)), ("T2", INT8S)), _dq_matmul_shapes),
    ContribSchema("MatMulIntegerToFloat", MS_DOMAIN,
                  "MatMulInteger of A and B dequantized by a_scale * b_scale (+ bias).",
                  (Param("A", "T1"), Param("B", "T2"), Param("a_scale", "T3"), Param("b_scale", "T3"),
                   Param("a_zero_point", "T1", True), Param("b_zero_point", "T2", True),
                   Param("bias", "T3", True)),
                  (Param("Y", "T3"),), (),
                  (("T1", INT8S), ("T2", INT8S), ("T3", ("tensor(float)", "tensor(float16)"))),
                  _int_to_float_shapes),
)
