"""onnxruntime's whole-model ways (:mod:`dispatch.model_ways`): the model file in one
InferenceSession with its symbolic dimensions left to onnxruntime, which keeps its own per-shape
caches. Two thread settings are offered, since which wins depends on the shape: every usable
core (onnxruntime's default set-up), and one thread, whose runs skip the pool's hand-offs and
win on small shapes (short sentences) on a machine of few cores. For an accuracy objective,
the model with its MatMul / Gemm weights dynamically quantized to int8 by onnxruntime's own
tool (``quantize_dynamic``), which only a bucket whose requests stay within the budget takes."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dispatch.model_ways import ModelWay, WayRunner
from impls.onnxruntime.settings import SETTINGS
from impls.regions import usable_cores


def _int8_file(model_path: str, folder: str) -> str:
    """``model_path`` with its MatMul / Gemm weights dynamically quantized to int8 (8-bit
    signed weights, activations quantized at run time), written into ``folder``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from impls.onnxruntime.quantized import DYNAMIC_OPS
    from impls.static_quant import quiet_root_logger

    out = str(Path(folder) / "int8.onnx")
    with quiet_root_logger():
        quantize_dynamic(model_path, out, op_types_to_quantize=list(DYNAMIC_OPS),
                         weight_type=QuantType.QInt8, extra_options={"MatMulConstBOnly": True})
    return out


def _session_run(ort: Any, model_path: str, threads: int | None) -> WayRunner:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    so.intra_op_num_threads = threads or SETTINGS["intra_op_threads"] or usable_cores()
    so.inter_op_num_threads = 1
    session = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])

    def run(feeds: Mapping[str, np.ndarray]) -> Sequence[np.ndarray]:
        return session.run(None, dict(feeds))

    return run


def _builder(threads: int | None, int8: bool = False) -> Callable[[str], WayRunner]:
    def build(model_path: str) -> WayRunner:
        import onnxruntime as ort

        if not int8:
            return _session_run(ort, model_path, threads)
        with tempfile.TemporaryDirectory(prefix="opdispatch-int8-") as tmp:
            return _session_run(ort, _int8_file(model_path, tmp), threads)

    return build


def ways() -> list[ModelWay]:
    """The ways this backend offers."""
    return [
        ModelWay("onnxruntime", "onnxruntime",
                 "onnxruntime InferenceSession, graph optimisation all, intra-op threads = "
                 "usable cores, dynamic dimensions", _builder(None),
                 {"graph_optimization_level": "all", "intra_op_threads": "usable cores"}),
        ModelWay("onnxruntime-1thread", "onnxruntime",
                 "onnxruntime InferenceSession, graph optimisation all, one intra-op thread, "
                 "dynamic dimensions", _builder(1),
                 {"graph_optimization_level": "all", "intra_op_threads": 1}),
        ModelWay("onnxruntime-int8", "onnxruntime",
                 "onnxruntime InferenceSession of the model quantized by quantize_dynamic "
                 "(int8 MatMul / Gemm weights, activations at run time), intra-op threads = "
                 "usable cores, dynamic dimensions", _builder(None, int8=True),
                 {"quantization": "dynamic int8 (MatMul, Gemm weights)"}, precision="int8"),
    ]
