"""The OpenVINO regions' settings, set by ``OpenVinoBackend.configure`` without importing the
region module (a backend whose registration is deferred is still configured:
dispatch.backend_manifest)."""

from __future__ import annotations

from typing import Any

#: threads 0: every core this process may use; the compiled cache's folder setting
SETTINGS: dict[str, Any] = {"threads": 0, "compiled_cache": "off"}

#: OpenVINO's CPU plugin quantizes the activations of a MatMul with compressed weights (4- or
#: 8-bit: MatMulNBits, a DequantizeLinear of weights) to int8 on the fly by default, in groups of
#: this many ("dynamic quantization"), whatever precision is asked for: a float32 way turns it
#: off (group size 0) unless the file itself declares int8 activations for every such MatMul
#: (:func:`impls.openvino.whole_model.declares_int8_activations`; a region's:
#: ``impls.openvino.region.dynamic_quantization``). Measured on the real-weight MiniLM with 11
#: MatMuls in 4 and 7 in 8 bits (Intel Xeon, Sapphire Rapids class, 2 cores, float32): 1.82 /
#: 3.71 / 8.45 ms at 16 / 48 / 120 tokens with it, 0.04 off onnxruntime at an output scale of
#: 5.7, past a float32 check; 2.56 / 5.24 / 12.21 ms without it, onnxruntime's float32 outputs,
#: and the float32 file's own speed (2.35 / 5.40 / 12.45 ms).
DYNAMIC_QUANTIZATION_GROUP = 32
