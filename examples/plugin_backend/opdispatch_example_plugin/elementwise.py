"""A standard ONNX operator in the plugin's own layout: ``Relu`` on column-major tensors."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority

from .layouts import COLMAJOR
from .table import impls

FLOATS = ("float16", "float32", "float64")


def _float_input(node: Node) -> str | None:
    x = node.input(0)
    if x is None or x.dtype is None or x.shape is None:
        return f"needs an input of static shape and dtype, received {x!r}"
    if np.dtype(x.dtype).name not in FLOATS:
        return f"handles {'/'.join(FLOATS)} inputs, received {np.dtype(x.dtype).name}"
    return None


@impls.register("Relu", "colmajor", priority=Priority.FALLBACK, supports=_float_input,
                layouts_in=(COLMAJOR,), layouts_out=(COLMAJOR,))
def relu_colmajor(node: Node) -> Callable[[np.ndarray], np.ndarray]:
    """Relu on a column-major tensor (elementwise: the layout does not matter)."""

    def run(x: np.ndarray) -> np.ndarray:
        return np.maximum(x, np.zeros((), x.dtype))

    return run
