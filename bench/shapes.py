"""Layer shapes of real architectures for the per-layer benchmarks."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import onnx
from onnx import helper, numpy_helper

from dispatch.graph import Node


@dataclass(frozen=True)
class ConvShape:
    """One distinct Conv layer: the node (with its constant weights) and its FLOPs."""

    label: str
    node: Node

    @property
    def flops(self) -> float:
        w = self.node.inputs[1]
        y = self.node.outputs[0]
        n, cout, ho, wo = y.shape
        cin_g, kh, kw = w.shape[1], w.shape[2], w.shape[3]
        return 2.0 * n * cout * ho * wo * cin_g * kh * kw


def _label(node: Node) -> str:
    x, w = node.inputs[0].shape, node.inputs[1].shape
    s = node.attr("strides", [1, 1])[0]
    g = node.attr("group", 1)
    grp = f" g{g}" if g != 1 else ""
    return f"{w[2]}x{w[3]}/{s} {x[1]}->{w[0]} @{x[2]}x{x[3]}{grp}"


@lru_cache(maxsize=4)
def conv_shapes(model: str = "resnet50") -> tuple[ConvShape, ...]:
    """Every distinct Conv of ``model`` (batch 1, 224x224), in order of first appearance."""
    from dispatch import Session
    from dispatch.zoo import light_model

    graph = Session(light_model(model, seed=0), backends=["numpy"]).graph
    seen: dict[tuple, ConvShape] = {}
    for node in graph.nodes:
        if node.op_type != "Conv":
            continue
        key = (
            node.inputs[0].shape, node.inputs[1].shape, len(node.inputs) > 2 and node.inputs[2] is not None,
            tuple(sorted((k, str(v)) for k, v in node.attrs.items())),
        )
        if key not in seen:
            seen[key] = ConvShape(_label(node), node)
    return tuple(seen.values())


def single_node_model(node: Node) -> onnx.ModelProto:
    """An ONNX model of one node with its constant inputs as initializers."""
    inits, graph_inputs, names = [], [], []
    for i, v in enumerate(node.inputs):
        if v is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        if v.const is not None:
            inits.append(numpy_helper.from_array(np.asarray(v.const), name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(v.shape)))
    outs = [f"out{i}" for i in range(len(node.outputs))]
    proto = helper.make_node(node.op_type, names, outs, **node.attrs)
    g = helper.make_graph(
        [proto], "single", graph_inputs,
        [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, list(v.shape))
         for o, v in zip(outs, node.outputs)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
