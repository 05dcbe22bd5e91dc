"""Test helpers: run one registered implementation on one ONNX node against onnx's own
reference evaluator (``onnx.reference.ReferenceEvaluator``), independently of the importer."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from dispatch.graph import Node, Value
from dispatch.onnx_attrs import attrs_from_proto


def make_node(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attrs: dict | None = None,
    *,
    n_outputs: int = 1,
    opset: int = 21,
    const_inputs: Sequence[int] = (),
    output_shapes: Sequence[tuple[int, ...] | None] | None = None,
    output_dtypes: Sequence[np.dtype | None] | None = None,
) -> tuple[Node, onnx.NodeProto]:
    """Build a :class:`Node` (and the matching NodeProto) whose input values carry the shapes
    and dtypes of ``inputs``; inputs listed in ``const_inputs`` are constants."""
    names = [f"in{i}" if a is not None else "" for i, a in enumerate(inputs)]
    outs = [f"out{i}" for i in range(n_outputs)]
    proto = helper.make_node(op_type, names, outs, name=f"{op_type}_0", **(attrs or {}))
    values: list[Value | None] = []
    for i, a in enumerate(inputs):
        if a is None:
            values.append(None)
            continue
        a = np.asarray(a)
        values.append(Value(names[i], tuple(a.shape), a.dtype, a if i in const_inputs else None))
    out_values = [
        Value(
            o,
            tuple(output_shapes[i]) if output_shapes and output_shapes[i] is not None else None,
            np.dtype(output_dtypes[i]) if output_dtypes and output_dtypes[i] is not None else None,
        )
        for i, o in enumerate(outs)
    ]
    node = Node(proto.name, op_type, values, out_values, attrs_from_proto(proto), "", opset)
    return node, proto


def reference_outputs(
    proto: onnx.NodeProto, inputs: Sequence[np.ndarray | None], opset: int = 21
) -> list[np.ndarray]:
    """Outputs of ``proto`` on ``inputs`` from onnx's reference evaluator."""
    feeds = {n: a for n, a in zip(proto.input, inputs) if n}
    graph = helper.make_graph(
        [proto],
        "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype),
                                       np.asarray(a).shape)
         for n, a in feeds.items()],
        [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in proto.output],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return list(ReferenceEvaluator(model).run(None, feeds))


def run_impl(impl, node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Build ``impl`` for ``node`` and run it once on ``inputs`` (standard layouts)."""
    kernel = impl.build(node)
    out = kernel(*inputs)
    return list(out) if isinstance(out, tuple | list) else [out]
