"""Edge cases (see :mod:`tests.reliability.numerics_cases`) of the data-dependent operators
(NonMaxSuppression, NonZero, Unique, Compress) and of control flow (If, Loop, Scan);
registered into :data:`~tests.reliability.numerics_cases.BUILDERS` (imported by
:mod:`tests.reliability.cases_index`).

The outputs' sizes depend on the values (dynamic values: ``shape=None`` in the dispatcher).

- NonZero, Compress and Unique take the edge values as data; NonZero also a copy with half
  the elements zeroed, Compress a boolean condition derived from the edge values (all False
  on ``zeros``: an empty result), Unique values drawn from a small pool of edge values so
  that there are duplicates (elements and slices).
- NonMaxSuppression: boxes [B, N, 4] and scores [B, C, N] from the edge kind's activation
  shapes (batch B = N, classes C = channels, boxes N = H x W). The scores take the edge
  values; the boxes are overlapping clusters scaled to the edge kind's magnitude (tiny: areas
  underflow to 0, huge / overflow: areas overflow to inf, zeros: empty boxes, nonfinite: NaN
  and +-inf coordinates), plus boxes whose coordinates are the raw edge values.
- If, Loop and Scan: one node whose small bodies (built with onnx.helper) compute with the
  edge values, read an outer-scope value (an implicit input), and for Loop / Scan carry a
  state and stack a scan output.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.reliability.numerics_cases import Build, Case, _sname, act_shapes, builder, edge_values

#: Documented differences of these operators' cases (merged, through cases_index, into
#: test_edge_numerics' DIFFERENCES): (implementation glob, op glob, edge glob) -> (the
#: Tolerance's fields, why).
DIFFERENCES: dict[tuple[str, str, str], tuple[dict, str]] = {}


def _i64(b: Build, values: object) -> str:
    return b.const(np.array(values, np.int64))


def _f32(b: Build, values: object) -> str:
    return b.const(np.array(values, np.float32))


def _shapes(edge: str) -> list[tuple[int, int, int, int]]:
    return act_shapes(edge, 2)


# -- NonZero ---------------------------------------------------------------------------------


@builder("NonZero")
def nonzero_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in [*_shapes(edge), (3, 17)]:
        b = Build(op, edge, _sname(shape))
        out.append(b.done(b.op_(op, [b.x(shape)])))
    shape = _shapes(edge)[0]
    b = Build(op, edge, f"half_zero_{_sname(shape)}")
    x = edge_values(shape, edge, b.rng)
    x.reshape(-1)[1::2] = 0.0
    out.append(b.done(b.op_(op, [b.x(shape, array=x)])))
    b = Build(op, edge, "int32")  # small integers (the edge values are floats)
    ints = b.rng.integers(-2, 3, (3, 17)).astype(np.int32)
    out.append(b.done(b.op_(op, [b.x(ints.shape, array=ints)])))
    return out


# -- Compress --------------------------------------------------------------------------------


@builder("Compress")
def compress_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in _shapes(edge):
        n, c, h, w = shape
        # (name, axis, condition length): a shorter condition selects nothing past its end
        for name, axis, length in (("axis1", 1, c), ("axis0", 0, n),
                                   ("axis_m1_short", -1, max(1, w - 1)),
                                   ("flat_short", None, max(1, n * c * h * w // 2))):
            b = Build(op, edge, f"{name}_{_sname(shape)}")
            x = b.x(shape)
            cond = edge_values((length,), edge, b.rng) > 0
            cond = b.x(cond.shape, array=cond)
            attrs = {} if axis is None else {"axis": axis}
            out.append(b.done(b.op_(op, [x, cond], **attrs)))
    return out


# -- Unique ----------------------------------------------------------------------------------


def _no_nan(x: np.ndarray) -> np.ndarray:
    """``x`` with NaN replaced by -0.0 (which Unique must merge with 0.0)."""
    return np.where(np.isnan(x), np.float32(-0.0), x).astype(np.float32)


def _pooled(b: Build, shape: tuple[int, ...], k: int = 7) -> np.ndarray:
    """Values of ``shape`` drawn from ``k`` edge values, NaN excepted (duplicates
    guaranteed)."""
    pool = _no_nan(edge_values((k,), b.edge, b.rng))
    if b.edge == "nonfinite":
        pool[1] = 0.0
    return pool[b.rng.integers(0, k, shape)]


@builder("Unique")
def unique_cases(op: str, edge: str) -> list[Case]:
    """Sorted and in order of first occurrence (``sorted=0``), of the flattened input and of
    slices. ``sorted=0`` only on rank-1 inputs or along axis 0: onnx's evaluator (the oracle
    of the reference) takes the unique values of ``sorted=0`` along axis 0 of the input as
    given (``np.take(x, indices, axis=0)``), which is ONNX only there.

    No NaN (``nonfinite`` has +-inf, and -0.0 next to 0.0): ONNX does not say whether NaN
    equals NaN. The reference and onnx's evaluator (np.unique) merge NaN elements into one
    but keep slices holding NaN apart; onnxruntime sorts with ``<``, for which NaN breaks the
    ordering, and returns fewer, arbitrary elements (measured: 1 unique value of 850 pooled
    from 7, for ``sorted=0``). The sizes differ, which no tolerance can relax."""
    out = []
    for shape in _shapes(edge):
        n, c, h, w = shape
        b = Build(op, edge, f"flat_sorted1_{_sname(shape)}")
        x = b.x(shape, array=_pooled(b, shape))
        out.append(b.done(*b.op_(op, [x], 4, sorted=1)))
        size = n * c * h * w
        b = Build(op, edge, f"flat_sorted0_{size}")
        x = b.x((size,), array=_pooled(b, (size,)))
        out.append(b.done(*b.op_(op, [x], 4, sorted=0)))
        b = Build(op, edge, f"axis1_{_sname(shape)}")  # channels repeated: unique slices
        base = _no_nan(edge_values((n, max(1, c // 2 + 1), h, w), edge, b.rng))
        x = base[:, b.rng.integers(0, base.shape[1], c)]
        out.append(b.done(*b.op_(op, [b.x(shape, array=x)], 4, axis=1)))
    for srt in (1, 0):
        b = Build(op, edge, f"axis0_sorted{srt}_rank2")
        base = _no_nan(edge_values((4, 17), edge, b.rng))
        x = base[b.rng.integers(0, 4, 9)]
        out.append(b.done(*b.op_(op, [b.x(x.shape, array=x)], 4, axis=0, sorted=srt)))
    return out


# -- NonMaxSuppression -------------------------------------------------------------------------

#: the magnitude of the clustered boxes' coordinates per value edge kind
BOX_SCALE = {"tiny": 1e-30, "huge": 1e30, "overflow": 1e38, "zeros": 0.0}


def _clustered_boxes(b: Build, batches: int, boxes: int, centers: bool) -> np.ndarray:
    """[batches, boxes, 4] boxes around a few cluster centres (so that some overlap and some
    do not), in the edge kind's magnitude: [y1, x1, y2, x2] (either diagonal) or, with
    ``centers``, [x_c, y_c, w, h]."""
    rng = b.rng
    k = max(1, boxes // 4)
    hubs = rng.uniform(0.0, 1.0, (batches, k, 2))
    which = rng.integers(0, k, (batches, boxes))
    ctr = np.take_along_axis(hubs, which[..., None], axis=1)
    ctr = ctr + rng.normal(0, 0.03, (batches, boxes, 2))
    size = rng.uniform(0.1, 0.3, (batches, boxes, 2))
    if centers:
        arr = np.concatenate([ctr, size], axis=-1)
    else:
        lo, hi = ctr - size / 2, ctr + size / 2
        arr = np.stack([lo[..., 1], lo[..., 0], hi[..., 1], hi[..., 0]], axis=-1)
        flip = rng.random((batches, boxes)) < 0.3  # the other diagonal
        arr[flip] = arr[flip][:, [2, 3, 0, 1]]
    arr = arr * BOX_SCALE.get(b.edge, 1.0)
    if b.edge == "nonfinite":
        flat = arr.reshape(-1)
        flat[::7] = np.nan
        flat[3::11] = np.inf
        flat[5::13] = -np.inf
    return arr.astype(np.float32)


#: name -> (center_point_box, box source, max_output_boxes_per_class, iou_threshold,
#: score_threshold or None)
NMS_KINDS: dict[str, tuple[int, str, int, float, float | None]] = {
    "corners": (0, "clustered", 1000, 0.5, None),
    "centers_max3": (1, "clustered", 3, 0.4, None),
    "score_threshold": (0, "clustered", 1000, 0.3, 0.0),
    "raw_boxes": (0, "raw", 5, 0.5, None),
}


@builder("NonMaxSuppression")
def nms_cases(op: str, edge: str) -> list[Case]:
    """Every kind on every edge kind. On ``nonfinite`` the boxes hold NaN and +-inf, the
    scores +-inf (ties among +inf: the lower box index first), and NaN only in the cases with
    a score threshold, which drops them: ONNX does not order NaN scores, and the reference
    (NaN last), onnx's evaluator and onnxruntime each place them elsewhere (measured on one
    class of 9 boxes with 2 NaN scores: three different selection orders)."""
    out = []
    for n, c, h, w in _shapes(edge):
        classes, boxes = min(c, 5), h * w
        for kind, (cpb, source, max_out, iou, score) in NMS_KINDS.items():
            b = Build(op, edge, f"{kind}_b{n}c{classes}n{boxes}")
            if source == "raw":
                bx = b.x((n, boxes, 4))
            else:
                bx = b.x((n, boxes, 4), array=_clustered_boxes(b, n, boxes, bool(cpb)))
            scores = edge_values((n, classes, boxes), edge, b.rng)
            if score is None:  # NaN scores only where the score threshold drops them
                scores[np.isnan(scores)] = np.inf
            ins = [bx, b.x(scores.shape, array=scores), _i64(b, [max_out]), _f32(b, [iou])]
            if score is not None:
                ins.append(_f32(b, [score]))
            out.append(b.done(b.op_(op, ins, center_point_box=cpb)))
    return out


# -- control flow --------------------------------------------------------------------------------


def _vi(name: str, elem: int = TensorProto.FLOAT, shape: list | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


@builder("If")
def if_cases(op: str, edge: str) -> list[Case]:
    """The condition is an input (True and False cases). The then branch adds an outer-scope
    bias to the outer-scope input and takes the absolute value; the else branch multiplies
    the input by a constant of its own (a Constant node), or, in the ``reduce`` cases, sums
    it over H and W: the branches' shapes differ, so the output's shape is known only at
    run time."""
    out = []
    for shape in _shapes(edge):
        c = shape[1]
        for kind in ("same", "reduce"):
            for cond in (True, False):
                b = Build(op, edge, f"{kind}_{'then' if cond else 'else'}_{_sname(shape)}")
                flag = b.x((), array=np.array(cond))
                x = b.x(shape)
                bias = b.w((c, 1, 1), "data")
                then = helper.make_graph(
                    [helper.make_node("Add", [x, bias], ["t_sum"]),
                     helper.make_node("Abs", ["t_sum"], ["t_out"])],
                    "then_body", [], [_vi("t_out")])
                if kind == "same":
                    else_nodes = [
                        helper.make_node("Constant", [], ["e_k"],
                                         value=numpy_helper.from_array(np.array(-0.5, np.float32))),
                        helper.make_node("Mul", [x, "e_k"], ["e_out"])]
                else:
                    else_nodes = [
                        helper.make_node("ReduceSum", [x, "e_axes"], ["e_out"], keepdims=1)]
                axes = [] if kind == "same" else [
                    numpy_helper.from_array(np.array([2, 3], np.int64), "e_axes")]
                els = helper.make_graph(else_nodes, "else_body", [], [_vi("e_out")], axes)
                out.append(b.done(b.op_(op, [flag], then_branch=then, else_branch=els)))
    return out


@builder("Loop")
def loop_cases(op: str, edge: str) -> list[Case]:
    """A constant trip count; the body adds i * x (x read from the outer scope) to a
    loop-carried accumulator that starts at an input, and emits Relu of it, flattened, as a
    scan output. ``cond_stop``: the body's condition ends the loop before the trip count.
    The scan output is 1-D: onnx's evaluator (the reference's oracle) joins the iterations'
    scan outputs with ``np.vstack``, which stacks them only when they are 1-D (it
    concatenates [N, C, H, W] into [trips * N, C, H, W])."""
    out = []
    for shape in _shapes(edge):
        for kind, trips in (("trip3", 3), ("trip1", 1), ("cond_stop", 5)):
            b = Build(op, edge, f"{kind}_{_sname(shape)}")
            x = b.x(shape)
            init = b.x(shape)
            nodes = [
                helper.make_node("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT),
                helper.make_node("Mul", [x, "i_f"], ["step"]),
                helper.make_node("Add", ["acc", "step"], ["acc_out"]),
                helper.make_node("Relu", ["acc_out"], ["acc_relu"]),
                helper.make_node("Reshape", ["acc_relu", "flat"], ["scan_out"]),
            ]
            inits = [numpy_helper.from_array(np.array([-1], np.int64), "flat")]
            if kind == "cond_stop":  # continue while i < 2: three iterations of five
                nodes.append(helper.make_node("Less", ["i", "two"], ["cond_out"]))
                inits.append(numpy_helper.from_array(np.array(2, np.int64), "two"))
            else:
                nodes.append(helper.make_node("Identity", ["cond"], ["cond_out"]))
            body = helper.make_graph(
                nodes, "loop_body",
                [_vi("i", TensorProto.INT64, []), _vi("cond", TensorProto.BOOL, []), _vi("acc")],
                [_vi("cond_out", TensorProto.BOOL, []), _vi("acc_out"), _vi("scan_out")], inits)
            cond = b.const(np.array(True))
            acc, scan = b.op_(op, [_i64(b, trips), cond, init], 2, body=body)
            out.append(b.done(acc, scan))
    return out


@builder("Scan")
def scan_cases(op: str, edge: str) -> list[Case]:
    """Running sums along axis 0 (the batch): the state (zeros) plus each slice, the running
    sum stacked as a scan output; ``outer``: the sum scaled by an outer-scope weight;
    ``two_inputs``: a second state (from an input) subtracts a second scan input's slices.
    Forward along axis 0 only: onnx's evaluator (the reference's oracle) refuses other scan
    axes and directions."""
    out = []
    for shape in _shapes(edge):
        _, c, h, w = shape
        for kind in ("running_sum", "outer", "two_inputs"):
            b = Build(op, edge, f"{kind}_{_sname(shape)}")
            x = b.x(shape)
            states = [b.const(np.zeros((c, h, w), np.float32))]
            scans = [x]
            body_in, body_out = [_vi("s"), _vi("xt")], [_vi("s_out"), _vi("y_t")]
            nodes = [helper.make_node("Add", ["s", "xt"], ["s_out"])]
            if kind == "outer":
                nodes.append(helper.make_node("Mul", ["s_out", b.w((w,))], ["y_t"]))
            else:
                nodes.append(helper.make_node("Identity", ["s_out"], ["y_t"]))
            if kind == "two_inputs":
                states.append(b.x((c, h, w)))
                scans.append(b.x(shape))
                nodes.append(helper.make_node("Sub", ["m", "ut"], ["m_out"]))
                body_in = [_vi("s"), _vi("m"), _vi("xt"), _vi("ut")]
                body_out = [_vi("s_out"), _vi("m_out"), _vi("y_t")]
            body = helper.make_graph(nodes, "scan_body", body_in, body_out)
            outs = b.op_(op, [*states, *scans], len(body_out), body=body,
                         num_scan_inputs=len(scans))
            out.append(b.done(*outs))
    return out
