"""Regions of the graph as models compiled by OpenVINO's CPU plugin: the proposals and the
region's standalone ONNX model come from :mod:`impls.regions` (shared with the onnxruntime
backend); this module owns what accepts a node for OpenVINO (:func:`node_reason`: the ops,
attributes and dtypes its ONNX frontend or CPU plugin runs differently from the reference are
refused with the reason) and the building: the region's ONNX model read by OpenVINO's ONNX
frontend, compiled once per region for the CPU (latency hint, one stream, float32 inference
precision, the configured threads), and run through one infer request per thread, with inputs
shared in place and outputs copied out of OpenVINO's buffers into arrays the caller owns.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import numpy as np

from dispatch import serving
from dispatch.compare import nbits_accuracy_level
from dispatch.fusion import FusedNode
from dispatch.graph import Graph, Node
from dispatch.registry import ImplTable, Priority
from impls import region_quirks, regions
from impls.openvino.settings import SETTINGS as SETTINGS  # set by the backend's configure
from impls.openvino.settings import dynamic_quantization
from impls.region_profile import MemoryProbe, first_run
from impls.regions import region_reason, static_node_reason, usable_cores

impls = ImplTable("openvino")

#: default-domain ops never offered to OpenVINO, with why
_QDQ = ("never offered to OpenVINO: its CPU plugin turns quantize / dequantize operators into "
        "FakeQuantize and runs their neighbours in int8 (its low-precision transformations), not "
        "in the reference's arithmetic; OpenVINO runs quantized graphs in the int8 variants "
        "(impls.openvino.reduced), which the accuracy objective measures")
UNSUPPORTED_OPS: dict[str, str] = {
    **{op: _QDQ for op in ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
                           "MatMulInteger", "QLinearMatMul", "ConvInteger", "QLinearConv")},
    "Mod": "never offered to OpenVINO, which computes Mod as x - trunc(x / y) * y through "
    "float32 (measured with OpenVINO 2026.4: fmod(1e10, 3) gives 0, not 1; fmod(1, inf) NaN, "
    "not 1; int32 (2**30 + 3) mod 7 gives 0, not 4) and cannot convert fmod=0 on floats",
    "BitShift": "never offered to OpenVINO, whose shifts are not ONNX's (measured with OpenVINO "
    "2026.4: uint8 255 << 2 saturates to 255, not 252; uint32 (2**32 - 1) >> 1 gives 0, not "
    "2**31 - 1)",
    "Loop": "never offered to OpenVINO, whose compiled Loop keeps the previous run's results "
    "(measured with OpenVINO 2026.4: a zero-iteration run returned the last run's scan "
    "outputs, shape and data; tests/models/wild/constructs.py)",
    "Scan": "never offered to OpenVINO: its Scan is the same TensorIterator as Loop, whose "
    "compiled form kept a previous run's results (measured with OpenVINO 2026.4)",
    "If": "never offered to OpenVINO, which rejects the If models exported in practice "
    "(measured with OpenVINO 2026.4 on silero-vad: 'input data tensor's rank has to be "
    "known (static)' inside its branches) and returned stale results in a Loop's nested If",
    "LpNormalization": "never offered to OpenVINO, whose LpNormalization adds an epsilon to the "
    "norm (measured with OpenVINO 2026.4: -0.998 for -1 where the norm is ~0.05, and x / eps "
    "where the float32 norm is 0, ONNX's 0)",
}

#: onnxruntime's contrib operators (com.microsoft; dispatch.contrib_schemas), keyed
#: ``domain::op``. Offered: the activations and normalizations OpenVINO's ONNX front end converts
#: (Gelu, FastGelu, BiasGelu, QuickGelu, SkipLayerNormalization, SkipSimplifiedLayerNormalization,
#: FusedMatMul), MatMulNBits, and Attention and MultiHeadAttention (without an integer mask: see
#: :func:`_dtype_reason`), measured against the references on every edge case
#: (tests/reliability/test_edge_numerics.py; inputs ~1e30-1e38 overflow float32 in these
#: sums of products as in onnxruntime's, documented there). Refused, with why:
CONTRIB_OPS: frozenset[str] = frozenset(f"com.microsoft::{op}" for op in (
    "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization", "FusedMatMul", "MatMulNBits", "Attention", "MultiHeadAttention"))
UNSUPPORTED_OPS.update({
    "com.microsoft::BiasSplitGelu": "never offered to OpenVINO: its ONNX front end does not convert "
                                    "com.microsoft BiasSplitGelu (OpenVINO 2026.4)",
    "com.microsoft::GroupQueryAttention": "never offered to OpenVINO: its ONNX front end converts "
                                          "GroupQueryAttention only with the past key and value given "
                                          "as tensors (OpenVINO 2026.4: 'inputs 3 and 4 must be "
                                          "provided'), which a prompt without a cache leaves out",
    "com.microsoft::RotaryEmbedding": "never offered to OpenVINO: measured wrong against the reference "
                                      "on 6 of 8 edge cases (OpenVINO 2026.4; a batch of 3, odd head "
                                      "sizes, ordinary values)",
})
_CONTRIB_QUANTIZED = ("never offered to OpenVINO yet: onnxruntime's dynamically quantized matmuls are not "
                      "measured against the reference on OpenVINO")
UNSUPPORTED_OPS.update({f"com.microsoft::{op}": _CONTRIB_QUANTIZED for op in (
    "DynamicQuantizeMatMul", "MatMulIntegerToFloat")})
_CONTRIB_QOPERATOR = ("never offered to OpenVINO yet: onnxruntime's QOperator-format quantized operators and "
                      "EmbedLayerNormalization are not measured against the reference on OpenVINO")
UNSUPPORTED_OPS.update({f"com.microsoft::{op}": _CONTRIB_QOPERATOR for op in (
    "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat",
    "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearSoftmax", "QGemm", "QAttention",
    "DynamicQuantizeLSTM", "EmbedLayerNormalization", "QEmbedLayerNormalization")})

#: dtypes the CPU plugin computes in a narrower type (it converts them at the model's edges and
#: runs the kernels in the narrower one), so their values may change on the way through
#: (measured: int64 2**40 through an Identity comes back 0)
NARROWED: dict[np.dtype, str] = {
    np.dtype(np.int64): "int32",
    np.dtype(np.uint64): "int32",
    np.dtype(np.float64): "float32",
}

#: ops that only move, select or convert integer elements; every other op on integer tensors
#: computes wrongly in the CPU plugin (measured: int8 / uint8 Add, Sub, Mul, Neg and Abs
#: saturate where ONNX wraps; int32 Div, Relu and comparisons go through float32, exact only
#: below 2**24; uint32 Div and Abs are wrong)
INTEGER_EXACT: frozenset[str] = frozenset({
    "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Split",
    "Slice", "Gather", "Expand", "Tile", "Where", "Cast",
    # measured exact on int8 / uint8 / int32 data up to +-2**31
    "GatherND", "GatherElements", "DepthToSpace", "SpaceToDepth",
})

#: ops measured to run right with empty (zero-size) tensors; others are refused them (measured
#: with OpenVINO 2026.4: a Gather with empty indices kills the process with SIGFPE, an Expand to
#: an empty shape returns [1, ...], ReduceMax / ReduceMin of an empty set give -+FLT_MAX where
#: ONNX gives -+inf, a Split into num_outputs with an empty part fails to convert)
EMPTY_EXACT: frozenset[str] = frozenset({
    "Add", "Sub", "Mul", "Div", "Sum", "Min", "Max", "Sigmoid", "Equal", "Less", "Greater",
    "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Where", "ReduceSum", "ReduceMean",
    "ReduceProd", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
    "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Concat", "Slice", "Tile",
})

#: inputs and outputs that hold indices into a tensor or its dimensions (so every valid value
#: fits in int32): they may be int64 at run time
INDEX_INPUTS: dict[str, tuple[int, ...]] = {"Gather": (1,), "TopK": (1,),
                                             # measured exact with run-time int32 / int64
                                             # indices, negative ones included
                                             "GatherND": (1,), "GatherElements": (1,),
                                             "ScatterND": (1,), "ScatterElements": (1,)}
INDEX_OUTPUTS: dict[str, tuple[int, ...]] = {"MaxPool": (1,), "Shape": (0,), "Size": (0,),
                                              "ArgMax": (0,), "ArgMin": (0,), "TopK": (1,)}

#: reductions whose ``axes`` attribute the ONNX frontend ignores from opset 13 to 17 (it
#: reduces over every axis instead; measured with OpenVINO 2026.4)
AXES_ATTR_IGNORED: frozenset[str] = frozenset({"ReduceL1", "ReduceLogSum", "ReduceLogSumExp"})


def _dtype_reason(node: Node) -> str | None:
    """Why ``node``'s run-time tensors (constants are not checked: they are folded into the
    compiled model) cannot be trusted to OpenVINO, else ``None``."""
    index_inputs = {id(node.inputs[k]) for k in INDEX_INPUTS.get(node.op_type, ())
                    if k < len(node.inputs) and node.inputs[k] is not None}
    index_inputs |= {id(node.outputs[k]) for k in INDEX_OUTPUTS.get(node.op_type, ())
                     if k < len(node.outputs)}
    for v in [*node.inputs, *node.outputs]:
        if v is None or v.dtype is None or v.is_const:
            continue
        if v.shape is not None and 0 in v.shape and node.op_type not in EMPTY_EXACT:
            return (f"{v.name} is empty {list(v.shape)}: {node.op_type} is not known to run "
                    "right on empty tensors in OpenVINO (a Gather with empty indices kills the "
                    "process)")
        dtype = np.dtype(v.dtype)
        if dtype.kind not in "biuf":
            return f"{v.name} is {dtype}, which OpenVINO's CPU plugin does not compute"
        narrow = NARROWED.get(dtype)
        if narrow is not None and id(v) not in index_inputs:
            return (f"{v.name} is {dtype}, which OpenVINO's CPU plugin computes in {narrow} "
                    f"(values beyond {narrow}'s range or precision change)")
        if dtype.kind in "iu" and node.op_type not in INTEGER_EXACT and id(v) not in index_inputs:
            return (f"{v.name} is {dtype}: OpenVINO's CPU plugin computes {node.op_type} on "
                    "integers saturating (8-bit) or through float32 (32-bit), not as ONNX does")
    return None


def _op_reason(node: Node) -> str | None:
    """Why OpenVINO's ONNX frontend or CPU plugin runs this ``node`` differently from the
    reference (attributes and inputs it mishandles), else ``None``."""
    op, attrs = node.op_type, node.attrs
    if op == "SimplifiedLayerNormalization" and int(attrs.get("axis", -1)) >= 0:
        return ("OpenVINO's ONNX frontend fails to convert onnxruntime's SimplifiedLayerNormalization "
                "with a non-negative axis (measured with OpenVINO 2026.4; negative ones convert)")
    if op in AXES_ATTR_IGNORED and 13 <= node.opset < 18 and attrs.get("axes"):
        return f"OpenVINO's ONNX frontend ignores {op}'s axes attribute at opset {node.opset}"
    if op == "ReduceLogSum" and attrs.get("noop_with_empty_axes") and (
            len(node.inputs) < 2 or node.inputs[1] is None
            or (node.inputs[1].is_const and np.asarray(node.inputs[1].const).size == 0)):
        return "OpenVINO computes log(x) where noop_with_empty_axes makes it the identity"
    if op == "Softmax" and node.opset < 13:
        shape = node.inputs[0].shape
        axis = int(attrs.get("axis", 1)) % max(len(shape), 1)
        if int(np.prod(shape[axis + 1:])) != 1:  # else the 2-D coercion changes nothing
            return ("OpenVINO's ONNX frontend runs Softmax before opset 13 along its axis alone, "
                    "not over the input coerced into 2-D")
    if op == "LRN" and int(attrs.get("size", 1)) % 2 == 0:
        return "OpenVINO centres LRN's window differently from ONNX when size is even"
    if op == "MaxPool" and len(node.outputs) > 1 and attrs.get("storage_order"):
        return "OpenVINO's MaxPool indices differ from ONNX's when storage_order is 1"
    if op == "Constant" and set(attrs) - {"value"}:
        return "OpenVINO's ONNX frontend reads only the value attribute of Constant"
    if op == "Dropout":
        if any(v is not None and not v.is_const for v in node.inputs[1:]):
            return "OpenVINO's ONNX frontend needs Dropout's ratio and training_mode constant"
        if len(node.inputs) > 2 and node.inputs[2] is not None and np.asarray(node.inputs[2].const).any():
            return "OpenVINO's ONNX frontend does not run Dropout in training mode"
    if op == "Pad":
        if attrs.get("mode") == "wrap":
            return "OpenVINO's ONNX frontend has no wrap padding"
        if any(v is not None and not v.is_const for v in node.inputs[1:]):
            # measured: a run-time constant_value pads with 0
            return "OpenVINO pads wrongly unless pads, constant_value and axes are constants"
    return None


def node_reason(node: Node) -> str | None:
    """``None`` when OpenVINO can run ``node`` as the reference does, else why not."""
    if node.key_op != node.op_type and node.key_op in UNSUPPORTED_OPS:  # another domain's
        return f"{node.key_op}: {UNSUPPORTED_OPS[node.key_op]}"
    why = static_node_reason(node, extra_ops=CONTRIB_OPS)
    if why is not None:
        return why
    if node.op_type in UNSUPPORTED_OPS:
        return f"{node.op_type}: {UNSUPPORTED_OPS[node.op_type]}"
    return _dtype_reason(node) or _op_reason(node) or region_quirks.openvino_reason(node)


def propose(graph: Graph) -> list[list[str]]:
    """OpenVINO's regions of ``graph`` (see :func:`impls.regions.propose`); the nodes it
    refuses are proposed alone too, so that the tuner records why (:func:`_supports`)."""
    return regions.propose(graph, node_reason, refused_alone=True)


def _supports(region: FusedNode) -> str | None:
    return region_reason(region, node_reason)


# ------------------------------------------------------------------------------------------
# building
# ------------------------------------------------------------------------------------------

_CORE: Any = None
_CORE_LOCK = threading.Lock()


def core() -> Any:
    """The process's one ``openvino.Core`` (created on first use; it holds the plugins)."""
    global _CORE
    with _CORE_LOCK:
        if _CORE is None:
            import openvino as ov

            _CORE = ov.Core()
        return _CORE


def compile_config(precision: str = "f32", region: FusedNode | None = None) -> dict[str, Any]:
    """The CPU plugin's settings for a region: latency, one stream, the configured threads,
    float32 inference (no bf16 / f16 where the CPU has them) and denormals kept: with
    ``CPU_DENORMALS_OPTIMIZATION`` on, compiling sets flush-to-zero on the calling thread, and
    numpy in that thread flushes denormals from then on (measured).

    Built for a throughput plan's serving configuration (:mod:`dispatch.serving`): a stream's
    thread count, unpinned when several streams share the cores, or, in the configuration's
    ``shared`` mode, the throughput hint with its number of OpenVINO streams sharing the
    threads. ``precision``: the inference precision hint (``f32``; ``bf16`` for the
    reduced-precision variant, :mod:`impls.openvino.reduced`). In float32, OpenVINO's dynamic
    quantization of activations is off unless ``region``'s MatMulNBits all declare int8
    activations (:func:`impls.openvino.settings.dynamic_quantization`)."""
    build = serving.build_settings()
    threads = (build and build.threads) or SETTINGS["threads"] or usable_cores()
    nodes = region.nodes if region is not None else []
    levels = [level for level in map(nbits_accuracy_level, nodes) if level is not None]
    exact = {} if precision != "f32" else dynamic_quantization(
        levels, any(n.op_type == "DequantizeLinear" for n in nodes))
    if build is not None and build.library_streams:
        return {
            "PERFORMANCE_HINT": "THROUGHPUT",
            "INFERENCE_NUM_THREADS": threads,
            "NUM_STREAMS": str(build.library_streams),
            "INFERENCE_PRECISION_HINT": precision,
            "CPU_DENORMALS_OPTIMIZATION": False,
            **exact,
        }
    config: dict[str, Any] = {
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": threads,
        "NUM_STREAMS": "1",
        "INFERENCE_PRECISION_HINT": precision,
        "CPU_DENORMALS_OPTIMIZATION": False,
        **exact,
    }
    if build is not None and build.shared_cores:
        # each stream's compiled model would pin its threads from the first core on, every
        # stream onto the same ones: 2 streams x 1 thread ran DenseNet-121 at 18/s pinned,
        # 37/s unpinned (AMD EPYC, 2 cores)
        config["ENABLE_CPU_PINNING"] = False
    return config


def compiled_model(region: FusedNode, precision: str = "f32", edges: str | None = None) -> Any:
    """``region`` compiled for OpenVINO's CPU plugin: its ONNX model read by the ONNX
    frontend from a file with external weights, through the compiled cache
    (:mod:`impls.openvino.compiled_cache`); ``edges="bf16"``: its float32 inputs and outputs
    read and written as bfloat16."""
    from impls.openvino.compiled_cache import compile_region

    return compile_region(core(), region, compile_config(precision, region), str(SETTINGS["compiled_cache"]),
                          edges)


def _direct_types(ports: Any) -> list[np.dtype] | None:
    """The numpy dtypes of compiled model ``ports``, ``None`` unless all are plain numbers (a
    boolean or string port goes through the binding's own conversion)."""
    types = []
    for port in ports:
        try:
            dtype = np.dtype(port.get_element_type().to_dtype())
        except (RuntimeError, TypeError, ValueError):
            return None
        if dtype.kind not in "iuf":
            return None
        types.append(dtype)
    return types


#: held while an infer request is created and first run, by any region (see build_region)
_FIRST_RUNS = threading.Lock()


class _Requests:
    """A compiled model's infer requests, each lent to one run at a time: as many as the runs
    that were ever in flight at once on it, not one per calling thread.

    Each thread used to keep its own request per compiled model. A plan of 16 streams x 1
    thread, called from 16 threads, then made 16 requests on each stream's model (each
    request goes to whichever stream is free): 256, each created and first run alone behind
    ``_FIRST_RUNS`` over the first seconds of serving (measured on mobilenet_v2, the AVX2
    machine: a first run every ~0.1 s for 6 s and a p99 of 300-800 ms at a p50 of 50-90 ms).
    A list's ``pop`` and ``append`` are atomic: no lock on the way of every run. The last
    request given back is lent first (its buffers are the likeliest in cache)."""

    __slots__ = ("free",)

    def __init__(self) -> None:
        self.free: list[Any] = []

    def take(self) -> Any | None:
        """A free request, else ``None``: the caller creates one."""
        try:
            return self.free.pop()
        except IndexError:
            return None

    def give_back(self, request: Any) -> None:
        self.free.append(request)


@impls.register_region("compiled", propose=propose, priority=Priority.DEFAULT, supports=_supports)
def build_region(region: FusedNode):
    """A region as one model compiled by OpenVINO's CPU plugin, each run on an infer request
    of its own while it runs.

    A compiled model may serve several threads at once, an infer request may not (it holds one
    run's tensors), so each run borrows one of the model's requests (:class:`_Requests`) and
    gives it back when its outputs are copied. Outputs are copied out of the
    request's buffers (``share_outputs=False``), which the next run of that request reuses, and
    given the dtype of the region's outputs where the plugin returned another. Its
    ``library_bytes`` attribute is what OpenVINO allocated while the model was compiled and
    first run (:class:`impls.region_profile.MemoryProbe`, less the outputs handed over; the
    initial figure covers the compilation alone), which the plan's peak memory counts."""
    return build_compiled(region)


def build_compiled(region: FusedNode, precision: str = "f32", compile: Any = None, edges: str | None = None):
    """:func:`build_region` with the inference precision hint ``precision``, or with the model
    ``compile(region)`` returns (a quantized one: :mod:`impls.openvino.reduced`); ``edges="bf16"``:
    the region's float32 inputs and outputs are bfloat16 arrays (the ``bf16`` layout)."""
    from openvino import Tensor

    core().get_versions("CPU")  # the plugin loaded before the probe: its code is not the region's data
    probe = MemoryProbe().start()
    compiled = compile(region) if compile is not None else compiled_model(region, precision, edges)
    created = probe.stop() or 0
    pending = [True]
    out_bytes = sum(v.nbytes for v in region.outputs)  # counted by the plan, not the library
    # by position: OpenVINO keeps the ONNX model's input and output order, not always its
    # names (a region that is one Dropout or Identity gets its input renamed to its output)
    if len(compiled.inputs) != len(region.inputs) or len(compiled.outputs) != len(region.outputs):
        raise RuntimeError(f"OpenVINO compiled {len(compiled.inputs)} inputs and {len(compiled.outputs)} "
                           f"outputs for a region of {len(region.inputs)} and {len(region.outputs)}")
    dtypes = [np.dtype(v.dtype) for v in region.outputs]
    if edges is not None:
        return _run_with_edges(compiled, dtypes, created)
    # the request's tensors set directly where every port is of a plain numeric type (and the
    # inputs writeable: OpenVINO shares no read-only memory): saves the binding's dispatch of a
    # list of inputs (measured on a ResNet-50 int8 region, 20 alternations of 15 runs in one
    # process: 1.5% of its 11.8 ms; OpenVINO 2026.4). The input dtypes, or None: never direct
    direct = _direct_types(compiled.inputs) if _direct_types(compiled.outputs) is not None else None
    requests = _Requests()

    def infer(request: Any, feeds: list[np.ndarray]) -> list[np.ndarray]:
        """One run; the outputs as arrays of the request's buffers (valid until its next run)."""
        if direct is not None and all(a.dtype == t and a.flags.writeable for a, t in zip(feeds, direct)):
            for k, a in enumerate(feeds):
                request.set_input_tensor(k, Tensor(a, shared_memory=True))
            request.infer()
            return [request.get_output_tensor(k).data for k in range(len(dtypes))]
        results = request.infer(dict(enumerate(feeds)), share_inputs=True, share_outputs=True)
        return [results[k] for k in range(len(dtypes))]

    def run(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        # the first run is measured, its infer request's buffers included
        first = MemoryProbe().start() if pending and first_run(pending) else None
        feeds = [np.require(a, requirements="C") for a in arrays]  # keeps 0-d arrays 0-d
        request = requests.take()
        # a new request is created and first run alone: the first runs of several requests
        # at once from Python threads deadlocked OpenVINO 2026.4's binding (11 processes in 25
        # of 4 threads starting together; none in 40 with first runs alone)
        with _FIRST_RUNS if request is None else contextlib.nullcontext():
            if request is None:
                request = compiled.create_infer_request()
            # copied out of the request's buffers, which its next run reuses
            outs = [np.array(r, dtype=dtype) for r, dtype in zip(infer(request, feeds), dtypes)]
        requests.give_back(request)  # not after a failed run: a new one is made instead
        if first is not None:
            grown = max(0, (first.stop() or 0) - out_bytes)
            run.library_bytes = created + grown  # type: ignore[attr-defined]
        return tuple(outs)

    run.library_bytes = created  # type: ignore[attr-defined]
    run.requests = requests  # type: ignore[attr-defined]
    return run


def _run_with_edges(compiled: Any, dtypes: list[np.dtype], created: int):
    """The kernel of a region compiled with bf16 edges: bfloat16 arrays in and out where the
    region's tensors are float32 (OpenVINO's Python binding has no bfloat16 dtype: the bytes
    go in and come out as 16-bit words), other tensors as they are."""
    import ml_dtypes
    from openvino import Tensor, Type

    bf16 = np.dtype(ml_dtypes.bfloat16)
    outs_dtype = [bf16 if d == np.float32 else d for d in dtypes]
    requests = _Requests()

    def tensor(a: np.ndarray) -> Any:
        a = np.ascontiguousarray(a)
        return Tensor(a.view(np.uint16), list(a.shape), Type.bf16) if a.dtype == bf16 else Tensor(a)

    def run(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        request = requests.take()
        with _FIRST_RUNS if request is None else contextlib.nullcontext():
            if request is None:
                request = compiled.create_infer_request()
            for k, a in enumerate(arrays):
                request.set_input_tensor(k, tensor(a))
            request.infer()
            outs = []
            for k, dtype in enumerate(outs_dtype):
                data = request.get_output_tensor(k).data
                outs.append(data.view(np.uint16).view(bf16).copy() if dtype == bf16
                            else np.array(data, dtype=dtype))
        requests.give_back(request)
        return tuple(outs)

    run.library_bytes = created  # type: ignore[attr-defined]
    return run
