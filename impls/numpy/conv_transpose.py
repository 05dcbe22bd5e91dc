"""numpy reference kernel for ConvTranspose (1-D, 2-D, 3-D and beyond).

One GEMM per group gives every (output channel, kernel offset) contribution of every input
pixel; col2im then adds them into the output canvas with one strided ``+=`` per kernel offset
(a loop over the kernel's offsets, never over pixels). Strides, dilations, group, pads,
``output_padding``, ``output_shape`` and every ``auto_pad`` mode follow the ONNX spec:

- the full (unpadded) extent along an axis is ``stride * (in - 1) + (kernel - 1) * dilation +
  1``; the output takes ``out`` elements of it starting at ``pad_begin`` (positions past the
  full extent, from ``output_padding`` or a large ``output_shape``, hold only the bias);
- without ``output_shape`` and with explicit pads (``NOTSET``) or ``VALID`` (no pads),
  ``out = full + output_padding - pad_begin - pad_end``;
- with ``output_shape`` (its last ``rank - 2`` values), or ``SAME_UPPER`` / ``SAME_LOWER``
  (``out = in * stride``), the total padding ``full + output_padding - out`` is split with the
  extra element at the end for SAME_UPPER and at the beginning otherwise (the spec's rule).

float16 computes in float32 and is rounded back once; float32 and float64 stay in their type.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.conv import AUTO_PADS, compute_dtype
from impls.numpy.misc import FLOAT_TYPES, check_dtypes
from impls.numpy.table import impls

Kernel = Callable[..., Any]


def _ints(node: Node, name: str, n: int, default: int) -> tuple[int, ...]:
    v = node.attr(name)
    return tuple(int(x) for x in v) if v is not None else (default,) * n


def _supports_conv_transpose(node: Node) -> str | None:
    if node.input(0) is None or node.input(1) is None:
        return "ConvTranspose needs inputs X and W"
    reason = check_dtypes(node, FLOAT_TYPES, (0, 1, 2), same=True)
    if reason:
        return reason
    auto_pad = node.attr("auto_pad", "NOTSET") or "NOTSET"
    if auto_pad not in AUTO_PADS:
        return f"ConvTranspose auto_pad must be one of {', '.join(AUTO_PADS)}; received {auto_pad!r}"
    group = int(node.attr("group", 1))
    if group < 1:
        return f"ConvTranspose group must be >= 1; received {group}"
    xs, ws = node.input(0).shape, node.input(1).shape
    rank = len(xs) if xs is not None else len(ws) if ws is not None else None
    if rank is None:
        return None
    if rank < 3:
        return f"ConvTranspose needs X of rank >= 3 (N, C, spatial...); received rank {rank}"
    nd = rank - 2
    for name, lo, per in (("strides", 1, 1), ("dilations", 1, 1), ("pads", 0, 2),
                          ("output_padding", 0, 1), ("kernel_shape", 1, 1)):
        values = node.attr(name)
        if values is None:
            continue
        if any(int(v) < lo for v in values):
            return f"ConvTranspose {name} must be >= {lo}; received {list(values)}"
        if len(values) != per * nd:
            return (f"ConvTranspose {name} needs {per * nd} values for {nd} spatial axes; "
                    f"received {list(values)}")
    out_shape = node.attr("output_shape")
    if out_shape is not None and len(out_shape) not in (nd, nd + 2):
        return f"ConvTranspose output_shape needs {nd} values; received {list(out_shape)}"
    return _shape_reason(node, xs, ws, group)


def _shape_reason(
    node: Node, xs: tuple[int, ...] | None, ws: tuple[int, ...] | None, group: int
) -> str | None:
    if xs is not None and ws is not None and len(ws) != len(xs):
        return f"ConvTranspose needs W of the rank of X ({len(xs)}); received W shape {ws}"
    if xs is not None and xs[1] % group:
        return f"ConvTranspose X has {xs[1]} channels, not divisible by group={group}"
    if xs is not None and ws is not None and ws[0] != xs[1]:
        return f"ConvTranspose W has {ws[0]} input channels; X has {xs[1]}"
    kernel = node.attr("kernel_shape")
    if kernel is not None and ws is not None and tuple(int(k) for k in kernel) != tuple(ws[2:]):
        return f"ConvTranspose kernel_shape {list(kernel)} does not match W's spatial shape {list(ws[2:])}"
    b = node.input(2)
    if b is not None and b.shape is not None and ws is not None and tuple(b.shape) != (ws[1] * group,):
        return f"ConvTranspose bias B must have shape ({ws[1] * group},); received {b.shape}"
    return None


def transpose_geometry(
    node: Node, spatial: Sequence[int], kernel: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(output size, pad begin) along each spatial axis of ``node`` for an input of spatial
    shape ``spatial`` and a kernel of ``kernel``."""
    nd = len(spatial)
    strides = _ints(node, "strides", nd, 1)
    dil = _ints(node, "dilations", nd, 1)
    out_pad = _ints(node, "output_padding", nd, 0)
    pads = _ints(node, "pads", 2 * nd, 0)
    auto_pad = node.attr("auto_pad", "NOTSET") or "NOTSET"
    given = node.attr("output_shape")
    full = [s * (n - 1) + (k - 1) * d + 1 for s, n, k, d in zip(strides, spatial, kernel, dil)]
    if given is not None:
        target = [int(v) for v in given][-nd:]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = [n * s for n, s in zip(spatial, strides)]
    else:
        if auto_pad == "VALID":
            pads = (0,) * (2 * nd)
        out = tuple(f + p - pads[i] - pads[i + nd] for i, (f, p) in enumerate(zip(full, out_pad)))
        return out, tuple(pads[:nd])
    begins = []
    for f, p, o in zip(full, out_pad, target):
        total = f + p - o
        begins.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
    return tuple(target), tuple(begins)


def col2im(
    cols: np.ndarray, spatial: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
    out: Sequence[int], begin: Sequence[int],
) -> np.ndarray:
    """Sum ``cols`` (N, M, *kernel, *spatial) into the output (N, M, *out): the contribution of
    input pixel ``i`` at kernel offset ``k`` lands at ``i * stride + k * dilation - begin``."""
    n, m = cols.shape[:2]
    nd = len(spatial)
    kernel = cols.shape[2 : 2 + nd]
    # the canvas covers the full extent and the requested window [begin, begin + out)
    lo = [min(0, b) for b in begin]
    hi = [max(s * (i - 1) + (k - 1) * d + 1, b + o) for s, i, k, d, b, o in
          zip(strides, spatial, kernel, dilations, begin, out)]
    canvas = np.zeros((n, m, *(h - low for h, low in zip(hi, lo))), dtype=cols.dtype)
    for offset in itertools.product(*(range(k) for k in kernel)):
        where = tuple(
            slice(o * d - low, o * d - low + s * (i - 1) + 1, s)
            for o, d, low, s, i in zip(offset, dilations, lo, strides, spatial)
        )
        canvas[(slice(None), slice(None), *where)] += cols[(slice(None), slice(None), *offset)]
    window = tuple(slice(b - low, b - low + o) for b, low, o in zip(begin, lo, out))
    return canvas[(slice(None), slice(None), *window)]


@impls.register(
    "ConvTranspose", "gemm_col2im", priority=Priority.DEFAULT, supports=_supports_conv_transpose
)
def conv_transpose_gemm_col2im(node: Node) -> Kernel:
    """ConvTranspose: one GEMM per group, then col2im by strided accumulation per kernel offset."""
    group = int(node.attr("group", 1))

    def run(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        with np.errstate(all="ignore"):  # IEEE: overflow to inf, inf - inf = NaN
            return conv_transpose(node, group, x, w, b)

    return run


def conv_transpose(
    node: Node, group: int, x: np.ndarray, w: np.ndarray, b: np.ndarray | None
) -> np.ndarray:
    """ConvTranspose of ``x`` by ``w`` (bias ``b``) with ``node``'s attributes."""
    ct = compute_dtype(x.dtype)
    n, c = x.shape[:2]
    spatial = tuple(x.shape[2:])
    kernel = tuple(w.shape[2:])
    nd = len(spatial)
    if c % group or w.shape[0] != c:
        raise ValueError(f"ConvTranspose X {x.shape} and W {w.shape} do not fit group={group}")
    mg = w.shape[1]
    m = mg * group
    out, begin = transpose_geometry(node, spatial, kernel)
    if any(o < 0 for o in out):
        raise ValueError(f"ConvTranspose output shape {list(out)} is negative")
    strides = _ints(node, "strides", nd, 1)
    dil = _ints(node, "dilations", nd, 1)
    p, k = math.prod(spatial), math.prod(kernel)
    xg = x.astype(ct, copy=False).reshape(n, group, c // group, p)
    wg = w.astype(ct, copy=False).reshape(group, c // group, mg * k)
    cols = np.matmul(wg.transpose(0, 2, 1), xg)  # (N, G, Mg * K, P)
    cols = cols.reshape(n, m, *kernel, *spatial)
    if 0 in out or 0 in spatial or n == 0 or m == 0:
        y = np.zeros((n, m, *out), dtype=ct)
    else:
        y = col2im(cols, spatial, strides, dil, out, begin)
    if b is not None:
        y = y + b.astype(ct, copy=False).reshape((1, m) + (1,) * nd)
    return np.asarray(y, dtype=x.dtype, order="C")
