"""Small hand-built ONNX graphs for control flow and data-dependent shapes ("Models from the
wild": If/Loop/Scan, data-dependent shapes, producers' quirks).

Each builder returns a checked ``onnx.ModelProto`` (opset 17, IR version 8, so that every
onnxruntime >= 1.17 and OpenVINO >= 2024.0 can load it; the two Paddle ones opset 11, IR 7,
as Paddle2ONNX wrote them) and ``feeds_for(name)`` gives several
input sets that take different branches, trip counts or output lengths, an empty result among
them where the construct has one. ``expected_shapes(name)`` gives each feed's output shapes,
as onnxruntime and onnx.reference compute them.

Self-check (onnx.checker full check, onnxruntime against onnx.reference.ReferenceEvaluator,
and whether OpenVINO compiles and runs each one)::

    python -m tests.models.wild.constructs

What the libraries did with them (onnx 1.23, onnxruntime 1.32, OpenVINO 2026.4):

- onnx.reference's Loop stacks scan outputs with np.vstack: a scalar scan output comes back
  [K, 1], and a loop of zero iterations raises; the self-check uses a fixed Loop
  (``_fixed_loop``).
- onnxruntime's Scan fails on a zero-length sequence (scan_cumsum has no such feed).
- OpenVINO compiles every construct, but a zero-sized result that follows a non-empty one on
  the same compiled model (Loop scan outputs of a zero-trip loop, TopK with k = 0) comes back
  with the previous inference's shape and data; a freshly compiled model gets it right. After
  that, running TopK with k = 0 on a new infer request of that compiled model crashes the
  process (SIGSEGV, every time: 3 of 3).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
F = TensorProto.FLOAT
I64 = TensorProto.INT64
B = TensorProto.BOOL


def _const(name: str, value, dtype=np.float32) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, dtype), name)
    )


def _init(name: str, value, dtype=np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="opdispatch-tests-wild",
        producer_version="1",
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


# --------------------------------------------------------------------------------------------
# builders


def if_outer_scope() -> onnx.ModelProto:
    """An If whose condition comes from the input data and whose branches read outer-scope values.

    ``t = x * 2`` is computed before the If and ``cond = ReduceSum(x) > 0``. The then branch
    returns ``t + bias`` (bias: a [4] initializer of the main graph) of shape [3, 4]; the else
    branch returns ``MatMul(t, W)`` (W: a [4, 2] initializer) of shape [3, 2]. Neither branch has
    inputs of its own: both name ``t`` and an initializer from the enclosing graph. The If's
    output is declared [3, "if_width"]: its second dimension is known only at run time.
    A second output, ``z = y * 3`` after the If, makes the If's result feed a downstream node.
    """
    x = helper.make_tensor_value_info("x", F, [3, 4])
    then_g = helper.make_graph(
        [helper.make_node("Add", ["t", "bias"], ["then_y"])],
        "then_branch",
        [],
        [helper.make_tensor_value_info("then_y", F, [3, 4])],
    )
    else_g = helper.make_graph(
        [helper.make_node("MatMul", ["t", "W"], ["else_y"])],
        "else_branch",
        [],
        [helper.make_tensor_value_info("else_y", F, [3, 2])],
    )
    nodes = [
        _const("two", 2.0),
        helper.make_node("Mul", ["x", "two"], ["t"]),
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        _const("zero", 0.0),
        helper.make_node("Greater", ["s", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g),
        _const("three", 3.0),
        helper.make_node("Mul", ["y", "three"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "if_outer_scope",
        [x],
        [
            helper.make_tensor_value_info("y", F, [3, "if_width"]),
            helper.make_tensor_value_info("z", F, [3, "if_width"]),
        ],
        initializer=[
            _init("bias", [0.5, -0.5, 1.0, -1.0]),
            _init("W", np.arange(8, dtype=np.float32).reshape(4, 2) / 8),
        ],
    )
    return _model(graph)


def loop_scan_outputs() -> onnx.ModelProto:
    """A Loop with a data-dependent trip count, a termination condition, loop-carried state and
    scan outputs, whose body reads an outer-scope value.

    ``M = Cast<int64>(Floor(Relu(ReduceMax(x))))``; ``delta = x * 0.5`` is computed before the
    Loop and read inside the body. Each iteration: ``s = s + delta``, ``cond = ReduceSum(s) <
    limit`` (limit: an initializer of the main graph, 20), scan outputs ``s`` ([K, 5]) and the
    iteration number as float ([K]). K = min(M, first iteration whose sum reaches the limit);
    K = 0 when max(x) < 1 (empty scan outputs).
    """
    x = helper.make_tensor_value_info("x", F, [5])
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "delta"], ["s_out"]),
            helper.make_node("ReduceSum", ["s_out"], ["total"], keepdims=0),
            helper.make_node("Less", ["total", "limit"], ["cond_out"]),
            helper.make_node("Identity", ["s_out"], ["s_scan"]),
            helper.make_node("Cast", ["i"], ["i_scan"], to=F),
        ],
        "loop_body",
        [
            helper.make_tensor_value_info("i", I64, []),
            helper.make_tensor_value_info("cond_in", B, []),
            helper.make_tensor_value_info("s_in", F, [5]),
        ],
        [
            helper.make_tensor_value_info("cond_out", B, []),
            helper.make_tensor_value_info("s_out", F, [5]),
            helper.make_tensor_value_info("s_scan", F, [5]),
            helper.make_tensor_value_info("i_scan", F, []),
        ],
    )
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
        helper.make_node("Relu", ["mx"], ["mx_pos"]),
        helper.make_node("Floor", ["mx_pos"], ["mx_floor"]),
        helper.make_node("Cast", ["mx_floor"], ["M"], to=I64),
        _const("half", 0.5),
        helper.make_node("Mul", ["x", "half"], ["delta"]),
        _const("cond0", True, np.bool_),
        _const("s0", np.zeros(5)),
        helper.make_node("Loop", ["M", "cond0", "s0"], ["s_final", "states", "steps"], body=body),
    ]
    graph = helper.make_graph(
        nodes,
        "loop_scan_outputs",
        [x],
        [
            helper.make_tensor_value_info("s_final", F, [5]),
            helper.make_tensor_value_info("states", F, ["iterations", 5]),
            helper.make_tensor_value_info("steps", F, ["iterations"]),
        ],
        initializer=[_init("limit", 20.0)],
    )
    return _model(graph)


def scan_cumsum() -> onnx.ModelProto:
    """A Scan (opset 17; Scan >= 11 has no batch axis) computing a running sum over the sequence
    axis, with a state and two scan outputs.

    ``x`` is [seq, 3] (seq symbolic, 0 allowed); the state starts at the ``s0`` input ([3]).
    The body adds the row to the state and emits the running sum and the running sum times
    ``scale``, a [3] initializer of the main graph read from the body (outer scope). Outputs:
    the final state [3], the cumulative sums [seq, 3] (np.cumsum(x, 0) + s0) and the scaled
    cumulative sums [seq, 3]. seq = 0 is valid ONNX, but onnxruntime (1.32) fails on it, so
    feeds_for gives none.
    """
    body = helper.make_graph(
        [
            helper.make_node("Add", ["acc_in", "row"], ["acc_out"]),
            helper.make_node("Identity", ["acc_out"], ["cum"]),
            helper.make_node("Mul", ["acc_out", "scale"], ["cum_scaled"]),
        ],
        "scan_body",
        [
            helper.make_tensor_value_info("acc_in", F, [3]),
            helper.make_tensor_value_info("row", F, [3]),
        ],
        [
            helper.make_tensor_value_info("acc_out", F, [3]),
            helper.make_tensor_value_info("cum", F, [3]),
            helper.make_tensor_value_info("cum_scaled", F, [3]),
        ],
    )
    graph = helper.make_graph(
        [
            helper.make_node(
                "Scan",
                ["s0", "x"],
                ["s_final", "cumsum", "cumsum_scaled"],
                body=body,
                num_scan_inputs=1,
            )
        ],
        "scan_cumsum",
        [
            helper.make_tensor_value_info("s0", F, [3]),
            helper.make_tensor_value_info("x", F, ["seq", 3]),
        ],
        [
            helper.make_tensor_value_info("s_final", F, [3]),
            helper.make_tensor_value_info("cumsum", F, ["seq", 3]),
            helper.make_tensor_value_info("cumsum_scaled", F, ["seq", 3]),
        ],
        initializer=[_init("scale", [1.0, -1.0, 0.5])],
    )
    return _model(graph)


def nonzero_gathernd() -> onnx.ModelProto:
    """Relu -> NonZero -> Transpose -> GatherND (the issue's example).

    ``x`` is [3, 4]; NonZero of Relu(x) gives [2, K] indices (K: how many entries are
    positive), transposed to [K, 2] and used to gather those K values. Outputs: the [K, 2]
    indices (int64) and the [K] values; K = 0 when no entry is positive.
    """
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("NonZero", ["r"], ["nz"]),
            helper.make_node("Transpose", ["nz"], ["idx"], perm=[1, 0]),
            helper.make_node("GatherND", ["r", "idx"], ["vals"]),
        ],
        "nonzero_gathernd",
        [helper.make_tensor_value_info("x", F, [3, 4])],
        [
            helper.make_tensor_value_info("idx", I64, ["nonzero", 2]),
            helper.make_tensor_value_info("vals", F, ["nonzero"]),
        ],
    )
    return _model(graph)


NMS_ANCHORS = 16
NMS_FEATURES = 8


def _anchors() -> np.ndarray:
    # a 4 x 4 grid of overlapping unit boxes [y1, x1, y2, x2], spaced 0.5 apart
    ys, xs = np.meshgrid(np.arange(4) * 0.5, np.arange(4) * 0.5, indexing="ij")
    lo = np.stack([ys.ravel(), xs.ravel()], axis=1)
    return np.concatenate([lo, lo + 1.0], axis=1)[None].astype(np.float32)  # [1, 16, 4]


def nms_after_head() -> onnx.ModelProto:
    """A small detector head followed by NonMaxSuppression and a Gather of the selected boxes.

    ``feat`` [1, 16, 8] (16 anchors, 8 features each) -> MatMul with a [8, 4] weight gives box
    deltas, added (x 0.1) to a fixed grid of overlapping anchors -> boxes [1, 16, 4]
    ([y1, x1, y2, x2]); MatMul with a [8, 2] weight plus a -2 bias, transposed and Sigmoid gives
    scores [1, 2, 16]. NonMaxSuppression (at most 5 boxes per class, IoU 0.5, score > 0.3)
    selects [K, 3] (batch, class, box) indices; the selected boxes are gathered ([K, 4], Gather
    on the box column) and their scores ([K], GatherND). K = 0 for an all-zero ``feat``
    (every score is sigmoid(-2) = 0.12).
    """
    rng = np.random.default_rng(1)
    w_box = rng.standard_normal((NMS_FEATURES, 4)).astype(np.float32)
    w_cls = rng.standard_normal((NMS_FEATURES, 2)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["feat", "w_box"], ["deltas"]),
        _const("box_scale", 0.1),
        helper.make_node("Mul", ["deltas", "box_scale"], ["deltas_scaled"]),
        helper.make_node("Add", ["anchors", "deltas_scaled"], ["boxes"]),
        helper.make_node("MatMul", ["feat", "w_cls"], ["logits0"]),
        helper.make_node("Add", ["logits0", "cls_bias"], ["logits"]),
        helper.make_node("Transpose", ["logits"], ["logits_t"], perm=[0, 2, 1]),
        helper.make_node("Sigmoid", ["logits_t"], ["scores"]),
        helper.make_node(
            "NonMaxSuppression",
            ["boxes", "scores", "max_per_class", "iou", "score_thr"],
            ["selected"],
            center_point_box=0,
        ),
        _const("col_box", 2, np.int64),
        helper.make_node("Gather", ["selected", "col_box"], ["box_idx"], axis=1),
        _const("batch_axis", [0], np.int64),
        helper.make_node("Squeeze", ["boxes", "batch_axis"], ["boxes0"]),
        helper.make_node("Gather", ["boxes0", "box_idx"], ["sel_boxes"], axis=0),
        helper.make_node("GatherND", ["scores", "selected"], ["sel_scores"]),
    ]
    graph = helper.make_graph(
        nodes,
        "nms_after_head",
        [helper.make_tensor_value_info("feat", F, [1, NMS_ANCHORS, NMS_FEATURES])],
        [
            helper.make_tensor_value_info("selected", I64, ["selected", 3]),
            helper.make_tensor_value_info("sel_boxes", F, ["selected", 4]),
            helper.make_tensor_value_info("sel_scores", F, ["selected"]),
        ],
        initializer=[
            _init("w_box", w_box),
            _init("w_cls", w_cls),
            _init("cls_bias", [-2.0, -2.0]),
            _init("anchors", _anchors()),
            _init("max_per_class", [5], np.int64),
            _init("iou", [0.5]),
            _init("score_thr", [0.3]),
        ],
    )
    return _model(graph)


def topk_runtime_k() -> onnx.ModelProto:
    """TopK whose k is computed at run time from the data, followed by ops on its outputs.

    ``x`` is [2, 10]; k = the smallest number of positive entries in a row
    (ReduceMin(ReduceSum(Cast<int64>(x > 0), axis 1)), a [1] int64). TopK(x, k, axis 1) gives
    values and indices [2, k]; downstream, ``weighted = values * Cast<float>(indices)``.
    k = 0 when a row has no positive entry (empty [2, 0] outputs).
    """
    nodes = [
        _const("zero", 0.0),
        helper.make_node("Greater", ["x", "zero"], ["pos"]),
        helper.make_node("Cast", ["pos"], ["pos_i"], to=I64),
        _const("axis1", [1], np.int64),
        helper.make_node("ReduceSum", ["pos_i", "axis1"], ["count"], keepdims=0),
        helper.make_node("ReduceMin", ["count"], ["k"], keepdims=1),
        helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1),
        helper.make_node("Cast", ["indices"], ["indices_f"], to=F),
        helper.make_node("Mul", ["values", "indices_f"], ["weighted"]),
    ]
    graph = helper.make_graph(
        nodes,
        "topk_runtime_k",
        [helper.make_tensor_value_info("x", F, [2, 10])],
        [
            helper.make_tensor_value_info("values", F, [2, "k"]),
            helper.make_tensor_value_info("indices", I64, [2, "k"]),
            helper.make_tensor_value_info("weighted", F, [2, "k"]),
        ],
    )
    return _model(graph)


def nested_if_in_loop() -> onnx.ModelProto:
    """A Loop whose body contains an If (nesting), with branches reading values two scopes up.

    Inputs ``x`` [4] and ``n`` (int64 scalar, the trip count). Each iteration: if
    ReduceSum(state) > ``threshold`` (an initializer of the main graph) the If halves the state,
    else it adds ``x`` (a main-graph input, read from inside the If inside the Loop body).
    Scan outputs: the state after each iteration ([n, 4]) and which branch was taken ([n],
    int64: 1 for halve, 0 for add). The loop condition stays true (runs n times); n = 0 gives
    empty scan outputs.
    """
    then_g = helper.make_graph(
        [_const("h", 0.5), helper.make_node("Mul", ["s_in", "h"], ["halved"])],
        "halve",
        [],
        [helper.make_tensor_value_info("halved", F, [4])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x"], ["added"])],
        "add_x",
        [],
        [helper.make_tensor_value_info("added", F, [4])],
    )
    body = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["s_in"], ["total"], keepdims=0),
            helper.make_node("Greater", ["total", "threshold"], ["big"]),
            helper.make_node("If", ["big"], ["s_out"], then_branch=then_g, else_branch=else_g),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Identity", ["s_out"], ["s_scan"]),
            helper.make_node("Cast", ["big"], ["branch"], to=I64),
        ],
        "loop_body",
        [
            helper.make_tensor_value_info("i", I64, []),
            helper.make_tensor_value_info("cond_in", B, []),
            helper.make_tensor_value_info("s_in", F, [4]),
        ],
        [
            helper.make_tensor_value_info("cond_out", B, []),
            helper.make_tensor_value_info("s_out", F, [4]),
            helper.make_tensor_value_info("s_scan", F, [4]),
            helper.make_tensor_value_info("branch", I64, []),
        ],
    )
    graph = helper.make_graph(
        [
            _const("cond0", True, np.bool_),
            _const("s0", np.zeros(4)),
            helper.make_node(
                "Loop", ["n", "cond0", "s0"], ["s_final", "states", "branches"], body=body
            ),
        ],
        "nested_if_in_loop",
        [
            helper.make_tensor_value_info("x", F, [4]),
            helper.make_tensor_value_info("n", I64, []),
        ],
        [
            helper.make_tensor_value_info("s_final", F, [4]),
            helper.make_tensor_value_info("states", F, ["n", 4]),
            helper.make_tensor_value_info("branches", I64, ["n"]),
        ],
        initializer=[_init("threshold", 6.0)],
    )
    return _model(graph)


def reshape_runtime_shape() -> onnx.ModelProto:
    """Reshape, Range and Expand fed by values computed from the input data.

    ``x`` is [2, 6]. c = Clip(Cast<int64>(ReduceMax(x)), 1, 12) and n = the number of positive
    entries. Outputs: ``reshaped`` = Reshape(x, [-1, c]) ([12 / c, c]: the feeds keep c a
    divisor of 12), ``ramp`` = Range(0, n, 1) ([n], int64) and ``grid`` =
    Expand(Unsqueeze(Cast<float>(ramp), 1), [n, c]) ([n, c]). n = 0 when no entry is
    positive (then c = 1 and ``ramp``/``grid`` are empty).
    """
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
        helper.make_node("Cast", ["mx"], ["mx_i"], to=I64),
        _const("one", 1, np.int64),
        _const("twelve", 12, np.int64),
        helper.make_node("Clip", ["mx_i", "one", "twelve"], ["c"]),
        _const("ax0", [0], np.int64),
        helper.make_node("Unsqueeze", ["c", "ax0"], ["c1"]),
        _const("minus1", [-1], np.int64),
        helper.make_node("Concat", ["minus1", "c1"], ["shape2"], axis=0),
        helper.make_node("Reshape", ["x", "shape2"], ["reshaped"]),
        _const("zero_f", 0.0),
        helper.make_node("Greater", ["x", "zero_f"], ["pos"]),
        helper.make_node("Cast", ["pos"], ["pos_i"], to=I64),
        helper.make_node("ReduceSum", ["pos_i"], ["n"], keepdims=0),
        _const("start", 0, np.int64),
        helper.make_node("Range", ["start", "n", "one"], ["ramp"]),
        helper.make_node("Cast", ["ramp"], ["ramp_f"], to=F),
        _const("ax1", [1], np.int64),
        helper.make_node("Unsqueeze", ["ramp_f", "ax1"], ["col"]),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        helper.make_node("Concat", ["n1", "c1"], ["grid_shape"], axis=0),
        helper.make_node("Expand", ["col", "grid_shape"], ["grid"]),
    ]
    graph = helper.make_graph(
        nodes,
        "reshape_runtime_shape",
        [helper.make_tensor_value_info("x", F, [2, 6])],
        [
            helper.make_tensor_value_info("reshaped", F, ["rows", "c"]),
            helper.make_tensor_value_info("ramp", I64, ["n"]),
            helper.make_tensor_value_info("grid", F, ["n", "c"]),
        ],
    )
    return _model(graph)


def _paddle_conv(name: str, in_dims: list, out_dims: list) -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["conv"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["conv"], ["relu"]),
            helper.make_node("GlobalAveragePool", ["relu"], ["pooled"]),
            helper.make_node("Reshape", ["pooled", "flat_shape"], ["y"]),
        ],
        name,
        [helper.make_tensor_value_info("x", F, in_dims)],
        [helper.make_tensor_value_info("y", F, out_dims)],
        initializer=[
            _init("conv_w", rng.standard_normal((8, 3, 3, 3)) * 0.3),
            _init("conv_b", rng.standard_normal(8) * 0.1),
            _init("flat_shape", [-1, 8], np.int64),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 11)], producer_name="PaddlePaddle"
    )
    model.ir_version = 7  # what Paddle2ONNX 0.x wrote with opset 11
    onnx.checker.check_model(model, full_check=True)
    return model


def paddle_negative_dims() -> onnx.ModelProto:
    """A tiny Conv model whose input is declared [-1, 3, -1, -1] (dim_value -1), as Paddle2ONNX
    writes dynamic dimensions.

    Conv(8, 3x3, pad 1) -> Relu -> GlobalAveragePool -> Reshape([-1, 8]); the output is
    declared [-1, 8]. Opset 11, IR 7, producer "PaddlePaddle", like RapidOCR's
    ch_ppocr_mobile_v2.0_cls model. Any [N, 3, H, W] input runs.
    """
    return _paddle_conv("paddle_negative_dims", [-1, 3, -1, -1], [-1, 8])


def paddle_question_dims() -> onnx.ModelProto:
    """The same model as paddle_negative_dims with the input declared [-1, 3, "?", "?"]: the
    literal dim_param "?" for both H and W, exactly as in RapidOCR's ch_ppocr_mobile_v2.0_cls
    model (whose real input is [N, 3, 48, 192]). By the letter of the ONNX spec two dims with
    the same dim_param are equal; the producer meant "unknown", and onnxruntime and OpenVINO
    accept H != W.
    """
    return _paddle_conv("paddle_question_dims", [-1, 3, "?", "?"], [-1, 8])


CONSTRUCTS: dict[str, Callable[[], onnx.ModelProto]] = {
    "if_outer_scope": if_outer_scope,
    "loop_scan_outputs": loop_scan_outputs,
    "scan_cumsum": scan_cumsum,
    "nonzero_gathernd": nonzero_gathernd,
    "nms_after_head": nms_after_head,
    "topk_runtime_k": topk_runtime_k,
    "nested_if_in_loop": nested_if_in_loop,
    "reshape_runtime_shape": reshape_runtime_shape,
    "paddle_negative_dims": paddle_negative_dims,
    "paddle_question_dims": paddle_question_dims,
}


def build(name: str) -> onnx.ModelProto:
    """The named construct's model."""
    return CONSTRUCTS[name]()


# --------------------------------------------------------------------------------------------
# feeds


def _f32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def feeds_for(name: str) -> list[dict[str, np.ndarray]]:
    """Several input sets for the named construct, each taking a different branch, trip count
    or output length (the last is the empty-result case where the construct has one)."""
    rng = np.random.default_rng(0)
    if name == "if_outer_scope":
        pos = _f32(rng.random((3, 4)) + 0.1)
        return [
            {"x": pos},  # then: [3, 4]
            {"x": -pos},  # else: [3, 2]
            {"x": np.zeros((3, 4), np.float32)},  # sum == 0 is not > 0: else
        ]
    if name == "loop_scan_outputs":
        return [
            {"x": _f32([0.5, 1.0, 3.5, 0.0, 2.0])},  # M = 3, sums 3.5, 7, 10.5 < 20: 3 iterations
            {"x": _f32([8.0, 8.0, 9.5, 8.0, 8.0])},  # M = 9, but the sum is 20.75 >= 20 at once: 1
            {"x": _f32([1.0, -1.0, 2.0, 0.5, -0.5])},  # M = 2, 2 iterations
            {"x": _f32([0.9, 0.1, -3.0, 0.0, 0.5])},  # M = 0: no iteration, empty scan outputs
        ]
    if name == "scan_cumsum":
        return [
            {"s0": np.zeros(3, np.float32), "x": _f32(rng.standard_normal((6, 3)))},
            {"s0": _f32([1, 2, 3]), "x": _f32(rng.standard_normal((1, 3)))},
            {"s0": _f32([-1, 0, 1]), "x": _f32(rng.standard_normal((3, 3)))},
            # no empty sequence: onnxruntime 1.32 fails on one ("Invalid dim0_offset of 0.
            # Dimension 0 is 0" in OrtValueTensorSlicer), onnx.reference gives [0, 3]
        ]
    if name == "nonzero_gathernd":
        mixed = _f32(rng.standard_normal((3, 4)))
        mixed[0, 0], mixed[2, 3] = 1.0, -1.0
        return [
            {"x": mixed},
            {"x": _f32(np.abs(rng.standard_normal((3, 4))) + 0.1)},  # all 12
            {"x": -_f32(np.abs(rng.standard_normal((3, 4))))},  # none: K = 0
        ]
    if name == "nms_after_head":
        return [
            {"feat": _f32(rng.standard_normal((1, NMS_ANCHORS, NMS_FEATURES)) * 2)},
            {"feat": _f32(rng.standard_normal((1, NMS_ANCHORS, NMS_FEATURES)) * 0.7)},
            {"feat": np.zeros((1, NMS_ANCHORS, NMS_FEATURES), np.float32)},  # K = 0
        ]
    if name == "topk_runtime_k":
        a = _f32(rng.standard_normal((2, 10)))
        a[0, :3] = np.abs(a[0, :3]) + 0.1
        a[0, 3:] = -np.abs(a[0, 3:]) - 0.1
        a[1] = np.abs(a[1]) + 0.1
        return [
            {"x": a},  # k = 3
            {"x": _f32(np.abs(rng.standard_normal((2, 10))) + 0.1)},  # k = 10
            {"x": _f32(np.stack([rng.standard_normal(10), -np.abs(rng.standard_normal(10))]))},
        ]  # the last: row 1 has no positive entry, k = 0
    if name == "nested_if_in_loop":
        x = _f32([1.0, 2.0, 0.5, 0.5])
        return [
            {"x": x, "n": np.array(5, np.int64)},  # add, add (sum 8 > 6), halve, add, halve
            {"x": x, "n": np.array(1, np.int64)},  # add only
            {"x": _f32([-1, -1, -1, -1]), "n": np.array(3, np.int64)},  # always add
            {"x": x, "n": np.array(0, np.int64)},  # no iteration
        ]
    if name == "reshape_runtime_shape":
        a = _f32([[0.5, 3.2, -1, 0.1, -0.2, 0.3], [2.0, -3, -1, 0.25, -2, -2]])  # c 3, n 6
        b = _f32([[6.5, -1, -1, -1, -1, -1], [-1, -1, -1, -1, -1, 4.0]])  # c 6, n 2
        return [
            {"x": a},  # reshaped [4, 3], ramp [6], grid [6, 3]
            {"x": b},  # reshaped [2, 6], ramp [2], grid [2, 6]
            {"x": -np.ones((2, 6), np.float32)},  # c 1, n 0: reshaped [12, 1], ramp and grid empty
        ]
    if name in ("paddle_negative_dims", "paddle_question_dims"):
        return [
            {"x": _f32(rng.standard_normal((1, 3, 48, 192)))},
            {"x": _f32(rng.standard_normal((2, 3, 7, 5)))},
            {"x": _f32(rng.standard_normal((3, 3, 1, 1)))},
        ]
    raise KeyError(name)


#: each feed's output shapes (as onnxruntime and onnx.reference give them), in feeds_for order
EXPECTED_SHAPES: dict[str, list[list[tuple[int, ...]]]] = {
    "if_outer_scope": [[(3, 4), (3, 4)], [(3, 2), (3, 2)], [(3, 2), (3, 2)]],
    "loop_scan_outputs": [
        [(5,), (3, 5), (3,)],
        [(5,), (1, 5), (1,)],
        [(5,), (2, 5), (2,)],
        [(5,), (0, 5), (0,)],
    ],
    "scan_cumsum": [[(3,), (6, 3), (6, 3)], [(3,), (1, 3), (1, 3)], [(3,), (3, 3), (3, 3)]],
    "nonzero_gathernd": [[(6, 2), (6,)], [(12, 2), (12,)], [(0, 2), (0,)]],
    "nms_after_head": [
        [(10, 3), (10, 4), (10,)],  # 5 per class: the most NonMaxSuppression may keep
        [(9, 3), (9, 4), (9,)],
        [(0, 3), (0, 4), (0,)],
    ],
    "topk_runtime_k": [[(2, 3)] * 3, [(2, 10)] * 3, [(2, 0)] * 3],
    "nested_if_in_loop": [
        [(4,), (5, 4), (5,)],
        [(4,), (1, 4), (1,)],
        [(4,), (3, 4), (3,)],
        [(4,), (0, 4), (0,)],
    ],
    "reshape_runtime_shape": [
        [(4, 3), (6,), (6, 3)],
        [(2, 6), (2,), (2, 6)],
        [(12, 1), (0,), (0, 1)],
    ],
    "paddle_negative_dims": [[(1, 8)], [(2, 8)], [(3, 8)]],
    "paddle_question_dims": [[(1, 8)], [(2, 8)], [(3, 8)]],
}


def expected_shapes(name: str) -> list[list[tuple[int, ...]]]:
    """Each feed's output shapes, in the order of feeds_for(name)."""
    return EXPECTED_SHAPES[name]


# --------------------------------------------------------------------------------------------
# self-check


def _ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _fixed_loop() -> type:
    """onnx.reference's Loop (onnx 1.15 to 1.23 at least) stacks scan outputs with np.vstack:
    a scalar scan output comes back [K, 1] instead of [K], and a loop that runs no iteration
    fails (np.vstack of an empty list). This subclass stacks with np.stack and gives a
    zero-iteration loop [0, *shape] scan outputs, shape being the body output's declared static
    shape (what onnxruntime does)."""
    from onnx.reference.ops.op_loop import Loop as _Loop

    class Loop(_Loop):
        op_domain = ""

        def _run(self, M, cond, *args, context=None, body=None, attributes=None, bindings=None):
            body = self.body
            names = body.input_names
            inputs = dict.fromkeys(names)
            for name, val in zip(names[2:], args):
                inputs[name] = val
            if context is not None:
                inputs.update({k: context[k] for k in context})
            scans: list[list[np.ndarray]] = [[] for _ in range(self.K)]
            carried = list(args)
            it = 0
            while (cond is None or bool(cond)) and (M is None or it < M):
                if names[0]:
                    inputs[names[0]] = np.array(it, dtype=np.int64)
                if names[1]:
                    inputs[names[1]] = cond
                outs = self._run_body(inputs, attributes=attributes, bindings=bindings)
                cond = outs[self.output_index[body.output_names[0]]]
                carried = list(outs[1 : 1 + self.N])
                for k in range(self.K):
                    scans[k].append(np.asarray(outs[1 + self.N + k]))
                for i, o in zip(names[2:], carried):
                    inputs[i] = o
                it += 1
            graph = next(a.g for a in self.onnx_node.attribute if a.name == "body")
            stacked = []
            for k, values in enumerate(scans):
                if values:
                    stacked.append(np.stack(values))
                    continue
                t = graph.output[1 + self.N + k].type.tensor_type
                dims = tuple(d.dim_value for d in t.shape.dim)
                dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
                stacked.append(np.zeros((0, *dims), dtype))
            return self._check_and_fix_outputs(tuple(carried + stacked))

    return Loop


def _reference_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(model, new_ops=[_fixed_loop()])
    return [np.asarray(o) for o in evaluator.run(None, feeds)]


def _openvino_check(name: str) -> str:
    """OpenVINO's verdict on one construct: compiles it once, runs every feed in order on one
    infer request (as a serving backend would) and compares with onnx.reference; a feed that
    differs is run again on a freshly compiled model, to tell a stale result from a wrong one.
    Run it in a child process (_openvino_verdict): OpenVINO 2026.4 can crash on these."""
    import openvino as ov

    model = build(name)
    feeds_list = feeds_for(name)
    config = {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32"}
    core = ov.Core()

    def compile_():
        return core.compile_model(core.read_model(model.SerializeToString()), "CPU", config)

    def outputs(request, compiled, feeds):
        request.infer(feeds)
        return [request.get_output_tensor(i).data.copy() for i in range(len(compiled.outputs))]

    try:
        compiled = compile_()
    except Exception as e:
        return f"rejected: {str(e).strip().splitlines()[-1][:200]}"
    request = compiled.create_infer_request()
    bad = []
    for i, feeds in enumerate(feeds_list):
        ref = _reference_run(model, feeds)
        try:
            got = outputs(request, compiled, feeds)
        except Exception as e:
            bad.append(f"feed {i} fails: {str(e).strip().splitlines()[-1][:160]}")
            continue
        if all(_close(g, r) for g, r in zip(got, ref)):
            continue
        fresh = compile_()
        again = outputs(fresh.create_infer_request(), fresh, feeds)
        how = (
            "right on a freshly compiled model (a stale result)"
            if all(_close(g, r) for g, r in zip(again, ref))
            else "wrong on a fresh model too"
        )
        bad.append(
            f"feed {i} after feed {i - 1}: shapes {[g.shape for g in got]}, expected "
            f"{[r.shape for r in ref]}; {how}"
        )
    return "compiles, every feed matches" if not bad else "compiles; " + "; ".join(bad)


def _openvino_verdict(name: str, timeout_s: float = 300) -> str:
    """_openvino_check in a child process; a crash becomes the verdict."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    code = (
        "from tests.models.wild.constructs import _openvino_check; "
        f"print('VERDICT:', _openvino_check({name!r}))"
    )
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return f"hung (no answer in {timeout_s:.0f} s)"
    for line in proc.stdout.splitlines():
        if line.startswith("VERDICT: "):
            return line[len("VERDICT: ") :]
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
    return f"child process ended with code {proc.returncode} ({tail})"


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.allclose(a, b, rtol=1e-5, atol=1e-6)


def self_check(openvino: bool = True) -> dict[str, str]:
    """Checks every construct; returns name -> OpenVINO's verdict (raises on any other failure)."""
    verdicts = {}
    for name, builder in CONSTRUCTS.items():
        model = builder()
        onnx.checker.check_model(model, full_check=True)
        feeds_list = feeds_for(name)
        shapes = []
        for feeds in feeds_list:
            got = _ort_run(model, feeds)
            ref = _reference_run(model, feeds)
            assert len(got) == len(ref), name
            for g, r in zip(got, ref):
                assert _close(g, r), (name, g.shape, r.shape, g.dtype, r.dtype)
            shapes.append([tuple(g.shape) for g in got])
        assert shapes == expected_shapes(name), (name, shapes)
        assert len({tuple(s) for s in shapes}) > 1, f"{name}: every feed gives the same shapes"
        verdict = _openvino_verdict(name) if openvino else "not checked"
        verdicts[name] = verdict
        print(f"{name:24s} ok ({len(feeds_list)} feeds, shapes {shapes}); OpenVINO: {verdict}")
    return verdicts


if __name__ == "__main__":
    import sys

    self_check(openvino="--no-openvino" not in sys.argv)
