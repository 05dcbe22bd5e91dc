"""Edge cases (see :mod:`tests.reliability.numerics_cases`) of ONNX's quantization operators;
registered into :data:`~tests.reliability.numerics_cases.BUILDERS`.

The float inputs of QuantizeLinear and DynamicQuantizeLinear take the edge values (the result of
quantizing NaN, or a range that overflows float32, is what each library makes of an undefined
case: the harness's tolerances say so); scales and zero points are fixed constants, per tensor
and per channel. The integer inputs of DequantizeLinear, MatMulInteger and QLinearMatMul take
the same integers on every edge kind (the edge values are floats), on the edge kind's shapes.
"""

from __future__ import annotations

import numpy as np

from tests.reliability.numerics_cases import Build, Case, _sname, act_shapes, builder, gemm_shapes

#: Documented differences of these operators' cases (merged into test_edge_numerics'
#: DIFFERENCES): (implementation glob, op glob, edge glob) -> (the Tolerance's fields, why).
DIFFERENCES: dict[tuple[str, str, str], tuple[dict, str]] = {
    ("*", "DynamicQuantizeLinear", "nonfinite"): (
        {"rtol": 0.0, "atol": 0.0, "not_compared": True},
        "a tensor holding NaN or +-inf has no range to quantize over: ONNX leaves the result "
        "undefined, and onnx's reference, onnxruntime and the numpy reference each give another",
    ),
    ("*", "QLinearConv", "*"): (
        {"rtol": 0.0, "atol": 0.0, "steps": 1},
        "onnx's ReferenceEvaluator rescales QLinearConv's integer sums in another order than "
        "MLAS's float32 x_scale * w_scale / y_scale (which the numpy reference follows, equal to "
        "onnxruntime: tests/numpy/test_conv_quantized.py): a value on a rounding half lands one "
        "step apart",
    ),
    ("Region.onnxruntime.session*", "DynamicQuantizeLinear", "zeros"): (
        {"rtol": 255.0, "atol": 0.0},
        "an all-zero tensor: onnxruntime gives the scale 1, onnx's reference 1 / 255 (its formula "
        "divides by 255 either way); the quantized values (the zero point) and what they "
        "dequantize to (0) agree",
    ),
}


@builder("QuantizeLinear")
def quantize_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        c = shape[1]
        b = Build(op, edge, f"u8_tensor_{_sname(shape)}")
        out.append(b.done(b.op_(op, [b.x(shape), b.const(np.array(0.05, np.float32)),
                                     b.const(np.array(128, np.uint8))])))
        b = Build(op, edge, f"i8_channel_{_sname(shape)}")
        scale = np.linspace(0.01, 0.2, c, dtype=np.float32)
        zp = (np.arange(c) % 7 - 3).astype(np.int8)
        out.append(b.done(b.op_(op, [b.x(shape), b.const(scale), b.const(zp)], axis=1)))
    return out


@builder("DequantizeLinear")
def dequantize_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        c = shape[1]
        b = Build(op, edge, f"u8_tensor_{_sname(shape)}")
        q = b.rng.integers(0, 256, shape).astype(np.uint8)
        out.append(b.done(b.op_(op, [b.x(shape, array=q), b.const(np.array(0.05, np.float32)),
                                     b.const(np.array(128, np.uint8))])))
        b = Build(op, edge, f"i8_channel_{_sname(shape)}")
        q = b.rng.integers(-128, 128, shape).astype(np.int8)
        out.append(b.done(b.op_(op, [b.x(shape, array=q),
                                     b.const(np.linspace(0.01, 0.2, c, dtype=np.float32)),
                                     b.const((np.arange(c) % 7 - 3).astype(np.int8))], axis=1)))
    return out


@builder("DynamicQuantizeLinear")
def dynamic_quantize_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        b = Build(op, edge, _sname(shape))
        out.append(b.done(*b.op_(op, [b.x(shape)], 3)))
    return out


@builder("MatMulInteger")
def matmul_integer_cases(op: str, edge: str) -> list[Case]:
    out = []
    for m, k, n in gemm_shapes(edge):
        b = Build(op, edge, f"{m}x{k}x{n}")
        a = b.rng.integers(0, 256, (m, k)).astype(np.uint8)
        w = b.rng.integers(-128, 128, (k, n)).astype(np.int8)
        out.append(b.done(b.op_(op, [b.x(a.shape, array=a), b.const(w), b.const(np.array(7, np.uint8)),
                                     b.const(np.array(0, np.int8))])))
    return out


@builder("QLinearMatMul")
def qlinear_matmul_cases(op: str, edge: str) -> list[Case]:
    out = []
    for m, k, n in gemm_shapes(edge):
        b = Build(op, edge, f"{m}x{k}x{n}")
        a = b.rng.integers(0, 256, (m, k)).astype(np.uint8)
        w = b.rng.integers(0, 256, (k, n)).astype(np.uint8)
        f = lambda v, t, b=b: b.const(np.array(v, t))  # noqa: E731
        y_scale = 0.02 * np.sqrt(k)  # keeps most outputs inside the uint8 range
        out.append(b.done(b.op_(op, [b.x(a.shape, array=a), f(0.01, np.float32), f(120, np.uint8), b.const(w),
                                     f(0.02, np.float32), f(130, np.uint8), f(y_scale, np.float32),
                                     f(128, np.uint8)])))
    return out


def _qconv_geometries(shape: tuple[int, int, int, int]) -> list[tuple[str, int, int, dict]]:
    """(name, output channels, group, attributes) of the quantized convolutions' cases."""
    c = shape[1]
    return [("k3p1", 8, 1, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
            ("k1s2", 5, 1, {"kernel_shape": [1, 1], "strides": [2, 2]}),
            ("depthwise", c, c, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": c})]


@builder("ConvInteger")
def conv_integer_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        for name, m, group, attrs in _qconv_geometries(shape):
            b = Build(op, edge, f"{name}_{_sname(shape)}")
            x = b.rng.integers(0, 256, shape).astype(np.uint8)
            w = b.rng.integers(-128, 128, (m, shape[1] // group, *attrs["kernel_shape"])).astype(np.int8)
            out.append(b.done(b.op_(op, [b.x(shape, array=x), b.const(w), b.const(np.array(7, np.uint8)),
                                         b.const(np.array(0, np.int8))], **attrs)))
    return out


@builder("QLinearConv")
def qlinear_conv_cases(op: str, edge: str) -> list[Case]:
    out = []
    for shape in act_shapes(edge, 2):
        for name, m, group, attrs in _qconv_geometries(shape):
            b = Build(op, edge, f"{name}_{_sname(shape)}")
            x = b.rng.integers(0, 256, shape).astype(np.uint8)
            kernel = (m, shape[1] // group, *attrs["kernel_shape"])
            w = b.rng.integers(-128, 128, kernel).astype(np.int8)
            f = lambda v, t, b=b: b.const(np.array(v, t))  # noqa: E731
            w_scale = np.linspace(0.005, 0.02, m, dtype=np.float32)  # per output channel
            y_scale = 0.02 * np.sqrt(np.prod(kernel[1:]))  # keeps most outputs inside uint8
            bias = b.rng.integers(-500, 500, (m,)).astype(np.int32)
            out.append(b.done(b.op_(op, [b.x(shape, array=x), f(0.01, np.float32), f(120, np.uint8),
                                         b.const(w), b.const(w_scale), b.const(np.zeros(m, np.int8)),
                                         f(y_scale, np.float32), f(128, np.uint8), b.const(bias)],
                                    **attrs)))
    return out
