"""Example models: the nine architectures shipped inside the ``onnx`` package under
``onnx/backend/test/data/light``, with seeded random weights substituted for the
``ConstantOfShape`` generators that stand in for their trained weights.

Weights are drawn by the role of the tensor (found from the operator that reads it): He-normal
for Conv/Gemm weights, positive variances and scales near one for normalisations, small
biases — so activations stay in a sane range through 50+ layers.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from dispatch.errors import ModelLoadError

LIGHT_MODELS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)

_PASS_THROUGH = {"Unsqueeze", "Reshape", "Identity", "Squeeze", "Flatten"}


def light_model_path(name: str) -> Path:
    """Path of ``light_{name}.onnx`` inside the installed onnx package."""
    if name not in LIGHT_MODELS:
        raise ModelLoadError(f"unknown example model {name!r}; known: {', '.join(LIGHT_MODELS)}")
    return Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"


def _role(model: onnx.ModelProto, value: str) -> tuple[str, int, onnx.NodeProto | None]:
    """(op type, input index, node) of the first real consumer of ``value``."""
    for _ in range(8):
        consumer = next(
            ((n, k) for n in model.graph.node for k, i in enumerate(n.input) if i == value), None
        )
        if consumer is None:
            return "", -1, None
        node, k = consumer
        if node.op_type in _PASS_THROUGH and k == 0:
            value = node.output[0]
            continue
        return node.op_type, k, node
    return "", -1, None


def _draw(rng: np.random.Generator, shape: tuple[int, ...], op: str, k: int, node) -> np.ndarray:
    if op in ("Conv", "Gemm", "MatMul") and k == 1:
        if op == "Gemm":
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            fan_in = shape[1] if trans_b else shape[0]
        elif op == "MatMul":
            fan_in = shape[0]
        else:
            fan_in = int(np.prod(shape[1:]))
        return rng.normal(0.0, np.sqrt(2.0 / max(fan_in, 1)), shape)
    if op == "BatchNormalization":
        if k == 1:
            return rng.uniform(0.8, 1.2, shape)
        if k == 3:
            return rng.normal(0.0, 0.1, shape)
        if k == 4:
            return rng.uniform(0.5, 1.5, shape)
        return rng.normal(0.0, 0.05, shape)
    if op == "Mul":
        return rng.uniform(0.8, 1.2, shape)
    return rng.normal(0.0, 0.05, shape)


def randomize_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Replace every ``ConstantOfShape`` whose shape is an initializer by an initializer of
    seeded random values of that shape; returns a new model."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    rng = np.random.default_rng(seed)
    inits = {i.name: i for i in out.graph.initializer}
    keep_nodes = []
    new_inits = []
    used_shapes: set[str] = set()
    for node in out.graph.node:
        if node.op_type == "ConstantOfShape" and node.input and node.input[0] in inits:
            shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]))
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            dtype = numpy_helper.to_array(value).dtype if value is not None else np.dtype(np.float32)
            op, k, consumer = _role(out, node.output[0])
            arr = _draw(rng, shape, op, k, consumer).astype(dtype)
            new_inits.append(numpy_helper.from_array(arr, node.output[0]))
            used_shapes.add(node.input[0])
        else:
            keep_nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(keep_nodes)
    still_used = {i for n in keep_nodes for i in n.input}
    kept_inits = [i for i in out.graph.initializer if i.name not in used_shapes or i.name in still_used]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept_inits + new_inits)
    init_names = {i.name for i in out.graph.initializer}
    # IR < 4 lists initializers as inputs: keep the list consistent
    inputs = [i for i in out.graph.input if i.name not in used_shapes or i.name in still_used]
    listed = {i.name for i in inputs}
    if any(i.name in init_names for i in model.graph.input):
        for t in new_inits:
            if t.name not in listed:
                inputs.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    return out


def light_model(name: str, seed: int = 0) -> onnx.ModelProto:
    """The light architecture ``name`` with seeded random weights."""
    return randomize_weights(onnx.load(str(light_model_path(name))), seed)


def drop_final_softmax(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose outputs are the logits feeding its final Softmax."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    last = g.node[-1]
    if last.op_type != "Softmax" or list(last.output) != [o.name for o in g.output]:
        return out
    logits = last.input[0]
    del g.node[-1]
    del g.output[:]
    g.output.append(onnx.helper.make_empty_tensor_value_info(logits))
    g.output[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return out
