"""numpy Conv kernels, and the sliding-window geometry that Conv and the pooling ops share.

Three algorithms, all N-d (Winograd 2-D only), all with groups, strides, pads, dilations and
every ``auto_pad`` mode:

- ``im2col``: one contiguous patch matrix per image and group, one BLAS matmul per group;
- ``direct``: accumulates one matmul per kernel offset (a broadcast multiply-add when each
  group has a single input channel, e.g. depthwise convolutions);
- ``winograd``: Winograd F(2x2, 3x3) for 2-D 3x3 stride-1 convolutions.

float16 runs in float32 and is rounded back once at the end; float32 stays float32.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.misc import FLOAT_TYPES, check_dtypes
from impls.numpy.table import impls

Kernel = Callable[..., Any]

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


# -- geometry shared with pool.py ------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """A sliding window over the spatial axes: kernel, strides, dilations and padding mode."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]
    auto_pad: str = "NOTSET"
    ceil_mode: bool = False

    @property
    def rank(self) -> int:
        return len(self.kernel)

    @property
    def extent(self) -> tuple[int, ...]:
        """Size of the dilated kernel along each spatial axis."""
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))

    @property
    def offsets(self) -> list[tuple[int, ...]]:
        """Every kernel offset, row-major (the order ONNX scans a window in)."""
        return list(itertools.product(*(range(k) for k in self.kernel)))

    def geometry(self, spatial: Sequence[int]) -> Geometry:
        """Padding and output size of this window over an input of spatial shape ``spatial``."""
        dims = [self._axis(i, int(n)) for i, n in enumerate(spatial)]
        out, pb, pe, extra = (tuple(t) for t in zip(*dims)) if dims else ((), (), (), ())
        return Geometry(tuple(int(n) for n in spatial), out, pb, pe, extra)

    def _axis(self, i: int, n: int) -> tuple[int, int, int, int]:
        """(output size, pad begin, pad end, extra end) along spatial axis ``i``."""
        s, ext = self.strides[i], self.extent[i]
        if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-n // s)
            total = max(0, (out - 1) * s + ext - n)
            pb = total // 2 if self.auto_pad == "SAME_UPPER" else total - total // 2
            pe = total - pb
        elif self.auto_pad == "VALID":
            pb = pe = 0
            out = (n - ext) // s + 1
        else:
            pb, pe = self.pads[i], self.pads[i + self.rank]
            span = n + pb + pe - ext
            if self.ceil_mode:
                out = -(-span // s) + 1
                if (out - 1) * s >= n + pb:  # the last window must start inside the input
                    out -= 1
            else:
                out = span // s + 1
        out = max(out, 0)
        extra = max(0, (out - 1) * s + ext - (n + pb + pe)) if out else 0
        return out, pb, pe, extra


@dataclass(frozen=True)
class Geometry:
    """Where a window lands over one input: output size and the padding it needs."""

    spatial: tuple[int, ...]
    out: tuple[int, ...]
    pad_begin: tuple[int, ...]
    pad_end: tuple[int, ...]
    #: cells past ``pad_end`` that ceil-mode windows reach (filled like padding, never counted)
    extra_end: tuple[int, ...]

    @property
    def padded(self) -> tuple[int, ...]:
        return tuple(
            n + b + e + x
            for n, b, e, x in zip(self.spatial, self.pad_begin, self.pad_end, self.extra_end)
        )

    @property
    def needs_padding(self) -> bool:
        return self.padded != self.spatial

    def coords(self, win: Window, i: int) -> np.ndarray:
        """Input coordinate (unpadded) of kernel offset ``o`` at output ``p`` on axis ``i``:
        an array of shape (kernel[i], out[i])."""
        o = np.arange(win.kernel[i])[:, None] * win.dilations[i]
        p = np.arange(self.out[i])[None, :] * win.strides[i]
        return p + o - self.pad_begin[i]


def window_attrs(node: Node, nd: int, kernel: Sequence[int]) -> Window:
    """The :class:`Window` of ``node``'s attributes for ``nd`` spatial axes (ONNX defaults)."""
    strides = node.attr("strides") or [1] * nd
    dilations = node.attr("dilations") or [1] * nd
    pads = node.attr("pads") or [0] * (2 * nd)
    auto_pad = node.attr("auto_pad", "NOTSET") or "NOTSET"
    return Window(
        kernel=tuple(int(k) for k in kernel),
        strides=tuple(int(s) for s in strides),
        dilations=tuple(int(d) for d in dilations),
        pads=tuple(int(p) for p in pads),
        auto_pad=str(auto_pad),
        ceil_mode=bool(node.attr("ceil_mode", 0)),
    )


def window_reason(node: Node, nd: int | None) -> str | None:
    """Why ``node``'s window attributes are malformed (for ``supports()``), or ``None``."""
    auto_pad = node.attr("auto_pad", "NOTSET") or "NOTSET"
    if auto_pad not in AUTO_PADS:
        return f"{node.op_type} auto_pad must be one of {', '.join(AUTO_PADS)}; received {auto_pad!r}"
    for name, lo, per in (("strides", 1, 1), ("dilations", 1, 1), ("pads", 0, 2)):
        values = node.attr(name)
        if values is None:
            continue
        if any(int(v) < lo for v in values):
            return f"{node.op_type} {name} must be >= {lo}; received {list(values)}"
        if nd is not None and len(values) != per * nd:
            return (
                f"{node.op_type} {name} needs {per * nd} values for {nd} spatial axes; "
                f"received {list(values)}"
            )
    kernel = node.attr("kernel_shape")
    if kernel is not None and nd is not None and len(kernel) != nd:
        return f"{node.op_type} kernel_shape needs {nd} values; received {list(kernel)}"
    return None


def pad_input(x: np.ndarray, geom: Geometry, value: Any = 0) -> np.ndarray:
    """``x`` with its spatial axes padded as ``geom`` needs (no copy when none is needed)."""
    if not geom.needs_padding:
        return x
    out = np.full(x.shape[:2] + geom.padded, value, dtype=x.dtype)
    inner = tuple(slice(b, b + n) for b, n in zip(geom.pad_begin, geom.spatial))
    out[(slice(None), slice(None), *inner)] = x
    return out


def offset_view(xp: np.ndarray, win: Window, geom: Geometry, offset: Sequence[int]) -> np.ndarray:
    """The strided view of padded ``xp`` that kernel ``offset`` sees at every output position:
    shape (N, C, *out)."""
    sl = tuple(
        slice(o * d, o * d + s * (n - 1) + 1, s) if n else slice(0, 0)
        for o, d, s, n in zip(offset, win.dilations, win.strides, geom.out)
    )
    return xp[(slice(None), slice(None), *sl)]


def patch_view(xp: np.ndarray, win: Window, geom: Geometry) -> np.ndarray:
    """Every window of padded ``xp`` as a read-only view of shape (N, C, *kernel, *out)."""
    sp = xp.strides[2:]
    strides = (
        *xp.strides[:2],
        *(st * d for st, d in zip(sp, win.dilations)),
        *(st * s for st, s in zip(sp, win.strides)),
    )
    return as_strided(xp, xp.shape[:2] + win.kernel + geom.out, strides, writeable=False)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype arithmetic runs in: float16 widens to float32, others stay."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(dtype)


# -- Conv ------------------------------------------------------------------------------------


def _static_shapes(node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    x, w = node.input(0), node.input(1)
    return (x.shape if x is not None else None), (w.shape if w is not None else None)


def _supports_conv(node: Node) -> str | None:
    if node.input(0) is None or node.input(1) is None:
        return "Conv needs inputs X and W"
    reason = check_dtypes(node, FLOAT_TYPES, (0, 1, 2), same=True)
    if reason:
        return reason
    xs, ws = _static_shapes(node)
    rank = len(xs) if xs is not None else len(ws) if ws is not None else None
    nd = rank - 2 if rank is not None else None
    reason = window_reason(node, nd)
    if reason:
        return reason
    group = int(node.attr("group", 1))
    if group < 1:
        return f"Conv group must be >= 1; received {group}"
    return _conv_shape_reason(node, xs, ws, group)


def _conv_shape_reason(
    node: Node, xs: tuple[int, ...] | None, ws: tuple[int, ...] | None, group: int
) -> str | None:
    if xs is not None and len(xs) < 3:
        return f"Conv needs X of rank >= 3 (N, C, spatial...); received shape {xs}"
    if xs is not None and ws is not None and len(ws) != len(xs):
        return f"Conv needs W of the rank of X ({len(xs)}); received W shape {ws}"
    if ws is not None and ws[0] % group:
        return f"Conv W has {ws[0]} output channels, not divisible by group={group}"
    if xs is not None and ws is not None and xs[1] != ws[1] * group:
        return (
            f"Conv X has {xs[1]} channels but W expects {ws[1]} per group x group={group} "
            f"= {ws[1] * group}"
        )
    kernel = node.attr("kernel_shape")
    if kernel is not None and ws is not None and tuple(int(k) for k in kernel) != tuple(ws[2:]):
        return f"Conv kernel_shape {list(kernel)} does not match W's spatial shape {list(ws[2:])}"
    b = node.input(2)
    if b is not None and b.shape is not None and ws is not None and tuple(b.shape) != (ws[0],):
        return f"Conv bias B must have shape ({ws[0]},); received {b.shape}"
    return None


Pack = Callable[[np.ndarray, int], Any]
Apply = Callable[[np.ndarray, Any, Window, Geometry, int], np.ndarray]


def _conv_kernel(node: Node, pack: Pack, apply: Apply) -> Kernel:
    """The shared Conv kernel: pad, run the algorithm ``apply`` on weights packed by ``pack``
    (once at build time when W is constant), add the bias, round back to the input dtype."""
    group = int(node.attr("group", 1))
    w_const = node.const_input(1)
    packed_const = None
    if w_const is not None:
        packed_const = pack(w_const.astype(compute_dtype(w_const.dtype)), group)
    windows: dict[tuple[int, ...], Window] = {}
    geoms: dict[tuple[tuple[int, ...], tuple[int, ...]], Geometry] = {}

    def run(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        ct = compute_dtype(x.dtype)
        kernel = tuple(w.shape[2:])
        win = windows.get(kernel)
        if win is None:
            win = windows[kernel] = window_attrs(node, len(kernel), kernel)
        key = (tuple(x.shape), kernel)
        geom = geoms.get(key)
        if geom is None:
            geom = geoms[key] = win.geometry(x.shape[2:])
        packed = packed_const if packed_const is not None else pack(w.astype(ct), group)
        n, m = x.shape[0], w.shape[0]
        if 0 in geom.out or n == 0:
            y = np.zeros((n, m, *geom.out), dtype=ct)
        else:
            xp = pad_input(x.astype(ct, copy=False), geom, 0)
            y = apply(xp, packed, win, geom, group).reshape((n, m, *geom.out))
        if b is not None:
            y += b.astype(ct, copy=False).reshape((1, m) + (1,) * len(geom.out))
        return np.asarray(y, dtype=x.dtype, order="C")

    return run


def _pack_im2col(w: np.ndarray, group: int) -> np.ndarray:
    """W as (group, M/group, C/group * prod(kernel)), contiguous."""
    return np.ascontiguousarray(w.reshape(group, w.shape[0] // group, -1))


def _apply_im2col(xp: np.ndarray, wg: np.ndarray, win: Window, geom: Geometry, group: int) -> np.ndarray:
    n = xp.shape[0]
    p = math.prod(geom.out)
    # (N, C, *kernel, *out) -> (N, G, C/G * K, P): one contiguous copy (none for 1x1 stride 1)
    cols = patch_view(xp, win, geom).reshape(n, group, wg.shape[2], p)
    return np.matmul(wg, cols)  # (N, G, M/G, P): one BLAS gemm per image and group


@impls.register("Conv", "im2col", priority=Priority.PREFERRED, supports=_supports_conv)
def conv_im2col(node: Node) -> Kernel:
    """Conv via im2col: a contiguous patch matrix and one BLAS matmul per group."""
    return _conv_kernel(node, _pack_im2col, _apply_im2col)


def _pack_direct(w: np.ndarray, group: int) -> np.ndarray:
    """W as (prod(kernel), group, M/group, C/group), contiguous."""
    m, cg = w.shape[:2]
    wk = w.reshape(group, m // group, cg, -1)
    return np.ascontiguousarray(wk.transpose(3, 0, 1, 2))


def _apply_direct(xp: np.ndarray, wk: np.ndarray, win: Window, geom: Geometry, group: int) -> np.ndarray:
    n = xp.shape[0]
    _, g, mg, cg = wk.shape
    out = geom.out
    if cg == 1:  # one input channel per group (depthwise): broadcast multiply-add
        y = np.zeros((n, g, mg, *out), dtype=xp.dtype)
        wshape = (g, mg) + (1,) * len(out)
        for k, offset in enumerate(win.offsets):
            xs = offset_view(xp, win, geom, offset).reshape(n, g, 1, *out)
            y += xs * wk[k].reshape(wshape)
        return y
    p = math.prod(out)
    y = np.zeros((n, g, mg, p), dtype=xp.dtype)
    for k, offset in enumerate(win.offsets):
        xs = offset_view(xp, win, geom, offset).reshape(n, g, cg, p)
        y += np.matmul(wk[k], xs)
    return y


@impls.register("Conv", "direct", priority=Priority.DEFAULT, supports=_supports_conv)
def conv_direct(node: Node) -> Kernel:
    """Conv accumulating one matmul (or broadcast multiply-add) per kernel offset."""
    return _conv_kernel(node, _pack_direct, _apply_direct)


# -- Winograd F(2x2, 3x3) --------------------------------------------------------------------

_WINO_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])


def _winograd_kernel_shape(node: Node) -> tuple[int, ...] | None:
    ws = node.input(1).shape if node.input(1) is not None else None
    if ws is not None:
        return tuple(ws[2:])
    kernel = node.attr("kernel_shape")
    return tuple(int(k) for k in kernel) if kernel is not None else None


def _supports_winograd(node: Node) -> str | None:
    reason = _supports_conv(node)
    if reason:
        return reason
    kernel = _winograd_kernel_shape(node)
    if kernel is None:
        return "Conv.numpy.winograd needs the kernel shape at build time (static W shape or kernel_shape)"
    strides = tuple(node.attr("strides") or [1] * len(kernel))
    dilations = tuple(node.attr("dilations") or [1] * len(kernel))
    if kernel != (3, 3) or set(strides) != {1} or set(dilations) != {1}:
        return (
            f"Conv.numpy.winograd needs a 2-D 3x3 kernel with stride 1 and dilation 1, received "
            f"kernel {'x'.join(map(str, kernel))}, strides {list(strides)}, "
            f"dilations {list(dilations)}"
        )
    return None


def _pack_winograd(w: np.ndarray, group: int) -> np.ndarray:
    """U = G w G^T for each filter: (16, group, M/group, C/group)."""
    m, cg = w.shape[:2]
    g = _WINO_G.astype(w.dtype)
    u = np.einsum("ij,mcjk,lk->ilmc", g, w, g)  # (4, 4, M, Cg)
    return np.ascontiguousarray(u.reshape(16, group, m // group, cg))


def _bt_rows(d: Sequence[np.ndarray]) -> list[np.ndarray]:
    """B^T applied along one axis of a 4-tile, given its four slices."""
    return [d[0] - d[2], d[1] + d[2], d[2] - d[1], d[1] - d[3]]


def _at_rows(m: Sequence[np.ndarray]) -> list[np.ndarray]:
    """A^T applied along one axis of a 4-tile, given its four slices."""
    return [m[0] + m[1] + m[2], m[1] - m[2] - m[3]]


def _apply_winograd(xp: np.ndarray, u: np.ndarray, win: Window, geom: Geometry, group: int) -> np.ndarray:
    n, c = xp.shape[:2]
    oh, ow = geom.out
    th, tw = -(-oh // 2), -(-ow // 2)
    need = (2 * th + 2, 2 * tw + 2)
    if xp.shape[2] < need[0] or xp.shape[3] < need[1]:
        grown = np.zeros((n, c, max(need[0], xp.shape[2]), max(need[1], xp.shape[3])), xp.dtype)
        grown[:, :, : xp.shape[2], : xp.shape[3]] = xp
        xp = grown
    s = xp.strides
    tiles = as_strided(
        xp, (n, c, th, tw, 4, 4), (s[0], s[1], 2 * s[2], 2 * s[3], s[2], s[3]), writeable=False
    )
    rows = _bt_rows([tiles[..., i, :] for i in range(4)])  # each (N, C, TH, TW, 4)
    v = np.empty((4, 4, c, n, th, tw), dtype=xp.dtype)
    for i, r in enumerate(rows):
        for j, col in enumerate(_bt_rows([r[..., k] for k in range(4)])):
            v[i, j] = col.transpose(1, 0, 2, 3)
    cg = c // group
    prod = np.matmul(u, v.reshape(16, group, cg, n * th * tw))  # (16, G, Mg, T)
    m = u.shape[1] * u.shape[2]
    prod = prod.reshape(4, 4, m, n, th, tw)
    y = np.empty((n, m, 2 * th, 2 * tw), dtype=xp.dtype)
    for a, r in enumerate(_at_rows([prod[i] for i in range(4)])):
        for b, val in enumerate(_at_rows([r[k] for k in range(4)])):
            y[:, :, a::2, b::2] = val.transpose(1, 0, 2, 3)
    return y[:, :, :oh, :ow]


@impls.register("Conv", "winograd", priority=Priority.DEFAULT, supports=_supports_winograd)
def conv_winograd(node: Node) -> Kernel:
    """Conv via Winograd F(2x2, 3x3) (2-D, 3x3 kernel, stride 1, dilation 1)."""
    return _conv_kernel(node, _pack_winograd, _apply_winograd)
