"""Static int8 quantization of a region (QDQ), what the onnxruntime and OpenVINO int8 variants
share: the region's ONNX model quantized by onnxruntime's own tool
(``onnxruntime.quantization.quantize_static``: QuantizeLinear / DequantizeLinear pairs around
the Conv, MatMul and Gemm nodes, weights int8 per output channel, activations uint8 with the
ranges calibrated on the user's data, min-max). Which pairs a model gets is its recipe
(:data:`RECIPES`, recorded by the plan step): onnxruntime's int8 kernels want the outputs
quantized too, OpenVINO's plugin fuses best what NNCF produces (inputs only, and in CNNs the
residual additions and poolings).

Calibration (:func:`calibrate`) runs once, while tuning, on the region's inputs recorded from
the calibration samples; the tool's calibration cache (its JSON) is what a plan step stores
(``precision["calibration"]``), so that the build (:func:`qdq_model`) quantizes the region
exactly as it was measured, without the data. onnxruntime runs the QDQ model with its int8
kernels (VNNI where the CPU has it); OpenVINO's CPU plugin reads the same model and runs the
quantized operations in int8 (its low-precision transformations).

A tensor whose calibrated range is not finite stays in float32 (:func:`float_tensors`): the
transformers exports' attention masks (``Where(mask, 0, -inf)`` and the ``Add`` of the scores
and that mask: measured on all-MiniLM-L6-v2 with padded sentences, range ``[-inf, 0]`` and
``[-inf, 46.2]`` in each of its 6 layers) have no uint8 scale; the tool computed a NaN zero
point for them ("invalid value encountered in divide"). :func:`calibrate` leaves their ranges
out of the cache it returns and names them (:data:`FLOAT_KEY`); :func:`qdq_model` leaves the
nodes it would quantize that read or write one of them in float.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dispatch.fusion import FusedNode
from impls.regions import region_model

#: the ops with weights whose inputs static quantization puts in int8 (every recipe)
STATIC_OPS = ("Conv", "MatMul", "Gemm")
#: what OpenVINO's recipe quantizes besides, in a convolutional region (NNCF's for CNNs): the
#: inputs of the additions of two activations (residual connections; a 2-input ``Sum`` counts)
#: and of the poolings, so that the CPU plugin runs them in u8 fused with the Convs around them
CNN_EXTRA_OPS = ("Add", "MaxPool", "AveragePool")
#: what calibration records ranges for: every recipe's tensors, so one calibration serves all
CALIBRATED_OPS = STATIC_OPS + CNN_EXTRA_OPS
#: samples calibrated at once, at most (:func:`calibration_stride`): the tool holds every
#: intermediate tensor of the samples it runs at once (128 ResNet-50 samples: gigabytes). Its
#: strided min-max merges each stride's ranges; its other bound, ``CalibMaxIntermediateOutputs``,
#: drops them (onnxruntime 1.32: ``clear_collected_data`` empties the outputs uncomputed)
CALIBRATION_CHUNK = 16
#: the opset a region is converted to first when older: per-channel weights need DequantizeLinear's
#: ``axis`` (opset 13); the tool does not convert (measured with onnxruntime 1.32 on an opset-9
#: ResNet-50: it writes DequantizeLinear-11 with an axis, an invalid model)
QDQ_OPSET = 13
#: the key of a calibration cache (besides the tool's ``calibration_method`` and ``data``, the
#: only ones it reads) naming the tensors whose calibrated range was not finite, with that
#: range as text (``{"t": ["-inf", "0.0"]}``): left out of ``data``, kept in float
FLOAT_KEY = "opdispatch_float_tensors"


@dataclass(frozen=True)
class QdqRecipe:
    """Which Quantize/Dequantize pairs a region's QDQ model gets."""

    name: str
    #: a pair on the outputs of the quantized ops too (what onnxruntime needs to run a Conv in
    #: int8: DQ -> Conv -> Q becomes QLinearConv); without it only their inputs are quantized,
    #: as NNCF does for OpenVINO, whose CPU plugin then fuses each Conv with its post-ops
    quantize_outputs: bool
    #: :data:`CNN_EXTRA_OPS` quantized too where the region is convolutional (has no MatMul:
    #: NNCF's recipe for transformers leaves additions and poolings in float)
    cnn_extras: bool
    doc: str


#: the recipes by the name a plan step records (``precision["qdq_recipe"]``)
RECIPES = {r.name: r for r in (
    QdqRecipe("onnxruntime", True, False, "Conv, MatMul, Gemm inputs and outputs (onnxruntime's default)"),
    QdqRecipe("inputs", False, False, "Conv, MatMul, Gemm inputs only"),
    QdqRecipe("openvino", False, True, "Conv, MatMul, Gemm inputs; in a convolutional region also the "
              "inputs of residual additions and poolings (NNCF's recipe for CNNs)"),
)}


def recipe_of(precision: dict[str, Any]) -> QdqRecipe:
    """The recipe a plan step's ``precision`` names; a step stored before recipes had names
    builds the one its accuracy was measured with (``quantized_outputs = no``: inputs only;
    nothing: onnxruntime's)."""
    name = precision.get("qdq_recipe") or ("inputs" if precision.get("quantized_outputs") == "no"
                                           else "onnxruntime")
    if name not in RECIPES:
        raise ValueError(f"unknown QDQ recipe {name!r:.40}; known: {', '.join(RECIPES)}")
    return RECIPES[name]


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
        if n.op_type in STATIC_OPS and len(n.inputs) > 1 and n.inputs[1] is not None \
                and n.inputs[1].is_const and np.asarray(n.inputs[1].const).dtype == np.float32:
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


def _prepared(model: Any) -> Any:
    """``model`` made ready for the tool: converted to :data:`QDQ_OPSET` when older, 2-input
    ``Sum`` nodes made ``Add`` (the same operation, which the tool can quantize: onnx's
    ResNet-50 adds its residuals with ``Sum``) and nameless nodes named."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), QDQ_OPSET)
    if opset < QDQ_OPSET:
        from onnx import version_converter

        model = version_converter.convert_version(model, QDQ_OPSET)
    for k, node in enumerate(model.graph.node):
        if node.op_type == "Sum" and len(node.input) == 2 and node.domain in ("", "ai.onnx"):
            node.op_type = "Add"
        if not node.name:
            node.name = f"_qdq_{k}_{node.op_type}"
    return model


def _plan(model: Any, recipe: QdqRecipe) -> tuple[list[str], list[str]]:
    """The op types ``recipe`` quantizes in ``model`` and the nodes of those types it leaves
    out (additions of a constant: biases, not residual connections)."""
    nodes = model.graph.node
    if not (recipe.cnn_extras and not any(n.op_type == "MatMul" for n in nodes)):
        return list(STATIC_OPS), []
    constants = {i.name for i in model.graph.initializer}
    constants |= {o for n in nodes if n.op_type == "Constant" for o in n.output}
    biases = [n.name for n in nodes if n.op_type == "Add" and any(i in constants for i in n.input)]
    return list(CALIBRATED_OPS), biases


def _range(entry: Any) -> tuple[float, float] | None:
    """A cache entry's ``(lowest, highest)`` (the tool's min-max ``TensorData`` as JSON),
    ``None`` when it holds no range of that form."""
    try:
        return float(entry["lowest"]["data"][0]), float(entry["highest"]["data"][0])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def float_tensors(calibration: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """The tensors of a calibration cache whose calibrated range is not finite (an end at
    -inf or +inf, or NaN): named under :data:`FLOAT_KEY` by :func:`calibrate`, or still in
    ``data`` (a cache stored before they were set apart). Such a tensor has no int8 scale."""
    found = {name: (float(lo), float(hi)) for name, (lo, hi) in (calibration.get(FLOAT_KEY) or {}).items()}
    for name, entry in (calibration.get("data") or {}).items():
        r = _range(entry)
        if r is not None and not (np.isfinite(r[0]) and np.isfinite(r[1])):
            found[name] = r
    return found


def finite_cache(calibration: dict[str, Any]) -> dict[str, Any]:
    """``calibration`` with the ranges that are not finite left out of ``data`` and named under
    :data:`FLOAT_KEY` (what :func:`calibrate` returns and the tool is given)."""
    floats = float_tensors(calibration)
    out = {k: v for k, v in calibration.items() if k != FLOAT_KEY}
    out["data"] = {k: v for k, v in (calibration.get("data") or {}).items() if k not in floats}
    if floats:
        out[FLOAT_KEY] = {k: [repr(lo), repr(hi)] for k, (lo, hi) in floats.items()}
    return out


def _touching(model: Any, tensors: set[str], ops: Sequence[str]) -> list[str]:
    """The nodes of ``model`` of the types in ``ops`` that read or write one of ``tensors``."""
    return [n.name for n in model.graph.node if n.op_type in ops
            and any(t in tensors for t in (*n.input, *n.output))]


def _quantize(region: FusedNode, folder: Path, cache: Path, reader: Any, exclude: Sequence[str] = (),
              recipe: QdqRecipe | None = None, stride: int | None = None) -> Any:
    """The tool run on ``region``'s model: with a ``reader``, calibration of every recipe's
    tensors into ``cache`` (:data:`CALIBRATED_OPS`; ``stride`` samples at a time); without, the
    ``recipe``'s QDQ model from the ranges in ``cache``."""
    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    src, out = folder / "region.onnx", folder / "int8.onnx"
    model = _prepared(region_model(region))
    if recipe is None:  # calibration
        ops, skipped, options = list(CALIBRATED_OPS), [], {"CalibStridedMinMax": stride} if stride else {}
    else:
        ops, skipped = _plan(model, recipe)
        # ranges that are not finite: out of the tool's cache, their nodes left in float
        stored = json.loads(cache.read_text())
        floats = set(float_tensors(stored))
        cache.write_text(json.dumps(finite_cache(stored)))
        skipped += [n for n in _touching(model, floats, ops) if n not in skipped]
        options = {} if recipe.quantize_outputs else {
            "OpTypesToExcludeOutputQuantization": [o for o in ops if o in STATIC_OPS or o == "Add"]}
        if "MaxPool" in ops:  # a pooling's input is quantized even where no quantized op wrote it
            options["ForceQuantizeNoInputCheck"] = True
    onnx.save(model, str(src))
    # (calibration: right after calibrating, the tool quantizes the region with every range it
    # found, an attention mask's [-inf, 0] too, and warns of the NaN zero point it computes;
    # that model is discarded and those ranges are set apart (:func:`finite_cache`). A build
    # gives the tool finite ranges only, so its warnings are shown.)
    with quiet_root_logger(), warnings.catch_warnings():
        if recipe is None:
            warnings.simplefilter("ignore", RuntimeWarning)
        quantize_static(str(src), str(out), reader, quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        op_types_to_quantize=ops, calibration_cache_path=str(cache),
                        nodes_to_exclude=[*exclude, *skipped], extra_options=options)
    return onnx.load(str(out))


def calibrate(region: FusedNode, samples: Sequence[Sequence[np.ndarray]]) -> dict[str, Any]:
    """The tool's calibration cache (JSON: each tensor's range) for ``region`` from its input
    ``samples`` (one tuple of arrays per sample, in the region's input order), run
    :func:`calibration_stride` samples at a time (the tool's strided min-max: each stride's
    ranges merged into the last's). The ranges that are not finite are set apart, under
    :data:`FLOAT_KEY` (:func:`finite_cache`): those tensors stay in float."""
    from onnxruntime.quantization import CalibrationDataReader

    names = [v.name for v in region.inputs]
    feeds = [dict(zip(names, s)) for s in samples]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(feeds)

        def __len__(self) -> int:
            return len(feeds)

        def set_range(self, start_index: int, end_index: int) -> None:
            self._it = iter(feeds[start_index:end_index])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    if not samples:
        raise ValueError("calibration needs at least one sample of the region's inputs")
    with tempfile.TemporaryDirectory(prefix="opdispatch-calib-") as tmp:
        cache = Path(tmp) / "calibration.json"
        _quantize(region, Path(tmp), cache, Reader(), stride=calibration_stride(len(feeds)))
        return finite_cache(json.loads(cache.read_text()))


def calibration_stride(n: int) -> int:
    """The samples calibrated at once out of ``n``: the largest divisor of ``n`` up to
    :data:`CALIBRATION_CHUNK` (the tool wants a stride that divides the samples)."""
    return max(d for d in range(1, min(n, CALIBRATION_CHUNK) + 1) if n % d == 0)


def qdq_model(region: FusedNode, recipe: str | None = None) -> Any:
    """``region``'s QDQ int8 model from the calibration its plan step stores
    (``region.attrs["precision"]["calibration"]``), the nodes its ``exclude`` names left in
    float (the blocks too sensitive for int8: one region, no boundary between them), and so
    are the nodes the recipe would quantize that read or write a tensor whose calibrated range
    is not finite (:func:`float_tensors`; a cache stored with such ranges in ``data`` too).

    ``recipe`` (a name of :data:`RECIPES`; default: the one the step records, see
    :func:`recipe_of`) says which pairs the model gets. OpenVINO's, measured on ResNet-50 one
    request at a time (OpenVINO LATENCY, each model in a process of its own, alternated):
    Conv/MatMul/Gemm inputs and outputs 11.9-12.4 ms (about 50 eltwise subgraphs left apart
    from the Convs); inputs only 11.3-11.9 ms (53 of 53 Convs fused with their Add and
    activation); with the residual additions and poolings too, 11.03 ms median of 5 against
    NNCF's 11.12 ms (the plugin's runtime graph then matches NNCF's: poolings in u8, no
    FakeQuantize left)."""
    precision = region.attrs.get("precision") or {}
    calibration = precision.get("calibration")
    exclude = precision.get("exclude") or []
    if not isinstance(exclude, list) or not all(isinstance(n, str) for n in exclude):
        raise ValueError(f"precision['exclude'] must list node names, received {exclude!r:.80}")
    if not isinstance(calibration, dict):
        raise ValueError("a static int8 region needs its calibration (precision['calibration'] of its "
                         "plan step, written by accuracy tuning)")
    chosen = recipe_of(precision if recipe is None else {"qdq_recipe": recipe})
    with tempfile.TemporaryDirectory(prefix="opdispatch-int8-") as tmp:
        cache = Path(tmp) / "calibration.json"
        cache.write_text(json.dumps(calibration))
        return _quantize(region, Path(tmp), cache, None, exclude, chosen)
