"""A small builder for ONNX test models."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper


class ModelBuilder:
    """Accumulate nodes, inputs, initializers and outputs; :meth:`build` returns a ModelProto."""

    def __init__(self, opset: int = 17, name: str = "test") -> None:
        self.opset = opset
        self.name = name
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def input(self, name: str, shape: Sequence[int | str | None], dtype=np.float32) -> str:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def const(self, array: np.ndarray, name: str | None = None) -> str:
        name = name or f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type: str, inputs: Sequence[str], n_out: int = 1, name: str | None = None,
           **attrs) -> str | list[str]:
        self._n += 1
        outs = [f"{op_type.lower()}{self._n}_{k}" for k in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name or f"{op_type}_{self._n}",
                                           **attrs))
        return outs[0] if n_out == 1 else outs

    def output(self, name: str, dtype=np.float32) -> None:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        self.outputs.append(helper.make_tensor_value_info(name, elem, None))

    def build(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])


def small_cnn(opset: int = 17, seed: int = 0) -> onnx.ModelProto:
    """Conv-BN-Relu x2 with a residual Add, pooling and a Gemm head (1x3x16x16 input)."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder(opset, "small_cnn")
    x = b.input("x", [1, 3, 16, 16])
    w1 = b.const(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32))
    c1 = b.op("Conv", [x, w1], pads=[1, 1, 1, 1])
    bn = b.op("BatchNormalization", [c1, b.const(rng.uniform(0.5, 1.5, 8).astype(np.float32)),
                                     b.const(rng.normal(0, 0.1, 8).astype(np.float32)),
                                     b.const(rng.normal(0, 0.1, 8).astype(np.float32)),
                                     b.const(rng.uniform(0.5, 1.5, 8).astype(np.float32))])
    r1 = b.op("Relu", [bn])
    w2 = b.const(rng.normal(0, 0.2, (8, 8, 3, 3)).astype(np.float32))
    c2 = b.op("Conv", [r1, w2, b.const(rng.normal(0, 0.1, 8).astype(np.float32))], pads=[1, 1, 1, 1])
    r2 = b.op("Relu", [c2])
    s = b.op("Add", [r2, r1])
    r3 = b.op("Relu", [s])
    p = b.op("GlobalAveragePool", [r3])
    f = b.op("Flatten", [p])
    g = b.op("Gemm", [f, b.const(rng.normal(0, 0.3, (5, 8)).astype(np.float32)),
                      b.const(np.zeros(5, np.float32))], transB=1)
    y = b.op("Softmax", [g], axis=1)
    b.output(y)
    return b.build()
