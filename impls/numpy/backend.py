"""The numpy reference backend."""

from __future__ import annotations

import importlib

import numpy as np

from dispatch.backend import Backend
from dispatch.registry import Registry

#: The modules whose implementations this backend registers, imported explicitly.
MODULES = (
    "conv",
    "gemm",
    "pool",
    "norm",
    "elementwise",
    "reduce",
    "shape",
    "misc",
)


class NumpyBackend(Backend):
    """Reference implementations in numpy; the semantics every other backend is tested against."""

    name = "numpy"
    device = "cpu"

    def version(self) -> str:
        return f"numpy {np.__version__}"

    def register(self, registry: Registry) -> None:
        from impls.numpy.table import impls

        for mod in MODULES:
            importlib.import_module(f"impls.numpy.{mod}")
        registry.add_table(impls)
