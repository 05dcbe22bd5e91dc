"""OpenVINO regions in reduced precision: the region compiled with the CPU plugin's inference
precision hint set to ``bf16`` where the CPU computes bf16 natively (AVX512_BF16 or AMX: the
plugin's ``OPTIMIZATION_CAPABILITIES`` name ``BF16``), ``f16`` where it computes f16 natively
(``FP16``: AMX-FP16, ARM), or its QDQ int8 model (:mod:`impls.static_quant`, ranges calibrated
on the user's data) run by the plugin in int8. The region still reads and writes the model's
float32 tensors (the plugin converts at its edges), so the variant is a drop-in for the
float32 region; only accuracy-objective tuning offers it (:mod:`tuner.accuracy`), which
measures the error it adds on the user's data.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np

from dispatch.fusion import FusedNode
from dispatch.registry import Priority
from impls.openvino.region import _supports, build_compiled, compile_config, core, impls, propose
from impls.static_quant import RECIPES, calibrate, qdq_model, static_reason
from layouts.registry import STANDARD


@functools.cache
def capabilities() -> frozenset[str]:
    """The CPU plugin's optimisation capabilities on this machine (``FP32``, ``BF16``, ``INT8``,
    ``FP16``, ...)."""
    return frozenset(str(c) for c in core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def _bf16_supports(region: FusedNode) -> str | None:
    if "BF16" not in capabilities():
        return (f"this CPU does not compute bf16 natively (OpenVINO's CPU plugin lists "
                f"{', '.join(sorted(capabilities()))}; bf16 needs AVX512_BF16 or AMX)")
    return _supports(region)


def _f16_supports(region: FusedNode) -> str | None:
    if "FP16" not in capabilities():
        return (f"this CPU does not compute f16 natively (OpenVINO's CPU plugin lists "
                f"{', '.join(sorted(capabilities()))}; f16 needs AMX-FP16 or ARM)")
    return _supports(region)


@impls.register_region("compiled_f16", propose=propose, priority=Priority.FALLBACK,
                       supports=_f16_supports, settings={"inference_precision": "f16"},
                       precision="fp16")
def build_region_f16(region: FusedNode):
    """A region compiled by OpenVINO's CPU plugin computing in f16 (float32 at its edges)."""
    return build_compiled(region, "f16")


@impls.register_region("compiled_bf16", propose=propose, priority=Priority.FALLBACK,
                       supports=_bf16_supports, settings={"inference_precision": "bf16"},
                       precision="bf16")
def build_region_bf16(region: FusedNode):
    """A region compiled by OpenVINO's CPU plugin computing in bf16 (float32 at its edges)."""
    return build_compiled(region, "bf16")


def _bf16_edges(node: FusedNode) -> tuple[str, ...]:
    return tuple("bf16" if v is not None and v.dtype == np.float32 else STANDARD for v in node.inputs)


def _bf16_edges_out(node: FusedNode) -> tuple[str, ...]:
    return tuple("bf16" if v.dtype == np.float32 else STANDARD for v in node.outputs)


@impls.register_region("compiled_bf16_edges", propose=propose, priority=Priority.FALLBACK,
                       supports=_bf16_supports, settings={"inference_precision": "bf16", "edges": "bf16"},
                       precision="bf16", layouts_in=_bf16_edges, layouts_out=_bf16_edges_out)
def build_region_bf16_edges(region: FusedNode):
    """:func:`build_region_bf16` reading and writing its float32 tensors as bfloat16 (the
    ``bf16`` layout): between two such regions nothing is converted; elsewhere the plan
    converts, and the tuner weighs it."""
    return build_compiled(region, "bf16", edges="bf16")


def _int8_supports(region: FusedNode) -> str | None:
    if "INT8" not in capabilities():
        return f"OpenVINO's CPU plugin lists no INT8 capability here ({', '.join(sorted(capabilities()))})"
    return _supports(region) or static_reason(region)


def _compile_qdq(region: FusedNode, precision: str = "f32"):
    """The region's QDQ int8 model compiled by the CPU plugin (from a temporary file: the
    compiled cache keys regions by their float32 model, not by their calibration).

    Measured with OpenVINO 2026.4: a 2-D MatMul -> Relu -> MatMul QDQ model computes wrongly
    (max difference 3.9 to onnxruntime's 0 on outputs up to 1.9), the same with 3-D
    activations rightly; the accuracy stage measures every variant's error on the user's data,
    so such a region is refused as over budget, never stored."""
    import onnx

    # the step's recipe (OpenVINO's: the plugin fuses each Conv with its post-ops); a plan step
    # stored before it builds the one its accuracy was measured with
    model = qdq_model(region)
    with tempfile.TemporaryDirectory(prefix="opdispatch-ov-int8-") as tmp:
        path = Path(tmp) / "int8.onnx"
        onnx.save(model, str(path))
        return core().compile_model(str(path), "CPU", compile_config(precision))


@impls.register_region("compiled_int8", propose=propose, priority=Priority.FALLBACK,
                       supports=_int8_supports,
                       settings={"quantization": f"static int8 QDQ, per channel: {RECIPES['openvino'].doc}",
                                 "qdq_recipe": "openvino"},
                       precision="int8", calibrate=calibrate)
def build_region_int8(region: FusedNode):
    """A region's QDQ int8 model (ranges calibrated on the user's data, stored with the plan
    step) compiled by OpenVINO's CPU plugin, which runs the quantized operations in int8."""
    return build_compiled(region, compile=_compile_qdq)


def _int8_bf16_supports(region: FusedNode) -> str | None:
    return _bf16_supports(region) or _int8_supports(region)


@impls.register_region("compiled_int8_bf16", propose=propose, priority=Priority.FALLBACK,
                       supports=_int8_bf16_supports,
                       settings={"quantization": f"static int8 QDQ, per channel: {RECIPES['openvino'].doc}",
                                 "qdq_recipe": "openvino", "inference_precision": "bf16"},
                       precision="int8", calibrate=calibrate)
def build_region_int8_bf16(region: FusedNode):
    """:func:`build_region_int8` with the operations left in float computed in bf16 (what
    OpenVINO does by default on a bf16 CPU)."""
    return build_compiled(region, compile=functools.partial(_compile_qdq, precision="bf16"))
