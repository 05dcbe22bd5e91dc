"""Regions of the graph as onnxruntime InferenceSessions.

The proposals — every supported node alone, blocks between cut points, stages, the maximal
ranges of supported nodes — and the region's standalone ONNX model come from
:mod:`impls.regions` (shared with the OpenVINO backend); this module owns what accepts a node
for onnxruntime and the building: an InferenceSession with every graph optimisation, run on
the caller's arrays (read in place; outputs allocated by onnxruntime and handed over without a
copy: :func:`bound_run`). Library settings are candidates too:
``Region.onnxruntime.session_extended`` builds the large regions without the layout
optimisations (the NCHWc transformer), ``Region.onnxruntime.session_1thread`` with one intra-op
thread, for the tuner to measure against the default build; the plan names the variant, so it
records the settings.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch import serving
from dispatch.fusion import FusedNode
from dispatch.graph import Graph, Node
from dispatch.registry import ImplTable, Priority
from impls import region_quirks, regions
from impls.onnxruntime.settings import SETTINGS as SETTINGS  # set by the backend's configure
from impls.onnxruntime.u8s8 import saturates_u8s8, widen_int8_weights
from impls.region_profile import MemoryProbe, first_run
from impls.regions import _cut_points as _cut_points  # re-exported: tests import it from here
from impls.regions import _cut_value as _cut_value
from impls.regions import region_model, region_reason, static_node_reason
from impls.regions import usable_cores as _usable_cores

impls = ImplTable("onnxruntime")

#: default-domain ops never offered (none today; onnxruntime implements the standard set)
UNSUPPORTED_OPS: frozenset[str] = frozenset()

#: the accuracy level of the MatMulNBits onnxruntime fuses from int4 QDQ weights (its session
#: option; onnxruntime's default is 4, int8 activations): 0, float32 activations as the file says
QDQ_MATMULNBITS_LEVEL = "0"

#: onnxruntime's contrib operators (com.microsoft) offered to it: those whose schemas the
#: import knows (dispatch.contrib_schemas) and that its CPU provider runs (BiasSplitGelu is
#: CUDA-only); tests/numpy/test_contrib_regions.py keeps the list in step with the schemas
CONTRIB_OPS: frozenset[str] = frozenset(
    f"com.microsoft::{op}" for op in (
        "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization", "FusedMatMul", "RotaryEmbedding", "MultiHeadAttention",
        "Attention", "GroupQueryAttention", "MatMulNBits", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
        # the quantizers' QOperator format and the optimizer's fused embeddings
        "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat",
        "QLinearGlobalAveragePool", "QLinearAveragePool", "QGemm", "QAttention", "DynamicQuantizeLSTM",
        "EmbedLayerNormalization", "QEmbedLayerNormalization", "QLinearSoftmax",
    )
)
#: contrib operators of the schemas not offered, with why
CONTRIB_REFUSED: dict[str, str] = {
    "com.microsoft::BiasSplitGelu": "never offered to onnxruntime, which runs BiasSplitGelu on CUDA only "
                                    "(no CPU kernel)",
}


#: OneHot's (indices, depth, values) dtypes onnxruntime's CPU provider has kernels for
#: (measured with onnxruntime 1.32 over every numeric combination; others fail to load)
ONEHOT_TYPES: frozenset[tuple[str, str, str]] = frozenset(
    (i, d, v)
    for i, ds, vs in (
        ("int32", ("int32",), ("float16", "float32")),
        ("int32", ("float16", "float32"), ("float16", "float32")),
        ("int64", ("int32",), ("float16", "float32")),
        ("int64", ("int64",), ("int64", "float16", "float32")),
        ("int64", ("float16", "float32"), ("int32", "float16", "float32")),
        ("float16", ("int64",), ("int64",)),
        ("float16", ("float16", "float32"), ("float16", "float32")),
        ("float32", ("int64",), ("int64",)),
        ("float32", ("float16", "float32"), ("float16", "float32")),
    )
    for d in ds
    for v in vs
)


def _op_reason(node: Node) -> str | None:
    """Why onnxruntime cannot run this ``node`` (an attribute or type combination it has no
    kernel for), else ``None``."""
    if node.op_type not in ("Mod", "OneHot"):  # the only ops checked here (a region checks every node)
        return None
    dtypes = [None if v is None or v.dtype is None else region_quirks.dtype_name(v.dtype)
              for v in node.inputs]
    if node.op_type == "Mod" and not node.attrs.get("fmod") and any(
            d is not None and d.startswith("float") for d in dtypes):
        return ("onnxruntime runs Mod on floats only with fmod=1 (it fails on fmod=0 before "
                "opset 28)")
    indices = node.inputs[0] if node.inputs else None
    runtime_indices = indices is not None and not indices.is_const
    if node.op_type == "OneHot" and node.opset < 11 and runtime_indices:
        return ("onnxruntime counts negative OneHot indices from depth before opset 11 too, "
                "where ONNX gives an all-off row (measured with onnxruntime 1.32)")
    known = len(dtypes) == 3 and None not in dtypes
    if node.op_type == "OneHot" and known and tuple(dtypes) not in ONEHOT_TYPES:
        return (f"onnxruntime has no OneHot kernel for indices {dtypes[0]}, depth {dtypes[1]}, "
                f"values {dtypes[2]}")
    return None


def _contrib_reason(node: Node) -> str | None:
    """Why onnxruntime's contrib kernel of ``node`` does not compute what its definition says."""
    if node.key_op in CONTRIB_REFUSED:
        return CONTRIB_REFUSED[node.key_op]
    b = node.input(1) if node.key_op == "com.microsoft::FusedMatMul" else None
    if b is not None and (b.shape is None or len(b.shape) == 1) and node.attrs.get("transA"):
        return ("onnxruntime's FusedMatMul with transA and a 1-D B reads A untransposed (measured "
                "with onnxruntime 1.32: A reshaped, not transposed)")
    if node.key_op == "com.microsoft::EmbedLayerNormalization" and len(node.outputs) < 2:
        return ("never offered to onnxruntime: its EmbedLayerNormalization without the mask_index output "
                "fails onnxruntime 1.32's type inference (output index 1 is out of range)")
    if node.key_op == "com.microsoft::QAttention":
        x = node.input(0)
        if x is not None and x.dtype == np.dtype(np.int8):
            return "never offered to onnxruntime: onnxruntime 1.32 has no QAttention kernel for an int8 input"
    if node.key_op == "com.microsoft::QGemm":
        a, b = node.input(0), node.input(3)
        if a is not None and b is not None and a.dtype == np.dtype(np.int8) and b.dtype == np.dtype(np.uint8):
            return "never offered to onnxruntime: onnxruntime 1.32 has no QGemm kernel for int8 A and uint8 B"
    if node.key_op in ("com.microsoft::QLinearAdd", "com.microsoft::QLinearMul") and any(
            node.input(k) is None for k in (2, 5, 7)):
        return (f"never offered to onnxruntime: its {node.op_type} with an omitted zero point fails "
                f"onnxruntime 1.32's type inference (input data type does not match)")
    return None


def node_reason(node: Node) -> str | None:
    """``None`` when onnxruntime can run ``node``, else why not."""
    why = _contrib_reason(node) or static_node_reason(node, dynamic_ok=True, extra_ops=CONTRIB_OPS)
    if why is None and node.op_type in UNSUPPORTED_OPS:
        return f"{node.op_type} is not offered to onnxruntime"
    return why or _op_reason(node) or region_quirks.onnxruntime_reason(node)


#: onnxruntime's graph optimisation levels a region can be built with: ``all`` includes the
#: layout optimisations (the NCHWc transformer: blocked convolutions and reorders), which win
#: on some convolutions and machines and lose on others; ``extended`` stops before them
OPTIMIZATION_LEVELS = ("all", "extended")


#: onnxruntime's graph optimisers a region holding QDQ nodes runs without. MatMulAddFusion
#: (basic level) turns a MatMul + Add into a Gemm, with Reshapes around it where the inputs are
#: 3-D; in a region its static shapes let it do so before the extended level's QDQ fusions,
#: which then no longer find their DequantizeLinear -> MatMul patterns (NNCF's QDQ BERT:
#: 8 MatMulIntegerToFloat in the file's optimised graph, 2 in the region's, and 31 Reshapes; a
#: model file with symbolic shapes escapes it). Measured on the tools' corpus (medians of 1,500
#: runs, three times; Intel Xeon, Sapphire Rapids class): NNCF's BERT 268-275 -> 228-237 us
#: (the file in onnxruntime: 231), onnxruntime's own QDQ files and the 4-bit QDQ GPT-2 within
#: 1-4% either way.
QDQ_DISABLED_OPTIMIZERS = ("MatMulAddFusion",)


def session(region: FusedNode, optimization: str = "all", profile_dir: str | None = None,
            model: Any = None, threads: int | None = None):
    """An InferenceSession for ``region`` (graph optimisation ``optimization``, one of
    :data:`OPTIMIZATION_LEVELS`; the configured threads). With ``profile_dir``, the session
    profiles its runs and writes its optimised model there (:mod:`impls.onnxruntime.profile`).
    ``model``: the region's ONNX model as built elsewhere (a quantized one:
    :mod:`impls.onnxruntime.quantized`), else :func:`impls.regions.region_model`'s.
    ``threads``: the intra-op thread count instead of the configured one."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if profile_dir is not None:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(profile_dir, "ort")
        so.optimized_model_filepath = os.path.join(profile_dir, "optimized.onnx")
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                    "optimized.bin")
        so.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    so.graph_optimization_level = {
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    }[optimization]
    so.log_severity_level = 3
    # a blocked int4 DequantizeLinear before a MatMul (the QDQ form of 4-bit weights) is fused
    # into MatMulNBits at accuracy level 4 by default: activations rounded to int8 (GPT-2's
    # 4-bit QDQ export: 0.0058 off the file's float math, past the reference check); level 0
    # keeps the float activations the file defines
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", QDQ_MATMULNBITS_LEVEL)
    # a throughput plan's stream is built with its own thread count (dispatch.serving)
    build = serving.build_settings()
    so.intra_op_num_threads = (threads or (build and build.threads) or SETTINGS["intra_op_threads"]
                               or _usable_cores())
    so.inter_op_num_threads = 1
    weights: dict[str, np.ndarray] = {}
    if model is None:
        model = region_model(region, weights)
    if saturates_u8s8() and _multiplies_int8(region):
        # this CPU's uint8 x int8 kernels saturate (impls.onnxruntime.u8s8): the exact form
        widen_int8_weights(model, weights)
    if weights:  # taken from memory, not serialised into the model (see region_model)
        names = list(weights)
        so.add_external_initializers(names, [ort.OrtValue.ortvalue_from_numpy(weights[n]) for n in names])
    if not region.attrs.get("whole_graph") or (build is not None and build.shared_cores):
        # onnxruntime's workers spin after each run; between regions other backends' kernels
        # run, and spinning workers hold the cores they need (measured on squeezenet,
        # alternating an onnxruntime and a native run: 16.0 ms with spinning, 13.6 without,
        # for 4.7 + 6.4 ms alone). Only a region that is the whole graph keeps spinning, and
        # only when no other stream of a throughput plan shares the cores with it.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    disabled = list(QDQ_DISABLED_OPTIMIZERS) if any(
        n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node) else None
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"],
                                disabled_optimizers=disabled)


def _multiplies_int8(region: FusedNode) -> bool:
    """Whether ``region`` holds an int8 constant that an integer kernel may multiply (a cheap
    test before :func:`widen_int8_weights` reads the model)."""
    return any(v is not None and v.is_const and v.dtype == np.int8 for n in region.nodes for v in n.inputs)


def propose(graph: Graph) -> list[list[str]]:
    """onnxruntime's regions of ``graph`` (see :func:`impls.regions.propose`); the nodes it
    refuses are proposed alone too, so that the tuner records why (:func:`_supports`)."""
    return regions.propose(graph, node_reason, refused_alone=True)


def propose_large(graph: Graph) -> list[list[str]]:
    """The large regions, where the settings variants are measured (see
    :func:`impls.regions.large_regions`), and every refused node alone, so that the tuner
    records why this variant does not run it either."""
    refused = [[n.name] for n in graph.nodes if node_reason(n) is not None]
    return regions.large_regions(graph, node_reason) + refused


def _supports(region: FusedNode) -> str | None:
    return region_reason(region, node_reason)


@impls.register_region("session", propose=propose, priority=Priority.DEFAULT, supports=_supports,
                       settings={"graph_optimization_level": "all"}, dynamic_shapes=True)
def build_region(region: FusedNode):
    """A region as one onnxruntime InferenceSession (``InferenceSession.run``, which may be
    called from several threads at once)."""
    return bound_run(region, lambda: session(region))


@impls.register_region("session_extended", propose=propose_large, priority=Priority.FALLBACK,
                       supports=_supports, settings={"graph_optimization_level": "extended"},
                       dynamic_shapes=True)
def build_region_extended(region: FusedNode):
    """A large region as one onnxruntime InferenceSession without the layout optimisations
    (no NCHWc transformer); a settings variant the tuner measures, never the untuned choice."""
    return bound_run(region, lambda: session(region, "extended"))


#: the thread count of :func:`build_region_1thread`
ONE_THREAD = 1


@impls.register_region("session_1thread", propose=propose_large, priority=Priority.FALLBACK,
                       supports=_supports, settings={"graph_optimization_level": "all",
                                                     "intra_op_num_threads": ONE_THREAD},
                       dynamic_shapes=True)
def build_region_1thread(region: FusedNode):
    """A large region as one onnxruntime InferenceSession on one intra-op thread; a settings
    variant the tuner measures, never the untuned choice. On small models the pool's hand-offs
    cost more than a second core gives: measured with the files of the tools' corpus alone in
    onnxruntime (medians of 3,000 runs, Intel Xeon, Sapphire Rapids class, 2 cores), one thread
    against the default two: bert_opt 67 against 88 us, gpt2_opt 113 against 147, NNCF's BERT
    156 against 237; the CNNs the other way (cnn 108 against 84, cnn_dyn_qop 857 against
    572)."""
    return bound_run(region, lambda: session(region, threads=ONE_THREAD))


def bound_run(region: FusedNode, make: Callable[[], Any]) -> Callable[..., tuple[np.ndarray, ...]]:
    """The region's run function over the session ``make()`` creates: ``InferenceSession.run``
    on the caller's arrays (read in place; the outputs onnxruntime allocates handed over
    without a copy). It was IO binding (one per calling thread) until measured slower in every
    case: 13.2 against 7.3 us on a small Conv, 93 against 86 us on a tiny BERT, 1.65 against
    1.61 ms with 6.4 MB of outputs (Intel Xeon, Sapphire Rapids class; onnxruntime 1.32). Its
    ``library_bytes`` attribute is what onnxruntime allocated while the session was created
    and first run (:class:`impls.region_profile.MemoryProbe`; the initial figure covers the
    creation alone), which the plan's peak memory counts."""
    import onnxruntime  # noqa: F401  (loaded before the probe: the library's code is not its data)

    probe = MemoryProbe().start()
    sess = make()
    created = probe.stop() or 0
    pending = [True]  # the first run is measured too (the arena grows to its high water)
    out_bytes = sum(v.nbytes for v in region.outputs)  # counted by the plan, not the library
    in_names = [v.name for v in region.inputs]
    out_names = [v.name for v in region.outputs]

    def run(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        # (np.require keeps 0-d arrays 0-d; most arrays are contiguous already: a flag read)
        feeds = {name: a if type(a) is np.ndarray and a.flags.c_contiguous
                 else np.require(a, requirements="C") for name, a in zip(in_names, arrays)}
        if pending and first_run(pending):  # no exception raised on later runs
            first = MemoryProbe().start()
            outputs = sess.run(out_names, feeds)
            grown = max(0, (first.stop() or 0) - out_bytes)
            run.library_bytes = created + grown  # type: ignore[attr-defined]
        else:
            outputs = sess.run(out_names, feeds)
        return tuple(outputs)

    run.library_bytes = created  # type: ignore[attr-defined]
    return run


