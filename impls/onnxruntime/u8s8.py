"""onnxruntime's uint8 x int8 products on CPUs without VNNI, and their exact form.

On an x86 CPU without VNNI (AVX2 only: AMD Zen 3, Intel before Cascade Lake), MLAS multiplies
uint8 activations by int8 weights with ``vpmaddubsw``, which adds two adjacent products into a
saturated int16: where ``a0 * w0 + a1 * w1`` passes 32767 the sum is clipped, and the result
is no longer the integer product the operator defines (measured with onnxruntime 1.32 on Zen 3:
a QGemm 2.7 off a value of 13, a quantized BERT's output 0.0015 off; onnxruntime's quantization
documentation names the issue and advises 7-bit weights or uint8 ones). With VNNI
(``vpdpbusd``: AVX512-VNNI, AVX-VNNI, AMX) the sums are exact.

The same math without the saturation: each such int8 weight ``w`` with zero point ``z`` becomes
the uint8 ``w + 128`` with zero point ``z + 128`` (``(w + 128) - (z + 128) = w - z`` exactly),
and onnxruntime runs its uint8 x uint8 kernel, which widens to int16 before it multiplies.
:func:`widen_int8_weights` rewrites a model so; the onnxruntime regions apply it where
:func:`saturates_u8s8` finds the CPU saturating, so that a region computes what the operator
defines (what the numpy reference computes) on every CPU.

Rewritten: the weight (a constant int8 tensor, with a constant or omitted int8 zero point) of
MatMulInteger, com.microsoft's DynamicQuantizeMatMul, MatMulIntegerToFloat, QGemm, QAttention,
DynamicQuantizeLSTM (W and R), QLinearMatMul and QLinearConv where the activation is uint8 (or
float, quantized to uint8 by the operator); int8 activations there are left alone (MLAS's
int8 x int8 kernels of those operators do not saturate: measured). In the QDQ format, a
constant int8 DequantizeLinear feeding a MatMul, Gemm or Conv whose activation comes from a
DequantizeLinear, uint8 or int8: onnxruntime fuses that pattern into MatMulIntegerToFloat,
whose int8 x int8 form saturates too on such a CPU (NNCF's int8 BERT: 0.011 off the
unfused math on Zen 3; with the weights widened onnxruntime leaves the pattern unfused, and
its result is the float math within 5e-7).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np

#: (domain, op) -> (activation input or None where the operator quantizes a float input to
#: uint8 itself, [(weight input, its zero point input)])
WEIGHTED_OPS: dict[tuple[str, str], tuple[int | None, tuple[tuple[int, int], ...]]] = {
    ("", "MatMulInteger"): (0, ((1, 3),)),
    ("", "QLinearMatMul"): (0, ((3, 5),)),
    ("", "QLinearConv"): (0, ((3, 5),)),
    ("com.microsoft", "DynamicQuantizeMatMul"): (None, ((1, 3),)),
    ("com.microsoft", "MatMulIntegerToFloat"): (0, ((1, 5),)),
    ("com.microsoft", "QGemm"): (0, ((3, 5),)),
    ("com.microsoft", "QAttention"): (0, ((1, 7),)),
    ("com.microsoft", "DynamicQuantizeLSTM"): (None, ((1, 9), (2, 11))),
}
#: float operators whose second input onnxruntime fuses with DequantizeLinear pairs into an
#: integer kernel (the QDQ format)
QDQ_CONSUMERS = frozenset({"MatMul", "Gemm", "Conv"})


@functools.lru_cache(maxsize=1)
def saturates_u8s8() -> bool:
    """Whether onnxruntime's uint8 x int8 MatMulInteger saturates on this CPU: measured on
    ``[255, 255] @ [127, 127]`` (64770 exactly; 32767 where the pair sum is clipped)."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return False
    k = 64  # a row long enough for MLAS's packed kernel, not a scalar fallback
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, k])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [4, 8])],
        [helper.make_tensor("b", TensorProto.INT8, [k, 8], [127] * (k * 8))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"a": np.full((4, k), 255, np.uint8)})
    return int(y.max()) != 255 * 127 * k


def _elem_types(model: Any) -> dict[str, int]:
    """Value name -> onnx element type, from the model's declarations and onnx's inference."""
    import onnx

    from dispatch.contrib_schemas import register_for_ops

    register_for_ops((n.domain, n.op_type) for n in model.graph.node)
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # no inference: what the model declares
        inferred = model
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.input, *g.value_info, *g.output]}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


def _int8_weights(model: Any, types: dict[str, int]) -> Iterator[tuple[Any, int, int]]:
    """(node, weight input, zero point input) of every int8 weight multiplied by uint8."""
    from onnx import TensorProto

    producers = {o: n for n in model.graph.node for o in n.output}

    def dequantized(name: str) -> bool:
        p = producers.get(name)
        return p is not None and p.op_type == "DequantizeLinear"

    for n in model.graph.node:
        entry = WEIGHTED_OPS.get((n.domain if n.domain != "ai.onnx" else "", n.op_type))
        if entry is not None:
            act, pairs = entry
            if act is None or types.get(n.input[act]) == TensorProto.UINT8:
                for w, z in pairs:
                    yield n, w, z
        elif n.op_type in QDQ_CONSUMERS and n.domain in ("", "ai.onnx") and len(n.input) > 1:
            dq = producers.get(n.input[1])
            if dq is not None and dq.op_type == "DequantizeLinear" and dequantized(n.input[0]):
                yield dq, 0, 2


def widen_int8_weights(model: Any, external: dict[str, np.ndarray] | None = None) -> list[str]:
    """Rewrite ``model`` (in place) so that onnxruntime multiplies its uint8 activations by
    uint8 weights: each int8 weight of :func:`_int8_weights` that is a constant (in the model,
    or in ``external``: initializers onnxruntime takes from memory) becomes ``w + 128`` as uint8,
    its zero point ``z + 128`` (128 where it was omitted). Returns the weights rewritten; a
    weight or zero point that is not a constant leaves its node as it was."""
    from onnx import TensorProto, numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    types = _elem_types(model)
    done: list[str] = []
    zeros: set[str] = set()
    for node, w, z in list(_int8_weights(model, types)):
        if w >= len(node.input) or node.input[w] not in inits or types.get(node.input[w]) != TensorProto.INT8:
            continue
        name = node.input[w]
        zname = node.input[z] if z < len(node.input) and node.input[z] else ""
        int8_zero = zname in inits and inits[zname].data_type == TensorProto.INT8
        if zname and zname not in zeros and not int8_zero:
            continue
        if name in done:  # a weight two nodes share: rewritten once (its zero point with it)
            continue
        outside = external is not None and name in external
        widened = _shifted(external[name] if outside else numpy_helper.to_array(inits[name]))
        if outside:
            external[name] = widened
            inits[name].data_type = TensorProto.UINT8
        else:
            inits[name].CopyFrom(numpy_helper.from_array(widened, name))
        if zname in zeros:  # a zero point two weights share: rewritten for the first
            pass
        elif zname:
            zeros.add(zname)
            zero = _shifted(numpy_helper.to_array(inits[zname]))
            inits[zname].CopyFrom(numpy_helper.from_array(zero, zname))
        else:
            zname = f"{name}__zero_point_u8"
            shape = _zero_shape(node, w, inits)
            zero_init = numpy_helper.from_array(np.full(shape, 128, np.uint8), zname)
            model.graph.initializer.append(zero_init)
            inits[zname] = zero_init
            while len(node.input) <= z:
                node.input.append("")
            node.input[z] = zname
        done.append(name)
    return done


def _shifted(q: np.ndarray) -> np.ndarray:
    """int8 ``q`` + 128 as uint8."""
    return (q.astype(np.int16) + 128).astype(np.uint8)


def _zero_shape(node: Any, w: int, inits: dict[str, Any]) -> tuple[int, ...]:
    """The shape of an omitted zero point: a DequantizeLinear's is its scale's; otherwise one
    value (the operators' per-tensor default)."""
    if node.op_type == "DequantizeLinear" and len(node.input) > 1 and node.input[1] in inits:
        return tuple(inits[node.input[1]].dims)
    return ()
