"""onnxruntime regions in int8, quantized by onnxruntime's own tool: dynamically
(``quantize_dynamic``: the MatMul and Gemm nodes whose weights are constants get int8 weights
and quantize their activations at run time, ``DynamicQuantizeLinear`` + ``MatMulInteger``) or
statically (a QDQ model with ranges calibrated on the user's data: :mod:`impls.static_quant`).
The region still reads and writes the model's float32 tensors, so the variant is a drop-in for
the float32 region; only accuracy-objective tuning offers it (:mod:`tuner.accuracy`), which
measures the error it adds on the user's data.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dispatch.fusion import FusedNode
from dispatch.registry import Priority
from impls.onnxruntime.region import _supports, bound_run, impls, propose, session
from impls.regions import region_model
from impls.static_quant import calibrate, qdq_model, quiet_root_logger, static_reason

#: the ops whose constant weights dynamic quantization turns into int8
DYNAMIC_OPS = ("MatMul", "Gemm")


def _weighted(region: FusedNode) -> list[str]:
    """The MatMul / Gemm nodes of ``region`` with a constant float32 matrix of weights."""
    found = []
    for n in region.nodes:
        if n.op_type not in DYNAMIC_OPS or len(n.inputs) < 2 or n.inputs[1] is None:
            continue
        w = n.inputs[1]
        if w.is_const and np.asarray(w.const).dtype == np.float32 and np.asarray(w.const).ndim == 2:
            found.append(n.name)
    return found


def _dynamic_supports(region: FusedNode) -> str | None:
    why = _supports(region)
    if why is None and not _weighted(region):
        why = "the region holds no MatMul or Gemm with constant float32 weights to quantize"
    return why


def dynamic_model(region: FusedNode, per_channel: bool = False) -> Any:
    """``region``'s ONNX model with its weighted MatMul / Gemm nodes dynamically quantized
    to int8 (onnxruntime's ``quantize_dynamic``, constant weights only). 8-bit weights on every
    CPU: on one without VNNI, where its uint8 x int8 kernels saturate pairs of products in 16
    bits, the tool's advice is 7-bit weights (``reduce_range``), but on BERT-base there (AMD
    Zen 3) this variant with 7-bit weights reached a worst cosine of 0.99877 on calibration
    samples where the tool's whole-model 8-bit default kept 0.99949 held out; the accuracy
    stage measures the error either way."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = region_model(region)
    # (the tool logs a suggestion to pre-process on the root logger at each call)
    with tempfile.TemporaryDirectory(prefix="opdispatch-int8-") as tmp, quiet_root_logger():
        out = Path(tmp) / "int8.onnx"
        quantize_dynamic(model, out, op_types_to_quantize=list(DYNAMIC_OPS), per_channel=per_channel,
                         weight_type=QuantType.QInt8, nodes_to_quantize=_weighted(region),
                         extra_options={"MatMulConstBOnly": True})
        return onnx.load(str(out))


@impls.register_region("session_int8_dynamic", propose=propose, priority=Priority.FALLBACK,
                       supports=_dynamic_supports,
                       settings={"quantization": "dynamic int8 (MatMul, Gemm weights)"},
                       dynamic_shapes=True, precision="int8")
def build_region_int8_dynamic(region: FusedNode):
    """A region as an onnxruntime InferenceSession with its weighted MatMul / Gemm nodes in
    int8, activations quantized at run time (float32 at its edges)."""
    model = dynamic_model(region)
    return bound_run(region, lambda: session(region, model=model))


def _static_supports(region: FusedNode) -> str | None:
    return _supports(region) or static_reason(region)


@impls.register_region("session_int8_static", propose=propose, priority=Priority.FALLBACK,
                       supports=_static_supports,
                       settings={"quantization": "static int8 QDQ (Conv, MatMul, Gemm; per channel)",
                                 "qdq_recipe": "onnxruntime"},
                       precision="int8", calibrate=calibrate)
def build_region_int8_static(region: FusedNode):
    """A region as an onnxruntime InferenceSession of its QDQ int8 model (ranges calibrated on
    the user's data, stored with the plan step; float32 at its edges)."""
    model = qdq_model(region)
    return bound_run(region, lambda: session(region, model=model))
