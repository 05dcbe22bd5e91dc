"""The ``ex_colmajor`` layout: a tensor stored column-major, i.e. its array's axes reversed.

A logical tensor of shape (d0, ..., dn) is stored as the C-contiguous array of shape
(dn, ..., d0) holding ``x.transpose()``. It holds tensors of any rank and dtype (for ranks 0
and 1 it stores the same bytes as the standard layout).
"""

from __future__ import annotations

import numpy as np

from layouts.registry import Layout, LayoutRegistry

from .table import BACKEND

COLMAJOR = "ex_colmajor"


def colmajor_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Physical shape of a logical ``shape`` in ``ex_colmajor``."""
    return tuple(reversed(shape))


def to_colmajor(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """FROM_STANDARD: a standard (row-major) array -> its column-major storage."""
    return np.ascontiguousarray(np.asarray(x).transpose())


def from_colmajor(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """TO_STANDARD: column-major storage -> the standard (row-major) array."""
    return np.ascontiguousarray(np.asarray(x).transpose())


def register_layouts(layouts: LayoutRegistry) -> None:
    """Add ``ex_colmajor`` with its two standard converters."""
    layouts.add_layout(
        Layout(COLMAJOR, "cpu", BACKEND, physical_shape=colmajor_shape,
               doc="column-major: the stored array's axes reversed"),
        to_standard=from_colmajor,
        from_standard=to_colmajor,
    )
