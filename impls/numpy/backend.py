"""The numpy reference backend."""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.backend import Backend
from dispatch.graph import Node
from dispatch.registry import Implementation, Registry

#: The modules whose implementations this backend registers, imported explicitly.
MODULES = (
    "conv",
    "gemm",
    "pool",
    "norm",
    "elementwise",
    "elementwise_math",
    "activations",
    "sorting",
    "index_ops",
    "reduce",
    "shape",
    "misc",
    "gather_scatter",
    "einsum",
    "resize",
    "conv_transpose",
    "group_norm",
    "depth_space",
    "lp_mvn_norm",
    "eye_like",
    "detection",
    "control_flow",
    "recurrent",
    "quantize",
    "conv_quantized",
    "contrib_activations",
    "contrib_normalization",
    "contrib_matmul",
    "contrib_attention",
    "contrib_quantized",
    "contrib_qoperator",
    "contrib_qattention",
    "contrib_qrecurrent",
    "contrib_embedding",
)


class NumpyBackend(Backend):
    """Reference implementations in numpy; the semantics every other backend is tested against."""

    name = "numpy"
    registration_needs = ()
    device = "cpu"

    def version(self) -> str:
        return f"numpy {np.__version__}"

    def register(self, registry: Registry) -> None:
        from impls.numpy.table import impls

        for mod in MODULES:
            importlib.import_module(f"impls.numpy.{mod}")
        registry.add_table(ieee(impl) for impl in impls)


def ieee(impl: Implementation) -> Implementation:
    """``impl`` with its build function and kernels run under ``np.errstate(all="ignore")``.

    ONNX float arithmetic follows IEEE 754: a product may overflow to inf, 0/0 is NaN, and
    neither is an error. numpy reports each as a RuntimeWarning (an exception where warnings
    are errors), which no kernel of the reference may raise for a valid input; wrapping every
    kernel here covers the ones (matmul, sums, means, squares) that did not guard themselves.
    """
    build = impl.build

    @functools.wraps(build)
    def quiet_build(node: Node) -> Callable[..., Any]:
        with np.errstate(all="ignore"):
            kernel = build(node)

        @functools.wraps(kernel)
        def run(*args: Any) -> Any:
            with np.errstate(all="ignore"):
                return kernel(*args)

        return run

    return dataclasses.replace(impl, build=quiet_build)
