"""Memory layouts and converters between them.

Every backend registers the layouts its implementations consume and produce, each with a
TO_STANDARD and FROM_STANDARD converter, and optionally direct converters as shortcuts. Any
two layouts meet through the standard one; :meth:`LayoutRegistry.path` finds the cheapest
chain by shortest path over the registered converters.
"""

from __future__ import annotations

import dispatch  # noqa: F401  (first: it sets the OpenBLAS thread default before numpy loads)
from layouts.registry import Converter, Layout, LayoutRegistry, bytes_moved
from layouts.standard import STANDARD, standard_layout

__all__ = ["STANDARD", "Converter", "Layout", "LayoutRegistry", "bytes_moved", "standard_layout"]
