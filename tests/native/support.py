"""Helpers for testing native implementations against the numpy/ONNX reference.

Native implementations consume and produce non-standard layouts; :func:`run_in_layouts`
converts standard inputs to the layouts an implementation declares (through the layout
registry's cheapest converter chain, exactly as a plan would) and converts its outputs back.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from dispatch.backend import load_registry
from dispatch.fusion import FusedNode
from dispatch.graph import Node
from dispatch.registry import STANDARD, Implementation, Registry
from tests.support import make_node, reference_outputs


@functools.lru_cache(maxsize=1)
def registry() -> Registry:
    """A registry with every built-in backend (one per test process)."""
    return load_registry(fresh=True)


def native_impls(op: str) -> list[Implementation]:
    """Every native implementation registered for ``op`` (a pattern key such as
    ``Conv+Relu`` for fused ones)."""
    reg = registry()
    return [i for i in reg.implementations if i.backend == "native" and i.op == op]


def case(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attrs: dict | None = None,
    *,
    opset: int = 21,
    const_inputs: Sequence[int] = (),
) -> tuple[Node, list[np.ndarray]]:
    """A node whose output values carry the reference's shapes and dtypes, and the reference
    outputs (onnx's ReferenceEvaluator)."""
    _, proto = make_node(op_type, inputs, attrs, opset=opset, const_inputs=const_inputs)
    ref = reference_outputs(proto, inputs, opset)
    node, _ = make_node(
        op_type, inputs, attrs, opset=opset, const_inputs=const_inputs, n_outputs=len(ref),
        output_shapes=[r.shape for r in ref], output_dtypes=[r.dtype for r in ref],
    )
    return node, ref


def run_in_layouts(
    impl: Implementation, node: Node, inputs: Sequence[np.ndarray | None]
) -> list[np.ndarray]:
    """Run ``impl`` on standard-layout ``inputs``: convert each to the layout the
    implementation wants, run, and convert every output back to the standard layout."""
    reg = registry()
    reason = impl.supports(node)
    assert reason is None, f"{impl.name} does not support {node}: {reason}"
    ins = []
    for v, arr, lay in zip(node.inputs, inputs, impl.input_layouts(node)):
        if arr is None or lay == STANDARD:
            ins.append(arr)
            continue
        for conv in reg.layouts.path(STANDARD, lay, v.shape, v.dtype):
            arr = conv(arr, v.shape)
        ins.append(arr)
    out = impl.build(node)(*ins)
    outs = list(out) if isinstance(out, tuple | list) else [out]
    result = []
    for v, arr, lay in zip(node.outputs, outs, impl.output_layouts(node)):
        layout = reg.layouts.layout(lay)
        assert tuple(arr.shape) == layout.stored_shape(v.shape), (
            f"{impl.name} returned physical shape {arr.shape} for {lay}, expected "
            f"{layout.stored_shape(v.shape)}"
        )
        if lay != STANDARD:
            for conv in reg.layouts.path(lay, STANDARD, v.shape, v.dtype):
                arr = conv(arr, v.shape)
        result.append(arr)
    return result


__all__ = ["FusedNode", "case", "native_impls", "registry", "run_in_layouts"]
