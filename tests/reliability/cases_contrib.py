"""Edge cases (see :mod:`tests.reliability.numerics_cases`) of onnxruntime's contrib operators
(issue 52: com.microsoft's Gelu, FastGelu, BiasGelu, QuickGelu, BiasSplitGelu,
SkipLayerNormalization, SkipSimplifiedLayerNormalization, FusedMatMul, RotaryEmbedding,
MultiHeadAttention, Attention, GroupQueryAttention, MatMulNBits, DynamicQuantizeMatMul,
MatMulIntegerToFloat and the default-domain SimplifiedLayerNormalization); registered into
:data:`~tests.reliability.numerics_cases.BUILDERS`, with the float64 formulas (:data:`ORACLES`)
that check their numpy references where onnx's ReferenceEvaluator knows no such operator.

Activations are (N, S, H) tensors of the edge kind's shapes ((N, C, H, W) read as N, H * W
positions of C features); biases, gammas and weights are constants ~1. In the attention
cases the queries (and Attention's input) carry the edge values, keys and values are weights;
the quantized matmuls' integer inputs are the same integers on every edge kind.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper

from dispatch.graph import Node
from tests.reliability.numerics_cases import Build, Case, _sname, act_shapes, builder, gemm_shapes

MS = "com.microsoft"

#: Documented differences of these operators' cases (merged into test_edge_numerics'
#: DIFFERENCES): (implementation glob, op glob, edge glob) -> (the Tolerance's fields, why).
DIFFERENCES: dict[tuple[str, str, str], tuple[dict, str]] = {
    ("Region.onnxruntime.session*|Region.openvino.compiled",
     "SimplifiedLayerNormalization|com.microsoft::Skip*LayerNormalization", "huge|overflow"): (
        {"rtol": 0.0, "atol": 0.0, "not_compared": True},
        "the mean of the squares of inputs ~1e30 overflows float32 (onnxruntime's stash type, float "
        "for these operators; OpenVINO's float32): the libraries give x / inf = 0 where the reference, "
        "which sums in float64, gives the normalized values; the result is undefined in float32, so "
        "it is checked for shape and dtype only",
    ),
    ("Region.onnxruntime.session*|Region.openvino.compiled", "com.microsoft::*Attention", "huge|overflow"): (
        {"rtol": 0.0, "atol": 0.0, "not_compared": True},
        "queries and keys ~1e30 (or their projections) give attention scores past float32's range: "
        "the libraries' float32 scores overflow to inf and their softmax gives NaN, where the reference, "
        "which scores in float64, gives the attended values; undefined in float32, so checked for "
        "shape and dtype only",
    ),
    ("Region.onnxruntime.session*|Region.openvino.compiled", "com.microsoft::MatMulNBits", "overflow"): (
        {"rtol": 0.0, "atol": 0.0, "not_compared": True},
        "products ~1e38 of dequantized weights of both signs: the libraries' float32 partial sums "
        "overflow to inf where the reference's float64 sum ends within range (or the reverse, by "
        "summation order); undefined in float32, so checked for shape and dtype only",
    ),
}


def _seq_shapes(edge: str) -> list[tuple[int, int, int]]:
    return [(n, h * w, c) for n, c, h, w in act_shapes(edge, 2)]


def _done(b: Build, *outputs: str) -> Case:
    """:meth:`Build.done` for a model that imports com.microsoft."""
    from dispatch.contrib_schemas import register_all

    register_all()
    build = b.b.build

    def with_ms() -> onnx.ModelProto:
        model = build()
        model.opset_import.append(helper.make_opsetid(MS, 1))
        return model

    b.b.build = with_ms  # type: ignore[method-assign]
    return b.done(*outputs)


def _key(op: str) -> str:
    return op if op == "SimplifiedLayerNormalization" else f"{MS}::{op}"


@builder(*(_key(op) for op in ("Gelu", "QuickGelu", "FastGelu", "BiasGelu", "BiasSplitGelu")))
def activation_cases(key: str, edge: str) -> list[Case]:
    op = key.split("::")[-1]
    out = []
    for n, s, h in _seq_shapes(edge):
        b = Build(key, edge, _sname((n, s, h)))
        width = 2 * h if op == "BiasSplitGelu" else h
        x = b.x((n, s, width))
        if op in ("BiasGelu", "BiasSplitGelu") or (op == "FastGelu" and h % 2):
            inputs = [x, b.w((width,))]
        else:
            inputs = [x]
        attrs = {"alpha": 1.25} if op == "QuickGelu" and h % 2 else {}
        out.append(_done(b, b.op_(op, inputs, domain=MS, **attrs)))
    return out


@builder(*(_key(op) for op in ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization")))
def skip_norm_cases(key: str, edge: str) -> list[Case]:
    op = key.split("::")[-1]
    out = []
    for k, (n, s, h) in enumerate(_seq_shapes(edge)):
        b = Build(key, edge, _sname((n, s, h)))
        skip = b.x((n, s, h)) if k % 2 == 0 else b.x((s, h))  # skip broadcast over the batch
        inputs = [b.x((n, s, h)), skip, b.w((h,))]
        if op == "SkipLayerNormalization":
            inputs.append(b.w((h,)))  # beta
        inputs.append(b.w((h,)))  # bias
        out.append(_done(b, b.op_(op, inputs, domain=MS, epsilon=1e-5)))
    return out


@builder("SimplifiedLayerNormalization")
def simplified_norm_cases(key: str, edge: str) -> list[Case]:
    out = []
    for k, (n, s, h) in enumerate(_seq_shapes(edge)):
        b = Build(key, edge, _sname((n, s, h)))
        axis = -1 if k % 2 == 0 else -2
        scale = b.w((h,) if axis == -1 else (s, h))
        out.append(_done(b, b.op_("SimplifiedLayerNormalization", [b.x((n, s, h)), scale], axis=axis,
                                  epsilon=1e-5)))
    return out


@builder(_key("FusedMatMul"))
def fused_matmul_cases(key: str, edge: str) -> list[Case]:
    out = []
    for m, k, n in gemm_shapes(edge):
        b = Build(key, edge, f"{m}x{k}x{n}_transB")
        out.append(_done(b, b.op_("FusedMatMul", [b.x((2, m, k)), b.w((n, k))], domain=MS, transB=1,
                                  alpha=0.5)))
        b = Build(key, edge, f"{m}x{k}x{n}_transA")
        out.append(_done(b, b.op_("FusedMatMul", [b.x((2, k, m)), b.w((k, n))], domain=MS, transA=1)))
    return out


# -- attention, rotary embedding and the quantized matmuls ------------------------------------------


def _angles(rows: int, half: int) -> tuple[np.ndarray, np.ndarray]:
    """cos / sin caches of rotary angles (rows, half)."""
    theta = np.arange(rows)[:, None] / 10000.0 ** (np.arange(half)[None, :] / max(half, 1))
    return np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)


@builder(_key("RotaryEmbedding"))
def rotary_cases(key: str, edge: str) -> list[Case]:
    out = []
    for k, (n, s, h) in enumerate(_seq_shapes(edge)):
        b = Build(key, edge, _sname((n, s, h)))
        cos, sin = _angles(s + 3, h)
        inputs = [b.x((n, s, 2 * h)), b.const(np.array([2], np.int64)), b.const(cos), b.const(sin)]
        out.append(_done(b, b.op_("RotaryEmbedding", inputs, domain=MS, interleaved=k % 2)))
    return out


@builder(_key("MultiHeadAttention"))
def mha_cases(key: str, edge: str) -> list[Case]:
    out = []
    for n, s, h in _seq_shapes(edge):
        b = Build(key, edge, _sname((n, s, h)))
        inputs = [b.x((n, s, 2 * h)), b.w((n, s + 1, 2 * h)), b.w((n, s + 1, 2 * h))]
        out.append(_done(b, b.op_("MultiHeadAttention", inputs, domain=MS, num_heads=2)))
    return out


@builder(_key("Attention"))
def attention_cases(key: str, edge: str) -> list[Case]:
    out = []
    for k, (n, s, h) in enumerate(_seq_shapes(edge)):
        b = Build(key, edge, _sname((n, s, h)))
        inputs = [b.x((n, s, h)), b.w((h, 3 * 8)), b.w((3 * 8,))]
        out.append(_done(b, b.op_("Attention", inputs, domain=MS, num_heads=2, unidirectional=k % 2)))
    return out


@builder(_key("GroupQueryAttention"))
def gqa_cases(key: str, edge: str) -> list[Case]:
    out = []
    for n, s, h in _seq_shapes(edge):
        b = Build(key, edge, _sname((n, s, h)))
        inputs = [b.x((n, s, 4 * 8)), b.w((n, s, 2 * 8)), b.w((n, s, 2 * 8)), "", "",
                  b.const(np.full(n, s - 1, np.int32)), b.const(np.array(s, np.int32))]
        out.append(_done(b, b.op_("GroupQueryAttention", inputs, domain=MS, num_heads=4, kv_num_heads=2)))
    return out


def _nbits_weights(rng: np.random.Generator, n: int, k: int, block: int) -> tuple[np.ndarray, ...]:
    """Random 4-bit MatMulNBits weights: B (N, blocks, block / 2), scales, packed zero points."""
    blocks = -(-k // block)
    q = rng.integers(0, 16, (n, blocks, block)).astype(np.uint8)
    zero = rng.integers(0, 16, (n, blocks + blocks % 2)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.1, n * blocks).astype(np.float32)
    return q[..., 0::2] | (q[..., 1::2] << 4), scales, (zero[:, 0::2] | (zero[:, 1::2] << 4)).reshape(-1)


@builder(_key("MatMulNBits"))
def matmul_nbits_cases(key: str, edge: str) -> list[Case]:
    out = []
    for m, k, n in gemm_shapes(edge):
        block = 16 if k < 32 else 32
        b = Build(key, edge, f"{m}x{k}x{n}")
        w, scales, zero = _nbits_weights(b.rng, n, k, block)
        inputs = [b.x((m, k)), b.const(w), b.const(scales), b.const(zero)]
        out.append(_done(b, b.op_("MatMulNBits", inputs, domain=MS, K=k, N=n, bits=4, block_size=block)))
    return out


@builder(_key("DynamicQuantizeMatMul"))
def dynamic_quantize_matmul_cases(key: str, edge: str) -> list[Case]:
    out = []
    for m, k, n in gemm_shapes(edge):
        b = Build(key, edge, f"{m}x{k}x{n}")
        weights = b.rng.integers(-128, 128, (k, n)).astype(np.int8)
        inputs = [b.x((m, k)), b.const(weights), b.const(np.array(0.02, np.float32))]
        out.append(_done(b, b.op_("DynamicQuantizeMatMul", inputs, domain=MS)))
    return out


@builder(_key("MatMulIntegerToFloat"))
def matmul_integer_to_float_cases(key: str, edge: str) -> list[Case]:
    out = []
    for m, k, n in gemm_shapes(edge):
        b = Build(key, edge, f"{m}x{k}x{n}")
        a = b.rng.integers(0, 256, (m, k)).astype(np.uint8)
        weights = b.rng.integers(-128, 128, (k, n)).astype(np.int8)
        inputs = [b.x((m, k), array=a), b.const(weights), b.const(np.array(0.05, np.float32)),
                  b.const(np.linspace(0.01, 0.03, n, dtype=np.float32)), b.const(np.array(128, np.uint8))]
        out.append(_done(b, b.op_("MatMulIntegerToFloat", inputs, domain=MS)))
    return out


# -- float64 formulas of the references ---------------------------------------------------------


def _erf_gelu(z: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return 0.5 * z * (1 + erf(z / np.sqrt(2)))


def _gelu(node: Node, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    z = x.astype(np.float64) + (0 if bias is None else bias.astype(np.float64))
    return _erf_gelu(z).astype(x.dtype)


def _fast_gelu(node: Node, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    z = x.astype(np.float64) + (0 if bias is None else bias.astype(np.float64))
    with np.errstate(all="ignore"):
        y = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))
    return y.astype(x.dtype)


def _quick_gelu(node: Node, x: np.ndarray) -> np.ndarray:
    from scipy.special import expit

    z = x.astype(np.float64)
    return (z * expit(float(node.attr("alpha", np.float32(1.702))) * z)).astype(x.dtype)


def _bias_split_gelu(node: Node, x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    z = x.astype(np.float64) + bias
    half = z.shape[-1] // 2
    return (z[..., :half] * _erf_gelu(z[..., half:])).astype(x.dtype)


def _skip_norm(node: Node, x: np.ndarray, skip: np.ndarray, gamma: np.ndarray,
               *rest: np.ndarray) -> np.ndarray:
    simplified = node.op_type == "SkipSimplifiedLayerNormalization"
    eps = float(node.attr("epsilon", np.float32(1e-12)))
    beta = None if simplified else (rest[0] if rest else None)
    bias = rest[0] if simplified and rest else (rest[1] if len(rest) > 1 else None)
    with np.errstate(all="ignore"):
        s = x.astype(np.float64) + skip + (0 if bias is None else bias)
        if not simplified:
            s = s - s.mean(axis=-1, keepdims=True)
        y = s / np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + eps) * gamma
        y = y + (0 if beta is None else beta)
    return y.astype(x.dtype)


def _simplified_norm(node: Node, x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    eps = float(node.attr("epsilon", np.float32(1e-5)))
    axes = tuple(range(int(node.attr("axis", -1)) % x.ndim, x.ndim))
    z = x.astype(np.float64)
    with np.errstate(all="ignore"):
        y = z / np.sqrt(np.mean(z * z, axis=axes, keepdims=True) + eps) * scale
    return y.astype(scale.dtype)


def _fused_matmul(node: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if node.attr("transA", 0):
        a64 = np.swapaxes(a64, -1, -2)
    if node.attr("transB", 0):
        b64 = np.swapaxes(b64, -1, -2)
    with np.errstate(all="ignore"):
        return (float(node.attr("alpha", 1.0)) * (a64 @ b64)).astype(a.dtype)


def _softmax64(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _heads64(x: np.ndarray, heads: int) -> np.ndarray:
    n, s, d = x.shape
    return x.astype(np.float64).reshape(n, s, heads, d // heads).transpose(0, 2, 1, 3)


def _attend64(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False) -> np.ndarray:
    """softmax(q k^T / sqrt(H)) v of (N, heads, S, H) heads (k, v grouped to q's heads), back to
    (N, S, heads * H)."""
    k, v = (np.repeat(t, q.shape[1] // t.shape[1], axis=1) for t in (k, v))
    z = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s, t = z.shape[-2:]
        z = np.where(np.arange(t)[None, :] <= np.arange(s)[:, None] + t - s, z, -np.inf)
    y = _softmax64(z) @ v
    n, heads, s, h = y.shape
    return y.transpose(0, 2, 1, 3).reshape(n, s, heads * h)


def _rotary(node: Node, x: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    z = x.astype(np.float64)
    p = int(pos.reshape(-1)[0]) + np.arange(x.shape[1])
    c, s = cos[p].astype(np.float64), sin[p].astype(np.float64)
    if node.attr("interleaved", 0):
        a, b = z[..., 0::2], z[..., 1::2]
        y = np.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(z.shape)
    else:
        half = c.shape[-1]
        a, b = z[..., :half], z[..., half:]
        y = np.concatenate([a * c - b * s, a * s + b * c], axis=-1)
    return y.astype(x.dtype)


def _mha(node: Node, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    heads = int(node.attr("num_heads"))
    with np.errstate(all="ignore"):
        return _attend64(_heads64(q, heads), _heads64(k, heads), _heads64(v, heads)).astype(q.dtype)


def _attention(node: Node, x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    heads, d = int(node.attr("num_heads")), w.shape[1] // 3
    with np.errstate(all="ignore"):
        qkv = x.astype(np.float64) @ w + bias
        q, k, v = (_heads64(qkv[..., j * d:(j + 1) * d], heads) for j in range(3))
        return _attend64(q, k, v, bool(node.attr("unidirectional", 0))).astype(x.dtype)


def _gqa(node: Node, q: np.ndarray, k: np.ndarray, v: np.ndarray, *_: np.ndarray) -> np.ndarray:
    heads, kv_heads = int(node.attr("num_heads")), int(node.attr("kv_num_heads"))
    with np.errstate(all="ignore"):
        y = _attend64(_heads64(q, heads), _heads64(k, kv_heads), _heads64(v, kv_heads), True)
    return y.astype(q.dtype)


def _matmul_nbits(node: Node, a: np.ndarray, w: np.ndarray, scales: np.ndarray,
                  zero: np.ndarray) -> np.ndarray:
    n, k, block = int(node.attr("N")), int(node.attr("K")), int(node.attr("block_size"))
    q = np.stack([w & 15, w >> 4], axis=-1).reshape(n, -1)[:, :k].astype(np.float64)
    z = np.stack([zero & 15, zero >> 4], axis=-1).reshape(n, -1).astype(np.float64)
    col = np.arange(k) // block
    weights = (q - z[:, col]) * scales.reshape(n, -1)[:, col]
    with np.errstate(all="ignore"):
        return (a.astype(np.float64) @ weights.T).astype(a.dtype)


def _dynamic_quantize_matmul(node: Node, a: np.ndarray, b: np.ndarray, b_scale: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        lo, hi = min(float(a.min(initial=0)), 0.0), max(float(a.max(initial=0)), 0.0)
        scale = np.float32((hi - lo) / 255)
        if not np.isfinite(scale) or scale == 0:
            return np.full((a.shape[0], b.shape[1]), np.nan if not np.isfinite(scale) else 0.0, a.dtype)
        zero = np.clip(np.round(-np.float32(lo) / scale), 0, 255)
        q = np.clip(np.round(a / scale) + zero, 0, 255)
        return ((q - zero) @ b.astype(np.float64) * float(scale) * float(b_scale)).astype(a.dtype)


def _matmul_integer_to_float(node: Node, a: np.ndarray, b: np.ndarray, a_scale: np.ndarray,
                             b_scale: np.ndarray, a_zero: np.ndarray) -> np.ndarray:
    y = (a.astype(np.float64) - float(a_zero)) @ b.astype(np.float64)
    return (y * float(a_scale) * b_scale.astype(np.float64)).astype(a_scale.dtype)


#: the float64 formulas by registry op key (see numerics_harness.ORACLES)
ORACLES: dict[str, Callable[..., np.ndarray]] = {
    _key("Gelu"): _gelu,
    _key("BiasGelu"): _gelu,
    _key("FastGelu"): _fast_gelu,
    _key("QuickGelu"): _quick_gelu,
    _key("BiasSplitGelu"): _bias_split_gelu,
    _key("SkipLayerNormalization"): _skip_norm,
    _key("SkipSimplifiedLayerNormalization"): _skip_norm,
    "SimplifiedLayerNormalization": _simplified_norm,
    _key("FusedMatMul"): _fused_matmul,
    _key("RotaryEmbedding"): _rotary,
    _key("MultiHeadAttention"): _mha,
    _key("Attention"): _attention,
    _key("GroupQueryAttention"): _gqa,
    _key("MatMulNBits"): _matmul_nbits,
    _key("DynamicQuantizeMatMul"): _dynamic_quantize_matmul,
    _key("MatMulIntegerToFloat"): _matmul_integer_to_float,
}

# the QOperator-format operators and EmbedLayerNormalization: their own module (size), which
# takes this module's helpers (so imported last) and registers its builders
from tests.reliability import cases_contrib_quantized as _quantized  # noqa: E402

ORACLES.update(_quantized.ORACLES)
DIFFERENCES.update(_quantized.DIFFERENCES)
