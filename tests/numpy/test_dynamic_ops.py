"""The numpy reference on nodes whose values have no static shape (``Value.shape is None``).

Downstream of a data-dependent operator (NonZero, NonMaxSuppression, Unique, Compress, a
TopK whose K is computed, a Range / Expand / Reshape / ConstantOfShape / Tile / Resize /
Slice / OneHot whose shape-giving input is computed) the graph carries values whose dtype is
known and whose shape is not; the numpy backend is what runs them. Every case here builds a
one-node :class:`dispatch.graph.Node` whose input and output values have ``shape=None``,
asks the numpy backend's registry for its reference implementation
(:meth:`dispatch.registry.Registry.reference_impl`: it must accept the node), runs the
kernel, and compares every output (dtype, shape and values exactly; floats within the
tolerances of the other numpy tests) with onnx's reference evaluator on the same node. Each
op runs on inputs giving outputs of different lengths, empty ones included; every other
numpy implementation of the op that accepts the dynamic node must agree too.

Where onnx's reference evaluator is not an oracle, onnxruntime is (the case says so):
Unique with ``sorted=0`` takes the first occurrences of the *flattened* input along axis 0
(wrong for a multi-dimensional input or another axis) and returns its sorted Y when Y is
the only output; onnxruntime orders them as ONNX specifies. Softmax before opset 13: the
evaluator ignores the 2-D coercion. The reference evaluator also
fails on NonMaxSuppression without its iou_threshold input and on a negative
max_output_boxes_per_class, so an omitted input is compared with the reference given the
input's ONNX default, and a negative maximum with the reference given 0.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from dispatch.graph import Node
from dispatch.registry import Implementation, Registry
from impls.numpy.backend import NumpyBackend
from layouts.registry import LayoutRegistry
from layouts.standard import standard_layout
from tests.support import make_node, reference_outputs

RNG = np.random.default_rng(2024)


def numpy_registry() -> Registry:
    """A registry holding the numpy backend only (its kernels as the backend wraps them)."""
    reg = Registry(layouts=LayoutRegistry())
    reg.layouts.add_layout(standard_layout())
    NumpyBackend().register(reg)
    return reg


REG = numpy_registry()


# -- inputs ----------------------------------------------------------------------------------


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def i64(*values: Any) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def f32v(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def bools(*values: int) -> np.ndarray:
    return np.array(values, dtype=bool)


def corner_boxes(batches: int, n: int) -> np.ndarray:
    """[batches, n, 4] boxes as [y1, x1, y2, x2], some with the corners the other way round,
    clustered so that many overlap."""
    p = RNG.uniform(0, 6, (batches, n, 2))
    q = p + RNG.uniform(-3, 3, (batches, n, 2))
    return np.concatenate([p, q], axis=-1).astype(np.float32)


def center_boxes(batches: int, n: int) -> np.ndarray:
    """[batches, n, 4] boxes as [x_center, y_center, width, height]."""
    c = RNG.uniform(0, 6, (batches, n, 2))
    wh = RNG.uniform(0.5, 3.5, (batches, n, 2))
    return np.concatenate([c, wh], axis=-1).astype(np.float32)


def scores(batches: int, classes: int, n: int, *, ties: bool = False) -> np.ndarray:
    s = RNG.uniform(0, 1, (batches, classes, n)).astype(np.float32)
    if ties:  # equal scores: the lower box index is selected first
        s[..., 1::3] = s[..., 0:1]
    return s


# -- cases -----------------------------------------------------------------------------------


@dataclass
class Case:
    op: str
    name: str
    inputs: list[np.ndarray | None]
    attrs: dict[str, Any] = field(default_factory=dict)
    n_outputs: int = 1
    opset: int = 21
    #: "reference" (onnx's evaluator) or "onnxruntime"
    oracle: str = "reference"
    #: the inputs onnx's evaluator runs instead (an omitted input given its ONNX default)
    oracle_inputs: list[np.ndarray | None] | None = None

    @property
    def id(self) -> str:
        return f"{self.op}-{self.name}"


CASES: list[Case] = []


def case(op: str, name: str, inputs: list, attrs: dict | None = None, **kw: Any) -> None:
    CASES.append(Case(op, name, list(inputs), attrs or {}, **kw))


# NonMaxSuppression: several batches and classes, both box formats, every optional input
for _cpb, _boxes in ((0, corner_boxes), (1, center_boxes)):
    _b, _s = _boxes(3, 10), scores(3, 4, 10, ties=True)
    _m, _iou, _st = i64(3), f32v(0.4), f32v(0.3)
    _t = f"cpb{_cpb}"
    case("NonMaxSuppression", f"{_t}_all_inputs", [_b, _s, _m, _iou, _st],
         {"center_point_box": _cpb})
    case("NonMaxSuppression", f"{_t}_no_score_threshold", [_b, _s, i64(100), f32v(0.5)],
         {"center_point_box": _cpb})
    case("NonMaxSuppression", f"{_t}_iou_0", [_b, _s, i64(10), f32v(0.0)],
         {"center_point_box": _cpb})
    case("NonMaxSuppression", f"{_t}_iou_1_keeps_all", [_b, _s, i64(10), f32v(1.0)],
         {"center_point_box": _cpb})
    case("NonMaxSuppression", f"{_t}_one_box_each", [_b, _s, i64(1), f32v(0.5), f32v(0.0)],
         {"center_point_box": _cpb})
    case("NonMaxSuppression", f"{_t}_threshold_drops_all", [_b, _s, i64(5), f32v(0.5),
                                                             f32v(1.0)],
         {"center_point_box": _cpb})
    case("NonMaxSuppression", f"{_t}_max_0", [_b, _s, i64(0), f32v(0.5)],
         {"center_point_box": _cpb})
    case("NonMaxSuppression", f"{_t}_max_negative", [_b, _s, i64(-2), f32v(0.5)],
         {"center_point_box": _cpb}, oracle_inputs=[_b, _s, i64(0), f32v(0.5)])
    case("NonMaxSuppression", f"{_t}_one_batch_class", [_boxes(1, 6), scores(1, 1, 6), i64(4),
                                                         f32v(0.3)],
         {"center_point_box": _cpb})
    case("NonMaxSuppression", f"{_t}_no_boxes", [np.zeros((2, 0, 4), np.float32),
                                                 np.zeros((2, 3, 0), np.float32), i64(4),
                                                 f32v(0.3)],
         {"center_point_box": _cpb})
    # omitted optional inputs: compared with the reference given their defaults
    case("NonMaxSuppression", f"{_t}_only_boxes_scores", [_b, _s], {"center_point_box": _cpb},
         oracle_inputs=[_b, _s, i64(0), f32v(0.0)])
    case("NonMaxSuppression", f"{_t}_no_iou", [_b, _s, i64(4)], {"center_point_box": _cpb},
         oracle_inputs=[_b, _s, i64(4), f32v(0.0)])
    case("NonMaxSuppression", f"{_t}_omitted_iou_with_score", [_b, _s, i64(4), None, _st],
         {"center_point_box": _cpb}, oracle_inputs=[_b, _s, i64(4), f32v(0.0), _st])
    case("NonMaxSuppression", f"{_t}_scalar_max", [_b, _s, np.array(2, np.int64), f32v(0.4)],
         {"center_point_box": _cpb}, oracle_inputs=[_b, _s, i64(2), f32v(0.4)])
# the unit-box layout of ONNX's own test: a few exact overlaps, opset 10 and 11
_unit = np.array([[[0.5, 0.5, 1.0, 1.0], [0.5, 0.6, 1.0, 1.0], [0.5, 0.4, 1.0, 1.0],
                   [0.5, 10.5, 1.0, 1.0], [0.5, 10.6, 1.0, 1.0], [0.5, 100.5, 1.0, 1.0]]],
                 np.float32)
_unit_scores = f32v(0.9, 0.75, 0.6, 0.95, 0.5, 0.3).reshape(1, 1, 6)
for _opset in (10, 11):
    case("NonMaxSuppression", f"onnx_center_box_opset{_opset}",
         [_unit, _unit_scores, i64(3), f32v(0.5), f32v(0.0)], {"center_point_box": 1},
         opset=_opset)

# NonZero: different counts, none at all, 0-d
for _name, _x in (
    ("float_2d", (f32(4, 5) > 0.3).astype(np.float32) * f32(4, 5)),
    ("int32_3d", RNG.integers(-1, 2, (2, 3, 4)).astype(np.int32)),
    ("bool_1d", bools(0, 1, 1, 0, 1)),
    ("all_zero", np.zeros((3, 2), np.int64)),
    ("empty", np.zeros((0, 4), np.float32)),
    ("scalar_nonzero", np.array(2.5, np.float32)),
    ("scalar_zero", np.array(0, np.int64)),
    ("uint8", RNG.integers(0, 2, (7,)).astype(np.uint8)),
):
    case("NonZero", _name, [_x])

# Unique: sorted 0 / 1, with and without axis, 1 to 4 outputs
_u2 = np.array([[2, 1, 2, 1], [3, 1, 3, 1], [2, 1, 2, 1]], np.int64)
_u1 = f32v(2.0, -1.0, 2.0, 0.5, -1.0, 7.0, 2.0)
for _n in (1, 2, 3, 4):
    case("Unique", f"sorted_1d_{_n}_outputs", [_u1], n_outputs=_n)
    case("Unique", f"sorted_2d_{_n}_outputs", [_u2], n_outputs=_n)
    case("Unique", f"unsorted_1d_{_n}_outputs", [_u1], {"sorted": 0}, n_outputs=_n,
         oracle="reference" if _n > 1 else "onnxruntime")
    case("Unique", f"unsorted_2d_{_n}_outputs", [_u2], {"sorted": 0}, n_outputs=_n,
         oracle="onnxruntime")
for _axis in (0, 1, -1):
    case("Unique", f"sorted_axis{_axis}", [_u2], {"axis": _axis}, n_outputs=4)
    case("Unique", f"unsorted_axis{_axis}", [_u2], {"axis": _axis, "sorted": 0}, n_outputs=4,
         oracle="reference" if _axis == 0 else "onnxruntime")
case("Unique", "sorted_axis_3d", [RNG.integers(0, 2, (2, 3, 2)).astype(np.int32)],
     {"axis": 1}, n_outputs=4)
case("Unique", "float_nan", [f32v(3.0, 1.0, np.nan, np.nan, 1.0, -0.0, 0.0)], n_outputs=4)
case("Unique", "strings", [np.array(["b", "a", "b", "c", "a"], dtype=object)], n_outputs=4)
case("Unique", "empty", [np.zeros((0,), np.float32)], n_outputs=4)
case("Unique", "all_same", [np.full((2, 3), 5, np.int32)], n_outputs=4)
case("Unique", "all_distinct_unsorted", [i64(9, 3, 5, 1)], {"sorted": 0}, n_outputs=4)
case("Unique", "bool", [bools(1, 0, 1, 1)], n_outputs=4)

# Compress: along an axis, flattened, shorter conditions, nothing selected
_cx = f32(3, 4)
case("Compress", "axis0", [_cx, bools(1, 0, 1)], {"axis": 0})
case("Compress", "axis1", [_cx, bools(0, 1, 1, 0)], {"axis": 1})
case("Compress", "axis_neg", [_cx, bools(1, 0, 0, 1)], {"axis": -1})
case("Compress", "short_condition", [_cx, bools(0, 1)], {"axis": 1})
case("Compress", "flattened", [_cx, bools(1, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0, 1)])
case("Compress", "flattened_short", [_cx, bools(0, 1, 1)])
case("Compress", "none_selected", [_cx, bools(0, 0, 0)], {"axis": 0})
case("Compress", "empty_condition", [_cx, np.zeros((0,), bool)], {"axis": 1})
case("Compress", "int64_3d", [RNG.integers(-9, 9, (2, 3, 2)), bools(1, 0, 1)], {"axis": 1})
case("Compress", "strings", [np.array([["a", "b"], ["c", "d"]], dtype=object), bools(0, 1)],
     {"axis": 0})
case("Compress", "opset9", [_cx, bools(1, 1, 0, 1)], {"axis": 1}, opset=9)

# TopK with K as a run-time input
_tx = f32(3, 6)
_tx[1, 2] = _tx[1, 4]  # a tie
for _k in (0, 1, 4, 6):
    case("TopK", f"k{_k}_largest", [_tx, i64(_k)], n_outputs=2)
    case("TopK", f"k{_k}_smallest", [_tx, i64(_k)], {"largest": 0}, n_outputs=2)
case("TopK", "axis0_k2", [_tx, i64(2)], {"axis": 0}, n_outputs=2)
case("TopK", "int64_k3", [RNG.integers(-5, 5, (4, 5)), i64(3)], n_outputs=2)

# Range: lengths from the values
for _name, _ins in (
    ("int_5", [np.array(0, np.int64), np.array(5, np.int64), np.array(1, np.int64)]),
    ("int_step3", [np.array(2, np.int64), np.array(17, np.int64), np.array(3, np.int64)]),
    ("int_down", [np.array(10, np.int32), np.array(-3, np.int32), np.array(-4, np.int32)]),
    ("int_empty", [np.array(5, np.int64), np.array(1, np.int64), np.array(1, np.int64)]),
    ("float", [np.array(0.5, np.float32), np.array(3.2, np.float32), np.array(0.4, np.float32)]),
    ("float_empty", [np.array(1.0, np.float32), np.array(1.0, np.float32),
                     np.array(0.5, np.float32)]),
):
    case("Range", _name, _ins)

# Expand / Reshape / ConstantOfShape / Tile with computed shapes
_ex = f32(3, 1)
for _name, _shape in (("rows", i64(3, 4)), ("batch", i64(2, 1, 5)), ("same", i64(1)),
                      ("empty", i64(0, 3, 1))):
    case("Expand", _name, [_ex, _shape])
_rx = f32(2, 3, 4)
for _name, _shape in (("flat", i64(-1)), ("copy_dim", i64(0, -1)), ("split", i64(4, 3, 2)),
                      ("scalarish", i64(24, 1))):
    case("Reshape", _name, [_rx, _shape])
case("Reshape", "allowzero_empty", [np.zeros((0, 3), np.float32), i64(3, 0)], {"allowzero": 1})
for _name, _shape, _value in (
    ("2x3_float", i64(2, 3), None),
    ("empty", i64(0, 4), None),
    ("scalar", np.zeros((0,), np.int64), None),
    ("int64_value", i64(3), helper.make_tensor("v", TensorProto.INT64, [1], [7])),
    ("bool_value", i64(2, 2), helper.make_tensor("v", TensorProto.BOOL, [1], [True])),
):
    case("ConstantOfShape", _name, [_shape], {} if _value is None else {"value": _value})
for _name, _reps in (("twice", i64(2, 1)), ("both", i64(2, 3)), ("none", i64(0, 3))):
    case("Tile", _name, [f32(2, 3), _reps])

# Resize with computed scales / sizes (roi omitted)
_img = f32(1, 2, 3, 4)
case("Resize", "nearest_sizes", [_img, None, None, i64(1, 2, 5, 7)], opset=19)
case("Resize", "nearest_sizes_down", [_img, None, None, i64(1, 2, 2, 2)], opset=19)
case("Resize", "linear_scales", [_img, None, f32v(1, 1, 2, 1.5)], {"mode": "linear"}, opset=19)
case("Resize", "linear_empty_scales_sizes", [_img, None, np.zeros((0,), np.float32),
                                             i64(1, 2, 4, 3)], {"mode": "linear"}, opset=19)
case("Resize", "cubic_sizes_axes", [_img, None, None, i64(6, 2)],
     {"mode": "cubic", "axes": [2, 3]}, opset=19)

# Slice with computed starts / ends / axes / steps
_sx = f32(4, 5, 3)
for _name, _ins in (
    ("basic", [i64(1, 0), i64(3, 4)]),
    ("axes_steps", [i64(0, 4), i64(5, -6), i64(1, 0), i64(2, -2)]),
    ("negative", [i64(-2), i64(100), i64(-1)]),
    ("empty", [i64(3), i64(1), i64(0)]),
    ("reverse_all", [i64(-1), i64(-100), i64(1), i64(-1)]),
):
    case("Slice", _name, [_sx, *_ins])

# OneHot with computed depth and values
_idx = i64(0, 2, -1, 5, 1)
case("OneHot", "depth3", [_idx, np.array(3, np.int64), f32v(0.0, 1.0)])
case("OneHot", "depth6_axis0", [_idx, np.array(6, np.int64), i64(-1, 4)], {"axis": 0})
case("OneHot", "depth0", [_idx, np.array(0, np.int64), f32v(0.0, 1.0)])
case("OneHot", "2d_indices", [RNG.integers(0, 4, (2, 3)), np.array(4.0, np.float32),
                              f32v(2.0, 5.0)], {"axis": 1})

# the ordinary operators downstream of a dynamic value
_gx = f32(5, 3)
for _name, _ix in (("three", i64(4, 0, -1)), ("one", i64(2)), ("none", np.zeros((0,), np.int64)),
                   ("2d", i64([0, 1], [3, 3]))):
    case("Gather", _name, [_gx, _ix])
case("Gather", "axis1", [_gx, i64(2, 0)], {"axis": 1})
case("GatherND", "pairs", [_gx, i64([0, 1], [4, 2], [-1, 0])])
case("GatherND", "rows", [_gx, i64([1], [3])])
case("GatherND", "none", [_gx, np.zeros((0, 2), np.int64)])
case("GatherND", "batch", [f32(2, 3, 4), i64([[0, 1]], [[2, 3]])], {"batch_dims": 1})
case("Concat", "rows", [f32(2, 3), f32(0, 3), f32(4, 3)], {"axis": 0})
case("Concat", "cols_neg", [f32(2, 1), f32(2, 5)], {"axis": -1})
case("Squeeze", "axes", [f32(1, 3, 1), i64(0)])
case("Squeeze", "all", [f32(1, 3, 1)])
case("Squeeze", "empty_dim_kept", [f32(0, 1), i64(1)])
case("Unsqueeze", "two", [f32(3, 2), i64(0, -1)])
case("Unsqueeze", "empty", [f32(0), i64(1)])
case("Transpose", "default", [f32(2, 3, 4)])
case("Transpose", "perm", [f32(2, 0, 4)], {"perm": [1, 2, 0]})
case("Cast", "to_int32", [f32(4, 2) * 10], {"to": TensorProto.INT32})
case("Cast", "to_float_empty", [np.zeros((0, 2), np.int64)], {"to": TensorProto.FLOAT})
case("Cast", "to_bool", [i64(0, 3, -1)], {"to": TensorProto.BOOL})
case("Shape", "full", [f32(3, 0, 2)])
case("Shape", "start_end", [f32(3, 4, 2, 5)], {"start": 1, "end": -1})
case("Where", "broadcast", [bools(1, 0, 1), f32(2, 3), f32(1, 3)])
case("Where", "empty", [np.zeros((0, 1), bool), f32(0, 3), f32(3)])
for _op in ("Add", "Sub", "Mul", "Div"):
    case(_op, "broadcast", [f32(4, 3), f32(3) + 2])
    case(_op, "empty", [f32(0, 3), f32(1, 3) + 2])
case("Div", "int", [i64(7, -7, 9), i64(2, 2, -4)])
for _op in ("ReduceMax", "ReduceMin", "ReduceSum"):
    case(_op, "axes1", [f32(3, 4), i64(1)], {"keepdims": 0}, opset=18)
    case(_op, "all", [f32(2, 3, 2)], opset=18)
    case(_op, "axes_neg_keep", [f32(2, 3, 2), i64(-1, 0)], opset=18)
case("ReduceSum", "empty_axis", [f32(0, 3), i64(0)], opset=13)
case("ArgMax", "axis1", [f32(4, 5)], {"axis": 1})
case("ArgMax", "last_index", [i64([1, 3, 3], [2, 2, 0])], {"axis": -1, "select_last_index": 1,
                                                            "keepdims": 0})
case("Softmax", "last", [f32(3, 4)])
case("Softmax", "axis0", [f32(3, 4)], {"axis": 0})
# onnx's evaluator ignores the 2-D coercion before opset 13 (see test_nn_ops.py)
case("Softmax", "opset11", [f32(2, 3, 4)], {"axis": 1}, opset=11, oracle="onnxruntime")
case("Softmax", "empty", [f32(0, 4)])
case("MatMul", "2d", [f32(3, 4), f32(4, 5)])
case("MatMul", "batch", [f32(2, 3, 4), f32(4, 2)])
case("MatMul", "vector", [f32(4), f32(2, 4, 3)])
case("MatMul", "empty_rows", [f32(0, 4), f32(4, 5)])

#: the operators this file must cover
DYNAMIC_OPS = frozenset({
    "NonMaxSuppression", "NonZero", "Unique", "Compress", "TopK", "Range", "Expand", "Reshape",
    "ConstantOfShape", "Tile", "Resize", "Slice", "OneHot", "GatherND", "Gather", "Concat",
    "Squeeze", "Unsqueeze", "Transpose", "Cast", "Shape", "Where", "Add", "Sub", "Mul", "Div",
    "ReduceMax", "ReduceMin", "ReduceSum", "ArgMax", "Softmax", "MatMul",
})


# -- harness ---------------------------------------------------------------------------------


def _strip_shapes(node: Node) -> Node:
    for v in [*node.inputs, *node.outputs]:
        if v is not None:
            v.shape = None
    return node


def build(c: Case, *, dynamic: bool = True) -> tuple[Node, onnx.NodeProto]:
    """The node of ``c`` (dtypes of its inputs; no static shape when ``dynamic``) and its
    NodeProto."""
    node, proto = make_node(c.op, c.inputs, c.attrs, n_outputs=c.n_outputs, opset=c.opset)
    return (_strip_shapes(node) if dynamic else node), proto


def onnxruntime_outputs(proto: onnx.NodeProto, inputs: list[np.ndarray | None],
                        opset: int) -> list[np.ndarray]:
    """Outputs of ``proto`` from onnxruntime (its CPU provider)."""
    import onnxruntime as ort

    feeds = {n: a for n, a in zip(proto.input, inputs, strict=False) if n}
    graph = helper.make_graph(
        [proto], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), None)
         for n, a in feeds.items()],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in proto.output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type for v in [*inferred.graph.value_info, *inferred.graph.output]}
    for out in model.graph.output:
        out.type.CopyFrom(types[out.name])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(sess.run(None, feeds))


def expected(c: Case) -> list[np.ndarray]:
    """What the oracle of ``c`` computes."""
    if c.oracle == "onnxruntime":
        _, proto = build(c)
        return onnxruntime_outputs(proto, c.inputs, c.opset)
    ins = c.inputs if c.oracle_inputs is None else c.oracle_inputs
    _, proto = make_node(c.op, ins, c.attrs, n_outputs=c.n_outputs, opset=c.opset)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return reference_outputs(proto, ins, c.opset)


def run(impl: Implementation, node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    out = impl.build(node)(*inputs)
    return list(out) if isinstance(out, tuple | list) else [out]


def assert_same(got: Any, want: Any, what: str) -> None:
    """``got`` equals ``want``: an ndarray of the same dtype and shape, row-major contiguous,
    the same values (floats within the other numpy tests' tolerances, NaN where NaN)."""
    want = np.asarray(want)
    assert isinstance(got, np.ndarray), f"{what}: {type(got).__name__}, not ndarray"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    assert got.flags.c_contiguous, f"{what}: not row-major contiguous"
    if got.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    tol = {np.dtype(np.float16): 3e-3, np.dtype(np.float32): 2e-5}.get(got.dtype, 1e-6)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True, err_msg=what)


def assert_outputs(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} outputs, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same(g, w, f"{what} output {k}")


# -- the comparison --------------------------------------------------------------------------


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_dynamic_node_matches_the_oracle(c: Case) -> None:
    node, _ = build(c)
    assert all(v.shape is None for v in node.inputs if v is not None)
    impl = REG.reference_impl(node)
    reasons = {i.name: i.supports(node) for i in REG.impls_for(c.op) if i.backend == "numpy"}
    assert impl is not None, f"no numpy implementation accepts the dynamic node: {reasons}"
    want = expected(c)
    assert_outputs(run(impl, node, c.inputs), want, f"{impl.name} {c.id}")


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_every_accepting_numpy_implementation_agrees(c: Case) -> None:
    node, _ = build(c)
    accepting = [i for i in REG.impls_for(c.op) if i.backend == "numpy" and i.supports(node) is None]
    assert accepting
    want = run(accepting[0], node, c.inputs)
    for impl in accepting[1:]:
        assert_outputs(run(impl, node, c.inputs), want, f"{impl.name} {c.id}")


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_dynamic_and_static_nodes_compute_alike(c: Case) -> None:
    """A node with static shapes (where its implementation accepts it) computes what the
    dynamic one does: tolerating ``shape=None`` changed nothing for the static case."""
    static, _ = build(c, dynamic=False)
    impl = REG.reference_impl(static)
    assert impl is not None, c.id
    dynamic, _ = build(c)
    assert_outputs(run(impl, static, c.inputs), run(REG.reference_impl(dynamic), dynamic,
                                                   c.inputs), c.id)


def test_every_operator_is_covered() -> None:
    covered = {c.op for c in CASES}
    assert covered == DYNAMIC_OPS, sorted(covered ^ DYNAMIC_OPS)
    for op in ("NonMaxSuppression", "NonZero", "Unique", "Compress"):
        assert any(i.backend == "numpy" for i in REG.impls_for(op)), op


def test_outputs_of_different_lengths_and_empty_ones_are_covered() -> None:
    """Each data-dependent op runs on inputs giving several output sizes, an empty one too."""
    for op in ("NonMaxSuppression", "NonZero", "Unique", "Compress", "TopK", "Range", "Slice"):
        sizes = set()
        for c in CASES:
            if c.op == op:
                sizes.add(expected(c)[0].size)
        assert 0 in sizes and len(sizes) >= 3, (op, sorted(sizes))


# -- the new operators with static shapes ----------------------------------------------------

STATIC_OPS = ("NonMaxSuppression", "NonZero", "Unique", "Compress")


@pytest.mark.parametrize("c", [c for c in CASES if c.op in STATIC_OPS],
                         ids=[c.id for c in CASES if c.op in STATIC_OPS])
def test_static_node_matches_the_oracle(c: Case) -> None:
    node, _ = build(c, dynamic=False)
    assert all(v.shape is not None for v in node.inputs if v is not None)
    impl = REG.reference_impl(node)
    assert impl is not None, [i.supports(node) for i in REG.impls_for(c.op)]
    assert_outputs(run(impl, node, c.inputs), expected(c), f"{impl.name} {c.id}")


def _reason(op: str, inputs: list, attrs: dict | None = None, **kw: Any) -> str:
    node, _ = make_node(op, inputs, attrs, **kw)
    reasons = [i.supports(node) for i in REG.impls_for(op) if i.backend == "numpy"]
    assert reasons and all(reasons), reasons
    return " ".join(r for r in reasons if r)


def _dynamic_kernel(op: str, inputs: list, attrs: dict | None = None, **kw: Any) -> Any:
    node, _ = make_node(op, inputs, attrs, **kw)
    _strip_shapes(node)
    impl = REG.reference_impl(node)
    assert impl is not None
    return impl.build(node)


def test_static_shapes_that_cannot_fit_are_refused_and_raise_when_dynamic() -> None:
    """What supports() refuses on static shapes, the kernel of the dynamic node raises on the
    arrays (a clear ValueError / IndexError that names the shapes)."""
    bad = [
        ("NonMaxSuppression", [f32(1, 3, 3), f32(1, 1, 3), i64(2), f32v(0.5)], {}, "boxes"),
        ("NonMaxSuppression", [f32(1, 3, 4), f32(1, 1, 4), i64(2), f32v(0.5)], {}, "scores"),
        ("NonMaxSuppression", [f32(2, 3, 4), f32(1, 1, 3), i64(2), f32v(0.5)], {}, "scores"),
        ("NonMaxSuppression", [f32(1, 3, 4), f32(1, 1, 3), i64(2, 3), f32v(0.5)], {},
         "one element"),
        ("Compress", [f32(2, 3), np.ones((1, 3), bool)], {"axis": 1}, "1-D"),
        ("Compress", [f32(2, 3), bools(1, 0)], {"axis": 2}, "out of range"),
        ("Unique", [f32(2, 3)], {"axis": 2}, "out of range"),
        ("TopK", [f32(2, 3), i64(1, 2)], {}, "one element"),
        ("Softmax", [f32(2, 3)], {"axis": 2}, "out of range"),
        ("Softmax", [f32(2, 3)], {"axis": 3}, "out of range"),
    ]
    for op, inputs, attrs, words in bad:
        n = 2 if op == "TopK" else 1
        opset = 11 if (op, attrs.get("axis")) == ("Softmax", 3) else 21
        assert words in _reason(op, inputs, attrs, n_outputs=n, opset=opset), (op, attrs)
        kernel = _dynamic_kernel(op, inputs, attrs, n_outputs=n, opset=opset)
        with pytest.raises((ValueError, IndexError), match=words):
            kernel(*inputs)


def test_refusals_of_attributes_and_types() -> None:
    assert "center_point_box" in _reason("NonMaxSuppression", [f32(1, 2, 4), f32(1, 1, 2)],
                                         {"center_point_box": 2})
    assert "float32" in _reason("NonMaxSuppression", [f32(1, 2, 4).astype(np.float64),
                                                      f32(1, 1, 2).astype(np.float64)])
    assert "opset 10" in _reason("NonMaxSuppression", [f32(1, 2, 4), f32(1, 1, 2)], opset=9)
    assert "sorted" in _reason("Unique", [f32(3)], {"sorted": 2})
    assert "string" in _reason("Unique", [np.array(["a"], object)], {"axis": 0})
    assert "negative" in _reason("Compress", [f32(2, 3), bools(1)], {"axis": -1}, opset=9)
    assert "bool" in _reason("Compress", [f32(2, 3), i64(1, 0)], {"axis": 0})


def test_compress_condition_selecting_past_the_end_raises() -> None:
    kernel = _dynamic_kernel("Compress", [f32(2, 3), bools(1, 0, 0, 1)], {"axis": 1})
    with pytest.raises(IndexError, match="outside the 3 entries"):
        kernel(f32(2, 3), bools(1, 0, 0, 1))
    x = f32(2, 3)
    assert_same(kernel(x, bools(0, 1, 0, 0)), x[:, 1:2], "trailing False")


def test_nms_matches_onnxruntime_on_random_boxes() -> None:
    """A second oracle for the box arithmetic: many random boxes, both formats."""
    for cpb, boxes in ((0, corner_boxes), (1, center_boxes)):
        c = Case("NonMaxSuppression", "ort", [boxes(2, 40), scores(2, 3, 40), i64(8),
                                              f32v(0.35), f32v(0.1)], {"center_point_box": cpb})
        node, proto = build(c)
        got = run(REG.reference_impl(node), node, c.inputs)
        assert_outputs(got, onnxruntime_outputs(proto, c.inputs, 11), f"cpb {cpb}")
        assert_outputs(got, expected(c), f"cpb {cpb} reference")


def test_nms_selection_order_and_ties() -> None:
    """Hand-checked: per class by descending score, equal scores by the lower box index,
    an overlapping box suppressed; batch-major rows."""
    boxes = np.array([[[0, 0, 1, 1], [0, 0, 1, 1], [0, 0.1, 1, 1.1], [5, 5, 6, 6]]], np.float32)
    sc = np.array([[[0.5, 0.5, 0.9, 0.1], [0.1, 0.2, 0.3, 0.4]]], np.float32)
    kernel = _dynamic_kernel("NonMaxSuppression", [boxes, sc, i64(10), f32v(0.5)])
    got = kernel(boxes, sc, i64(10), f32v(0.5))
    assert got.tolist() == [[0, 0, 2], [0, 0, 3], [0, 1, 3], [0, 1, 2]]
    # at 0.95 only an identical box suppresses: box 1 duplicates box 0 (equal scores in
    # class 0: box 0 comes first and box 1 goes), box 0 goes after box 1 in class 1
    got = kernel(boxes, sc, i64(10), f32v(0.95))
    assert got.tolist() == [[0, 0, 2], [0, 0, 0], [0, 0, 3], [0, 1, 3], [0, 1, 2], [0, 1, 1]]


def test_nms_suppresses_only_above_the_threshold() -> None:
    """IoU exactly at iou_threshold keeps the box (ONNX: suppressed when greater); an
    exact-threshold pair checked with the reference too."""
    boxes = np.array([[[0, 0, 1, 1], [0, 0, 1, 2], [0, 0, 1, 4]]], np.float32)  # IoU 0.5, 0.25
    sc = np.array([[[0.9, 0.8, 0.7]]], np.float32)
    for thr, want in ((0.5, [0, 1, 2]), (0.25, [0, 2]), (0.2, [0])):
        c = Case("NonMaxSuppression", f"thr{thr}", [boxes, sc, i64(3), f32v(thr)])
        node, _ = build(c)
        got = run(REG.reference_impl(node), node, c.inputs)
        assert got[0][:, 2].tolist() == want, thr
        assert_outputs(got, expected(c), f"threshold {thr}")


def test_resize_with_scales_and_sizes_both_unknown_decides_when_it_runs() -> None:
    """Two computed inputs without a static shape may each turn out empty: the node is
    accepted, and the kernel refuses only when both hold values."""
    x = f32(1, 1, 2, 2)
    ins = [x, None, f32v(1, 1, 2, 2), i64(1, 1, 4, 4)]
    node, _ = make_node("Resize", ins, opset=19)
    assert "both scales and sizes" in REG.impls_for("Resize")[0].supports(node)
    kernel = _dynamic_kernel("Resize", ins, opset=19)
    with pytest.raises(ValueError, match="both scales and sizes"):
        kernel(*ins)
    assert kernel(x, None, np.zeros(0, np.float32), i64(1, 1, 3, 3)).shape == (1, 1, 3, 3)
