"""Edge-shape and edge-value cases for the numerics tests (issue 7, "Numerics").

A *case* is a small ONNX model — one node, or a chain that a fused pattern matches — with
feeds. :data:`BUILDERS` maps every registry op key (``Conv``, ``Conv+Add+Relu``, ...) to a
function ``build(edge) -> [Case, ...]``; the test module asserts that every op key of the
registry has one, so a new operator or pattern cannot escape the edge cases.

Edge kinds (:data:`EDGES`):

- ``1x1``: spatial extent 1x1 (and M = 1 / N = 1 / K = 1 for matrix products);
- ``odd_channels``: channel counts not divisible by the 8 / 16 blocks (1, 3, 7, 17, 33);
- ``batch3``: batch 3;
- ``tiny``: activations ~1e-30 with every fourth element a denormal (~1e-40);
- ``huge``: activations ~1e30 (finite results);
- ``overflow``: positive activations in [1e38, 3.4e38] and positive weights, so products and
  sums overflow to +inf (in any summation order: every term is positive);
- ``zeros``: all-zero activations (0/0, log 0, 1/0 included);
- ``nonfinite``: N(0, 1) activations with NaN, +inf and -inf scattered through them (every
  7th, 11th and 13th element): NaN must propagate as in numpy (max, min, Relu, pooling).

Weights stay ~1 so that the edge values reach the outputs instead of underflowing.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.builders import ModelBuilder

OPSET = 20
SHAPE_EDGES = ("1x1", "odd_channels", "batch3")
VALUE_EDGES = ("tiny", "huge", "overflow", "zeros", "nonfinite")
EDGES = SHAPE_EDGES + VALUE_EDGES

#: rank-4 activation shapes (N, C, H, W) per edge kind
ACT_SHAPES: dict[str, list[tuple[int, int, int, int]]] = {
    "1x1": [(1, 16, 1, 1), (2, 17, 1, 1), (1, 3, 1, 1)],
    "odd_channels": [(1, 1, 5, 5), (1, 3, 6, 6), (2, 7, 5, 5), (1, 17, 4, 4), (1, 33, 3, 3)],
    "batch3": [(3, 16, 4, 4), (3, 7, 3, 3), (3, 33, 1, 1)],
}
VALUE_SHAPES = [(2, 17, 5, 5), (1, 16, 3, 3), (1, 3, 4, 4)]
#: (M, K, N) of matrix products per edge kind
GEMM_SHAPES: dict[str, list[tuple[int, int, int]]] = {
    "1x1": [(1, 1, 1), (1, 16, 1), (1, 1, 17)],
    "odd_channels": [(3, 17, 33), (5, 7, 3)],
    "batch3": [(3, 16, 16), (3, 33, 7)],
}
VALUE_GEMM_SHAPES = [(4, 17, 33)]


def act_shapes(edge: str, limit: int | None = None) -> list[tuple[int, int, int, int]]:
    """The rank-4 activation shapes of ``edge`` (the first ``limit`` of them)."""
    shapes = ACT_SHAPES.get(edge, VALUE_SHAPES)
    return shapes[:limit] if limit else shapes


def gemm_shapes(edge: str) -> list[tuple[int, int, int]]:
    return GEMM_SHAPES.get(edge, VALUE_GEMM_SHAPES)


def edge_values(shape: tuple[int, ...], edge: str, rng: np.random.Generator,
                role: str = "data") -> np.ndarray:
    """float32 values of ``role`` for ``edge``.

    Roles: ``data`` (activations: carry the edge values), ``positive`` (activations of ops
    defined on x >= 0: |data|), ``weight`` (~N(0, 0.5), positive in [1, 2] for ``overflow``),
    ``variance`` (a BatchNormalization variance: uniform [0.5, 2] in every edge kind).
    """
    shape = tuple(int(d) for d in shape)
    if role == "variance":
        return rng.uniform(0.5, 2.0, shape).astype(np.float32)
    if role == "weight":
        if edge == "overflow":
            return rng.uniform(1.0, 2.0, shape).astype(np.float32)
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)
    if edge == "tiny":
        x = rng.standard_normal(shape) * 1e-30
        flat = x.reshape(-1)
        flat[::4] = rng.uniform(1.0, 10.0, flat[::4].shape) * 1e-40 * rng.choice([-1.0, 1.0], flat[::4].shape)
        x = flat.reshape(shape)
    elif edge == "huge":
        x = rng.standard_normal(shape) * 1e30
    elif edge == "overflow":
        x = rng.uniform(1e38, 3.4e38, shape)
    elif edge == "zeros":
        x = np.zeros(shape)
    elif edge == "nonfinite":
        x = rng.standard_normal(shape)
        flat = x.reshape(-1)
        flat[::7] = np.nan
        flat[3::11] = np.inf
        flat[5::13] = -np.inf
        x = flat.reshape(shape)
    else:
        x = rng.standard_normal(shape)
    x = x.astype(np.float32)
    return np.abs(x) if role == "positive" else x


@dataclass
class Case:
    """One model and its feeds; ``name`` identifies it within its op key and edge kind."""

    op: str
    edge: str
    name: str
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.op}[{self.edge}:{self.name}]"


class Build:
    """A :class:`ModelBuilder` with seeded edge-valued feeds."""

    def __init__(self, op: str, edge: str, name: str) -> None:
        self.op, self.edge, self.name = op, edge, name
        self.b = ModelBuilder(OPSET, name=f"{op}_{edge}_{name}".replace("+", "_"))
        self.rng = np.random.default_rng(zlib.crc32(f"{op}/{edge}/{name}".encode()))
        self.feeds: dict[str, np.ndarray] = {}

    def x(self, shape: tuple[int, ...], role: str = "data", array: np.ndarray | None = None) -> str:
        """A graph input with edge values (or ``array``)."""
        name = f"x{len(self.feeds)}"
        arr = edge_values(shape, self.edge, self.rng, role) if array is None else array
        self.b.input(name, list(arr.shape), arr.dtype)
        self.feeds[name] = arr
        return name

    def w(self, shape: tuple[int, ...], role: str = "weight") -> str:
        """A constant (initializer) with values of ``role``."""
        return self.b.const(edge_values(shape, self.edge, self.rng, role))

    def const(self, array: np.ndarray) -> str:
        return self.b.const(np.asarray(array))

    def op_(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs) -> str | list[str]:
        return self.b.op(op_type, inputs, n_out, **attrs)

    def done(self, *outputs: str) -> Case:
        """The case whose graph outputs are ``outputs``, declared with the types that onnx's
        shape inference gives them."""
        for o in outputs:
            self.b.outputs.append(helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None))
        model = self.b.build()
        inferred = onnx.shape_inference.infer_shapes(model)
        types = {v.name: v.type for v in [*inferred.graph.value_info, *inferred.graph.output]}
        for out in model.graph.output:
            if types.get(out.name) is not None and types[out.name].tensor_type.elem_type:
                out.type.CopyFrom(types[out.name])
        return Case(self.op, self.edge, self.name, model, self.feeds)


Builder = Callable[[str], list[Case]]
BUILDERS: dict[str, Builder] = {}


def builder(*ops: str) -> Callable[[Callable[[str, str], list[Case]]], Callable]:
    """Register ``fn(op, edge) -> cases`` for each op key in ``ops``."""

    def deco(fn: Callable[[str, str], list[Case]]) -> Callable:
        for op in ops:
            BUILDERS[op] = lambda edge, op=op: fn(op, edge)
        return fn

    return deco


def _sname(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape)


# -- convolutions and their fused chains ------------------------------------------------------

#: Conv configurations: name -> (kernel, stride, pads, group rule, output channels rule)
CONV_KINDS = ("k3p1", "k1", "k1s2", "k3s2p1", "k3d2p2", "k5pasym", "depthwise", "grouped")
CHAINS: dict[str, tuple[str, ...]] = {
    "Conv": (),
    "Conv+Relu": ("Relu",),
    "Conv+Clip": ("Clip",),
    "Conv+Add": ("Add",),
    "Conv+Add+Relu": ("Add", "Relu"),
    "Conv+Sum": ("Sum",),
    "Conv+Sum+Relu": ("Sum", "Relu"),
}


def _group_for(c: int) -> int | None:
    """A group count > 1 dividing ``c`` that is not depthwise-like (None when c is prime)."""
    for g in (3, 2):
        if c % g == 0 and c // g >= 1 and c > g:
            return g
    return None


def _conv_case(op: str, edge: str, shape: tuple[int, ...], kind: str, tail: tuple[str, ...]) -> Case | None:
    n, c, h, w = shape
    group, m = 1, 17 if c != 17 else 5
    kh = 3 if kind in ("k3p1", "k3s2p1", "k3d2p2", "depthwise", "grouped") else 1
    kh = 5 if kind == "k5pasym" else kh
    stride = 2 if kind in ("k1s2", "k3s2p1") else 1
    dil = 2 if kind == "k3d2p2" else 1
    pads = {3: [1] * 4, 1: [0] * 4, 5: [2, 1, 2, 3]}[kh] if dil == 1 else [2] * 4
    if kind == "depthwise":
        group, m = c, c
    elif kind == "grouped":
        g = _group_for(c)
        if g is None:
            return None
        group, m = g, 2 * c if c // g < 4 else c
    ext = dil * (kh - 1) + 1
    oh, ow = (h + pads[0] + pads[2] - ext) // stride + 1, (w + pads[1] + pads[3] - ext) // stride + 1
    b = Build(op, edge, f"{kind}_{_sname(shape)}")
    x = b.x(shape)
    y = b.op_("Conv", [x, b.w((m, c // group, kh, kh)), b.w((m,), "data")],
              kernel_shape=[kh, kh], strides=[stride, stride], pads=pads, group=group,
              dilations=[dil, dil])
    for t in tail:
        if t == "Relu":
            y = b.op_("Relu", [y])
        elif t == "Clip":
            y = b.op_("Clip", [y, b.const(np.float32(-1.0)), b.const(np.float32(6.0))])
        else:
            y = b.op_(t, [y, b.x((n, m, oh, ow))])
    return b.done(y)


@builder(*CHAINS)
def conv_cases(op: str, edge: str) -> list[Case]:
    tail = CHAINS[op]
    shapes = act_shapes(edge)
    kinds = CONV_KINDS if not tail else ("k3p1", "k1", "depthwise", "grouped")
    if edge == "odd_channels" and tail:
        shapes = [(1, 3, 6, 6), (2, 7, 5, 5), (1, 33, 3, 3)]
    out = []
    for shape in shapes:
        for kind in kinds:
            case = _conv_case(op, edge, shape, kind, tail)
            if case is not None:
                out.append(case)
    return out


# -- matrix products ----------------------------------------------------------------------------


@builder("Gemm", "Gemm+Relu", "Gemm+Clip")
def gemm_cases(op: str, edge: str) -> list[Case]:
    out = []
    for m, k, n in gemm_shapes(edge):
        for trans_b in (0, 1):
            b = Build(op, edge, f"{m}x{k}x{n}_tB{trans_b}")
            a = b.x((m, k))
            y = b.op_("Gemm", [a, b.w((n, k) if trans_b else (k, n)), b.w((n,), "data")], transB=trans_b)
            if op.endswith("Relu"):
                y = b.op_("Relu", [y])
            elif op.endswith("Clip"):
                y = b.op_("Clip", [y, b.const(np.float32(0.0)), b.const(np.float32(6.0))])
            out.append(b.done(y))
    return out


@builder("MatMul", "MatMul+Relu", "MatMul+Add", "MatMul+Add+Relu")
def matmul_cases(op: str, edge: str) -> list[Case]:
    out = []
    tail = op.split("+")[1:]
    for m, k, n in gemm_shapes(edge):
        batch = 3 if edge == "batch3" else 2
        for kind in ("const_b", "batched"):
            b = Build(op, edge, f"{kind}_{m}x{k}x{n}")
            if kind == "const_b":
                y = b.op_("MatMul", [b.x((m, k)), b.w((k, n))])
            else:
                # the second operand ~1 as a weight: a product of two huge values overflows
                # with either sign, and inf - inf in float32 sums depends on their order
                y = b.op_("MatMul", [b.x((batch, m, k)), b.x((batch, k, n), "weight")])
            for t in tail:
                y = b.op_("Relu", [y]) if t == "Relu" else b.op_("Add", [y, b.w((n,), "data")])
            out.append(b.done(y))
    return out


# -- pooling, normalisation ----------------------------------------------------------------------


@builder("MaxPool", "AveragePool")
def pool_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge):
        configs: list[tuple[str, dict]] = [("k3s1p1", {"kernel_shape": [3, 3], "pads": [1] * 4})]
        if shape[2] >= 2:
            configs.append(("k2s2", {"kernel_shape": [2, 2], "strides": [2, 2]}))
        if op == "AveragePool":
            configs.append(("k3s1p1_incl", {"kernel_shape": [3, 3], "pads": [1] * 4, "count_include_pad": 1}))
        for name, attrs in configs:
            b = Build(op, edge, f"{name}_{_sname(shape)}")
            out.append(b.done(b.op_(op, [b.x(shape)], **attrs)))
    return out


@builder("GlobalMaxPool", "GlobalAveragePool", "LRN")
def global_pool_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge):
        b = Build(op, edge, _sname(shape))
        attrs = {"size": 3} if op == "LRN" else {}
        out.append(b.done(b.op_(op, [b.x(shape)], **attrs)))
    return out


@builder("BatchNormalization", "BatchNormalization+Relu")
def bn_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge):
        c = shape[1]
        b = Build(op, edge, _sname(shape))
        y = b.op_("BatchNormalization", [b.x(shape), b.w((c,)), b.w((c,), "data"), b.w((c,)),
                                         b.w((c,), "variance")])
        if op.endswith("Relu"):
            y = b.op_("Relu", [y])
        out.append(b.done(y))
    return out


@builder("LayerNormalization")
def layernorm_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in [*act_shapes(edge, 2), (3, 17)]:
        b = Build(op, edge, _sname(shape))
        out.append(b.done(b.op_(op, [b.x(shape), b.w(shape[-1:]), b.w(shape[-1:], "data")], axis=-1)))
    return out


@builder("Softmax", "LogSoftmax")
def softmax_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in [*act_shapes(edge, 2), (3, 17)]:
        for axis in (1, -1):
            b = Build(op, edge, f"{_sname(shape)}_axis{axis}")
            out.append(b.done(b.op_(op, [b.x(shape)], axis=axis)))
    return out


# -- elementwise ----------------------------------------------------------------------------------

UNARY = ("Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Neg", "Erf", "Identity", "HardSwish", "Elu",
         "LeakyRelu", "Gelu", "Dropout")
POSITIVE_UNARY = ("Sqrt", "Log", "Reciprocal")
UNARY_ATTRS: dict[str, list[tuple[str, dict]]] = {
    "Elu": [("alpha1", {"alpha": 1.0}), ("alpha0.5", {"alpha": 0.5})],
    "LeakyRelu": [("alpha0.1", {"alpha": 0.1})],
    "Gelu": [("erf", {}), ("tanh", {"approximate": "tanh"})],
}


def _unary_shapes(edge: str) -> list[tuple[int, ...]]:
    return [*act_shapes(edge, 2), (3, 17)]


@builder(*UNARY, *POSITIVE_UNARY)
def unary_cases(op: str, edge: str) -> list[Case]:
    out = []
    role = "positive" if op in POSITIVE_UNARY else "data"
    for shape in _unary_shapes(edge):
        for name, attrs in UNARY_ATTRS.get(op, [("", {})]):
            b = Build(op, edge, f"{_sname(shape)}{'_' + name if name else ''}")
            out.append(b.done(b.op_(op, [b.x(shape, role)], **attrs)))
    if op in POSITIVE_UNARY:  # negative inputs: NaN (Sqrt, Log) or a negative result
        b = Build(op, edge, "signed")
        out.append(b.done(b.op_(op, [b.x((3, 17))])))
    return out


@builder("Clip")
def clip_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in _unary_shapes(edge):
        for name, lo, hi in (("m1_2", -1.0, 2.0), ("0_6", 0.0, 6.0), ("max_only", None, 1.0),
                             ("none", None, None)):
            b = Build(op, edge, f"{_sname(shape)}_{name}")
            ins = [b.x(shape), "" if lo is None else b.const(np.float32(lo))]
            if hi is not None:
                ins.append(b.const(np.float32(hi)))
            while ins and ins[-1] == "":
                ins.pop()
            out.append(b.done(b.op_(op, ins)))
    return out


BINARY = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Equal", "Less", "Greater",
          "LessOrEqual", "GreaterOrEqual")


@builder(*BINARY)
def binary_cases(op: str, edge: str) -> list[Case]:
    """Same shapes (both inputs variable), a per-channel constant (C, 1, 1), a (1, C, 1, 1)
    variable, a scalar constant, a rank-2 bias over the last axis."""
    out = []
    base = "positive" if op == "Pow" else "data"
    for shape in act_shapes(edge, 2):
        c = shape[1]
        for kind in ("same", "channel_const", "channel_var", "scalar", "swapped"):
            b = Build(op, edge, f"{kind}_{_sname(shape)}")
            x = b.x(shape, base)
            if op == "Pow":  # a positive base; exponents ~1 (or the special cases 2, 0.5)
                if kind == "same":
                    other = b.x(shape, "weight")
                elif kind == "channel_const":
                    other = b.w((c, 1, 1))
                elif kind == "channel_var":
                    other = b.x((1, c, 1, 1), "weight")
                else:
                    other = b.const(np.float32(2.0 if kind == "scalar" else 0.5))
                out.append(b.done(b.op_(op, [x, other])))
                continue
            if kind == "same":
                ins = [x, b.x(shape)]
            elif kind == "channel_const":
                ins = [x, b.w((c, 1, 1), "data")]
            elif kind == "channel_var":
                ins = [x, b.x((1, c, 1, 1))]
            elif kind == "scalar":
                ins = [x, b.const(np.float32(0.5))]
            else:
                ins = [b.w((c, 1, 1), "data"), x]
            out.append(b.done(b.op_(op, ins)))
    b = Build(op, edge, "rank2_bias")
    out.append(b.done(b.op_(op, [b.x((3, 17), base), b.w((17,), "weight" if op == "Pow" else "data")])))
    if op in ("Max", "Min"):
        shape = act_shapes(edge)[0]
        b = Build(op, edge, f"three_{_sname(shape)}")
        out.append(b.done(b.op_(op, [b.x(shape), b.x(shape), b.x(shape)])))
    return out


@builder("Sum")
def sum_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        for k in (1, 2, 3):
            b = Build(op, edge, f"{k}in_{_sname(shape)}")
            out.append(b.done(b.op_(op, [b.x(shape) for _ in range(k)])))
    b = Build(op, edge, "broadcast")
    out.append(b.done(b.op_(op, [b.x((3, 17)), b.x((17,))])))
    return out


@builder("Mul+Add")
def mul_add_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        c = shape[1]
        b = Build(op, edge, _sname(shape))
        y = b.op_("Mul", [b.x(shape), b.w((c, 1, 1))])
        out.append(b.done(b.op_("Add", [y, b.w((c, 1, 1), "data")])))
    return out


@builder("Add+Relu")
def add_relu_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        for kind in ("same", "channel"):
            b = Build(op, edge, f"{kind}_{_sname(shape)}")
            other = b.x(shape) if kind == "same" else b.w((shape[1], 1, 1), "data")
            out.append(b.done(b.op_("Relu", [b.op_("Add", [b.x(shape), other])])))
    return out


@builder("And", "Or", "Xor", "Not", "Where")
def bool_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        b = Build(op, edge, _sname(shape))
        flags = [b.x(shape, array=edge_values(shape, edge, b.rng) > 0) for _ in range(2)]
        if op == "Not":
            y = b.op_(op, flags[:1])
        elif op == "Where":
            y = b.op_(op, [flags[0], b.x(shape), b.x(shape)])
        else:
            y = b.op_(op, flags)
        out.append(b.done(y))
    return out


@builder("Concat")
def concat_cases(op: str, edge: str) -> list[Case]:
    out = []
    for n, c, h, w in act_shapes(edge, 2):
        b = Build(op, edge, f"c_{n}x{c}x{h}x{w}")
        parts = [b.x((n, k, h, w)) for k in (3, c, 7)]
        out.append(b.done(b.op_(op, parts, axis=1)))
        b = Build(op, edge, f"n_{n}x{c}x{h}x{w}")
        out.append(b.done(b.op_(op, [b.x((n, c, h, w)), b.x((1, c, h, w))], axis=0)))
    b = Build(op, edge, "rank2")
    out.append(b.done(b.op_(op, [b.x((3, 17)), b.x((3, 1))], axis=-1)))
    return out


# -- reductions, casts, shapes ---------------------------------------------------------------------

REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare",
          "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp")


@builder(*REDUCE)
def reduce_cases(op: str, edge: str) -> list[Case]:
    out = []
    role = "positive" if op == "ReduceLogSum" else "data"
    for shape in act_shapes(edge, 2):
        for axes, keep in (([1], 1), ([2, 3], 0), (None, 1)):
            b = Build(op, edge, f"{_sname(shape)}_axes{'all' if axes is None else axes}_k{keep}")
            ins = [b.x(shape, role)]
            if axes is not None:
                ins.append(b.const(np.array(axes, np.int64)))
            out.append(b.done(b.op_(op, ins, keepdims=keep)))
    return out


@builder("Cast")
def cast_cases(op: str, edge: str) -> list[Case]:
    out = []
    for to, name in ((TensorProto.DOUBLE, "f64"), (TensorProto.FLOAT16, "f16")):
        shape = act_shapes(edge)[0]
        b = Build(op, edge, f"{name}_{_sname(shape)}")
        out.append(b.done(b.op_(op, [b.x(shape)], to=to)))
    return out


@builder("Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Split", "Slice", "Gather",
         "Shape", "Size", "Expand", "Tile", "Pad")
def shape_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        out.append(_shape_case(Build(op, edge, _sname(shape)), op, shape))
    return out


def _shape_case(b: Build, op: str, shape: tuple[int, int, int, int]) -> Case:
    n, c, h, w = shape

    def i64(v: list[int]) -> str:
        return b.const(np.array(v, np.int64))

    if op == "Squeeze":
        y = b.op_(op, [b.x((n, c, 1, w)), i64([2])])
    elif op == "Expand":
        y = b.op_(op, [b.x((1, c, 1, 1)), i64(list(shape))])
    else:
        x = b.x(shape)
        inputs: dict[str, list[str]] = {
            "Reshape": [x, i64([n, -1])], "Unsqueeze": [x, i64([0])],
            "Split": [x, i64([1, c - 1] if c > 1 else [1])],
            "Slice": [x, i64([0, 1]), i64([c, h]), i64([1, 2])],
            "Gather": [x, i64([0, c - 1, 0])], "Tile": [x, i64([1, 2, 1, 1])],
            "Pad": [x, i64([0, 1, 1, 0, 0, 2, 0, 1])],
        }
        attrs: dict[str, dict] = {"Flatten": {"axis": 1}, "Transpose": {"perm": [0, 2, 3, 1]},
                                  "Split": {"axis": 1}, "Gather": {"axis": 1}}
        n_out = 2 if op == "Split" and c > 1 else 1
        y = b.op_(op, inputs.get(op, [x]), n_out, **attrs.get(op, {}))
    return b.done(*(y if isinstance(y, list) else [y]))


@builder("Constant", "ConstantOfShape")
def constant_cases(op: str, edge: str) -> list[Case]:
    out = []
    shape = act_shapes(edge)[0]
    b = Build(op, edge, _sname(shape))
    if op == "Constant":
        value = numpy_helper.from_array(edge_values(shape, edge, b.rng))
        y = b.op_(op, [], value=value)
    else:
        fill = numpy_helper.from_array(edge_values((1,), edge, b.rng))
        y = b.op_(op, [b.const(np.array(shape, np.int64))], value=fill)
    out.append(b.done(y))
    return out


def with_all_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose every node output is a graph output (for onnx's reference
    evaluator, which returns graph outputs only)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for node in m.graph.node:
        for o in node.output:
            if o and o not in have:
                m.graph.output.append(helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None))
                have.add(o)
    return m


def cases(op: str, edge: str) -> list[Case]:
    """The cases of registry op key ``op`` for ``edge``."""
    return BUILDERS[op](edge)


# the builders of the issue-14 operators live in their own modules; importing them registers them
from tests.reliability import cases_contrib as _cases_contrib  # noqa: E402,F401
from tests.reliability import cases_index as _cases_index  # noqa: E402,F401
from tests.reliability import cases_math as _cases_math  # noqa: E402,F401
from tests.reliability import cases_quant as _cases_quant  # noqa: E402,F401
