"""Edge cases (see :mod:`tests.reliability.numerics_cases`) of the exporters' index operators
(issue 14); registered into :data:`~tests.reliability.numerics_cases.BUILDERS`.

The data tensors carry the edge values (activations of the edge kind's shapes); index tensors
are constants (as exporters emit them) holding negative as well as positive indices, the same
on every edge kind; weights (ConvTranspose, Einsum, the normalisations' scales) are ~1 (in
[1, 2] for ``overflow``, so that sums of positive terms overflow in any order). Scatters use
distinct indices for ``reduction="none"`` (ONNX leaves duplicates undefined) and duplicates
for the accumulating reductions.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from tests.reliability.numerics_cases import Build, Case, _sname, act_shapes, builder

#: Documented differences of these operators' cases (merged into test_edge_numerics'
#: DIFFERENCES): (implementation glob, op glob, edge glob) -> (the Tolerance's fields, why).
DIFFERENCES: dict[tuple[str, str, str], tuple[dict, str]] = {
    ("GroupNormalization.numpy.*", "GroupNormalization", "huge"): (
        {"rtol": 1e-3, "atol": 1e-4, "any_where_nan": True},
        "ONNX's GroupNormalization function body (onnx's ReferenceEvaluator runs it) computes "
        "the variance as E[x^2] - E[x]^2: squares of |x| ~1e30 overflow float32 and give "
        "inf - inf = NaN; the reference's two-pass variance gives the float32 result (bias)",
    ),
    ("MeanVarianceNormalization.numpy.*", "MeanVarianceNormalization", "huge"): (
        {"rtol": 1e-3, "atol": 1e-4, "any_where_nan": True},
        "ONNX's MeanVarianceNormalization function body computes the variance as E[x^2] - "
        "E[x]^2 (see GroupNormalization): NaN where squares of |x| ~1e30 overflow float32",
    ),
    ("Region.onnxruntime.session*", "GroupNormalization", "huge"): (
        {"rtol": 1e-3, "atol": 1e-4, "nan_anywhere": True},
        "onnxruntime's GroupNormalization gives NaN where squares of |x| ~1e30 overflow "
        "float32, as ONNX's function body does (see the numpy GroupNormalization)",
    ),
    ("ScatterElements.numpy.*", "ScatterElements", "nonfinite"): (
        {"rtol": 1e-5, "atol": 1e-6, "nan_anywhere": True},
        "onnx's ReferenceEvaluator reduces ScatterElements' max / min with Python's max(x, y) "
        "/ min(x, y), which drops a NaN update; the reference propagates NaN (np.maximum / "
        "np.minimum), as onnx's own ScatterND and the Max / Min operators do",
    ),
    ("Region.onnxruntime.session*|Region.openvino.compiled", "ScatterND|ScatterElements",
     "nonfinite"): (
        {"rtol": 1e-5, "atol": 1e-6, "any_where_nan": True},
        "onnxruntime's and OpenVINO's scatter max / min reductions return the non-NaN operand "
        "(their max / min pooling and reductions do the same); the reference propagates NaN",
    ),
    ("Resize.numpy.*", "Resize", "nonfinite"): (
        {"rtol": 0.0, "atol": 0.0, "not_compared": True},
        "onnx's ReferenceEvaluator is no oracle for Resize here: it clips float outputs to "
        "+-FLT_MAX (its saturate_cast turns inf into 3.4e38), and computes nearest as a 0 / 1 "
        "weighted sum (an inf neighbour makes 0 * inf = NaN). The numpy Resize is checked on "
        "these edge kinds through the onnxruntime and OpenVINO regions compared with it (exact "
        "for nearest) and by tests/numpy/test_exporter_index_ops.py",
    ),
    ("Region.onnxruntime.session*|Region.openvino.compiled", "Resize", "nonfinite"): (
        {"rtol": 1e-4, "atol": 1e-5, "any_where_nan": True, "nan_anywhere": True},
        "linear interpolation multiplies taps of weight 0 too: which taps an implementation "
        "multiplies (every tap of a separable pass in the reference, a 2-D bilinear product "
        "in onnxruntime / OpenVINO) decides where an inf neighbour gives 0 * inf = NaN; the "
        "finite values agree",
    ),
}


def _i64(b: Build, values: object) -> str:
    return b.const(np.array(values, np.int64))


def _signed(idx: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``idx`` (in [0, size)) with about half of the entries written as negative indices."""
    neg = rng.integers(0, 2, idx.shape).astype(bool)
    return np.where(neg, idx - size, idx).astype(np.int64)


# -- gathers and scatters ------------------------------------------------------------------------


@builder("GatherND")
def gather_nd_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        n, c, h, w = shape
        b = Build(op, edge, f"hw_slices_{_sname(shape)}")
        idx = [[0, c - 1], [n - 1, 0], [-1, -1]]
        out.append(b.done(b.op_(op, [b.x(shape), _i64(b, idx)])))
        b = Build(op, edge, f"batch1_{_sname(shape)}")
        rows = _signed(b.rng.integers(0, c, (n, 2, 1)), c, b.rng)  # (N, 2, 1): 2 channels each
        out.append(b.done(b.op_(op, [b.x(shape), b.const(rows)], batch_dims=1)))
        b = Build(op, edge, f"elements_{_sname(shape)}")
        size = np.array([n, c, h, w])
        pts = _signed(b.rng.integers(0, size, (5, 4)), size, b.rng)
        out.append(b.done(b.op_(op, [b.x(shape), b.const(pts)])))
    return out


def _distinct_rows(n: int, c: int, rng: np.random.Generator) -> np.ndarray:
    """Up to 3 distinct (n, c) pairs, as signed indices (K, 2)."""
    pairs = [(i, j) for i in range(n) for j in range(c)]
    pick = rng.permutation(len(pairs))[: min(3, len(pairs))]
    chosen = np.array([pairs[k] for k in pick], np.int64)
    return _signed(chosen, np.array([n, c]), rng)


@builder("ScatterND")
def scatter_nd_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        n, c, h, w = shape
        for reduction in ("none", "add", "mul", "max", "min"):
            b = Build(op, edge, f"{reduction}_{_sname(shape)}")
            idx = _distinct_rows(n, c, b.rng)
            if reduction != "none":  # a duplicate: both updates reduce into one slice
                idx = np.concatenate([idx, idx[:1]])
            upd = b.x((len(idx), h, w))
            out.append(b.done(b.op_(op, [b.x(shape), b.const(idx), upd], reduction=reduction)))
    return out


@builder("GatherElements")
def gather_elements_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        for axis in (1, 3):  # onnx's evaluator fails on a negative axis (unit tests have them)
            b = Build(op, edge, f"axis{axis}_{_sname(shape)}")
            a = axis % 4
            ishape = list(shape)
            ishape[a] = 3  # fewer or more entries than the data's axis
            idx = _signed(b.rng.integers(0, shape[a], ishape), shape[a], b.rng)
            out.append(b.done(b.op_(op, [b.x(shape), b.const(idx)], axis=axis)))
    return out


@builder("ScatterElements")
def scatter_elements_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        for axis, reduction in ((1, "none"), (-1, "none"), (1, "add"), (-1, "max"), (1, "min"),
                                (-1, "mul")):
            b = Build(op, edge, f"axis{axis}_{reduction}_{_sname(shape)}")
            a = axis % 4
            ishape = list(shape)
            ishape[a] = min(2, shape[a])
            size = shape[a]
            if reduction == "none":  # distinct targets along the axis for every position
                order = np.argsort(b.rng.random((*ishape[:a], size, *ishape[a + 1:])), axis=a)
                idx = np.take(order, np.arange(ishape[a]), axis=a)
            else:
                ishape[a] += 1  # more updates than targets on small axes: duplicates
                idx = b.rng.integers(0, size, ishape)
            idx = _signed(idx, size, b.rng)
            upd = b.x(tuple(idx.shape))
            out.append(b.done(b.op_(op, [b.x(shape), b.const(idx), upd], axis=axis,
                                    reduction=reduction)))
    return out


# -- Einsum --------------------------------------------------------------------------------------


@builder("Einsum")
def einsum_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        n, c, _, w = shape
        b = Build(op, edge, f"channel_mix_{_sname(shape)}")
        out.append(b.done(b.op_(op, [b.x(shape), b.w((c, 5))], equation="nchw,ck->nkhw")))
        b = Build(op, edge, f"batched_{_sname(shape)}")
        out.append(b.done(b.op_(op, [b.x(shape), b.x((n, c, w, 3), "weight")],
                                equation="...ij,...jk->...ik")))
        b = Build(op, edge, f"transpose_{_sname(shape)}")
        out.append(b.done(b.op_(op, [b.x(shape)], equation="nchw->nhwc")))
        b = Build(op, edge, f"reduce_{_sname(shape)}")
        out.append(b.done(b.op_(op, [b.x(shape)], equation="nchw->nc")))
    return out


# -- Resize --------------------------------------------------------------------------------------

#: name -> (attributes, scales or None, sizes rule or None)
RESIZE_KINDS: dict[str, tuple[dict, list[float] | None, str | None]] = {
    "nearest_asym_floor_x2": ({"coordinate_transformation_mode": "asymmetric",
                               "nearest_mode": "floor"}, [1, 1, 2, 2], None),
    "nearest_half_pixel_sizes": ({}, None, "odd"),
    "linear_half_pixel_x2": ({"mode": "linear"}, [1, 1, 2, 2], None),
    "linear_align_corners_sizes": ({"mode": "linear",
                                    "coordinate_transformation_mode": "align_corners"}, None, "odd"),
    "linear_pytorch_half_pixel_down": ({"mode": "linear",
                                        "coordinate_transformation_mode": "pytorch_half_pixel"},
                                       None, "down"),
    "cubic_x2": ({"mode": "cubic"}, [1, 1, 2, 2], None),
}


def _resize_sizes(shape: tuple[int, ...], rule: str) -> list[int]:
    n, c, h, w = shape
    if rule == "odd":
        return [n, c, 2 * h + 1, w + 2]
    return [n, c, max(1, h // 2), max(1, (w + 1) // 2)]


@builder("Resize")
def resize_cases(op: str, edge: str) -> list[Case]:
    """Every kind on every edge, but cubic on ``overflow``: its weights are partly negative and
    above 1, so partial sums of values ~3e38 overflow float32 in an order each library picks
    (onnxruntime and OpenVINO give inf or inf - inf = NaN where the float64 sum of the
    reference is finite, onnx's evaluator saturates to FLT_MAX); tests/numpy covers the
    reference's cubic near FLT_MAX."""
    out = []
    for shape in act_shapes(edge, 2):
        for kind, (attrs, scales, sizes) in RESIZE_KINDS.items():
            if edge == "overflow" and attrs.get("mode") == "cubic":
                continue
            b = Build(op, edge, f"{kind}_{_sname(shape)}")
            ins = [b.x(shape), ""]
            if scales is not None:
                ins.append(b.const(np.array(scales, np.float32)))
            else:
                ins += ["", _i64(b, _resize_sizes(shape, sizes))]
            out.append(b.done(b.op_(op, ins, **attrs)))
    return out


# -- ConvTranspose -------------------------------------------------------------------------------

#: name -> (kernel, strides, pads, output_padding, group rule)
CONV_T_KINDS = {
    "k3s2p1op1": (3, 2, 1, 1, "one"),
    "k2s2": (2, 2, 0, 0, "one"),
    "k3s1p1_depthwise": (3, 1, 1, 0, "depthwise"),
    "k4s2p1_bias": (4, 2, 1, 0, "one"),
}


@builder("ConvTranspose")
def conv_transpose_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        c = shape[1]
        for kind, (k, s, p, op_pad, grouping) in CONV_T_KINDS.items():
            group, mg = (c, 1) if grouping == "depthwise" else (1, 5)
            b = Build(op, edge, f"{kind}_{_sname(shape)}")
            ins = [b.x(shape), b.w((c, mg, k, k))]
            if kind.endswith("bias"):  # not grouped: onnx's evaluator adds B[0] to every group
                ins.append(b.w((mg * group,), "data"))
            out.append(b.done(b.op_(op, ins, kernel_shape=[k, k], strides=[s, s], pads=[p] * 4,
                                    output_padding=[op_pad] * 2, group=group)))
    return out


# -- normalisations ------------------------------------------------------------------------------


def _declare_shape(case: Case, shape: tuple[int, ...]) -> Case:
    """``case`` with its (one) graph output declared of ``shape``: onnx's shape inference
    gives GroupNormalization-21 and MeanVarianceNormalization (functions without an inference
    function) no output shape, and the harness imports without the pass that fills it in
    (Session does run it)."""
    dims = case.model.graph.output[0].type.tensor_type.shape
    if not dims.dim:
        for d in shape:
            dims.dim.add().dim_value = d
    return case


@builder("InstanceNormalization", "GroupNormalization")
def group_norm_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in [*act_shapes(edge, 2), (3, 6, 7)]:
        c = shape[1]
        options = ([c] if op == "InstanceNormalization"
                   else sorted({1, c} | {g for g in (2, 3, 4) if c % g == 0}))
        for groups in options:
            b = Build(op, edge, f"g{groups}_{_sname(shape)}")
            attrs = {} if op == "InstanceNormalization" else {"num_groups": groups}
            if op == "GroupNormalization":
                # onnx's checker rejects GroupNormalization-18 (scale and bias per group) as
                # deprecated at opsets 18 to 20: the cases use opset 21 (per channel)
                b.b.opset = 21
            count = c
            y = b.op_(op, [b.x(shape), b.w((count,)), b.w((count,), "data")], **attrs)
            out.append(_declare_shape(b.done(y), shape))
    return out


# -- DepthToSpace / SpaceToDepth -------------------------------------------------------------------


@builder("DepthToSpace", "SpaceToDepth")
def depth_space_cases(op: str, edge: str) -> list[Case]:
    out = []
    for n, c, h, w in act_shapes(edge, 2):
        for block, mode in ((2, "DCR"), (2, "CRD"), (3, "DCR")):
            if op == "SpaceToDepth" and mode == "CRD":
                continue  # SpaceToDepth's mode is opset 28; the cases are opset 20
            shape = (n, c * block * block, h, w) if op == "DepthToSpace" else (n, c, h * block, w * block)
            b = Build(op, edge, f"b{block}_{mode}_{_sname(shape)}")
            attrs = {"blocksize": block}
            if op == "DepthToSpace":
                attrs["mode"] = mode
            out.append(b.done(b.op_(op, [b.x(shape)], **attrs)))
    return out


# -- LpNormalization, MeanVarianceNormalization, EyeLike ----------------------------------------


@builder("LpNormalization")
def lp_norm_cases(op: str, edge: str) -> list[Case]:
    """p = 2 only: onnx's evaluator computes the L1 norm as the signed sum (``x ** 1``), so it
    is no oracle for p = 1 (tests/numpy and ONNX's conformance cases cover p = 1)."""
    out = []
    for shape in [*act_shapes(edge, 2), (3, 17)]:
        for axis, p in ((1, 2), (-1, 2)):
            b = Build(op, edge, f"axis{axis}_p{p}_{_sname(shape)}")
            out.append(b.done(b.op_(op, [b.x(shape)], axis=axis, p=p)))
    return out


@builder("MeanVarianceNormalization")
def mvn_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        for axes in (None, [2, 3], [1]):
            b = Build(op, edge, f"axes{axes or 'default'}_{_sname(shape)}")
            attrs = {} if axes is None else {"axes": axes}
            out.append(_declare_shape(b.done(b.op_(op, [b.x(shape)], **attrs)), shape))
    return out


@builder("EyeLike")
def eye_like_cases(op: str, edge: str) -> list[Case]:
    out = []
    for _, c, h, w in act_shapes(edge, 2):
        for k, dtype in ((0, None), (1, None), (-2, TensorProto.INT32)):
            shape = (c, h * w)
            b = Build(op, edge, f"k{k}_{dtype}_{_sname(shape)}")
            attrs = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
            out.append(b.done(b.op_(op, [b.x(shape)], **attrs)))
    return out


# the data-dependent and control-flow operators' builders live in their own module; importing
# it registers them, and their documented differences join these
from tests.reliability import cases_dynamic as _cases_dynamic  # noqa: E402

DIFFERENCES.update(_cases_dynamic.DIFFERENCES)
from tests.reliability import cases_recurrent as _cases_recurrent  # noqa: E402

DIFFERENCES.update(_cases_recurrent.DIFFERENCES)
