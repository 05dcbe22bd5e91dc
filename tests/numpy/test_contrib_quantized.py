"""numpy references of onnxruntime's contrib quantized matmuls (com.microsoft MatMulNBits,
DynamicQuantizeMatMul, MatMulIntegerToFloat) against onnxruntime, through a Session (issue 52):
bit widths, block sizes, zero points packed and float, g_idx, bias, accuracy levels, weights
from onnxruntime's own MatMulNBitsQuantizer and hand-packed ones, and the refused forms."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.numpy.contrib_support import check_against_ort, one_node_model, run_ort, run_ours

RNG = np.random.default_rng(5253)


def rand(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return np.asarray(RNG.standard_normal(shape), dtype=dtype)


def pack(values: np.ndarray, bits: int) -> np.ndarray:
    """Rows of ``bits``-bit values (..., count) packed into uint8, the low bits first, each row
    padded to whole bytes."""
    per_byte = 8 // bits
    count = values.shape[-1]
    padded = np.zeros((*values.shape[:-1], math.ceil(count / per_byte) * per_byte), np.uint8)
    padded[..., :count] = values
    grouped = padded.reshape(*values.shape[:-1], -1, per_byte).astype(np.uint16)
    return (grouped << (np.arange(per_byte) * bits)).sum(axis=-1).astype(np.uint8)


def quantize(w: np.ndarray, bits: int, block: int, zero_kind: str) -> tuple:
    """W (N, K) quantized by hand as MatMulNBits reads it: (B, scales, zero_points or None)."""
    n, k = w.shape
    blocks = math.ceil(k / block)
    padded = np.zeros((n, blocks * block), np.float32)
    padded[:, :k] = w
    wb = padded.reshape(n, blocks, block)
    top = (1 << bits) - 1
    lo, hi = np.minimum(wb.min(-1), 0), np.maximum(wb.max(-1), 0)
    if zero_kind == "none":  # symmetric: the zero point is 2^(bits - 1)
        scale = np.maximum(np.abs(wb).max(-1), 1e-6) / (1 << (bits - 1))
        zero = np.full((n, blocks), 1 << (bits - 1), np.float32)
    else:
        scale = np.maximum(hi - lo, 1e-6) / top
        zero = np.clip(np.round(-lo / scale), 0, top)
    q = np.clip(np.round(wb / scale[..., None] + zero[..., None]), 0, top).astype(np.uint8)
    b = pack(q, bits)  # (N, blocks, block * bits / 8)
    scales = scale.astype(np.float32).reshape(-1)
    if zero_kind == "none":
        return b, scales, None
    if zero_kind == "float":
        return b, scales, zero.astype(np.float32).reshape(-1)
    return b, scales, pack(zero.astype(np.uint8), bits).reshape(-1)


def nbits(a: np.ndarray, w: np.ndarray, bits: int = 4, block: int = 32, zero_kind: str = "uint8",
          bias: bool = False, attrs: dict | None = None, tol_dtype=None, g_idx=None) -> list[np.ndarray]:
    n, k = w.shape
    b, scales, zp = quantize(w, bits, block, zero_kind)
    dtype = a.dtype
    inputs = [("A", a), ("B", b), ("scales", scales.astype(dtype)),
              ("zero_points", None if zp is None else (zp if zp.dtype == np.uint8 else zp.astype(dtype))),
              ("g_idx", g_idx), ("bias", rand(n, dtype=dtype) if bias else None)]
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block, **(attrs or {})}
    return check_against_ort("MatMulNBits", inputs, ["Y"], attrs, tol_dtype=tol_dtype,
                             const=("B", "scales", "zero_points", "g_idx"))


@pytest.mark.parametrize("block", [16, 32, 128])
@pytest.mark.parametrize("zero_kind", ["none", "uint8", "float"])
@pytest.mark.parametrize("bias", [False, True])
def test_matmul_nbits_4bit(block, zero_kind, bias):
    nbits(rand(2, 3, 64), rand(24, 64), 4, block, zero_kind, bias)


@pytest.mark.parametrize("k", [40, 100])
@pytest.mark.parametrize("zero_kind", ["none", "uint8"])
def test_matmul_nbits_k_not_a_multiple_of_the_block(k, zero_kind):
    """The last block is padded; an odd number of blocks pads the packed zero points' rows."""
    nbits(rand(5, k), rand(10, k), 4, 32, zero_kind)


@pytest.mark.parametrize("bits", [2, 8])
@pytest.mark.parametrize("zero_kind", ["none", "uint8"])
def test_matmul_nbits_other_bit_widths(bits, zero_kind):
    nbits(rand(3, 64), rand(16, 64), bits, 32, zero_kind)


#: float32 A against onnxruntime's accuracy levels: 0 to 3 compute in float32 from the
#: dequantized weights on the CPU (float32 tolerance: measured 3.5e-7 of max |Y|); 4 quantizes
#: A to int8 per block on the fly, an error of up to |A| / 254 per element summed over K
#: (measured 4.6e-3 of max |Y| with K = 128: the test allows 1e-2 of max |Y|)
ACCURACY_TOLERANCE = {0: None, 1: None, 2: None, 3: None, 4: "int8"}


@pytest.mark.parametrize("level", sorted(ACCURACY_TOLERANCE))
def test_matmul_nbits_accuracy_levels(level):
    a, w = rand(4, 128), rand(32, 128)
    if ACCURACY_TOLERANCE[level] == "int8":
        b, scales, zp = quantize(w, 4, 32, "uint8")
        inputs = [("A", a), ("B", b), ("scales", scales), ("zero_points", zp)]
        model = one_node_model("MatMulNBits", inputs, ["Y"],
                               {"K": 128, "N": 32, "bits": 4, "block_size": 32, "accuracy_level": level},
                               const=("B", "scales", "zero_points"))
        (ours,), (theirs,) = run_ours(model, {"A": a}), run_ort(model, {"A": a})
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-2 * float(np.abs(theirs).max()))
        return
    nbits(a, w, 4, 32, "uint8", attrs={"accuracy_level": level}, tol_dtype=ACCURACY_TOLERANCE[level])


def test_matmul_nbits_float16():
    nbits(rand(2, 64, dtype=np.float16), rand(16, 64), 4, 32, "uint8", bias=True)


@pytest.mark.parametrize("zero_kind", ["none", "float"])
def test_matmul_nbits_g_idx(zero_kind):
    """g_idx naming each column's block (here the blocks in a shuffled order of columns)."""
    k, block = 64, 16
    g_idx = RNG.permutation(np.arange(k) // block).astype(np.int32)
    nbits(rand(3, k), rand(8, k), 4, block, zero_kind, g_idx=g_idx)


def test_matmul_nbits_g_idx_with_packed_zero_points_is_refused():
    """onnxruntime 1.32 ignores uint8 zero points when g_idx is given (it dequantizes with
    2^(bits - 1)): refused, so that such a node runs on onnxruntime."""
    from dispatch.errors import OpDispatchError

    k, block = 64, 16
    b, scales, zp = quantize(rand(8, k), 4, block, "uint8")
    a = rand(3, k)
    inputs = [("A", a), ("B", b), ("scales", scales), ("zero_points", zp),
              ("g_idx", (np.arange(k) // block).astype(np.int32))]
    model = one_node_model("MatMulNBits", inputs, ["Y"], {"K": k, "N": 8, "bits": 4, "block_size": block},
                           const=("B", "scales", "zero_points", "g_idx"))
    with pytest.raises(OpDispatchError, match="g_idx and uint8 zero_points"):
        run_ours(model, {"A": a})
    (ours,), (theirs,) = run_ours(model, {"A": a}, backends=None), run_ort(model, {"A": a})
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block", [32, 128])
@pytest.mark.parametrize("symmetric", [True, False])
def test_matmul_nbits_from_onnxruntimes_quantizer(block, symmetric):
    """A MatMul model quantized by onnxruntime's MatMulNBitsQuantizer, run as it writes it."""
    pytest.importorskip("onnx_ir")
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    k, n = 256, 48
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 5, k])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 5, n])],
        [onnx.numpy_helper.from_array(rand(k, n), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    quantizer = MatMulNBitsQuantizer(model, block_size=block, is_symmetric=symmetric)
    quantizer.process()
    quantized = quantizer.model.model
    assert [nd.op_type for nd in quantized.graph.node] == ["MatMulNBits"]
    x = rand(2, 5, k)
    (ours,), (theirs,) = run_ours(quantized, {"x": x}), run_ort(quantized, {"x": x})
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attrs,match", [
    ({"bits": 3}, "bits=3: supported are 2, 4, 8"),
    ({"block_size": 24}, "block_size=24: supported are powers of 2 from 16"),
])
def test_matmul_nbits_refused_forms(attrs, match):
    from dispatch.errors import OpDispatchError

    b, scales, _ = quantize(rand(8, 64), 4, 32, "none")
    inputs = [("A", rand(2, 64)), ("B", b), ("scales", scales)]
    model = one_node_model("MatMulNBits", inputs, ["Y"], {"K": 64, "N": 8, "block_size": 32, **attrs},
                           const=("B", "scales"))
    with pytest.raises(OpDispatchError, match=match):
        run_ours(model, {"A": inputs[0][1]})


def test_matmul_nbits_empty_rows():
    nbits(rand(0, 64), rand(8, 64), 4, 32, "uint8", bias=True)


# -- DynamicQuantizeMatMul and MatMulIntegerToFloat ------------------------------------------------


def int_weights(k: int, n: int, dtype: type) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, (k, n)).astype(dtype)


@pytest.mark.parametrize("b_type", [np.int8, np.uint8])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("zero", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_dynamic_quantize_matmul(b_type, per_column, zero, bias):
    k, n = 32, 12
    shape = (n,) if per_column else ()
    inputs = [("A", rand(2, 5, k)), ("B", int_weights(k, n, b_type)),
              ("b_scale", np.asarray(RNG.random(shape) * 0.02 + 0.001, np.float32)),
              ("b_zero_point", int_weights(1, n, b_type).reshape(-1)[: n if per_column else 1].reshape(shape)
               if zero else None),
              ("bias", rand(n) if bias else None)]
    check_against_ort("DynamicQuantizeMatMul", inputs, ["Y"], const=("B", "b_scale", "b_zero_point", "bias"))


@pytest.mark.parametrize("case", ["all_positive", "all_zero", "empty"])
def test_dynamic_quantize_matmul_ranges(case):
    a = {"all_positive": np.abs(rand(4, 16)), "all_zero": np.zeros((4, 16), np.float32),
         "empty": rand(0, 16)}[case]
    inputs = [("A", a), ("B", int_weights(16, 8, np.int8)), ("b_scale", np.float32(0.05).reshape(()))]
    check_against_ort("DynamicQuantizeMatMul", inputs, ["Y"], const=("B", "b_scale"))


@pytest.mark.parametrize("a_type,b_type", [(np.uint8, np.int8), (np.int8, np.int8), (np.uint8, np.uint8)])
@pytest.mark.parametrize("zeros", [False, True])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_matmul_integer_to_float(a_type, b_type, zeros, per_column, dtype):
    k, n = 24, 10
    shape = (n,) if per_column else ()
    inputs = [("A", int_weights(6, k, a_type)), ("B", int_weights(k, n, b_type)),
              ("a_scale", np.asarray(0.03, dtype)),
              ("b_scale", np.asarray(RNG.random(shape) * 0.02 + 0.001, dtype)),
              ("a_zero_point", int_weights(1, 1, a_type).reshape(()) if zeros else None),
              ("b_zero_point", int_weights(1, n, b_type).reshape(-1)[: n if per_column else 1].reshape(shape)
               if zeros else None),
              ("bias", rand(n, dtype=dtype))]
    check_against_ort("MatMulIntegerToFloat", inputs, ["Y"], const=("B", "b_scale", "b_zero_point"))
