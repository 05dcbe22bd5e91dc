"""Numeric agreement with the reference: per-op tolerances and the output comparison.

Every candidate, fused pattern, region and whole plan is accepted only if its outputs match the
numpy reference within the tolerance of the ops involved (:data:`TOLERANCE`; errors add up along
a chain, so a group of nodes takes the loosest) or, end to end, :data:`MODEL_TOLERANCE`. The
tuner checks candidates with it and a Session checks a plan tuned on its first run with it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dispatch.graph import Graph, Node

#: (rtol, atol relative to max(1, max |reference|)) per op; the default covers exact ops.
TOLERANCE: dict[str, tuple[float, float]] = {
    "Conv": (1e-3, 1e-4),
    "Gemm": (1e-3, 1e-4),
    "MatMul": (1e-3, 1e-4),
    "BatchNormalization": (1e-4, 1e-5),
    "LRN": (1e-4, 1e-5),
    "AveragePool": (1e-4, 1e-5),
    "GlobalAveragePool": (1e-4, 1e-5),
    "Softmax": (1e-4, 1e-6),
    "LogSoftmax": (1e-4, 1e-5),
    "LayerNormalization": (1e-3, 1e-4),
    # onnxruntime's contrib operators (dispatch.contrib_schemas), as their standard relatives
    "com.microsoft::FusedMatMul": (1e-3, 1e-4),
    "com.microsoft::SkipLayerNormalization": (1e-3, 1e-4),
    "com.microsoft::SkipSimplifiedLayerNormalization": (1e-3, 1e-4),
    "SimplifiedLayerNormalization": (1e-3, 1e-4),
    # attention: sums of products and a softmax, like MatMul; rotary embedding: a rotation
    # (a cos - b sin cancels); the quantized matmuls: MatMul's sums of products (MatMulNBits
    # with accuracy_level 4 declares int8 activations: INT8_ACTIVATIONS_TOLERANCE)
    "com.microsoft::MultiHeadAttention": (1e-3, 1e-4),
    "com.microsoft::Attention": (1e-3, 1e-4),
    "com.microsoft::GroupQueryAttention": (1e-3, 1e-4),
    "com.microsoft::RotaryEmbedding": (1e-4, 1e-5),
    "com.microsoft::MatMulNBits": (1e-3, 1e-4),
    "com.microsoft::DynamicQuantizeMatMul": (1e-3, 1e-4),
    "com.microsoft::MatMulIntegerToFloat": (1e-3, 1e-4),
    # the quantizers' QAttention as Attention (its integer product is exact); the optimizer's
    # EmbedLayerNormalization as LayerNormalization
    "com.microsoft::QAttention": (1e-3, 1e-4),
    # DynamicQuantizeLSTM quantizes its hidden state at every step: onnxruntime with several
    # threads quantizes each thread's share of the batch on its own (measured with onnxruntime
    # 1.32, 2 threads, batch 2: each row alone matches to 3e-7), the reference the whole batch
    # as onnxruntime does on one thread; a value one quantization step apart is carried through
    # the recurrence (measured up to 1.24e-2 at an output of 0.099, batch 3, 2 threads, 6 steps)
    "com.microsoft::DynamicQuantizeLSTM": (3e-2, 3e-2),
    "com.microsoft::EmbedLayerNormalization": (1e-3, 1e-4),
    # sums of products like Conv / MatMul, normalisations like LayerNormalization (a
    # variance of 0, one element per group, scales rounding errors by 1 / sqrt(epsilon))
    "ConvTranspose": (1e-3, 1e-4),
    "Einsum": (1e-3, 1e-4),
    "InstanceNormalization": (1e-3, 1e-4),
    "GroupNormalization": (1e-3, 1e-4),
    "MeanVarianceNormalization": (1e-3, 1e-4),
    "ReduceMean": (1e-4, 1e-5),
    "ReduceSum": (1e-4, 1e-5),
    # recurrences: a state carried over every step of the sequence
    "LSTM": (1e-3, 1e-4),
    "GRU": (1e-3, 1e-4),
    "RNN": (1e-3, 1e-4),
    # control flow: a body may be a whole model (silero-vad's If holds its LSTM decoder), so
    # errors add up as a model's do (MODEL_TOLERANCE)
    "If": (1e-3, 1e-4),
    "Loop": (1e-3, 1e-4),
    "Scan": (1e-3, 1e-4),
}
DEFAULT_TOLERANCE = (1e-5, 1e-6)

#: MatMulNBits whose ``accuracy_level`` is 4: the file lets the kernel compute with A quantized
#: to int8 (onnxruntime's MLAS quantizes A per block on the fly, OpenVINO's CPU plugin per
#: group of 32: "dynamic quantization"), an error of up to |A| / 254 per element summed over K.
#: Measured: onnxruntime against the float reference 4.6e-3 of max |Y| on one node with
#: K = 128; the real-weight MiniLM with 11 such nodes, OpenVINO against onnxruntime, 7e-3 of
#: max |Y| over 16..120 tokens. The reference stays the float product the int8 one
#: approximates; any implementation within this of it computes what the file declares.
INT8_ACTIVATIONS_TOLERANCE = (2e-2, 2e-2)
#: the MatMulNBits ``accuracy_level`` that declares int8 activations (0: unset, 1: float32,
#: 2: float16, 3: bfloat16; onnxruntime's x86 CPU kernels compute 1 to 3 in float32)
INT8_ACCURACY_LEVEL = 4


def nbits_accuracy_level(node: Node) -> int | None:
    """A MatMulNBits node's ``accuracy_level`` (0 when unset), ``None`` for any other node."""
    if node.key_op != "com.microsoft::MatMulNBits":
        return None
    return int(node.attrs.get("accuracy_level", 0) or 0)


def declares_int8_activations(node: Node) -> bool:
    """Whether ``node`` is a MatMulNBits whose file lets it compute with int8 activations."""
    return nbits_accuracy_level(node) == INT8_ACCURACY_LEVEL


def node_tolerance(node: Node) -> tuple[float, float]:
    """The tolerance of one node: its op's (:data:`TOLERANCE`), or the int8 activations'
    when its file declares them (:func:`declares_int8_activations`)."""
    if declares_int8_activations(node):
        return INT8_ACTIVATIONS_TOLERANCE
    return TOLERANCE.get(node.key_op, DEFAULT_TOLERANCE)


#: quantized (integer) outputs that may differ from the reference by this many quantization
#: steps: a float32 value that onnxruntime computes in another order (or, for the sigmoid, by
#: MLAS's polynomial approximation) can fall on the other side of a rounding half; every other
#: integer output must equal the reference's
QUANTIZED_STEPS: dict[str, int] = {
    f"com.microsoft::{op}": 1 for op in (
        "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat",
        "QLinearGlobalAveragePool", "QLinearAveragePool", "QGemm")
}


def quantized_steps(nodes: Sequence[Node]) -> int:
    """How many quantization steps an integer output of ``nodes`` may differ by (0: none)."""
    return max((QUANTIZED_STEPS.get(n.key_op, 0) for n in nodes), default=0)


def tolerance(nodes: Sequence[Node]) -> tuple[float, float]:
    """The loosest tolerance among the ops of ``nodes`` (errors add up along a chain)."""
    tols = [node_tolerance(n) for n in nodes] or [DEFAULT_TOLERANCE]
    return max(t[0] for t in tols), max(t[1] for t in tols)


#: whole-model tolerance of the end-to-end validation (errors accumulate over many layers)
MODEL_TOLERANCE = (1e-3, 1e-4)


def model_tolerance(nodes: Sequence[Node]) -> tuple[float, float]:
    """The end-to-end tolerance of a model of ``nodes``: :data:`MODEL_TOLERANCE`, or a node's
    own where that is looser (a MatMulNBits that declares int8 activations: a plan of the
    model may run it on a library that takes the int8 path and another plan on one that does
    not)."""
    rtol, atol = tolerance(nodes)
    return max(rtol, MODEL_TOLERANCE[0]), max(atol, MODEL_TOLERANCE[1])


#: a QDQ model's float output made by a DequantizeLinear of a quantized activation may differ
#: from the reference by this many steps of its scale (on top of MODEL_TOLERANCE): the reference
#: dequantizes, computes in float32 and requantizes, onnxruntime's QLinear* kernels requantize
#: integer sums (MLAS's order); a value on a rounding half lands one step apart, and a later
#: layer can carry the step on (measured: 2 steps on 2 of 4,096 logits of the GPT-2 corpus's
#: quantize_static QDQ model, tests/models/tools)
QDQ_OUTPUT_STEPS = 2


def dequantized_output_steps(graph: Graph) -> list[float]:
    """Per output of ``graph``: the absolute difference :data:`QDQ_OUTPUT_STEPS` steps make
    when a DequantizeLinear of a computed (quantized activation) value with a constant scale
    makes it, else 0."""
    producers = {o.name: n for n in graph.nodes for o in n.outputs}
    out = []
    for v in graph.outputs:
        n = producers.get(v.name)
        x, scale = (n.input(0), n.input(1)) if n is not None else (None, None)
        if (n is None or n.op_type != "DequantizeLinear" or x is None or x.is_const
                or scale is None or not scale.is_const or not np.size(scale.const)):
            out.append(0.0)
            continue
        out.append(QDQ_OUTPUT_STEPS * float(np.max(np.abs(np.asarray(scale.const, np.float64)))))
    return out


def check_outputs(
    outs: Sequence[np.ndarray],
    refs: Sequence[np.ndarray],
    nodes: Sequence[Node],
    tol: tuple[float, float] | None = None,
    extra_atol: Sequence[float] = (),
) -> str | None:
    """``None`` when every output matches its reference within the ops' tolerance (or
    ``tol``: rtol, and atol relative to max(1, max |reference|)), float outputs within
    ``extra_atol`` (per output, absolute: :func:`dequantized_output_steps`) besides."""
    rtol, atol = tol or tolerance(nodes)
    for k, (o, r) in enumerate(zip(outs, refs)):
        o, r = np.asarray(o), np.asarray(r)
        if o.shape != r.shape or o.dtype != r.dtype:
            return f"output {k}: {o.dtype}{list(o.shape)} where the reference gives {r.dtype}{list(r.shape)}"
        if r.dtype.kind not in "fc":
            steps = quantized_steps(nodes) if r.dtype.kind in "iu" else 0
            diff = np.abs(o.astype(np.int64) - r.astype(np.int64)) if steps else None
            if diff is not None and (not diff.size or int(diff.max()) <= steps):
                continue
            if not np.array_equal(o, r):
                return f"output {k}: differs from the reference"
            continue
        finite = np.abs(r[np.isfinite(r)]) if r.size else np.zeros(1)
        scale = max(1.0, float(finite.max())) if finite.size else 1.0
        bound = atol * scale + (extra_atol[k] if k < len(extra_atol) else 0.0)
        if not np.allclose(o, r, rtol=rtol, atol=bound, equal_nan=True):
            err = np.nanmax(np.abs(o.astype(np.float64) - r)) if o.size else 0.0
            return f"output {k}: max abs error {err:.3g} exceeds rtol {rtol:g} / atol {bound:.3g}"
    return None
