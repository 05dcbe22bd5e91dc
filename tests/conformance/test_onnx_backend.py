"""ONNX's own conformance suite (``onnx.backend.test.BackendTest``) against the dispatcher.

Selected node tests: every node test whose model uses only operators that some registered
backend implements (so each operator we claim is checked by ONNX's own cases, including the
``_expanded`` function-body variants). Real-model tests: the light architectures shipped in
the onnx package (``test_resnet50`` etc.), compared with onnx's stored outputs.

Every exclusion sits in :data:`EXCLUDED` with its reason.
"""

from __future__ import annotations

import os
import re
import unittest

import onnx
import onnx.backend.test

from dispatch.backend import load_registry
from dispatch.onnx_backend import DispatchBackend

NODE_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node")

#: test name (without the ``_cpu`` suffix) -> why it is excluded
EXCLUDED: dict[str, str] = {}

#: regular expressions of excluded families -> why
EXCLUDED_PATTERNS: dict[str, str] = {
    r"bfloat16|float8|FLOAT8|float4|int4|uint4|e4m3|e5m2|_e8m0": "numpy has no bfloat16 / float8 / float4 / int4 dtypes",
    r"_string|STRING": "string tensors are out of scope",
    r"^test_cast_.*_to_(FLOAT16|DOUBLE|FLOAT)_?.*STRING|^test_castlike": "CastLike and string casts are out of scope",
    r"_sequence|_optional|_opt_": "sequence and optional types are out of scope",
}


def _ops_of(model_dir: str) -> set[str] | None:
    path = os.path.join(model_dir, "model.onnx")
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception:
        return None
    if any(o.domain not in ("", "ai.onnx") for o in model.opset_import):
        return None
    if model.functions:
        return None
    ops: set[str] = set()
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            return None
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return None
        ops.add(node.op_type)
    return ops


def selected_node_tests() -> list[str]:
    """Names of the node tests whose operators are all implemented by some backend."""
    implemented = set(load_registry().ops)
    names = []
    for name in sorted(os.listdir(NODE_DIR)):
        ops = _ops_of(os.path.join(NODE_DIR, name))
        if ops and ops <= implemented:
            names.append(name)
    return names


def _excluded(name: str) -> str | None:
    if name in EXCLUDED:
        return EXCLUDED[name]
    for pattern, why in EXCLUDED_PATTERNS.items():
        if re.search(pattern, name):
            return why
    return None


SELECTED = selected_node_tests()
RUN = [n for n in SELECTED if _excluded(n) is None]
REAL_MODELS = ["test_bvlc_alexnet", "test_densenet121", "test_inception_v1", "test_inception_v2",
               "test_resnet50", "test_shufflenet", "test_squeezenet", "test_vgg19", "test_zfnet512"]

backend_test = onnx.backend.test.BackendTest(DispatchBackend, __name__)
backend_test.include("^(" + "|".join(re.escape(n) for n in RUN + REAL_MODELS) + ")_cpu$")
globals().update(backend_test.test_cases)


def test_selection_is_not_empty():
    """The selection covers the operators in scope (a guard against an empty suite)."""
    assert len(RUN) > 300, f"only {len(RUN)} node tests selected"
    for op in ("conv", "maxpool", "averagepool", "batchnorm", "gemm", "matmul", "softmax", "slice",
               "split", "gather", "reduce_mean", "layer_normalization", "gelu", "where", "expand"):
        assert any(n.startswith(f"test_{op}") for n in RUN), op


def test_every_exclusion_has_a_reason():
    for name in SELECTED:
        why = _excluded(name)
        assert why is None or len(why) > 10


if __name__ == "__main__":
    unittest.main()

