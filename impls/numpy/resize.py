"""numpy reference kernel for Resize, opsets 11 to 19.

Resize is separable: each resized axis is one vectorised pass (no loop over output elements).
A pass maps the output coordinates to input coordinates (``coordinate_transformation_mode``),
then

- ``nearest`` selects one input element per output element (``nearest_mode``
  round_prefer_floor / round_prefer_ceil / floor / ceil; indices clamped to the input), so the
  values are copied exactly, NaN and infinities included, in any dtype;
- ``linear`` and ``cubic`` (``cubic_coeff_a``, ``exclude_outside``, and from opset 18
  ``antialias``) weigh ``n`` neighbours (edge-clamped), one gather-multiply-add per tap, in
  float64; the result is rounded to the input dtype once at the end (integers: rounded half to
  even and clamped to the type's range, as onnx's reference does).

Output sizes come from ``sizes`` (with ``keep_aspect_ratio_policy`` from opset 18) or from
``scales`` (``floor(input * scale)``, as onnx's shape inference and onnxruntime compute it, the
roi not included), over ``axes`` (opset 18) or every axis. Coordinates follow onnx's reference
(``length_resized`` is ``scale * length_original``, a real number when it comes from scales)
except ``pytorch_half_pixel`` with a resized length of 1, which gives 0 as the ONNX spec and
onnxruntime say (onnx's reference gives -0.5; the two differ in cubic mode only). ``roi`` is
read for ``tf_crop_and_resize`` only, where outputs mapped outside the input take
``extrapolation_value``. Axes whose scale is 1 and size unchanged (roi 0..1) are skipped.

Refused (``supports()``): opset 10 (other coordinate rules), ``antialias`` with nearest,
``exclude_outside`` outside cubic mode, scales and sizes both given, and names the opset does
not define.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.misc import (
    ANY_TYPE,
    NUMERIC_TYPES,
    check_dtypes,
    first_reason,
    int_list,
    normalize_axes,
)
from impls.numpy.table import impls

Kernel = Callable[..., Any]

MODES = ("nearest", "linear", "cubic")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
POLICIES = ("stretch", "not_larger", "not_smaller")
#: coordinate_transformation_mode -> (first opset, last opset) that define it
COORDINATE_MODES: dict[str, tuple[int, int]] = {
    "half_pixel": (11, 10**6),
    "pytorch_half_pixel": (11, 10**6),
    "align_corners": (11, 10**6),
    "asymmetric": (11, 10**6),
    "tf_crop_and_resize": (11, 10**6),
    "tf_half_pixel_for_nn": (11, 12),
    "half_pixel_symmetric": (19, 10**6),
}


@dataclass(frozen=True)
class ResizeAttrs:
    """The attributes of one Resize node (ONNX defaults filled in for its opset)."""

    mode: str = "nearest"
    coordinates: str = "half_pixel"
    nearest_mode: str = "round_prefer_floor"
    cubic_coeff_a: float = -0.75
    exclude_outside: bool = False
    extrapolation_value: float = 0.0
    antialias: bool = False
    axes: tuple[int, ...] | None = None
    policy: str = "stretch"

    @classmethod
    def of(cls, node: Node) -> ResizeAttrs:
        new = node.opset >= 18
        axes = node.attr("axes") if new else None
        return cls(
            mode=str(node.attr("mode", "nearest")),
            coordinates=str(node.attr("coordinate_transformation_mode", "half_pixel")),
            nearest_mode=str(node.attr("nearest_mode", "round_prefer_floor")),
            cubic_coeff_a=float(node.attr("cubic_coeff_a", -0.75)),
            exclude_outside=bool(node.attr("exclude_outside", 0)),
            extrapolation_value=float(node.attr("extrapolation_value", 0.0)),
            antialias=bool(node.attr("antialias", 0)) if new else False,
            axes=None if axes is None else tuple(int(a) for a in axes),
            policy=str(node.attr("keep_aspect_ratio_policy", "stretch")) if new else "stretch",
        )


# -- supports --------------------------------------------------------------------------------


def _attrs_reason(node: Node, a: ResizeAttrs) -> str | None:
    if a.mode not in MODES:
        return f"Resize mode {a.mode!r} is not one of {', '.join(MODES)}"
    lo, hi = COORDINATE_MODES.get(a.coordinates, (1, 0))
    if not lo <= node.opset <= hi:
        known = [m for m, (lo, hi) in COORDINATE_MODES.items() if lo <= node.opset <= hi]
        return (
            f"Resize coordinate_transformation_mode {a.coordinates!r} is not defined at opset "
            f"{node.opset}; known: {', '.join(known)}"
        )
    if a.mode == "nearest" and a.nearest_mode not in NEAREST_MODES:
        return f"Resize nearest_mode {a.nearest_mode!r} is not one of {', '.join(NEAREST_MODES)}"
    if a.policy not in POLICIES:
        return f"Resize keep_aspect_ratio_policy {a.policy!r} is not one of {', '.join(POLICIES)}"
    if a.antialias and a.mode == "nearest":
        return "Resize antialias=1 applies to linear and cubic modes; received mode nearest"
    if a.exclude_outside and a.mode != "cubic":
        return (
            f"Resize exclude_outside=1 is supported in cubic mode only; received mode {a.mode!r} "
            f"(its weights are 0 / 1 selections there and renormalising them is undefined)"
        )
    return None


def _surely_present(node: Node, i: int) -> bool:
    """Whether input ``i`` is known at build time to hold values: a constant or a static
    shape that is not empty (an empty tensor counts as omitted; a value without a static
    shape may turn out empty when the kernel runs, which then decides)."""
    v = node.input(i)
    if v is None:
        return False
    if v.is_const:
        return np.asarray(v.const).size > 0
    return v.shape is not None and 0 not in v.shape


def _supports_resize(node: Node) -> str | None:
    if node.opset < 11:
        return (
            f"Resize at opset {node.opset} (Resize-10: nearest / linear with asymmetric "
            f"coordinates of its own) is not supported; opsets 11 to 19 are"
        )
    if node.input(0) is None:
        return "Resize needs its input X"
    a = ResizeAttrs.of(node)
    reason = first_reason(
        _attrs_reason(node, a),
        check_dtypes(node, ANY_TYPE if a.mode == "nearest" else NUMERIC_TYPES),
        check_dtypes(node, frozenset({"float16", "float32", "float64"}), (1, 2)),
        check_dtypes(node, frozenset({"int64"}), (3,)),
    )
    if reason:
        return reason
    scales, sizes = _surely_present(node, 2), _surely_present(node, 3)
    if scales and sizes:
        return "Resize received both scales and sizes; ONNX allows only one"
    if node.input(2) is None and node.input(3) is None:
        return "Resize needs scales or sizes; neither is given"
    if a.coordinates == "tf_crop_and_resize" and node.input(1) is None:
        return "Resize with tf_crop_and_resize needs the roi input"
    xs = node.input(0).shape
    if xs is not None and a.axes is not None:
        try:
            normalize_axes(a.axes, len(xs))
        except ValueError as exc:
            return f"Resize axes: {exc}"
    return None


# -- geometry --------------------------------------------------------------------------------


def output_geometry(
    shape: Sequence[int],
    scales: np.ndarray | None,
    sizes: np.ndarray | None,
    axes: Sequence[int] | None,
    policy: str,
) -> tuple[list[int], list[float], tuple[int, ...]]:
    """(output shape, scale per axis, resized axes) of a Resize of a tensor of ``shape``."""
    r = len(shape)
    ax = tuple(range(r)) if axes is None else normalize_axes(axes, r, "Resize axes")
    out = [int(d) for d in shape]
    scale = [1.0] * r
    if sizes is not None:
        want = int_list(sizes)
        if len(want) != len(ax):
            raise ValueError(f"Resize sizes {want} need {len(ax)} values (axes {list(ax)})")
        for d, n in zip(ax, want):
            if n < 0 or (shape[d] == 0 and n > 0):
                raise ValueError(f"Resize cannot resize axis {d} of size {shape[d]} to {n}")
            out[d] = n
            scale[d] = n / shape[d] if shape[d] else 1.0
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            s = pick(scale[d] for d in ax)
            for d in ax:
                scale[d] = s
                out[d] = int(s * shape[d] + 0.5)
    elif scales is not None:
        given = np.asarray(scales, dtype=np.float64).reshape(-1)
        if given.size != len(ax):
            raise ValueError(f"Resize scales {given.tolist()} need {len(ax)} values (axes {list(ax)})")
        if (given <= 0).any() or not np.isfinite(given).all():
            raise ValueError(f"Resize scales must be positive; received {given.tolist()}")
        for d, s in zip(ax, given.tolist()):
            scale[d] = s
            out[d] = math.floor(s * shape[d])
    else:
        raise ValueError("Resize needs scales or sizes; neither was given")
    return out, scale, ax


def source_coords(
    mode: str, n_out: int, n_in: int, scale: float, roi: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray | None]:
    """Input coordinate (float64) of each of ``n_out`` outputs along one axis, and the mask of
    outputs to extrapolate (tf_crop_and_resize only, else ``None``)."""
    y = np.arange(n_out, dtype=np.float64)
    width = scale * n_in  # length_resized as onnx's reference takes it (real with scales)
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5, None
    if mode == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
        return offset + (y + 0.5) / scale - 0.5, None
    if mode == "pytorch_half_pixel":
        return ((y + 0.5) / scale - 0.5) if width > 1 else np.zeros(n_out), None
    if mode == "align_corners":
        return (np.zeros(n_out) if width == 1 else y * (n_in - 1) / (width - 1)), None
    if mode == "asymmetric":
        return y / scale, None
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale, None
    if mode == "tf_crop_and_resize":
        start, end = roi
        if width == 1:
            x = np.full(n_out, (end - start) * (n_in - 1) / 2)
        else:
            x = y * (end - start) * (n_in - 1) / (width - 1)
        x = x + start * (n_in - 1)
        return x, (x < 0) | (x > n_in - 1)
    raise ValueError(f"Resize coordinate_transformation_mode {mode!r} is not known")


def _split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(base, ratio) with ``x = base + ratio`` and ratio in (0, 1] (an integer ``x`` sits at
    ratio 1 above ``x - 1``, as onnx's reference places it)."""
    fl = np.floor(x)
    base = np.where(x == fl, fl - 1, fl)
    return base.astype(np.int64), x - base


def nearest_index(x: np.ndarray, n_in: int, nearest_mode: str) -> np.ndarray:
    """Index of the input element each coordinate ``x`` selects (clamped to the input)."""
    base, r = _split(x)
    if nearest_mode == "round_prefer_floor":
        upper = r > 0.5
    elif nearest_mode == "round_prefer_ceil":
        upper = r >= 0.5
    elif nearest_mode == "floor":
        upper = r == 1.0
    else:  # ceil
        upper = np.ones(r.shape, bool)
    return np.clip(base + upper, 0, n_in - 1)


def _cubic(t: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel of parameter ``a`` at distances ``t``."""
    t = np.abs(t)
    t2, t3 = t * t, t * t * t
    near = (a + 2) * t3 - (a + 3) * t2 + 1
    far = a * t3 - 5 * a * t2 + 8 * a * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def tap_weights(
    mode: str, x: np.ndarray, n_in: int, scale: float, attrs: ResizeAttrs
) -> tuple[np.ndarray, np.ndarray]:
    """(indices, weights), each (len(x), taps), of linear or cubic interpolation at ``x``;
    the indices are clamped to the input (edge padding)."""
    base, r = _split(x)
    support = 1.0 if mode == "linear" else 2.0
    if attrs.antialias:
        s = min(scale, 1.0)
        start = int(math.floor(-support / s) + 1)
    else:
        s, start = 1.0, 1 - int(support)
    offsets = np.arange(start, 2 - start)  # taps relative to base: 2 - 2 * start of them
    dist = (offsets[None, :] - r[:, None]) * s
    w = (np.clip(1.0 - np.abs(dist), 0.0, 1.0) if mode == "linear"
         else _cubic(dist, attrs.cubic_coeff_a))
    idx = base[:, None] + offsets[None, :]
    if attrs.exclude_outside:
        w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
    if attrs.antialias or attrs.exclude_outside:
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, n_in - 1), w


def _along(v: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """A 1-D ``v`` shaped to broadcast along ``axis`` of a rank-``ndim`` tensor."""
    return v.reshape((1,) * axis + (-1,) + (1,) * (ndim - axis - 1))


def _fill(dtype: np.dtype, value: float) -> Any:
    """``value`` in ``dtype`` (integers rounded and clamped, as the final rounding does)."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return dtype.type(np.clip(np.round(value), info.min, info.max))
    if dtype.kind in "fc":
        return dtype.type(value)
    return value


def resize_axis(
    x: np.ndarray, axis: int, n_out: int, scale: float, roi: tuple[float, float], attrs: ResizeAttrs
) -> np.ndarray:
    """One separable pass of Resize: ``x`` resized to ``n_out`` along ``axis``. Nearest keeps
    the dtype of ``x``; linear and cubic return float64."""
    n_in = x.shape[axis]
    coords, outside = source_coords(attrs.coordinates, n_out, n_in, scale, roi)
    if attrs.mode == "nearest":
        y = np.take(x, nearest_index(coords, n_in, attrs.nearest_mode), axis=axis)
        fill = _fill(x.dtype, attrs.extrapolation_value)
    else:
        idx, w = tap_weights(attrs.mode, coords, n_in, scale, attrs)
        xf = x.astype(np.float64, copy=False)
        y = np.zeros((*x.shape[:axis], n_out, *x.shape[axis + 1:]), np.float64)
        for t in range(idx.shape[1]):
            y += np.take(xf, idx[:, t], axis=axis) * _along(w[:, t], axis, x.ndim)
        fill = attrs.extrapolation_value
    if outside is not None and outside.any():
        y = np.where(_along(outside, axis, x.ndim), fill, y)
    return y


def _cast_back(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if y.dtype == dtype:
        return np.ascontiguousarray(y)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        y = np.clip(np.round(y), info.min, info.max)
    return np.asarray(y, dtype=dtype, order="C")


def resize(
    x: np.ndarray,
    roi: np.ndarray | None,
    scales: np.ndarray | None,
    sizes: np.ndarray | None,
    attrs: ResizeAttrs,
) -> np.ndarray:
    """ONNX Resize of ``x`` (see the module docstring)."""
    out, scale, axes = output_geometry(x.shape, scales, sizes, attrs.axes, attrs.policy)
    r = x.ndim
    full_roi = [0.0] * r + [1.0] * r
    if roi is not None and attrs.coordinates == "tf_crop_and_resize":
        given = np.asarray(roi, dtype=np.float64).reshape(-1).tolist()
        if len(given) != 2 * len(axes):
            raise ValueError(f"Resize roi {given} needs {2 * len(axes)} values (axes {list(axes)})")
        for i, d in enumerate(axes):
            full_roi[d], full_roi[r + d] = given[i], given[len(axes) + i]
    y = x
    for d in sorted(axes):
        box = (full_roi[d], full_roi[r + d])
        if math.isclose(scale[d], 1.0) and out[d] == x.shape[d] and box == (0.0, 1.0):
            continue  # identity along this axis
        if out[d] == 0 or y.size == 0:
            y = np.zeros((*y.shape[:d], out[d], *y.shape[d + 1:]), y.dtype)
            continue
        y = resize_axis(y, d, out[d], scale[d], box, attrs)
    return _cast_back(y, x.dtype)


@impls.register("Resize", "separable", priority=Priority.DEFAULT, supports=_supports_resize)
def resize_separable(node: Node) -> Kernel:
    """Resize (opsets 11-19): nearest / linear / cubic, one vectorised pass per resized axis."""
    attrs = ResizeAttrs.of(node)

    def run(
        x: np.ndarray,
        roi: np.ndarray | None = None,
        scales: np.ndarray | None = None,
        sizes: np.ndarray | None = None,
    ) -> np.ndarray:
        if scales is not None and np.size(scales) == 0:
            scales = None
        if sizes is not None and np.size(sizes) == 0:
            sizes = None
        if scales is not None and sizes is not None:
            raise ValueError("Resize received both scales and sizes; ONNX allows only one")
        if roi is not None and np.size(roi) == 0:
            roi = None
        with np.errstate(all="ignore"):  # IEEE: 0 * inf = NaN in the weighted sums
            return resize(x, roi, scales, sizes, attrs)

    return run
