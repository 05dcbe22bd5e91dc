"""The ``example`` backend: what it registers and in which order."""

from __future__ import annotations

import importlib

import numpy as np

from dispatch.backend import Backend
from dispatch.registry import Registry

#: the plugin's modules that fill its tables, imported explicitly (relative to this package)
MODULES = ("elementwise", "fastgelu")


class ExampleBackend(Backend):
    """An example plugin: the ``ex_colmajor`` layout, ``Relu`` in it, and the custom operator
    ``com.example.FastGelu`` (schema, shape function, reference and two implementations)."""

    name = "example"
    device = "cpu"
    #: register() reads nothing other backends registered, so a process that defers the
    #: registration of backends it does not use need not register any before this one
    registration_needs = ()

    def version(self) -> str:
        from . import __version__

        return f"example-plugin {__version__} (numpy {np.__version__})"

    def register(self, registry: Registry) -> None:
        from .fastgelu import FAST_GELU_SCHEMA, fast_gelu_shapes
        from .layouts import register_layouts
        from .table import BACKEND, impls, reference

        package = __name__.rpartition(".")[0]
        for mod in MODULES:
            importlib.import_module(f"{package}.{mod}")
        register_layouts(registry.layouts)
        registry.add_op_schema(FAST_GELU_SCHEMA, backend=BACKEND, infer=fast_gelu_shapes)
        registry.add_table(impls)
        registry.add_table(reference)
