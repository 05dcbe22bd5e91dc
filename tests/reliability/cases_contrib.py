"""Edge cases (see :mod:`tests.reliability.numerics_cases`) of onnxruntime's contrib operators
(issue 52: com.microsoft's Gelu, FastGelu, BiasGelu, QuickGelu, BiasSplitGelu,
SkipLayerNormalization, SkipSimplifiedLayerNormalization, FusedMatMul and the default-domain
SimplifiedLayerNormalization); registered into
:data:`~tests.reliability.numerics_cases.BUILDERS`, with the float64 formulas (:data:`ORACLES`)
that check their numpy references where onnx's ReferenceEvaluator knows no such operator.

Activations are (N, S, H) tensors of the edge kind's shapes ((N, C, H, W) read as N, H * W
positions of C features); biases, gammas and weights are constants ~1.
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
}
