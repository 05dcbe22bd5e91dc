"""onnxruntime's quantized contrib operators of the QOperator format (what
``quantize_static`` / ``quantize_dynamic`` write with ``quant_format=QuantFormat.QOperator``)
and ``EmbedLayerNormalization`` (the transformers optimizer's fused embeddings), domain
``com.microsoft`` (issue 52), as schema data, as onnxruntime 1.32 registers them, each with a
shape function: ``QLinearAdd``, ``QLinearMul``, ``QLinearSigmoid``, ``QLinearLeakyRelu``,
``QLinearConcat``, ``QLinearGlobalAveragePool``, ``QLinearAveragePool``, ``QGemm``,
``QAttention``, ``DynamicQuantizeLSTM`` and ``EmbedLayerNormalization``.
:mod:`dispatch.contrib_schemas` holds them in its one registry (``SCHEMAS``);
``tests/numpy/test_contrib_schemas.py`` compares them with onnxruntime's own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dispatch.contrib_schema_base import MS_DOMAIN, ContribSchema, Dim, NoDefault, Param, arg, known
from dispatch.op_schema import TensorInfo

INT8S = ("tensor(uint8)", "tensor(int8)")
FLOAT = "tensor(float)"
INT = NoDefault("INT")
Ins = Sequence[TensorInfo | None]
Outs = list[TensorInfo | None]


def _dims(t: TensorInfo | None) -> tuple[Dim, ...] | None:
    return None if t is None or t.shape is None else tuple(t.shape)


def _broadcast(a: Sequence[Dim], b: Sequence[Dim]) -> tuple[Dim, ...]:
    """numpy's broadcast of two shapes; a dimension unknown where the inputs do not decide it."""
    a, b = tuple(a), tuple(b)
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out: list[Dim] = []
    for x, y in zip(a, b):
        if x == 1:
            out.append(y)
        elif y == 1 or x == y:
            out.append(x)
        elif known(x) and known(y):
            raise ValueError(f"shapes {list(a)} and {list(b)} do not broadcast")
        else:
            out.append(None)
    return tuple(out)


def binary_shapes(inputs: Ins, attrs: Mapping[str, Any]) -> Outs:
    """C: A and B (inputs 0 and 3) broadcast, in A's dtype."""
    a, b = arg(inputs, 0), arg(inputs, 3)
    if a is None:
        return [None]
    sa, sb = _dims(a), _dims(b)
    return [TensorInfo(a.dtype, None if sa is None or sb is None else _broadcast(sa, sb))]


def unary_shapes(inputs: Ins, attrs: Mapping[str, Any]) -> Outs:
    """Y has X's dtype and shape."""
    x = arg(inputs, 0)
    return [None if x is None else TensorInfo(x.dtype, x.shape)]


def concat_shapes(inputs: Ins, attrs: Mapping[str, Any]) -> Outs:
    """Y: the tensors (inputs 2, 5, 8...) concatenated along ``axis``, in Y_zero_point's dtype."""
    zp = arg(inputs, 1)
    dtype = zp.dtype if zp is not None else None
    shapes = [_dims(arg(inputs, k)) for k in range(2, len(inputs), 3)]
    if not shapes or any(s is None for s in shapes):
        return [TensorInfo(dtype, None)]
    rank = len(shapes[0])  # type: ignore[arg-type]
    axis = int(attrs.get("axis", 0))
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is outside the inputs' rank {rank}")
    axis %= rank
    out = list(shapes[0])  # type: ignore[arg-type]
    sizes = [s[axis] for s in shapes]  # type: ignore[index]
    out[axis] = sum(sizes) if all(known(d) for d in sizes) else None  # type: ignore[misc]
    return [TensorInfo(dtype, tuple(out))]


def global_pool_shapes(inputs: Ins, attrs: Mapping[str, Any]) -> Outs:
    """Y (N, C, 1, ...) of X (N, C, ...); with ``channels_last`` (N, 1, ..., C) of (N, ..., C)."""
    x = arg(inputs, 0)
    if x is None:
        return [None]
    s = _dims(x)
    if s is None or len(s) < 3:
        return [TensorInfo(x.dtype, None)]
    if int(attrs.get("channels_last", 0)):
        return [TensorInfo(x.dtype, (s[0], *(1,) * (len(s) - 2), s[-1]))]
    return [TensorInfo(x.dtype, (s[0], s[1], *(1,) * (len(s) - 2)))]


def dtype_only(index: int) -> Any:
    """A shape function giving one output of input ``index``'s dtype, its shape unknown."""

    def infer(inputs: Ins, attrs: Mapping[str, Any]) -> Outs:
        x = arg(inputs, index)
        return [TensorInfo(None if x is None else x.dtype, None)]

    return infer


def qgemm_shapes(inputs: Ins, attrs: Mapping[str, Any]) -> Outs:
    """Y (M, N): float32 without y_scale, else y_zero_point's dtype (A's without one)."""
    a, b, ys, yz = arg(inputs, 0), arg(inputs, 3), arg(inputs, 7), arg(inputs, 8)
    dtype = np.dtype(np.float32) if ys is None else (yz.dtype if yz is not None else (a.dtype if a else None))
    sa, sb = _dims(a), _dims(b)
    if sa is None or sb is None or len(sa) != 2 or len(sb) != 2:
        return [TensorInfo(dtype, None)]
    m = sa[1] if int(attrs.get("transA", 0)) else sa[0]
    n = sb[0] if int(attrs.get("transB", 0)) else sb[1]
    return [TensorInfo(dtype, (m, n))]


def qattention_shapes(inputs: Ins, attrs: Mapping[str, Any]) -> Outs:
    """output (B, S, D) with D a third of the weight's columns, in input_scale's dtype; present
    (2, B, N, P + S, D / N)."""
    x, scale = arg(inputs, 0), arg(inputs, 3)
    dtype = scale.dtype if scale is not None else np.dtype(np.float32)
    xs, ws, ps = _dims(x), _dims(arg(inputs, 1)), _dims(arg(inputs, 8))
    n = int(attrs.get("num_heads", 0)) or None
    d = ws[1] // 3 if ws is not None and len(ws) == 2 and known(ws[1]) else None  # type: ignore[operator]
    if xs is None or len(xs) != 3:
        return [TensorInfo(dtype, None), TensorInfo(dtype, None)]
    b, s = xs[0], xs[1]
    past: Dim = ps[3] if ps is not None and len(ps) == 5 else (0 if arg(inputs, 8) is None else None)
    total = past + s if known(past) and known(s) else None  # type: ignore[operator]
    head = d // n if d is not None and n else None
    return [TensorInfo(dtype, (b, s, d)), TensorInfo(dtype, (2, b, n, total, head))]


def lstm_shapes(inputs: Ins, attrs: Mapping[str, Any]) -> Outs:
    """Y (S, D, B, H), Y_h and Y_c (D, B, H) of X (S, B, I) and R (D, H, 4H), in X's dtype."""
    x = arg(inputs, 0)
    if x is None:
        return [None] * 3
    xs, rs = _dims(x), _dims(arg(inputs, 2))
    direction = attrs.get("direction", "forward")
    d = 2 if direction in ("bidirectional", b"bidirectional") else 1
    h: Dim = int(attrs["hidden_size"]) if attrs.get("hidden_size") is not None else (
        rs[1] if rs is not None and len(rs) == 3 else None)
    s, b = (xs[0], xs[1]) if xs is not None and len(xs) == 3 else (None, None)
    state = TensorInfo(x.dtype, (d, b, h))
    return [TensorInfo(x.dtype, (s, d, b, h)), state, state]


def embed_shapes(inputs: Ins, attrs: Mapping[str, Any]) -> Outs:
    """output and embedding_sum (B, S, H) of input_ids (B, S) and word_embedding (V, H), in
    word_embedding's dtype; mask_index (B,) int32."""
    ids, word = arg(inputs, 0), arg(inputs, 2)
    dtype = word.dtype if word is not None else None
    si, sw = _dims(ids), _dims(word)
    if si is not None and len(si) != 2:
        raise ValueError(f"input_ids must be 2-D (batch, sequence), received shape {list(si)}")
    b, s = (si[0], si[1]) if si is not None else (None, None)
    h = sw[1] if sw is not None and len(sw) == 2 else None
    out = TensorInfo(dtype, None if si is None else (b, s, h))
    return [out, TensorInfo(np.dtype(np.int32), (b,)), out]


def qembed_shapes(inputs: Ins, attrs: Mapping[str, Any]) -> Outs:
    """layernorm_out (B, S, H) float32 of input_ids (B, S) and word_embedding_quant (V, H);
    mask_index_out (B,) int32."""
    ids, word = _dims(arg(inputs, 0)), _dims(arg(inputs, 2))
    b, s = (ids[0], ids[1]) if ids is not None and len(ids) == 2 else (None, None)
    h = word[1] if word is not None and len(word) == 2 else None
    return [TensorInfo(np.dtype(np.float32), None if ids is None else (b, s, h)),
            TensorInfo(np.dtype(np.int32), (b,))]


def _qparams(*names: str, t: str = "T", optional_zero: bool = True) -> tuple[Param, ...]:
    """(X, X_scale, X_zero_point) triples of the named tensors."""
    out: list[Param] = []
    for n in names:
        out += [Param(n, t), Param(f"{n}_scale", FLOAT), Param(f"{n}_zero_point", t, optional_zero)]
    return tuple(out)


_BINARY_INPUTS = (*_qparams("A", "B"), Param("C_scale", FLOAT), Param("C_zero_point", "T", True))
_UNARY_INPUTS = (*_qparams("X"), Param("Y_scale", FLOAT), Param("Y_zero_point", "T", True))
_POOL_INPUTS = (Param("X", "T"), Param("x_scale", FLOAT), Param("x_zero_point", "T", True),
                Param("y_scale", FLOAT), Param("y_zero_point", "T", True))
_LSTM_INPUTS = (Param("X", "T"), Param("W", "T2"), Param("R", "T2"), Param("B", "T", True),
                Param("sequence_lens", "T1", True), Param("initial_h", "T", True),
                Param("initial_c", "T", True), Param("P", "T", True), Param("W_scale", "T"),
                Param("W_zero_point", "T2"), Param("R_scale", "T"), Param("R_zero_point", "T2"))
_EMBED_INPUTS = (Param("input_ids", "T1"), Param("segment_ids", "T1", True), Param("word_embedding", "T"),
                 Param("position_embedding", "T"), Param("segment_embedding", "T", True),
                 Param("gamma", "T"), Param("beta", "T"), Param("mask", "T1", True),
                 Param("position_ids", "T1", True))
_T8 = (("T", INT8S),)

QUANTIZED_SCHEMAS: tuple[ContribSchema, ...] = (
    ContribSchema("QLinearAdd", MS_DOMAIN,
                  "C = quantize(dequantize(A) + dequantize(B)), A and B broadcast, per-tensor scales.",
                  _BINARY_INPUTS, (Param("C", "T"),), (), _T8, binary_shapes),
    ContribSchema("QLinearMul", MS_DOMAIN,
                  "C = quantize(dequantize(A) * dequantize(B)), A and B broadcast, per-tensor scales.",
                  _BINARY_INPUTS, (Param("C", "T"),), (), _T8, binary_shapes),
    ContribSchema("QLinearSigmoid", MS_DOMAIN, "Y = quantize(sigmoid(dequantize(X))).",
                  _UNARY_INPUTS, (Param("Y", "T"),), (), _T8, unary_shapes),
    ContribSchema("QLinearLeakyRelu", MS_DOMAIN, "Y = quantize(leaky_relu(dequantize(X), alpha)).",
                  _UNARY_INPUTS, (Param("Y", "T"),), (("alpha", float(np.float32(0.01))),), _T8,
                  unary_shapes),
    ContribSchema("QLinearConcat", MS_DOMAIN,
                  "Y = quantize(concat(dequantize(X_i), axis)) of (X_i, scale_i, zero_point_i) triples.",
                  (Param("Y_scale", "TF"), Param("Y_zero_point", "T8"), Param("inputs", "TV", variadic=True)),
                  (Param("Y", "T8"),), (("axis", NoDefault("INT", True)),),
                  (("T8", INT8S), ("TF", (FLOAT,)), ("TV", (*INT8S, FLOAT))), concat_shapes),
    ContribSchema("QLinearGlobalAveragePool", MS_DOMAIN,
                  "Y = quantize(mean of dequantize(X) over the spatial axes), channels first or last.",
                  (Param("X", "T"), Param("x_scale", FLOAT), Param("x_zero_point", "T"),
                   Param("y_scale", FLOAT), Param("y_zero_point", "T")),
                  (Param("Y", "T"),), (("channels_last", 0),), _T8, global_pool_shapes),
    ContribSchema("QLinearAveragePool", MS_DOMAIN,
                  "Y = quantize(AveragePool(dequantize(X))), channels first or last.",
                  _POOL_INPUTS, (Param("Y", "T"),),
                  (("auto_pad", "NOTSET"), ("ceil_mode", 0), ("channels_last", 0), ("count_include_pad", 0),
                   ("kernel_shape", NoDefault("INTS", True)), ("pads", NoDefault("INTS")),
                   ("strides", NoDefault("INTS"))), _T8, dtype_only(0)),
    ContribSchema("QGemm", MS_DOMAIN,
                  "Y = alpha * (A - a_zero) (B - b_zero) a_scale b_scale + C, quantized when y_scale is "
                  "given.",
                  (Param("A", "TA"), Param("a_scale", "T"), Param("a_zero_point", "TA"), Param("B", "TB"),
                   Param("b_scale", "T"), Param("b_zero_point", "TB"), Param("C", "TC", True),
                   Param("y_scale", "T", True), Param("y_zero_point", "TYZ", True)),
                  (Param("Y", "TY"),), (("alpha", 1.0), ("transA", 0), ("transB", 0)),
                  (("T", (FLOAT,)), ("TA", INT8S), ("TB", INT8S), ("TC", ("tensor(int32)",)), ("TYZ", INT8S),
                   ("TY", (FLOAT, *INT8S))), qgemm_shapes),
    ContribSchema("QAttention", MS_DOMAIN,
                  "Attention of a quantized input and packed Q, K, V weight: (input - input_zero_point) "
                  "(weight - weight_zero_point) input_scale weight_scale + bias, then multi-head attention.",
                  (Param("input", "T1"), Param("weight", "T2"), Param("bias", "T3"),
                   Param("input_scale", "T3"),
                   Param("weight_scale", "T3"), Param("mask_index", "T4", True),
                   Param("input_zero_point", "T1", True), Param("weight_zero_point", "T2", True),
                   Param("past", "T3", True)),
                  (Param("output", "T3"), Param("present", "T3", True)),
                  (("do_rotary", INT), ("mask_filter_value", NoDefault("FLOAT")),
                   ("num_heads", NoDefault("INT", True)), ("past_present_share_buffer", INT),
                   ("scale", NoDefault("FLOAT")), ("unidirectional", 0)),
                  (("T1", INT8S), ("T2", INT8S), ("T3", (FLOAT, "tensor(float16)")),
                   ("T4", ("tensor(int32)",))),
                  qattention_shapes),
    ContribSchema("DynamicQuantizeLSTM", MS_DOMAIN,
                  "LSTM of float X with quantized W (D, I, 4H) and R (D, H, 4H) (scales and zero points "
                  "per direction or per column); X and the hidden state quantized to uint8 as it runs.",
                  _LSTM_INPUTS, (Param("Y", "T", True), Param("Y_h", "T", True), Param("Y_c", "T", True)),
                  (("activation_alpha", NoDefault("FLOATS")), ("activation_beta", NoDefault("FLOATS")),
                   ("activations", NoDefault("STRINGS")), ("clip", NoDefault("FLOAT")),
                   ("direction", "forward"),
                   ("hidden_size", INT), ("input_forget", 0)),
                  (("T", (FLOAT,)), ("T1", ("tensor(int32)",)), ("T2", INT8S)), lstm_shapes),
    ContribSchema("EmbedLayerNormalization", MS_DOMAIN,
                  "LayerNormalization of word, position (and segment) embeddings summed; mask_index: "
                  "the number of ones of each row of mask.",
                  _EMBED_INPUTS,
                  (Param("output", "T"), Param("mask_index", "T1", True), Param("embedding_sum", "T", True)),
                  (("epsilon", float(np.float32(1e-12))), ("mask_index_type", INT)),
                  (("T1", ("tensor(int32)",)), ("T", (FLOAT, "tensor(float16)"))), embed_shapes),
    ContribSchema("QEmbedLayerNormalization", MS_DOMAIN,
                  "EmbedLayerNormalization of quantized embedding tables, gamma and beta (dequantized "
                  "per tensor).",
                  (Param("input_ids", "T1"), Param("segment_ids", "T1", True),
                   Param("word_embedding_quant", "T2"), Param("position_embedding_quant", "T2"),
                   Param("segment_embedding", "T2", True), Param("gamma_quant", "T2"),
                   Param("beta_quant", "T2"), Param("mask", "T1", True),
                   Param("word_embedding_scale", "T"), Param("position_embedding_scale", "T"),
                   Param("segment_embedding_scale", "T", True), Param("gamma_scale", "T"),
                   Param("beta_scale", "T"), Param("word_embedding_zero_point", "T2"),
                   Param("position_embedding_zero_point", "T2"),
                   Param("segment_embedding_zero_point", "T2", True),
                   Param("gamma_zero_point", "T2"), Param("beta_zero_point", "T2")),
                  (Param("layernorm_out", "T"), Param("mask_index_out", "T1")),
                  (("epsilon", float(np.float32(1e-12))),),
                  (("T1", ("tensor(int32)",)), ("T2", ("tensor(int8)", "tensor(uint8)")), ("T", (FLOAT,))),
                  qembed_shapes),
    ContribSchema("QLinearSoftmax", MS_DOMAIN,
                  "Y = quantize(softmax(dequantize(X), axis)), over the axes of the Softmax opset it fused.",
                  (Param("X", "T"), Param("X_scale", FLOAT), Param("x_zero_point", "T", True),
                   Param("y_scale", FLOAT), Param("y_zero_point", "T")),
                  (Param("Y", "T"),), (("axis", -1), ("opset", NoDefault("INT", True))),
                  (("T", ("tensor(uint8)", "tensor(int8)")),), unary_shapes),
)
