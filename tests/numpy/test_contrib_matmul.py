"""numpy reference of onnxruntime's contrib com.microsoft FusedMatMul against onnxruntime,
through a Session (issue 52): transA / transB / transBatchA / transBatchB, alpha,
broadcast batches, 1-D operands and empty dimensions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.numpy.contrib_support import check_against_ort, one_node_model, run_ours

RNG = np.random.default_rng(5200)


def rand(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return np.asarray(RNG.standard_normal(shape), dtype=dtype)


def as_stored(shape: tuple[int, ...], trans: bool, trans_batch: bool) -> tuple[int, ...]:
    """The stored shape of an operand that FusedMatMul multiplies as ``shape``."""
    dims = list(shape)
    if trans and len(dims) >= 2:
        dims[-1], dims[-2] = dims[-2], dims[-1]
    if trans_batch and len(dims) >= 3:
        dims = [dims[-2], *dims[:-2], dims[-1]]
    return tuple(dims)


@pytest.mark.parametrize("ta,tb", list(itertools.product([0, 1], repeat=2)))
@pytest.mark.parametrize("alpha", [None, 0.125, -2.0])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_fused_matmul_transposes_and_alpha(ta, tb, alpha, dtype):
    a = rand(*as_stored((2, 3, 4, 5), ta, False), dtype=dtype)
    b = rand(*as_stored((2, 3, 5, 6), tb, False), dtype=dtype)
    attrs = {"transA": ta, "transB": tb, **({} if alpha is None else {"alpha": alpha})}
    check_against_ort("FusedMatMul", [("A", a), ("B", b)], ["Y"], attrs)


@pytest.mark.parametrize("ta,tba,tb,tbb", [c for c in itertools.product([0, 1], repeat=4) if c[1] or c[3]])
def test_fused_matmul_batch_transposes(ta, tba, tb, tbb):
    a = rand(*as_stored((3, 4, 5), ta, tba))
    b = rand(*as_stored((3, 5, 6), tb, tbb))
    attrs = {"transA": ta, "transBatchA": tba, "transB": tb, "transBatchB": tbb, "alpha": 0.5}
    check_against_ort("FusedMatMul", [("A", a), ("B", b)], ["Y"], attrs)


@pytest.mark.parametrize("sa,sb,ta,tb", [
    ((2, 1, 4, 5), (3, 5, 6), 0, 0),     # broadcast batches
    ((4, 5), (2, 3, 6, 5), 0, 1),        # 2-D against a batch
    ((5,), (5, 6), 0, 0),                # 1-D A: a row
    ((4, 5), (5,), 0, 0),                # 1-D B: a column
    ((0, 4, 5), (5, 6), 0, 0),           # empty batch
    ((3, 4, 0), (3, 0, 6), 0, 0),        # empty inner dimension: zeros
])
def test_fused_matmul_shapes(sa, sb, ta, tb):
    check_against_ort("FusedMatMul", [("A", rand(*sa)), ("B", rand(*sb))], ["Y"],
                      {"transA": ta, "transB": tb, "alpha": 3.0})


@pytest.mark.parametrize("sa", [(5, 4), (2, 5, 4)])
def test_fused_matmul_transposed_a_times_a_vector_follows_the_definition(sa):
    """transA with a 1-D B: onnxruntime 1.32 sizes the product as transposed but reads A's data
    untransposed (A reshaped, not transposed: a divergence of onnxruntime from its own
    definition, which the reference does not copy)."""
    a, b = rand(*sa), rand(5)
    model = one_node_model("FusedMatMul", [("A", a), ("B", b)], ["Y"], {"transA": 1})
    (y,) = run_ours(model, {"A": a, "B": b})
    np.testing.assert_allclose(y, np.swapaxes(a, -1, -2) @ b, rtol=1e-5, atol=1e-5)
    from tests.numpy.contrib_support import run_ort

    (theirs,) = run_ort(model, {"A": a, "B": b})
    reshaped = a.reshape(*sa[:-2], sa[-1], sa[-2]) @ b
    assert np.allclose(theirs, reshaped, rtol=1e-5, atol=1e-5) or np.allclose(theirs, y, rtol=1e-5, atol=1e-5)


def test_fused_matmul_constant_weight():
    check_against_ort("FusedMatMul", [("A", rand(2, 7, 8)), ("B", rand(16, 8))], ["Y"], {"transB": 1},
                      const=("B",))


def test_fused_matmul_inner_mismatch_is_refused_at_import():
    from dispatch.errors import OpDispatchError

    model = one_node_model("FusedMatMul", [("A", rand(4, 5)), ("B", rand(4, 6))], ["Y"])
    with pytest.raises(OpDispatchError, match="inner dimension"):
        run_ours(model, {})
