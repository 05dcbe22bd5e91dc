"""An example out-of-tree opdispatch backend, ``example``.

It brings:

- a layout of its own, ``ex_colmajor`` (column-major: the axes of the stored array reversed),
  with its TO_STANDARD and FROM_STANDARD converters;
- ``Relu`` and ``com.example.FastGelu`` in that layout, and ``FastGelu`` in the standard one;
- the custom operator ``com.example.FastGelu`` (the tanh approximation of GELU, with an optional
  bias added first): its ONNX schema and shape function, so models using it import, and its
  reference implementation, against which the tuner checks every other implementation.

It is found either through the ``opdispatch.backends`` entry point of its installed
distribution, or by putting this package folder into a folder listed in
``OPDISPATCH_PLUGIN_PATH`` (the package then loads under a private module name, which is why
its modules import each other relatively).
"""

from __future__ import annotations

from .backend import ExampleBackend
from .fastgelu import DOMAIN, FAST_GELU_SCHEMA, fast_gelu
from .layouts import COLMAJOR

__version__ = "0.1.0"

#: what a plugin folder looks for (the entry point names ExampleBackend directly)
OPDISPATCH_BACKENDS = [ExampleBackend]

__all__ = ["COLMAJOR", "DOMAIN", "FAST_GELU_SCHEMA", "OPDISPATCH_BACKENDS", "ExampleBackend",
           "__version__", "fast_gelu"]
