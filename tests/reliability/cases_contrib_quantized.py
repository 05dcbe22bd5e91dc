"""Edge cases (see :mod:`tests.reliability.numerics_cases`) of onnxruntime's QOperator-format
operators and EmbedLayerNormalization (issue 52: com.microsoft's QLinearAdd, QLinearMul,
QLinearSigmoid, QLinearLeakyRelu, QLinearConcat, QLinearGlobalAveragePool, QLinearSoftmax,
QAttention, DynamicQuantizeLSTM, EmbedLayerNormalization, QEmbedLayerNormalization), registered into
:data:`~tests.reliability.numerics_cases.BUILDERS` by :mod:`tests.reliability.cases_contrib`
(which merges :data:`ORACLES` and :data:`DIFFERENCES` into its own).

The quantized operators' tensors are the same integers on every edge kind (their scales and
zero points constants); DynamicQuantizeLSTM's X carries the edge values; EmbedLayerNormalization's
ids are integers, its tables weights of the edge kind.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dispatch.graph import Node
from tests.reliability.cases_contrib import MS, _done, _key, _seq_shapes
from tests.reliability.numerics_cases import Build, Case, _sname, act_shapes, builder, gemm_shapes

_QOPS = ("QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat",
         "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearSoftmax", "QGemm")

#: Documented differences (merged into test_edge_numerics' DIFFERENCES): (implementation glob,
#: op glob, edge glob) -> (the Tolerance's fields, why).
DIFFERENCES: dict[tuple[str, str, str], tuple[dict, str]] = {
    ("*", "|".join(_key(op) for op in _QOPS), "*"): (
        {"rtol": 1e-5, "atol": 1e-6, "steps": 1},
        "a quantized output may be one step off (dispatch.compare.QUANTIZED_STEPS): a float32 value "
        "computed in another order, or by MLAS's polynomial sigmoid, can fall on the other side of a "
        "rounding half; QGemm's float output is a float32 rescaling of exact integers (the default "
        "tolerance)",
    ),
    ("Region.onnxruntime.session*", _key("DynamicQuantizeLSTM"), "huge|overflow|nonfinite"): (
        {"rtol": 0.0, "atol": 0.0, "not_compared": True},
        "X of ~1e30, +-inf or NaN gives a quantization scale past float32's range (or NaN): X is then "
        "not quantizable, the result undefined (the reference gives NaN, onnxruntime its saturated "
        "integers); checked for shape and dtype only",
    ),
}


def _ints(b: Build, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    info = np.iinfo(dtype)
    return b.rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def _qparams(b: Build, scale: float, dtype: type) -> list[str]:
    zero = 128 if dtype == np.uint8 else 0
    return [b.const(np.array(scale, np.float32)), b.const(np.array(zero + 3, dtype))]


@builder(*(_key(op) for op in _QOPS if op != "QGemm"))
def qlinear_cases(key: str, edge: str) -> list[Case]:
    op = key.split("::")[-1]
    out = []
    for k, shape in enumerate(act_shapes(edge, 2)):
        dtype = np.uint8 if k % 2 == 0 else np.int8
        b = Build(key, edge, _sname(shape))
        x = b.x(shape, array=_ints(b, shape, dtype))
        n, c, h, w = shape
        if op in ("QLinearAdd", "QLinearMul"):
            other = b.x((c, 1, 1), array=_ints(b, (c, 1, 1), dtype))
            inputs = [x, *_qparams(b, 0.05, dtype), other, *_qparams(b, 0.02, dtype),
                      *_qparams(b, 0.07, dtype)]
            out.append(_done(b, b.op_(op, inputs, domain=MS)))
        elif op in ("QLinearSigmoid", "QLinearLeakyRelu"):
            attrs = {"alpha": 0.2} if op == "QLinearLeakyRelu" and k % 2 else {}
            inputs = [x, *_qparams(b, 0.05, dtype), *_qparams(b, 1 / 256, dtype)]
            out.append(_done(b, b.op_(op, inputs, domain=MS, **attrs)))
        elif op == "QLinearConcat":
            other = b.x((n, 2, h, w), array=_ints(b, (n, 2, h, w), dtype))
            inputs = [*_qparams(b, 0.05, dtype), x, *_qparams(b, 0.05, dtype), other,
                      *_qparams(b, 0.03, dtype)]
            out.append(_done(b, b.op_(op, inputs, domain=MS, axis=1)))
        elif op == "QLinearSoftmax":  # the fused Softmax's opset: 13 (one axis) or 12 (the tail)
            opset, axis = (13, -1) if k % 2 == 0 else (12, 1)
            y_zero = np.array(0 if dtype == np.uint8 else -128, dtype)
            inputs = [x, *_qparams(b, 0.05, dtype), b.const(np.array(1 / 256, np.float32)), b.const(y_zero)]
            out.append(_done(b, b.op_(op, inputs, domain=MS, opset=opset, axis=axis)))
        elif op == "QLinearAveragePool":
            inputs = [x, *_qparams(b, 0.05, dtype), *_qparams(b, 0.03, dtype)]
            out.append(_done(b, b.op_(op, inputs, domain=MS, kernel_shape=[min(h, 3), min(w, 2)],
                                      pads=[1, 0, 1, 0] if h > 1 else [0, 0, 0, 0], count_include_pad=k % 2)))
        else:
            inputs = [x, *_qparams(b, 0.05, dtype), *_qparams(b, 0.03, dtype)]
            out.append(_done(b, b.op_(op, inputs, domain=MS, channels_last=k % 2)))
    return out


@builder(_key("QGemm"))
def qgemm_cases(key: str, edge: str) -> list[Case]:
    out = []
    for j, (m, k, n) in enumerate(gemm_shapes(edge)):
        b = Build(key, edge, f"{m}x{k}x{n}")
        a = b.x((m, k), array=_ints(b, (m, k), np.uint8))
        inputs = [a, *_qparams(b, 0.03, np.uint8), b.const(_ints(b, (n, k), np.int8)),
                  b.const(np.linspace(0.005, 0.02, n, dtype=np.float32)), b.const(np.zeros(n, np.int8)),
                  b.const(b.rng.integers(-500, 500, (n,)).astype(np.int32))]
        if j % 2:  # quantized output
            inputs += _qparams(b, 0.5, np.uint8)
        out.append(_done(b, b.op_("QGemm", inputs, domain=MS, transB=1, alpha=0.5)))
    return out


@builder(_key("QAttention"))
def qattention_cases(key: str, edge: str) -> list[Case]:
    out = []
    for k, (n, s, h) in enumerate(_seq_shapes(edge)):
        b = Build(key, edge, _sname((n, s, h)))
        x = b.x((n, s, h), array=_ints(b, (n, s, h), np.uint8))
        weight = b.const(_ints(b, (h, 24), np.int8))
        inputs = [x, weight, b.w((24,)), b.const(np.array(0.02, np.float32)),
                  b.const(np.array(0.01, np.float32)), "", b.const(np.array(120, np.uint8)),
                  b.const(np.array(2, np.int8))]
        out.append(_done(b, b.op_("QAttention", inputs, domain=MS, num_heads=2, unidirectional=k % 2)))
    return out


@builder(_key("DynamicQuantizeLSTM"))
def dynamic_quantize_lstm_cases(key: str, edge: str) -> list[Case]:
    out = []
    hidden = 4
    for k, (n, s, h) in enumerate(_seq_shapes(edge)):
        b = Build(key, edge, _sname((n, s, h)))
        dtype = np.int8 if k % 2 == 0 else np.uint8
        zero = 0 if dtype == np.int8 else 128
        bias = b.rng.normal(0, 0.1, (1, 8 * hidden)).astype(np.float32)
        inputs = [b.x((s, n, h)), b.const(_ints(b, (1, h, 4 * hidden), dtype)),
                  b.const(_ints(b, (1, hidden, 4 * hidden), dtype)), b.const(bias), "", "", "", "",
                  b.const(np.array([0.01], np.float32)), b.const(np.array([zero], dtype)),
                  b.const(np.array([0.02], np.float32)), b.const(np.array([zero], dtype))]
        out.append(_done(b, b.op_("DynamicQuantizeLSTM", inputs, domain=MS, hidden_size=hidden)))
    return out


@builder(_key("EmbedLayerNormalization"))
def embed_cases(key: str, edge: str) -> list[Case]:
    out = []
    for k, (n, s, h) in enumerate(_seq_shapes(edge)):
        b = Build(key, edge, _sname((n, s, h)))
        ids = b.x((n, s), array=b.rng.integers(0, 11, (n, s)).astype(np.int32))
        segs = b.x((n, s), array=b.rng.integers(0, 2, (n, s)).astype(np.int32))
        inputs = [ids, segs, b.w((11, h)), b.w((s + 2, h)), b.w((2, h)), b.w((h,)), b.w((h,))]
        eps = 1e-5 if k % 2 else 1e-12
        out.append(_done(b, b.op_("EmbedLayerNormalization", inputs, domain=MS, epsilon=eps)))
    return out


@builder(_key("QEmbedLayerNormalization"))
def qembed_cases(key: str, edge: str) -> list[Case]:
    out = []
    for k, (n, s, h) in enumerate(_seq_shapes(edge)):
        b = Build(key, edge, _sname((n, s, h)))
        dtype = np.uint8 if k % 2 == 0 else np.int8
        ids = b.x((n, s), array=b.rng.integers(0, 11, (n, s)).astype(np.int32))
        segs = b.x((n, s), array=b.rng.integers(0, 2, (n, s)).astype(np.int32))
        tables = [b.const(_ints(b, shape, dtype)) for shape in ((11, h), (s + 2, h), (2, h), (h,), (h,))]
        scales = [b.const(np.array(v, np.float32)) for v in (0.02, 0.01, 0.03, 0.008, 0.004)]
        points = (3, 1, 0, 2, 5) if dtype == np.int8 else (130, 128, 127, 3, 120)
        zeros = [b.const(np.array(z, dtype)) for z in points]
        inputs = [ids, segs, *tables, "", *scales, *zeros]
        eps = 1e-5 if k % 2 else 1e-12
        y, mask_index = b.op_("QEmbedLayerNormalization", inputs, 2, domain=MS, epsilon=eps)
        out.append(_done(b, y, mask_index))
    return out


# -- float64 formulas -----------------------------------------------------------------------------


def _requantize(v: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    info = np.iinfo(zero.dtype)
    return np.clip(np.rint(v / float(scale)) + int(zero), info.min, info.max).astype(zero.dtype)


def _deq(x: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    return (x.astype(np.float64) - int(zero)) * float(scale)


def _qbinary(node: Node, a, sa, za, b, sb, zb, sc, zc) -> np.ndarray:
    fa, fb = _deq(a, sa, za), _deq(b, sb, zb)
    return _requantize(fa + fb if node.op_type == "QLinearAdd" else fa * fb, sc, zc)


def _qunary(node: Node, x, sx, zx, sy, zy) -> np.ndarray:
    v = _deq(x, sx, zx)
    if node.op_type == "QLinearSigmoid":
        y = 1 / (1 + np.exp(-v))
    else:
        y = np.where(v >= 0, v, v * float(node.attr("alpha", np.float32(0.01))))
    return _requantize(y, sy, zy)


def _qconcat(node: Node, sy, zy, *triples) -> np.ndarray:
    parts = [_deq(triples[k], triples[k + 1], triples[k + 2]) for k in range(0, len(triples), 3)]
    return _requantize(np.concatenate(parts, axis=int(node.attr("axis"))), sy, zy)


def _qsoftmax(node: Node, x, sx, zx, sy, zy) -> np.ndarray:
    v = _deq(x, sx, zx)
    axis = int(node.attr("axis", -1))
    rows = v.reshape(int(np.prod(v.shape[:axis])), -1) if int(node.attr("opset")) < 13 else v
    e = np.exp(rows - rows.max(axis=-1, keepdims=True))
    return _requantize((e / e.sum(axis=-1, keepdims=True)).reshape(v.shape), sy, zy)


def _qpool(node: Node, x, sx, zx, sy, zy) -> np.ndarray:
    axes = (1, 2) if node.attr("channels_last", 0) else (2, 3)
    return _requantize(_deq(x, sx, zx).mean(axis=axes, keepdims=True), sy, zy)


def _qavgpool(node: Node, x, sx, zx, sy, zy) -> np.ndarray:
    kh, kw = (int(k) for k in node.attr("kernel_shape"))
    top, left, bottom, right = (int(p) for p in node.attr("pads"))
    v = _deq(x, sx, zx)
    padded = np.pad(v, ((0, 0), (0, 0), (top, bottom), (left, right)))
    inside = np.pad(np.ones(v.shape[2:]), ((top, bottom), (left, right)))
    oh, ow = padded.shape[2] - kh + 1, padded.shape[3] - kw + 1
    total = sum(padded[:, :, a:a + oh, c:c + ow] for a in range(kh) for c in range(kw))
    count = (np.full((oh, ow), kh * kw) if node.attr("count_include_pad", 0)
             else sum(inside[a:a + oh, c:c + ow] for a in range(kh) for c in range(kw)))
    return _requantize(total / count, sy, zy)


def _qgemm(node: Node, a, sa, za, b, sb, zb, c, *y) -> np.ndarray:
    w = b.T if node.attr("transB", 0) else b
    acc = (a.astype(np.float64) - float(za)) @ (w.astype(np.float64) - zb.astype(np.float64)) + c
    v = acc * float(sa) * sb.astype(np.float64) * float(node.attr("alpha", 1.0))
    return _requantize(v, y[0], y[1]) if y else v.astype(np.float32)


def _qattention(node: Node, x, w, bias, sx, sw, zx, zw) -> np.ndarray:
    from tests.reliability.cases_contrib import _attend64, _heads64

    heads, d = int(node.attr("num_heads")), w.shape[1] // 3
    qkv = _deq(x, sx, zx) @ _deq(w, sw, zw) + bias
    q, k, v = (_heads64(qkv[..., j * d:(j + 1) * d], heads) for j in range(3))
    return _attend64(q, k, v, bool(node.attr("unidirectional", 0))).astype(np.float32)


def _quantize_u8(a: np.ndarray) -> np.ndarray | None:
    """``a`` as uint8-quantized then dequantized (onnxruntime's dynamic quantization); None
    where its range is not finite."""
    lo, hi = min(float(a.min(initial=0)), 0.0), max(float(a.max(initial=0)), 0.0)
    scale = float(np.float32((hi - lo) / 255)) if hi > lo else 1.0
    if not np.isfinite(scale) or not np.isfinite(lo):
        return None
    zero = float(np.clip(np.rint(-lo / scale), 0, 255))
    return (np.clip(np.rint(a / scale) + zero, 0, 255) - zero) * scale


def _dq_lstm(node: Node, x, w, r, bias, *rest) -> np.ndarray:
    ws, wz, rs, rz = rest[-4:]
    hid = r.shape[1]
    with np.errstate(all="ignore"):
        seq, batch, _ = x.shape
        y = np.zeros((seq, 1, batch, hid))
        xq = _quantize_u8(x.astype(np.float64).reshape(seq * batch, -1))
        if xq is None:
            return np.full(y.shape, np.nan, np.float32)
        xw = (xq @ _deq(w[0], ws[0], wz[0])).reshape(seq, batch, -1) + bias[0, :4 * hid] + bias[0, 4 * hid:]
        h, c = np.zeros((batch, hid)), np.zeros((batch, hid))
        sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
        for t in range(seq):
            g = xw[t] + _quantize_u8(h) @ _deq(r[0], rs[0], rz[0])
            i, o, f, cc = (g[:, j * hid:(j + 1) * hid] for j in range(4))
            c = sig(f) * c + sig(i) * np.tanh(cc)
            h = sig(o) * np.tanh(c)
            y[t, 0] = h
    return y.astype(np.float32)


def _embed(node: Node, ids, segs, word, pos, seg, gamma, beta) -> np.ndarray:
    eps = float(node.attr("epsilon", np.float32(1e-12)))
    with np.errstate(all="ignore"):
        s = word.astype(np.float64)[ids] + pos.astype(np.float64)[np.arange(ids.shape[1])] + seg.astype(
            np.float64)[segs]
        z = s - s.mean(axis=-1, keepdims=True)
        y = z / np.sqrt((z * z).mean(axis=-1, keepdims=True) + eps) * gamma + beta
    return y.astype(word.dtype)


def _qembed(node: Node, ids, segs, word, pos, seg, gamma, beta, *params) -> tuple[np.ndarray, np.ndarray]:
    """(the tables dequantized, then EmbedLayerNormalization; mask_index zeros: no mask)"""
    scales, zeros = params[:5], params[5:]
    quantized = (word, pos, seg, gamma, beta)
    tables = [_deq(t, sc, z).astype(np.float32) for t, sc, z in zip(quantized, scales, zeros)]
    y = _embed(node, ids, segs, *tables)
    return y, np.zeros(ids.shape[0], np.int32)


#: the float64 formulas by registry op key (merged into cases_contrib.ORACLES)
ORACLES: dict[str, Callable[..., np.ndarray]] = {
    _key("QLinearAdd"): _qbinary,
    _key("QLinearMul"): _qbinary,
    _key("QLinearSigmoid"): _qunary,
    _key("QLinearLeakyRelu"): _qunary,
    _key("QLinearConcat"): _qconcat,
    _key("QLinearGlobalAveragePool"): _qpool,
    _key("QLinearAveragePool"): _qavgpool,
    _key("QGemm"): _qgemm,
    _key("QAttention"): _qattention,
    _key("DynamicQuantizeLSTM"): _dq_lstm,
    _key("EmbedLayerNormalization"): _embed,
    _key("QLinearSoftmax"): _qsoftmax,
    _key("QEmbedLayerNormalization"): _qembed,
}
