"""Edge cases (see :mod:`tests.reliability.numerics_cases`) of the exporters' math operators
(issue 14); registered into :data:`~tests.reliability.numerics_cases.BUILDERS`.

Elementwise functions and activations take the edge values themselves (functions defined on
an interval also take them mapped into it: tanh(x) for asin / acos / atanh, 1 + |x| for
acosh). The ordering operators (ArgMax, ArgMin, TopK, Hardmax) see the edge values as keys,
NaN and +-inf included; CumSum sums them; Trilu masks them; OneHot writes them as its
off / on values; Range counts from edge-sized starts and steps. Integer cases (Mod, Sign,
BitShift, Range) take the same integers on every edge kind: the edge values are floats.
"""

from __future__ import annotations

import numpy as np

from tests.reliability.numerics_cases import (
    Build,
    Case,
    _sname,
    _unary_shapes,
    act_shapes,
    builder,
    edge_values,
)

# -- elementwise functions and activations ------------------------------------------------------

#: op -> [(case name suffix, attributes)]
FLOAT_UNARY: dict[str, list[tuple[str, dict]]] = {
    "IsNaN": [("", {})],
    "IsInf": [("", {}), ("pos", {"detect_negative": 0}), ("neg", {"detect_positive": 0})],
    "Sin": [("", {})],
    "Cos": [("", {})],
    "Tan": [("", {})],
    "Atan": [("", {})],
    "Sinh": [("", {})],
    "Cosh": [("", {})],
    "Asinh": [("", {})],
    "Floor": [("", {})],
    "Ceil": [("", {})],
    "Round": [("", {})],
    "Sign": [("", {})],
    "Softplus": [("", {})],
    "HardSigmoid": [("", {}), ("a0.5_b0.1", {"alpha": 0.5, "beta": 0.1})],
    "Selu": [("", {}), ("a2_g0.5", {"alpha": 2.0, "gamma": 0.5})],
    "Celu": [("", {}), ("a2", {"alpha": 2.0})],
    "Softsign": [("", {})],
    "ThresholdedRelu": [("", {}), ("a0.5", {"alpha": 0.5})],
    "Mish": [("", {})],
    "Shrink": [("", {}), ("l1_b0.5", {"lambd": 1.0, "bias": 0.5})],
}
#: functions defined on part of the line: op -> how the edge values are mapped into it
BOUNDED_UNARY = {
    "Asin": np.tanh,
    "Acos": np.tanh,
    "Atanh": np.tanh,
    "Acosh": lambda x: 1 + np.abs(x),
}


@builder(*FLOAT_UNARY, *BOUNDED_UNARY)
def math_unary_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in _unary_shapes(edge):
        for name, attrs in FLOAT_UNARY.get(op, [("", {})]):
            b = Build(op, edge, f"{_sname(shape)}{'_' + name if name else ''}")
            x = edge_values(shape, edge, b.rng)
            if op in BOUNDED_UNARY:
                with np.errstate(all="ignore"):
                    x = BOUNDED_UNARY[op](x).astype(np.float32)
            out.append(b.done(b.op_(op, [b.x(shape, array=x)], **attrs)))
    if op in BOUNDED_UNARY:  # the edge values as they are: NaN outside the domain
        b = Build(op, edge, "unmapped")
        out.append(b.done(b.op_(op, [b.x((3, 17))])))
    if op == "Sign":
        b = Build(op, edge, "int32")
        ints = b.rng.integers(-3, 4, (3, 17)).astype(np.int32)
        out.append(b.done(b.op_(op, [b.x(ints.shape, array=ints)])))
    return out


@builder("PRelu")
def prelu_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        for kind in ("channel", "same"):
            b = Build(op, edge, f"{kind}_{_sname(shape)}")
            slope = b.w((shape[1], 1, 1)) if kind == "channel" else b.x(shape, "weight")
            out.append(b.done(b.op_(op, [b.x(shape), slope])))
    b = Build(op, edge, "rank2_last_axis")
    out.append(b.done(b.op_(op, [b.x((3, 17)), b.w((17,))])))
    return out


# -- binary and variadic --------------------------------------------------------------------------


@builder("Mod")
def mod_cases(op: str, edge: str) -> list[Case]:
    """fmod=1 (C fmod) on floats by a weight-sized divisor and by a per-channel constant,
    fmod=0 (the divisor's sign) on floats and on int32 (including negative operands)."""
    out = []
    for shape in act_shapes(edge, 2):
        c = shape[1]
        for kind, fmod in (("same", 1), ("channel", 1), ("same", 0)):
            b = Build(op, edge, f"{kind}_fmod{fmod}_{_sname(shape)}")
            y = b.x(shape, "weight") if kind == "same" else b.w((c, 1, 1))
            out.append(b.done(b.op_(op, [b.x(shape), y], fmod=fmod)))
    b = Build(op, edge, "int32_fmod0")
    a = b.rng.integers(-50, 50, (3, 17)).astype(np.int32)
    d = b.rng.integers(1, 9, (17,)).astype(np.int32) * np.where(np.arange(17) % 2, 1, -1).astype(np.int32)
    out.append(b.done(b.op_(op, [b.x(a.shape, array=a), b.const(d)], fmod=0)))
    return out


@builder("Mean")
def mean_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        for k in (1, 2, 3):
            b = Build(op, edge, f"{k}in_{_sname(shape)}")
            out.append(b.done(b.op_(op, [b.x(shape) for _ in range(k)])))
    b = Build(op, edge, "broadcast")
    out.append(b.done(b.op_(op, [b.x((3, 17)), b.x((17,))])))
    return out


@builder("BitShift")
def bitshift_cases(op: str, edge: str) -> list[Case]:
    """Unsigned operands (the types every ONNX version has), amounts inside and outside
    [0, bits)."""
    out = []
    for dtype in (np.uint8, np.uint32):
        for direction in ("LEFT", "RIGHT"):
            b = Build(op, edge, f"{np.dtype(dtype).name}_{direction}")
            bits = np.iinfo(dtype).bits
            x = b.rng.integers(0, np.iinfo(dtype).max, (3, 17), endpoint=True).astype(dtype)
            y = b.rng.integers(0, bits + 2, (17,)).astype(dtype)
            out.append(b.done(b.op_(op, [b.x(x.shape, array=x), b.x(y.shape, array=y)],
                                    direction=direction)))
    return out


# -- ordering ---------------------------------------------------------------------------------------


@builder("ArgMax", "ArgMin")
def arg_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        for axis, keep, last in ((1, 1, 0), (-1, 0, 0), (1, 0, 1)):
            b = Build(op, edge, f"{_sname(shape)}_a{axis}_k{keep}_l{last}")
            out.append(b.done(b.op_(op, [b.x(shape)], axis=axis, keepdims=keep,
                                    select_last_index=last)))
    return out


@builder("TopK")
def topk_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        for axis, largest in ((1, 1), (-1, 1), (1, 0)):
            k = max(1, (shape[axis] + 1) // 2)
            b = Build(op, edge, f"{_sname(shape)}_a{axis}_k{k}_l{largest}")
            values, indices = b.op_(op, [b.x(shape), b.const(np.array([k], np.int64))], 2,
                                    axis=axis, largest=largest)
            out.append(b.done(values, indices))
    return out


@builder("Hardmax")
def hardmax_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in _unary_shapes(edge):
        for axis in (1, -1):
            b = Build(op, edge, f"{_sname(shape)}_a{axis}")
            out.append(b.done(b.op_(op, [b.x(shape)], axis=axis)))
    return out


# -- index operators --------------------------------------------------------------------------------


@builder("CumSum")
def cumsum_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        for axis, exclusive, reverse in ((1, 0, 0), (-1, 1, 0), (2, 0, 1), (1, 1, 1)):
            b = Build(op, edge, f"{_sname(shape)}_a{axis}_e{exclusive}_r{reverse}")
            ax = b.const(np.array(axis, np.int64 if axis != 2 else np.int32))
            out.append(b.done(b.op_(op, [b.x(shape), ax], exclusive=exclusive, reverse=reverse)))
    return out


@builder("Trilu")
def trilu_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in [*act_shapes(edge, 2), (3, 17)]:
        for upper, k in ((1, None), (0, 1), (1, -2)):
            b = Build(op, edge, f"{_sname(shape)}_u{upper}_k{k}")
            ins = [b.x(shape)] + ([] if k is None else [b.const(np.array(k, np.int64))])
            out.append(b.done(b.op_(op, ins, upper=upper)))
    return out


#: Range (start, delta) of float32 per value edge kind; the limit is start + 7.5 deltas
RANGE_FLOATS = {
    "tiny": (1e-30, 3e-31),
    "huge": (-1e30, 2.5e29),
    "overflow": (3e38, -4e37),
    "zeros": (0.0, 0.5),
    "nonfinite": (-2.0, 0.75),
}


@builder("Range")
def range_cases(op: str, edge: str) -> list[Case]:
    """float32 ranges of edge-sized starts and steps (an increasing and a decreasing one),
    an empty one, and int64 / int32 ranges."""
    start, delta = RANGE_FLOATS.get(edge, (0.5, 0.25))
    out = []
    for name, s, d in (("up", start, delta), ("down", start + 7.5 * delta, -delta)):
        b = Build(op, edge, f"float32_{name}")
        ins = [b.const(np.array(v, np.float32)) for v in (s, s + 7.5 * d, d)]
        out.append(b.done(b.op_(op, ins)))
    for name, vals, dtype in (("float32_empty", (1.0, 1.0, 0.5), np.float32),
                              ("int64", (-7, 20, 3), np.int64), ("int32_down", (5, -6, -2), np.int32)):
        b = Build(op, edge, name)
        out.append(b.done(b.op_(op, [b.const(np.array(v, dtype)) for v in vals])))
    return out


@builder("OneHot")
def onehot_cases(op: str, edge: str) -> list[Case]:
    """Indices in [-depth, depth) and beyond (all off), the edge values as [off, on]."""
    out = []
    for shape in [act_shapes(edge)[0][:2], (3, 5)]:
        for axis in (-1, 1):
            depth = 7
            b = Build(op, edge, f"{_sname(shape)}_a{axis}")
            idx = b.rng.integers(-depth - 2, depth + 2, shape).astype(np.int64)
            values = b.x((2,))
            out.append(b.done(b.op_(op, [b.const(idx), b.const(np.array(depth, np.int64)), values],
                                    axis=axis)))
    b = Build(op, edge, "runtime_int32_indices")
    idx = b.rng.integers(-9, 9, (4, 6)).astype(np.int32)
    out.append(b.done(b.op_(op, [b.x(idx.shape, array=idx), b.const(np.array(5, np.int64)),
                                 b.w((2,), "data")], axis=0)))
    return out


@builder("CastLike")
def castlike_cases(op: str, edge: str) -> list[Case]:
    """The edge values cast like a float64 and like a float16 constant (as Cast's cases)."""
    out = []
    for like, name in ((np.zeros(1, np.float64), "f64"), (np.zeros(1, np.float16), "f16")):
        shape = act_shapes(edge)[0]
        b = Build(op, edge, f"{name}_{_sname(shape)}")
        out.append(b.done(b.op_(op, [b.x(shape), b.const(like)])))
    return out
