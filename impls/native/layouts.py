"""The native backend's activation layouts and their converters (C++ in native/src/layouts.cpp).

- ``nhwc``: channels last, physical shape (N, H, W, C).
- ``nchw8c`` / ``nchw16c``: channels in blocks of 8 / 16, physical shape
  (N, ceil(C/B), H, W, B); channels past C are zero so kernels may read whole blocks.

Each layout registers TO_STANDARD and FROM_STANDARD converters; ``nhwc`` <-> ``nchw16c`` and
``nhwc`` <-> ``nchw8c`` have direct converters, which beat the two-step path through ``std``.
Layouts hold rank-4 float32 tensors only.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from impls.common import as_f32 as _c
from impls.native._module import native
from layouts.registry import Layout, LayoutRegistry

BACKEND = "native"
BLOCKS = {"nchw8c": 8, "nchw16c": 16}


def blocked_shape(shape: tuple[int, ...], block: int) -> tuple[int, ...]:
    """Physical shape of a logical (N, C, H, W) tensor in nchw{block}c."""
    n, c, h, w = shape
    return (n, -(-c // block), h, w, block)


def nhwc_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    n, c, h, w = shape
    return (n, h, w, c)


def _to_blocked(block: int) -> Callable[[np.ndarray, tuple[int, ...]], np.ndarray]:
    def fn(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return native().nchw_to_blocked(_c(x), block)

    return fn


def _from_blocked(block: int) -> Callable[[np.ndarray, tuple[int, ...]], np.ndarray]:
    def fn(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return native().blocked_to_nchw(_c(x), list(shape), block)

    return fn


def _nhwc_to_blocked(block: int) -> Callable[[np.ndarray, tuple[int, ...]], np.ndarray]:
    def fn(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return native().nhwc_to_blocked(_c(x), block)

    return fn


def _blocked_to_nhwc(block: int) -> Callable[[np.ndarray, tuple[int, ...]], np.ndarray]:
    def fn(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return native().blocked_to_nhwc(_c(x), list(shape), block)

    return fn


def to_nhwc(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return native().nchw_to_nhwc(_c(x))


def from_nhwc(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return native().nhwc_to_nchw(_c(x))


def register_layouts(layouts: LayoutRegistry) -> None:
    """Add nhwc, nchw8c and nchw16c with their standard and direct converters."""
    f32 = ("float32",)
    layouts.add_layout(
        Layout("nhwc", "cpu", BACKEND, rank=4, dtypes=f32, physical_shape=nhwc_shape,
               doc="channels last (N, H, W, C)"),
        to_standard=from_nhwc,
        from_standard=to_nhwc,
    )
    for name, block in BLOCKS.items():
        layouts.add_layout(
            Layout(name, "cpu", BACKEND, rank=4, dtypes=f32,
                   physical_shape=lambda s, b=block: blocked_shape(s, b),
                   doc=f"channels blocked by {block}, zero-padded (N, C/{block}, H, W, {block})"),
            to_standard=_from_blocked(block),
            from_standard=_to_blocked(block),
        )
        layouts.add_converter("nhwc", name, _nhwc_to_blocked(block), backend=BACKEND)
        layouts.add_converter(name, "nhwc", _blocked_to_nhwc(block), backend=BACKEND)
