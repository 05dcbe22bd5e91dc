"""Helpers of the contrib-operator tests (issue 52): a one-node model of an onnxruntime contrib
operator, run by opdispatch's numpy backend and by onnxruntime."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

MS = "com.microsoft"
OPSETS = {"": 17, MS: 1}


def one_node_model(op: str, inputs: Sequence[tuple[str, np.ndarray | None]], outputs: Sequence[str],
                   attrs: Mapping[str, Any] | None = None, domain: str = MS,
                   opsets: Mapping[str, int] = OPSETS, const: Sequence[str] = ()) -> onnx.ModelProto:
    """A model of one ``op`` node: each (name, array) input is a graph input (an initializer
    when its name is in ``const``; ``None``: an omitted optional input); the outputs are
    declared without a shape (an empty name: an omitted optional output)."""
    ins, inits = [], []
    for name, arr in inputs:
        if arr is None:
            continue
        if name in const:
            inits.append(onnx.numpy_helper.from_array(arr, name))
        else:
            ins.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)))
    node = helper.make_node(op, [n if a is not None else "" for n, a in inputs], list(outputs),
                            domain=domain, name="n0", **dict(attrs or {}))
    outs = [helper.make_tensor_value_info(o, 0, None) for o in outputs if o]
    graph = helper.make_graph([node], "contrib", ins, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    return _typed_outputs(model)


def _typed_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its outputs' element types declared, from onnx's shape inference with the
    contrib schemas (onnxruntime wants them); left undeclared where the inference fails."""
    from dispatch.contrib_schemas import register_all

    register_all()
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception:  # an invalid model: a test of the error
        return model
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.output}
    for o in model.graph.output:
        o.type.tensor_type.elem_type = types.get(o.name, 0)
    return model


def feeds_of(model: onnx.ModelProto,
             inputs: Sequence[tuple[str, np.ndarray | None]]) -> dict[str, np.ndarray]:
    graph_inputs = {i.name for i in model.graph.input}
    return {n: a for n, a in inputs if a is not None and n in graph_inputs}


def run_ours(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
             backends: Sequence[str] | None = ("numpy",)) -> list[np.ndarray]:
    from dispatch import Session

    sess = Session(model, backends=list(backends) if backends is not None else None, store=False)
    return [np.asarray(o) for o in sess.run(None, dict(feeds))]


def exact_on_this_cpu(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` as onnxruntime computes the operators' exact integer math on this CPU: itself,
    or, where onnxruntime's uint8 x int8 kernels saturate (no VNNI: impls.onnxruntime.u8s8), a
    copy with those int8 weights widened to uint8 (the same products, unsaturated)."""
    from impls.onnxruntime.u8s8 import saturates_u8s8, widen_int8_weights

    if not saturates_u8s8():
        return model
    widened = onnx.ModelProto()
    widened.CopyFrom(model)
    widen_int8_weights(widened)
    return widened


def run_ort(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's outputs of ``model`` (its exact form on a CPU where uint8 x int8 saturates:
    :func:`exact_on_this_cpu`)."""
    import onnxruntime as ort

    model = exact_on_this_cpu(model)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in sess.run(None, dict(feeds))]


def tolerance(dtype: np.dtype) -> dict[str, float]:
    if dtype == np.float16:
        return {"rtol": 2e-3, "atol": 2e-3}
    if dtype == np.float64:
        return {"rtol": 1e-10, "atol": 1e-12}
    return {"rtol": 1e-5, "atol": 1e-5}


def check_against_ort(op: str, inputs: Sequence[tuple[str, np.ndarray | None]], outputs: Sequence[str],
                      attrs: Mapping[str, Any] | None = None, *, domain: str = MS,
                      skip_outputs: Sequence[int] = (), const: Sequence[str] = (),
                      backends: Sequence[str] | None = ("numpy",),
                      tol_dtype: Any = None) -> list[np.ndarray]:
    """Run the one-node model through opdispatch and onnxruntime and compare every output
    (but those in ``skip_outputs``): same shapes, dtypes and values within the tolerance of
    their dtype (of ``tol_dtype`` where given)."""
    model = one_node_model(op, inputs, outputs, attrs, domain, const=const)
    feeds = feeds_of(model, inputs)
    ours = run_ours(model, feeds, backends)
    theirs = run_ort(model, feeds)
    assert len(ours) == len(theirs)
    for k, (o, t) in enumerate(zip(ours, theirs)):
        if k in skip_outputs:
            continue
        assert o.shape == t.shape, f"output {k}: {o.shape} != {t.shape}"
        assert o.dtype == t.dtype, f"output {k}: {o.dtype} != {t.dtype}"
        tol = tolerance(np.dtype(tol_dtype or t.dtype))
        np.testing.assert_allclose(o.astype(np.float64), t.astype(np.float64), **tol,
                                   err_msg=f"{op} output {k}")
    return ours


def run_ors_or_skip(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """:func:`run_ort`, the test skipped where onnxruntime is not installed."""
    import pytest

    pytest.importorskip("onnxruntime")
    return run_ort(model, feeds)
