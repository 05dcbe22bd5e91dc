"""Helpers for the plugin tests: the example plugin's location, copies of it, models using its
custom operator, and the operator's formula written here independently of the plugin."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_DIR = REPO / "examples" / "plugin_backend"
PACKAGE = "opdispatch_example_plugin"
DOMAIN = "com.example"
#: every implementation of com.example::FastGelu the example plugin registers
FAST_GELU_IMPLS = ("FastGelu.example.tanh", "FastGelu.example.colmajor", "FastGelu.numpy.reference")


def copy_plugin(folder: Path) -> Path:
    """Copy the example plugin's package into ``folder`` (a plugin folder); returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(EXAMPLE_DIR / PACKAGE, folder / PACKAGE,
                    ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def write_module(folder: Path, name: str, source: str) -> Path:
    """Write a plugin module ``name`` (dedented ``source``) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def fast_gelu_formula(x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """GELU, tanh approximation, with the bias added first (float64)."""
    z = x.astype(np.float64) + (0.0 if bias is None else bias.astype(np.float64))
    return 0.5 * z * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (z + 0.044715 * z**3)))


def fast_gelu_model(
    shape: Sequence[int] = (32, 64),
    *,
    bias: bool = True,
    relu: bool = False,
    dtype: type = np.float32,
    seed: int = 0,
    bias_len: int | None = None,
    import_domain: bool = True,
) -> tuple[onnx.ModelProto, np.ndarray | None]:
    """``x -> com.example.FastGelu(x[, bias]) (node "gelu") [-> Relu (node "relu")] -> y``.

    Returns the model and its bias (``None`` without one)."""
    rng = np.random.default_rng(seed)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits, ins = [], ["x"]
    b = None
    if bias:
        b = rng.standard_normal(bias_len or shape[-1]).astype(dtype)
        inits.append(numpy_helper.from_array(b, "bias"))
        ins.append("bias")
    nodes = [helper.make_node("FastGelu", ins, ["g" if relu else "y"], domain=DOMAIN, name="gelu")]
    if relu:
        nodes.append(helper.make_node("Relu", ["g"], ["y"], name="relu"))
    graph = helper.make_graph(nodes, "fast_gelu", [helper.make_tensor_value_info("x", elem, list(shape))],
                              [helper.make_tensor_value_info("y", elem, None)], inits)
    opsets = [helper.make_opsetid("", 17)]
    if import_domain:
        opsets.append(helper.make_opsetid(DOMAIN, 1))
    return helper.make_model(graph, opset_imports=opsets), b
