"""The standard layout: row-major contiguous at any rank (``nchw`` for rank-4 activations)."""

from __future__ import annotations

from layouts.registry import CORE, STANDARD, Layout

__all__ = ["STANDARD", "standard_layout"]


def standard_layout() -> Layout:
    """The standard layout every backend can read and write."""
    return Layout(
        name=STANDARD,
        device="cpu",
        backend=CORE,
        rank=None,
        doc="row-major contiguous at any rank; NCHW for rank-4 activations",
    )
