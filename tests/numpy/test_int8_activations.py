"""MatMulNBits with ``accuracy_level`` 4: the file lets the kernel compute with int8
activations (onnxruntime's int8 path, OpenVINO's dynamic quantization). Such a node is checked
within :data:`dispatch.compare.INT8_ACTIVATIONS_TOLERANCE` of the float reference, so that the
libraries that take the int8 path are not rejected (they were, and a level-4 file of
onnxruntime's own quantizer ran on numpy: issue 52); a file that does not declare it keeps the
float32 checks, and OpenVINO's float32 ways then turn its dynamic quantization off."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from dispatch import Session
from dispatch.backend import load_registry
from dispatch.compare import (
    INT8_ACTIVATIONS_TOLERANCE,
    MODEL_TOLERANCE,
    TOLERANCE,
    check_outputs,
    model_tolerance,
    node_tolerance,
)
from tests.numpy.contrib_support import one_node_model, run_ort, run_ours
from tests.numpy.test_contrib_quantized import quantize

pytest.importorskip("onnxruntime")

K, N, M, BLOCK = 256, 64, 16, 32


def nbits_model(level: int | None, seed: int = 7) -> tuple[onnx.ModelProto, np.ndarray]:
    """One 4-bit MatMulNBits (block 32, uint8 zero points: the blocks onnxruntime's int8 path
    and OpenVINO's compressed weights take) and an input for it."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b, scales, zp = quantize(rng.standard_normal((N, K)).astype(np.float32), 4, BLOCK, "uint8")
    attrs = {"K": K, "N": N, "bits": 4, "block_size": BLOCK}
    if level is not None:
        attrs["accuracy_level"] = level
    model = one_node_model("MatMulNBits", [("A", a), ("B", b), ("scales", scales), ("zero_points", zp)],
                           ["Y"], attrs, const=("B", "scales", "zero_points"))
    return model, a


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def test_the_declared_level_sets_the_tolerance(reg):
    for level, expected in ((None, TOLERANCE["com.microsoft::MatMulNBits"]),
                            (0, TOLERANCE["com.microsoft::MatMulNBits"]),
                            (4, INT8_ACTIVATIONS_TOLERANCE)):
        graph = Session(nbits_model(level)[0], backends=["numpy"], registry=reg, store=False).graph
        assert node_tolerance(graph.nodes[0]) == expected, level
        assert model_tolerance(graph.nodes) == (max(expected[0], MODEL_TOLERANCE[0]),
                                                max(expected[1], MODEL_TOLERANCE[1]))


def test_onnxruntime_level4_is_within_the_int8_tolerance_and_past_the_float_one(reg):
    """onnxruntime really takes its int8 path at level 4 (past the float tolerance: the check
    would reject it), and stays within the declared one; level 0 matches in float32."""
    model, a = nbits_model(4)
    graph = Session(model, backends=["numpy"], registry=reg, store=False).graph
    (ref,), (theirs,) = run_ours(model, {"A": a}), run_ort(model, {"A": a})
    assert check_outputs([theirs], [ref], graph.nodes) is None
    assert check_outputs([theirs], [ref], [], tol=TOLERANCE["com.microsoft::MatMulNBits"]) is not None
    model0, a0 = nbits_model(0)
    (ref0,), (theirs0,) = run_ours(model0, {"A": a0}), run_ort(model0, {"A": a0})
    assert check_outputs([theirs0], [ref0], [], tol=TOLERANCE["com.microsoft::MatMulNBits"]) is None


def test_tuning_accepts_onnxruntime_for_a_level4_node(reg):
    """The tuner's own check of each onnxruntime candidate (it rejected them all before, and
    the level-4 file ran on numpy alone)."""
    from tuner.candidates import enumerate_candidates
    from tuner.measure import measure_candidate

    graph = Session(nbits_model(4)[0], backends=["numpy"], registry=reg, store=False).graph
    cands = [c for c in enumerate_candidates(graph, reg, ["numpy", "onnxruntime"]).candidates
             if c.impl.backend == "onnxruntime"]
    assert cands
    for cand in cands:
        m = measure_candidate(reg, cand, time_cap_s=0.01, warmup=0, min_repeats=1)
        assert m.error is None, (cand.id, m.error)


def test_openvino_float32_way_turns_dynamic_quantization_off_unless_declared(tmp_path, reg):
    """OpenVINO quantizes the activations of compressed-weight MatMuls by default: its float32
    whole-model way must match the float reference on a file that does not declare int8
    activations (it is past that tolerance with OpenVINO's default), and may use them where
    the file declares them (within the int8 tolerance)."""
    pytest.importorskip("openvino")
    from impls.openvino.whole_model import declares_int8_activations, ways

    latency = next(w for w in ways() if w.name == "openvino-latency")
    for level in (None, 4):
        model, a = nbits_model(level)
        path = tmp_path / f"nbits_{level}.onnx"
        onnx.save(model, str(path))
        assert declares_int8_activations(str(path)) == (level == 4)
        graph = Session(model, backends=["numpy"], registry=reg, store=False).graph
        (ref,) = run_ours(model, {"A": a})
        (got,) = latency.build(str(path))({"A": a})
        if level is None:
            assert check_outputs([got], [ref], [], tol=model_tolerance(graph.nodes)) is None
        else:
            assert check_outputs([got], [ref], graph.nodes) is None


@pytest.mark.parametrize("level", [None, 4])
def test_openvino_regions_take_matmulnbits_with_the_files_activations(reg, level):
    """An OpenVINO region of a MatMulNBits: dynamic quantization off unless the node declares
    int8 activations; either way within the node's tolerance of the reference."""
    pytest.importorskip("openvino")
    from impls.openvino.region import compile_config
    from tuner.candidates import enumerate_candidates
    from tuner.measure import measure_candidate

    graph = Session(nbits_model(level)[0], backends=["numpy"], registry=reg, store=False).graph
    cands = [c for c in enumerate_candidates(graph, reg, ["numpy", "openvino"]).candidates
             if c.impl.backend == "openvino"]
    assert cands, "OpenVINO offers no region for MatMulNBits"
    for cand in cands:
        assert compile_config(region=cand.node)["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == (32 if level else 0)
        m = measure_candidate(reg, cand, time_cap_s=0.01, warmup=0, min_repeats=1)
        assert m.error is None, (cand.id, m.error)
