"""Memory layouts and converters between them.

Every backend registers the layouts its implementations consume and produce, each with a
TO_STANDARD and FROM_STANDARD converter, and optionally direct converters as shortcuts. Any
two layouts meet through the standard one; :meth:`LayoutRegistry.path` finds the cheapest
chain by shortest path over the registered converters.

``layouts`` is the floor below ``dispatch`` and imports nothing from it. Importing the package
is cheap (the base errors, :mod:`layouts.errors`, are imported by every core module): the names
below are resolved on first use.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

# before numpy loads (layouts.registry imports it): the OpenBLAS default that importing
# dispatch sets (dispatch.blas.BLAS_SPIN_ENV), for a program that imports layouts first
if "numpy" not in sys.modules:
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

if TYPE_CHECKING:
    from layouts.registry import Converter, Layout, LayoutRegistry, bytes_moved
    from layouts.standard import STANDARD, standard_layout

#: public name -> the module that defines it (imported on first use)
_LAZY = {
    "Converter": "layouts.registry",
    "Layout": "layouts.registry",
    "LayoutRegistry": "layouts.registry",
    "bytes_moved": "layouts.registry",
    "STANDARD": "layouts.standard",
    "standard_layout": "layouts.standard",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'layouts' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["STANDARD", "Converter", "Layout", "LayoutRegistry", "bytes_moved", "standard_layout"]
