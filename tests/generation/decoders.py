"""The tiny decoders of tests/models/decoders (made by make_decoders.py there) and the yardstick
every way is compared with: the exported model run step by step with onnxruntime's plain
``run``, each step's presents fed back as the next step's past, written here from the model's
declared names, independently of :mod:`dispatch.generation`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

DECODERS = Path(__file__).resolve().parents[1] / "models" / "decoders"
MODELS = {"gpt2": DECODERS / "gpt2_tiny.onnx", "llama": DECODERS / "llama_tiny.onnx"}
HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
ALL_WAYS = ["onnxruntime-iobinding", "onnxruntime", "openvino-stateful", "openvino"]
PROMPT = [5, 17, 42, 9, 200, 3, 77, 31]


def way_param(name: str):
    """``name`` as a test parameter, skipped cleanly where its library is missing."""
    marks = [pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")] \
        if name.startswith("openvino") else []
    return pytest.param(name, marks=marks, id=name)


WAYS = [way_param(w) for w in ALL_WAYS]


def reference_greedy(path: Path, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy tokens from onnxruntime's plain ``run``, presents fed back as pasts."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    pasts = [n for n in inputs if n.startswith("past_key_values.")]
    past = {n: np.zeros((1, inputs[n].shape[1], 0, inputs[n].shape[3]), np.float32) for n in pasts}
    feed, length, tokens = np.array([prompt], np.int64), 0, []
    for _ in range(new_tokens):
        n = feed.shape[1]
        feeds = {"input_ids": feed, "attention_mask": np.ones((1, length + n), np.int64), **past}
        if "position_ids" in inputs:
            feeds["position_ids"] = np.arange(length, length + n, dtype=np.int64)[None]
        results = dict(zip(outputs, session.run(None, feeds)))
        past = {n: results[n.replace("past_key_values.", "present.")] for n in pasts}
        length += n
        tokens.append(int(results["logits"][0, -1].argmax()))
        feed = np.array([[tokens[-1]]], np.int64)
    return tokens


def merged(path: Path) -> onnx.ModelProto:
    """The decoder at ``path`` shaped as optimum merges one: its graph under one ``If`` on a bool
    input ``use_cache_branch``. Both branches are the cached graph here (optimum's other branch
    takes no past), which is what a generation that always feeds ``True`` runs."""
    model = onnx.load(str(path))
    graph = model.graph
    outputs = [o.name for o in graph.output]

    def branch(tag: str) -> onnx.GraphProto:
        rename = {n: f"{n}_{tag}" for n in outputs}
        nodes = []
        for node in graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[:] = [rename.get(x, x) for x in copy.input]
            copy.output[:] = [rename.get(x, x) for x in copy.output]
            copy.name = f"{copy.name}_{tag}" if copy.name else ""
            nodes.append(copy)
        values = []
        for out in graph.output:
            value = onnx.ValueInfoProto()
            value.CopyFrom(out)
            value.name = rename[out.name]
            values.append(value)
        return helper.make_graph(nodes, f"{tag}_branch", [], values)

    flag = helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1])
    nodes = [helper.make_node("Squeeze", ["use_cache_branch"], ["use_cache_scalar"]),
             helper.make_node("If", ["use_cache_scalar"], outputs, then_branch=branch("with_past"),
                              else_branch=branch("without_past"))]
    out = helper.make_model(helper.make_graph(nodes, "merged", [*graph.input, flag], list(graph.output),
                                              list(graph.initializer)),
                            opset_imports=model.opset_import)
    out.ir_version = model.ir_version
    return out
