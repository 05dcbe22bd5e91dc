"""Where onnxruntime and OpenVINO run the exporters' index, layout and normalisation operators
(Resize, Einsum, DepthToSpace, SpaceToDepth, GroupNormalization, MeanVarianceNormalization,
and the types some lack kernels for; OpenVINO's LpNormalization is in its UNSUPPORTED_OPS)
differently from ONNX (the numpy reference) or fail on them, measured with onnxruntime 1.32 and
OpenVINO 2026.4 on one-node regions (tests/numpy/test_exporter_index_ops.py's cases and more);
each region backend's ``node_reason`` refuses these nodes with the reason given here.

GroupNormalization before opset 21 (scale and bias per group) is refused by both: onnx's
checker rejects it as deprecated, so its region model would not load.

Resize, both libraries: with ``align_corners`` (and onnxruntime with ``tf_crop_and_resize``)
they take ``length_resized`` as the integer output length, where ONNX's reference and its
conformance data take ``scale * length_original``; the two differ when scales give a
fractional length (measured: errors of 0.5 to 2.7 on N(0, 1) data).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from dispatch.graph import Node

#: dtypes onnxruntime's CPU Resize has kernels for (others: NOT_IMPLEMENTED at session creation)
ORT_RESIZE_TYPES = frozenset({"float16", "float32", "int8", "uint8", "int32"})
#: op -> the dtypes of input 0 onnxruntime's CPU provider has kernels for, where it lacks some
#: (measured: NOT_IMPLEMENTED at session creation); SpaceToDepth gains more at opset 28
ORT_TYPES: dict[str, frozenset[str]] = {
    "DepthToSpace": frozenset({"float16", "float32", "float64", "int8", "uint8"}),
    "SpaceToDepth": frozenset({"float16", "float32", "float64", "int8", "uint8"}),
    "ConvTranspose": frozenset({"float16", "float32"}),
    "InstanceNormalization": frozenset({"float16", "float32"}),
    "Einsum": frozenset({"float16", "float32", "float64", "int32", "int64"}),
    "EyeLike": frozenset({"float16", "float32", "float64", "int32", "int64", "uint64"}),
}
#: EyeLike's output dtypes onnxruntime has kernels for
ORT_EYE_LIKE_OUT = frozenset({"float32", "float64", "int32", "int64", "uint64"})


def _const(node: Node, i: int) -> np.ndarray | None:
    v = node.input(i)
    if v is None or not v.is_const:
        return None
    c = np.asarray(v.const)
    return c if c.size else None


def _given(node: Node, i: int) -> bool:
    v = node.input(i)
    return v is not None and not (v.is_const and np.asarray(v.const).size == 0)


def _fractional_lengths(node: Node) -> str | None:
    """Why the resized lengths ``scale * length`` may be fractional (scales given and not
    constant, or constant with a fractional product), else ``None``."""
    if not _given(node, 2) or _given(node, 3):
        return None  # sizes: the lengths are integers
    xs = node.inputs[0].shape if node.inputs and node.inputs[0] is not None else None
    scales = _const(node, 2)
    if scales is None or xs is None:
        return "its scales are not constant (the resized lengths scale * length may be fractional)"
    axes = node.attr("axes") if node.opset >= 18 else None
    dims = [xs[int(a)] for a in axes] if axes is not None else list(xs)
    for s, n in zip(scales.astype(np.float64).tolist(), dims):
        if not float(s * n).is_integer():
            return f"scale {s:g} gives axis length {n} the fractional resized length {s * n:g}"
    return None


def _resized_axes(node: Node) -> list[int] | None:
    """The axes whose length a Resize changes (from its static input and output shapes)."""
    x, y = node.inputs[0], node.outputs[0]
    if x is None or x.shape is None or y.shape is None or len(x.shape) != len(y.shape):
        return None
    return [k for k, (a, b) in enumerate(zip(x.shape, y.shape)) if a != b]


def _rank(node: Node) -> int | None:
    x = node.inputs[0] if node.inputs else None
    return None if x is None or x.shape is None else len(x.shape)


# -- OpenVINO ---------------------------------------------------------------------------------


def _group_norm_18(node: Node) -> str | None:
    if node.op_type == "GroupNormalization" and node.opset < 21:
        return ("onnx's checker rejects GroupNormalization before opset 21 as deprecated (the "
                "region model would not load)")
    return None


#: ops OpenVINO's CPU plugin gets wrong on AVX-512 CPUs only (see :func:`openvino_reason`)
OPENVINO_AVX512_REFUSED = ("Greater", "GreaterOrEqual")


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """The first CPU's flags in /proc/cpuinfo (Linux x86; empty when unknown)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def has_avx512() -> bool:
    """Whether this CPU has AVX-512 (Linux: /proc/cpuinfo's flags; ``False`` when unknown)."""
    return "avx512f" in _cpu_flags()


def has_vnni() -> bool:
    """Whether this CPU has an int8 dot product without an int16 intermediate (AVX512_VNNI or
    AVX-VNNI; ``True`` when the flags are unknown, as on Arm, where the quirk below is x86's)."""
    flags = _cpu_flags()
    return not flags or not ({"avx2", "sse4_1"} & flags) or bool({"avx512_vnni", "avx_vnni"} & flags)


#: onnxruntime's u8 x s8 ops and the index of their int8 weight input
ORT_U8S8_WEIGHT = {"MatMulInteger": 1, "QLinearMatMul": 3, "QLinearConv": 3}


def _onnxruntime_u8s8(node: Node) -> str | None:
    at = ORT_U8S8_WEIGHT.get(node.op_type)
    if at is None:
        return None
    a, w = node.input(0), node.input(at)
    if a is None or w is None or a.dtype is None or w.dtype is None:
        return None
    if dtype_name(a.dtype) != "uint8" or dtype_name(w.dtype) != "int8" or w.is_const:
        return None  # a constant weight: the region widens it to uint8 where the CPU saturates
    from impls.onnxruntime.u8s8 import saturates_u8s8

    if not saturates_u8s8():
        return None
    # measured with onnxruntime 1.32 on an AMD EPYC (Zen 3, AVX2, no VNNI): MatMulInteger
    # 4x17 @ 17x33 with full-range operands differs from the exact int32 product at 41 of 132
    # elements, QLinearMatMul at 88 of 132 and QLinearConv at 481 of 825 outputs (by up to 11);
    # exact on AVX512_VNNI. Its u8 x s8 kernels without VNNI add pairs of products in 16 bits
    # with saturation (vpmaddubsw); a constant weight is widened to uint8 by the region
    # (impls.onnxruntime.u8s8), a weight computed at run time cannot be
    return (f"onnxruntime's {node.op_type} of uint8 by int8 saturates on this CPU (no VNNI: its "
            f"AVX2 kernel adds pairs of products in 16 bits, vpmaddubsw): results differ from "
            f"ONNX's exact integer product; a constant weight is widened to uint8 by the region, "
            f"but {w.name!r} is computed at run time")


def openvino_reason(node: Node) -> str | None:
    """Why OpenVINO's ONNX frontend or CPU plugin runs this node differently from ONNX (or
    fails on it), else ``None``."""
    if (node.op_type in OPENVINO_AVX512_REFUSED and has_avx512()
            and any(v is not None and v.dtype is not None and np.dtype(v.dtype).kind == "f"
                    for v in node.inputs)):
        # measured with OpenVINO 2026.4 on an AVX-512 Xeon (not on AVX2): Greater(NaN, 1),
        # Greater(1, NaN) and Greater(NaN, NaN) give True, GreaterOrEqual likewise; Less is right
        return (f"{node.op_type} on floats is never offered to OpenVINO on AVX-512 CPUs, where "
                f"its CPU plugin gives True when an operand is NaN (ONNX: False)")
    if node.op_type == "Resize":
        return _openvino_resize(node)
    if node.op_type in ("AveragePool", "MaxPool") and int(node.attr("ceil_mode", 0)):
        why = _window_past_input(node)
        if why:
            return why
    if node.op_type == "SpaceToDepth" and node.opset >= 28 and node.attr("mode", "DCR") == "CRD":
        return "OpenVINO's SpaceToDepth ignores mode CRD (measured: it gives the DCR order)"
    if node.op_type == "LSTM" and node.input(7) is not None:
        return ("OpenVINO's ONNX frontend drops an LSTM's peepholes P (measured with OpenVINO "
                "2026.4: P missing from the compiled model's inputs, errors up to 0.33)")
    if node.op_type == "Einsum":
        eq = str(node.attr("equation", "")).replace(" ", "")
        if "->" not in eq and any(len(set(t)) < len(t.replace("...", "")) for t in eq.split(",")):
            return ("OpenVINO fails to compile an implicit-output Einsum with a repeated label "
                    "(measured: 'ii')")
    return _group_norm_18(node)


def _window_past_input(node: Node) -> str | None:
    """A ceil-mode pool whose window is larger than its padded input (EfficientNet's pooler
    in the dynamo export): OpenVINO's ONNX frontend fails to convert it (measured, 2026.4)."""
    x = node.input(0)
    kernel = node.attr("kernel_shape")
    if x is None or x.shape is None or not kernel:
        return None
    pads = list(node.attr("pads", [0] * (2 * len(kernel))) or [0] * (2 * len(kernel)))
    spatial = x.shape[2:]
    for k, (size, kk) in enumerate(zip(spatial, kernel)):
        if int(kk) > int(size) + int(pads[k]) + int(pads[k + len(kernel)]):
            return (f"OpenVINO fails to convert a ceil_mode {node.op_type} whose window ({list(kernel)}) "
                    f"is larger than its padded input ({list(spatial)}) (measured: frontend error)")
    return None


def _openvino_resize(node: Node) -> str | None:
    a = node.attrs
    ctm = str(a.get("coordinate_transformation_mode", "half_pixel"))
    if ctm in ("half_pixel_symmetric", "tf_crop_and_resize"):
        return f"OpenVINO's ONNX frontend does not convert Resize with {ctm} (measured: compile fails)"
    if node.opset >= 18 and int(a.get("antialias", 0)):
        return "OpenVINO's antialiased Resize differs from ONNX's (measured: errors up to 1.0)"
    if int(a.get("exclude_outside", 0)):
        return ("OpenVINO's cubic Resize with exclude_outside differs from ONNX's "
                "(measured: errors 0.05 to 0.15)")
    if node.opset >= 18 and str(a.get("keep_aspect_ratio_policy", "stretch")) != "stretch":
        return "OpenVINO's Resize ignores keep_aspect_ratio_policy (measured: wrong output shape)"
    if node.opset >= 18 and any(int(x) < 0 for x in a.get("axes") or ()):
        return "OpenVINO's ONNX frontend fails on Resize with negative axes"
    rank = _rank(node)
    if rank is not None and rank > 5:
        return (f"OpenVINO's Resize of rank {rank} is not offered: the linear one crashes the "
                "process (measured: free(): invalid pointer)")
    resized = _resized_axes(node)
    if resized is None:
        return "Resize's output shape is not static"
    if rank is not None and rank >= 4 and any(k < 2 for k in resized):
        return ("OpenVINO fails to compile (nearest, linear) or computes wrongly (cubic) a Resize "
                "of the batch or channel axis")
    if ctm == "align_corners":
        why = _fractional_lengths(node)
        if why:
            return (f"OpenVINO's align_corners takes the integer output length where ONNX takes "
                    f"scale * length: {why}")
    return None


# -- onnxruntime ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def dtype_name(dtype: Any) -> str:
    """``np.dtype(dtype).name``, remembered (a region's check asks it of every node, and
    numpy builds the name anew each time: ~5 us)."""
    return np.dtype(dtype).name


def onnxruntime_reason(node: Node) -> str | None:
    """Why onnxruntime runs this node differently from ONNX (or fails on it), else ``None``."""
    if node.op_type == "Resize":
        return _onnxruntime_resize(node)
    x = node.inputs[0] if node.inputs else None
    dtype = None if x is None or x.dtype is None else dtype_name(x.dtype)
    known = ORT_TYPES.get(node.op_type)
    if node.op_type == "SpaceToDepth" and node.opset >= 28:
        known = None
    if known is not None and dtype is not None and dtype not in known:
        return (f"onnxruntime has no {node.op_type} kernel for {dtype} (measured: "
                "NOT_IMPLEMENTED)")
    y = node.outputs[0] if node.outputs else None
    if node.op_type == "EyeLike" and y is not None and y.dtype is not None:
        out = dtype_name(y.dtype)
        if out not in ORT_EYE_LIKE_OUT:
            return f"onnxruntime has no EyeLike kernel giving {out} (measured: NOT_IMPLEMENTED)"
    scatter = node.op_type in ("ScatterND", "ScatterElements")
    if scatter and dtype == "float16" and str(node.attrs.get("reduction", "none")) != "none":
        return f"onnxruntime's {node.op_type} has no float16 reduction (measured: the run fails)"
    if node.op_type == "Einsum":
        return _onnxruntime_einsum(node)
    if node.op_type in ORT_U8S8_WEIGHT:
        return _onnxruntime_u8s8(node)
    if node.op_type == "MeanVarianceNormalization":
        return ("MeanVarianceNormalization is never offered to onnxruntime, which divides by "
                "the standard deviation without ONNX's epsilon 1e-9 (measured: a constant "
                "group gives 0 / 0 = NaN where ONNX gives 0, values ~1e-30 give inf)")
    return _group_norm_18(node)


def _onnxruntime_resize(node: Node) -> str | None:
    x = node.inputs[0]
    dtype = None if x is None or x.dtype is None else np.dtype(x.dtype)
    if dtype is not None and dtype.name not in ORT_RESIZE_TYPES:
        return f"onnxruntime's CPU Resize has no {dtype.name} kernel (measured: NOT_IMPLEMENTED)"
    mode = str(node.attrs.get("mode", "nearest"))
    ctm = str(node.attrs.get("coordinate_transformation_mode", "half_pixel"))
    if mode != "nearest" and dtype is not None and dtype.kind in "iu":
        return (f"onnxruntime's {mode} Resize of {dtype.name} rounds differently from ONNX's "
                f"reference (measured)")
    if ctm in ("align_corners", "tf_crop_and_resize"):
        why = _fractional_lengths(node)
        if why:
            return (f"onnxruntime's {ctm} takes the integer output length where ONNX takes "
                    f"scale * length: {why}")
    if mode == "nearest":
        return None
    rank, resized = _rank(node), _resized_axes(node)
    if rank is None or resized is None:
        return "Resize's input or output shape is not static"
    if node.opset >= 18 and str(node.attrs.get("keep_aspect_ratio_policy", "stretch")) != "stretch":
        # one scale for every listed axis: onnxruntime checks the scales, not the sizes
        axes = node.attrs.get("axes")
        resized = sorted({int(a) % rank for a in axes} if axes else set(range(rank)))
    if not _ort_layout_ok(mode, rank, resized):
        return (f"onnxruntime's {mode} Resize takes only {ORT_LAYOUTS[mode]}; this one resizes "
                f"axes {resized} of rank {rank} (measured: session creation fails)")
    return None


ORT_LAYOUTS = {
    "linear": "ranks 2 and 3, rank 4 with axes 0 and 1 or 0 and 3 kept, rank 5 with axes 0 "
              "and 1 kept",
    "cubic": "rank 2, and rank 4 with axes 0 and 1 kept",
}


def _ort_layout_ok(mode: str, rank: int, resized: Sequence[int]) -> bool:
    kept = set(range(rank)) - set(resized)
    if mode == "linear":
        return rank in (2, 3) or (rank == 4 and ({0, 1} <= kept or {0, 3} <= kept)) or (
            rank == 5 and {0, 1} <= kept)
    return rank == 2 or (rank == 4 and {0, 1} <= kept)


def _onnxruntime_einsum(node: Node) -> str | None:
    """Einsum's labels and ellipses (its dtypes are checked with the other ops')."""
    eq = str(node.attr("equation", "")).replace(" ", "")
    if re.search(r"[A-Z]", eq):
        return "onnxruntime's Einsum takes only lower-case labels (measured: run fails)"
    terms = eq.partition("->")[0].split(",")
    spans = set()
    for term, v in zip(terms, node.inputs):
        if "..." in term and v is not None and v.shape is not None:
            spans.add(len(v.shape) - len(term.replace("...", "")))
    if len(spans) > 1:
        return ("onnxruntime's Einsum needs every ellipsis to span as many axes (it does not "
                f"broadcast ellipses of {sorted(spans)} axes; measured: session creation fails)")
    return None

