"""Conversion of ONNX attributes and tensor types to plain Python and numpy values."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

from dispatch.errors import ModelLoadError


def attrs_from_proto(node: onnx.NodeProto, opsets: dict[str, int] | None = None) -> dict[str, Any]:
    """Attributes of ``node`` as Python values: int, float, str, list, numpy array, or a
    :class:`dispatch.subgraph.Subgraph` for a control-flow body (``opsets``: the model's)."""
    from dispatch.subgraph import Subgraph

    out: dict[str, Any] = {}
    for a in node.attribute:
        if a.ref_attr_name:
            raise ModelLoadError(
                f"node {node.name or node.op_type!r}: attribute {a.name!r} references a function "
                f"attribute ({a.ref_attr_name!r}); only attributes with values are supported"
            )
        if a.type == AttributeProto.TENSOR:
            out[a.name] = numpy_helper.to_array(a.t)
        elif a.type == AttributeProto.STRING:
            out[a.name] = a.s.decode("utf-8", errors="replace")
        elif a.type == AttributeProto.STRINGS:
            out[a.name] = [s.decode("utf-8", errors="replace") for s in a.strings]
        elif a.type == AttributeProto.GRAPH:
            out[a.name] = Subgraph.of(a.g, opsets)
        elif a.type == AttributeProto.GRAPHS:
            raise ModelLoadError(
                f"node {node.name or node.op_type!r} ({node.op_type}): attribute {a.name!r} holds "
                f"a list of subgraphs; only single-graph attributes (If, Loop, Scan) are supported"
            )
        elif a.type == AttributeProto.SPARSE_TENSOR:
            raise ModelLoadError(
                f"node {node.name or node.op_type!r}: sparse tensor attribute {a.name!r} is not supported"
            )
        else:
            value = helper.get_attribute_value(a)
            if isinstance(value, list | tuple):
                value = list(value)
            out[a.name] = value
    return out


def np_dtype(elem_type: int) -> np.dtype:
    """numpy dtype of an ONNX TensorProto element type."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        name = (onnx.TensorProto.DataType.Name(elem_type)
                if elem_type in onnx.TensorProto.DataType.values() else str(elem_type))
        raise ModelLoadError(f"tensor element type {name} is not supported") from None
