"""Static int8 quantization of a region (QDQ), what the onnxruntime and OpenVINO int8 variants
share: the region's ONNX model quantized by onnxruntime's own tool
(``onnxruntime.quantization.quantize_static``: QuantizeLinear / DequantizeLinear pairs around
the Conv, MatMul and Gemm nodes, weights int8 per output channel, activations uint8 with the
ranges calibrated on the user's data, min-max).

Calibration (:func:`calibrate`) runs once, while tuning, on the region's inputs recorded from
the calibration samples; the tool's calibration cache (its JSON) is what a plan step stores
(``precision["calibration"]``), so that the build (:func:`qdq_model`) quantizes the region
exactly as it was measured, without the data. onnxruntime runs the QDQ model with its int8
kernels (VNNI where the CPU has it); OpenVINO's CPU plugin reads the same model and runs the
quantized operations in int8 (its low-precision transformations).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dispatch.fusion import FusedNode
from impls.regions import region_model

#: the ops whose inputs static quantization puts in int8
STATIC_OPS = ("Conv", "MatMul", "Gemm")
#: the opset a region is converted to first when older: per-channel weights need DequantizeLinear's
#: ``axis`` (opset 13); the tool does not convert (measured with onnxruntime 1.32 on an opset-9
#: ResNet-50: it writes DequantizeLinear-11 with an axis, an invalid model)
QDQ_OPSET = 13


def tool_reason() -> str | None:
    """Why onnxruntime's quantization tool cannot quantize statically from stored ranges here."""
    try:
        from onnxruntime.quantization import quantize_static
    except ImportError as exc:
        return f"onnxruntime's quantization tool is not importable ({exc})"
    if "calibration_cache_path" not in inspect.signature(quantize_static).parameters:
        return "this onnxruntime's quantize_static has no calibration cache (onnxruntime >= 1.24 has one)"
    return None


def static_reason(region: FusedNode) -> str | None:
    """``None`` when ``region`` holds a Conv, MatMul or Gemm with constant float32 weights to
    quantize and the tool is there, else why not."""
    why = tool_reason()
    if why is not None:
        return why
    for n in region.nodes:
        if n.op_type in STATIC_OPS and len(n.inputs) > 1 and n.inputs[1] is not None and n.inputs[1].is_const \
                and np.asarray(n.inputs[1].const).dtype == np.float32:
            return None
    return "the region holds no Conv, MatMul or Gemm with constant float32 weights to quantize"


@contextlib.contextmanager
def quiet_root_logger() -> Iterator[None]:
    """The tool logs a suggestion to pre-process on the root logger at each call: silenced."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(level)


def _quantize(region: FusedNode, folder: Path, cache: Path, reader: Any, exclude: Sequence[str] = (),
              quantize_outputs: bool = True) -> Any:
    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    src, out = folder / "region.onnx", folder / "int8.onnx"
    model = region_model(region)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), QDQ_OPSET)
    if opset < QDQ_OPSET:  # per-channel DequantizeLinear (its axis) needs opset 13
        from onnx import version_converter

        model = version_converter.convert_version(model, QDQ_OPSET)
    onnx.save(model, str(src))
    # (a tensor whose calibrated range is empty makes the tool divide by a zero scale and warn;
    # the error such a region adds is what the accuracy stage measures and refuses)
    with quiet_root_logger(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        quantize_static(str(src), str(out), reader, quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        op_types_to_quantize=list(STATIC_OPS), calibration_cache_path=str(cache),
                        nodes_to_exclude=list(exclude),
                        extra_options={} if quantize_outputs else {
                            "OpTypesToExcludeOutputQuantization": list(STATIC_OPS)})
    return onnx.load(str(out))


def calibrate(region: FusedNode, samples: Sequence[Sequence[np.ndarray]]) -> dict[str, Any]:
    """The tool's calibration cache (JSON: each tensor's range) for ``region`` from its input
    ``samples`` (one tuple of arrays per sample, in the region's input order)."""
    from onnxruntime.quantization import CalibrationDataReader

    names = [v.name for v in region.inputs]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter([dict(zip(names, s)) for s in samples])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    if not samples:
        raise ValueError("calibration needs at least one sample of the region's inputs")
    with tempfile.TemporaryDirectory(prefix="opdispatch-calib-") as tmp:
        cache = Path(tmp) / "calibration.json"
        _quantize(region, Path(tmp), cache, Reader())
        return json.loads(cache.read_text())


def qdq_model(region: FusedNode, quantize_outputs: bool = True) -> Any:
    """``region``'s QDQ int8 model from the calibration its plan step stores
    (``region.attrs["precision"]["calibration"]``), the nodes its ``exclude`` names left in
    float (the blocks too sensitive for int8: one region, no boundary between them).

    ``quantize_outputs``: a Quantize/Dequantize pair on the outputs of the quantized ops too
    (what onnxruntime needs to run a Conv in int8: DQ -> Conv -> Q becomes QLinearConv); without
    it only their inputs are quantized, as NNCF does for OpenVINO, whose CPU plugin then fuses
    each Conv with the Add and activation after it (measured on ResNet-50 here: 53 of 53 Convs
    fused against about 50 eltwise subgraphs left apart, 11.3-11.7 ms against 11.9-12.4 ms one
    request at a time, NNCF's model 11.1-11.6 ms)."""
    precision = region.attrs.get("precision") or {}
    calibration = precision.get("calibration")
    exclude = precision.get("exclude") or []
    if not isinstance(exclude, list) or not all(isinstance(n, str) for n in exclude):
        raise ValueError(f"precision['exclude'] must list node names, received {exclude!r:.80}")
    if not isinstance(calibration, dict):
        raise ValueError("a static int8 region needs its calibration (precision['calibration'] of its "
                         "plan step, written by accuracy tuning)")
    with tempfile.TemporaryDirectory(prefix="opdispatch-int8-") as tmp:
        cache = Path(tmp) / "calibration.json"
        cache.write_text(json.dumps(calibration))
        return _quantize(region, Path(tmp), cache, None, exclude, quantize_outputs)
