"""The OpenVINO regions' settings, set by ``OpenVinoBackend.configure`` without importing the
region module (a backend whose registration is deferred is still configured:
dispatch.backend_manifest)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: threads 0: every core this process may use; the compiled cache's folder setting
SETTINGS: dict[str, Any] = {"threads": 0, "compiled_cache": "off"}

#: OpenVINO's CPU plugin quantizes the activations of a MatMul with compressed weights (4- or
#: 8-bit: MatMulNBits, a DequantizeLinear of weights) to int8 on the fly by default, in groups of
#: this many ("dynamic quantization"), whatever precision is asked for: a float32 way turns it
#: off (group size 0) unless the file itself declares int8 activations for every such MatMul
#: (:func:`dynamic_quantization`). Measured on the real-weight MiniLM with 11
#: MatMuls in 4 and 7 in 8 bits (Intel Xeon, Sapphire Rapids class, 2 cores, float32): 1.82 /
#: 3.71 / 8.45 ms at 16 / 48 / 120 tokens with it, 0.04 off onnxruntime at an output scale of
#: 5.7, past a float32 check; 2.56 / 5.24 / 12.21 ms without it, onnxruntime's float32 outputs,
#: and the float32 file's own speed (2.35 / 5.40 / 12.45 ms).
DYNAMIC_QUANTIZATION_GROUP = 32


def dynamic_quantization(levels: Iterable[int], dequantizes: bool) -> dict[str, int]:
    """The float32 setting of a model or region whose MatMulNBits have accuracy ``levels``
    (``dequantizes``: it holds a DequantizeLinear, whose weights OpenVINO compresses and whose
    activations it would quantize as well): :data:`DYNAMIC_QUANTIZATION_GROUP` where there are
    MatMulNBits, every one declaring int8 activations, and no DequantizeLinear; else 0 (off)."""
    from dispatch.compare import INT8_ACCURACY_LEVEL

    levels = list(levels)
    declared = bool(levels) and all(level == INT8_ACCURACY_LEVEL for level in levels) and not dequantizes
    return {"DYNAMIC_QUANTIZATION_GROUP_SIZE": DYNAMIC_QUANTIZATION_GROUP if declared else 0}
