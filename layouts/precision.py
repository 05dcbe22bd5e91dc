"""Precision as a layout property: float32 tensors held in a reduced precision, and the
converters between them and the standard layout (casts, quantize / dequantize).

A reduced-precision layout holds a *logical* float32 tensor whose stored array is in another
element type, so the layout registry prices and plans a change of precision like any other
change of layout: an implementation that reads or writes a reduced precision declares these
layouts, and the optimiser counts the converters at every boundary, or none where a producer
and its consumer agree.

| layout | stored array | from the standard layout | to the standard layout |
|---|---|---|---|
| ``bf16`` | ``ml_dtypes.bfloat16`` | round to nearest even (1) | exact widening |
| ``fp16`` | ``numpy.float16`` | round to nearest even (IEEE 754) | exact widening |
| ``u8`` | :class:`QuantizedArray` (2) | ONNX ``DynamicQuantizeLinear`` | ONNX ``DequantizeLinear`` |

(1) what AVX512_BF16's ``vcvtneps2bf16`` does; (2) ``uint8`` with its scale and zero point.

The quantization arithmetic here is ONNX's (round half to even, saturation to the type's
range, per-tensor, per-axis and blocked scales); the numpy reference's ``QuantizeLinear``,
``DequantizeLinear`` and ``DynamicQuantizeLinear`` kernels call the same functions, so a
converter and the operator it stands for cannot disagree.

A conversion chain never passes *through* a reduced precision on its way between two other
layouts (:meth:`layouts.registry.LayoutRegistry.path_and_cost`): precision is lost only where
a plan asks for it.
"""

from __future__ import annotations

import numpy as np

from layouts.registry import CORE, Layout, LayoutRegistry

#: the integer element types QuantizeLinear writes and DequantizeLinear reads (8 and 16 bit;
#: DequantizeLinear also reads int32)
QUANT_RANGES: dict[str, tuple[int, int]] = {
    "uint8": (0, 255),
    "int8": (-128, 127),
    "uint16": (0, 65535),
    "int16": (-32768, 32767),
}


class QuantizedArray(np.ndarray):
    """A ``uint8`` array that carries its per-tensor ``scale`` (float32) and ``zero_point``
    (uint8): the stored form of a tensor in the ``u8`` layout. Slices and copies keep both."""

    scale: np.float32
    zero_point: np.uint8

    def __new__(cls, data: np.ndarray, scale: float, zero_point: int) -> QuantizedArray:
        obj = np.asarray(data, dtype=np.uint8).view(cls)
        obj.scale = np.float32(scale)
        obj.zero_point = np.uint8(zero_point)
        return obj

    def __array_finalize__(self, obj: object) -> None:
        self.scale = getattr(obj, "scale", np.float32(1.0))
        self.zero_point = getattr(obj, "zero_point", np.uint8(0))

    def __reduce__(self):  # pickling keeps the quantization parameters
        base = super().__reduce__()
        return (_rebuild, (base, self.scale, self.zero_point))


def _rebuild(base: tuple, scale: np.float32, zero_point: np.uint8) -> QuantizedArray:
    fn, args, state = base[0], base[1], base[2]
    arr = fn(*args)
    arr.__setstate__(state)
    out = arr.view(QuantizedArray)
    out.scale, out.zero_point = scale, zero_point
    return out


def param_shape(param: np.ndarray, shape: tuple[int, ...], axis: int, block_size: int = 0) -> np.ndarray:
    """A scale or zero point broadcast against a tensor of ``shape``: a scalar (per tensor), a
    1-D array along ``axis`` (per axis), or, with ``block_size``, an array of the tensor's rank
    whose ``axis`` holds one entry per block (blocked, ONNX opset 21)."""
    param = np.asarray(param)
    if param.ndim == 0 or (param.size == 1 and block_size == 0):
        return param.reshape(())
    rank = len(shape)
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for a tensor of rank {rank}")
    if block_size:
        if param.ndim != rank:
            raise ValueError(f"a blocked scale needs rank {rank}, received shape {param.shape}")
        return np.repeat(param, block_size, axis=axis)[tuple(slice(0, d) for d in shape)]
    if param.ndim != 1 or param.shape[0] != shape[axis]:
        raise ValueError(
            f"a per-axis scale along axis {axis} needs {shape[axis]} entries, received shape "
            f"{param.shape}"
        )
    view = [1] * rank
    view[axis] = shape[axis]
    return param.reshape(view)


def quantize_linear(
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    dtype: np.dtype | str | None = None,
) -> np.ndarray:
    """ONNX ``QuantizeLinear``: ``saturate(round_half_even(x / scale) + zero_point)`` in
    ``dtype`` (the zero point's type, else ``uint8``). NaN, which ONNX leaves undefined, gives
    the type's minimum, as onnxruntime does."""
    out = np.dtype(dtype if dtype is not None else (zero_point.dtype if zero_point is not None else np.uint8))
    if out.name not in QUANT_RANGES:
        raise ValueError(f"QuantizeLinear writes {', '.join(QUANT_RANGES)}, received {out.name}")
    lo, hi = QUANT_RANGES[out.name]
    shape = tuple(np.shape(x))
    s = param_shape(scale, shape, axis, block_size).astype(np.float32)
    with np.errstate(all="ignore"):
        y = np.rint(np.asarray(x, dtype=np.float32) / s)
        if zero_point is not None:
            y = y + param_shape(zero_point, shape, axis, block_size).astype(np.float32)
        return np.clip(np.where(np.isnan(y), lo, y), lo, hi).astype(out)


def dequantize_linear(
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    dtype: np.dtype | str | None = None,
) -> np.ndarray:
    """ONNX ``DequantizeLinear``: ``(x - zero_point) * scale`` in ``dtype`` (the scale's type,
    else float32)."""
    shape = tuple(np.shape(x))
    s = param_shape(scale, shape, axis, block_size)
    out = np.dtype(dtype) if dtype is not None else np.dtype(np.asarray(scale).dtype)
    dx = np.asarray(x).astype(np.float32)
    if zero_point is not None:
        dx = dx - param_shape(zero_point, shape, axis, block_size).astype(np.float32)
    return np.asarray(dx * s.astype(np.float32)).astype(out)


def dynamic_quantize_linear(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONNX ``DynamicQuantizeLinear``: asymmetric per-tensor uint8 with the range widened to
    include 0; returns ``(y, scale, zero_point)``."""
    x = np.asarray(x, dtype=np.float32)
    hi = np.float32(max(0.0, float(np.max(x)))) if x.size else np.float32(0)
    lo = np.float32(min(0.0, float(np.min(x)))) if x.size else np.float32(0)
    # (as onnx's reference computes it: a constant zero tensor gets the scale 1 / 255)
    scale = np.float32(np.float32(1.0 if hi == lo else hi - lo) / np.float32(255))
    zp = np.float32(np.rint(np.clip(np.float32(0) - lo / scale, 0, 255)))
    with np.errstate(all="ignore"):
        y = np.clip(np.rint(x / scale) + zp, 0, 255).astype(np.uint8)
    return y, np.array(scale, dtype=np.float32), np.array(zp, dtype=np.uint8)


# -- the converters -------------------------------------------------------------------------


def to_bf16(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    import ml_dtypes  # (onnx's own dependency; imported when first used)

    return np.ascontiguousarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16)


def to_fp16(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(x, dtype=np.float32).astype(np.float16)


def widen(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """bf16 or fp16 back to float32 (exact)."""
    return np.asarray(x).astype(np.float32)


def to_u8(x: np.ndarray, shape: tuple[int, ...]) -> QuantizedArray:
    y, scale, zp = dynamic_quantize_linear(x)
    return QuantizedArray(y, scale, zp)


def from_u8(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if not isinstance(x, QuantizedArray):
        raise TypeError(
            f"a tensor in the u8 layout is a QuantizedArray (uint8 with its scale and zero point); "
            f"received a {type(x).__name__} of {np.asarray(x).dtype}"
        )
    return dequantize_linear(np.asarray(x).view(np.uint8), x.scale, x.zero_point)


#: reduced-precision layouts: name -> (precision, stored element type, doc, from_standard, to_standard)
PRECISION_LAYOUTS = {
    "bf16": ("bf16", "bfloat16", "float32 held as bfloat16 (round to nearest even)", to_bf16, widen),
    "fp16": ("fp16", "float16", "float32 held as IEEE half (round to nearest even)", to_fp16, widen),
    "u8": ("int8", "uint8", "float32 held as ONNX DynamicQuantizeLinear's per-tensor uint8 "
           "with its scale and zero point", to_u8, from_u8),
}


def register_precision_layouts(layouts: LayoutRegistry) -> None:
    """Add the reduced-precision layouts with their standard converters (the core registers
    them with the standard layout, so every backend may declare them)."""
    for name, (precision, stored, doc, from_std, to_std) in PRECISION_LAYOUTS.items():
        layouts.add_layout(
            Layout(name, "cpu", CORE, dtypes=("float32",), doc=doc, precision=precision,
                   stored_dtype=stored),
            to_standard=to_std,
            from_standard=from_std,
        )
