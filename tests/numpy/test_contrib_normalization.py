"""numpy references of onnxruntime's contrib normalizations (com.microsoft
SkipLayerNormalization and SkipSimplifiedLayerNormalization, default-domain
SimplifiedLayerNormalization) against onnxruntime, through a Session (issue 52)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.numpy.contrib_support import check_against_ort, one_node_model, run_ours

RNG = np.random.default_rng(520)
B, S, H = 2, 3, 16


def rand(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return np.asarray(RNG.standard_normal(shape) * 2 + 0.5, dtype=dtype)


SKIP_SHAPES = {"same": (B, S, H), "batch1": (1, S, H), "2d": (S, H)}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("skip", sorted(SKIP_SHAPES))
@pytest.mark.parametrize("beta,bias", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("outputs", [1, 4])
def test_skip_layer_norm(dtype, skip, beta, bias, outputs):
    inputs = [("input", rand(B, S, H, dtype=dtype)), ("skip", rand(*SKIP_SHAPES[skip], dtype=dtype)),
              ("gamma", rand(H, dtype=dtype)), ("beta", rand(H, dtype=dtype) if beta else None),
              ("bias", rand(H, dtype=dtype) if bias else None)]
    check_against_ort("SkipLayerNormalization", inputs, ["out", "mean", "inv", "sum"][:outputs])


@pytest.mark.parametrize("epsilon", [None, 1e-5, 0.5])
def test_skip_layer_norm_epsilon_2d_and_constant_rows(epsilon):
    x = rand(4, H)
    x[1] = 3.0  # a constant row: variance 0, the result is beta (epsilon decides inv_std_var)
    attrs = {} if epsilon is None else {"epsilon": epsilon}
    skip = np.zeros_like(x)
    check_against_ort("SkipLayerNormalization", [("input", x), ("skip", skip), ("gamma", rand(H)),
                                                 ("beta", rand(H))], ["out", "mean", "inv"], attrs)


def test_skip_layer_norm_only_the_sum_output_and_weights_as_initializers():
    inputs = [("input", rand(B, S, H)), ("skip", rand(B, S, H)), ("gamma", rand(H)), ("beta", None),
              ("bias", rand(H))]
    check_against_ort("SkipLayerNormalization", inputs, ["out", "", "", "sum"], const=("gamma", "bias"))


def test_skip_layer_norm_empty_batch():
    inputs = [("input", rand(0, S, H)), ("skip", rand(S, H)), ("gamma", rand(H)), ("beta", rand(H))]
    check_against_ort("SkipLayerNormalization", inputs, ["out", "mean", "inv", "sum"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("skip", sorted(SKIP_SHAPES))
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("epsilon", [None, 1e-6])
def test_skip_simplified_layer_norm(dtype, skip, bias, epsilon):
    inputs = [("input", rand(B, S, H, dtype=dtype)), ("skip", rand(*SKIP_SHAPES[skip], dtype=dtype)),
              ("gamma", rand(H, dtype=dtype)), ("bias", rand(H, dtype=dtype) if bias else None)]
    attrs = {} if epsilon is None else {"epsilon": epsilon}
    # the mean output (1) is not compared: the simplified form computes none (ours is zeros)
    ours = check_against_ort("SkipSimplifiedLayerNormalization", inputs, ["out", "mean", "inv", "sum"],
                             attrs, skip_outputs=(1,))
    assert not ours[1].any() and ours[1].shape == (B, S, 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("axis", [-1, 1, -2])
@pytest.mark.parametrize("outputs", [1, 2])
def test_simplified_layer_norm(dtype, axis, outputs):
    x = rand(B, S, H, dtype=dtype)
    scale = rand(*x.shape[axis % 3:], dtype=dtype)
    ours = check_against_ort("SimplifiedLayerNormalization", [("X", x), ("scale", scale)],
                             ["Y", "inv_std_var"][:outputs], {"axis": axis, "epsilon": 1e-4}, domain="",
                             tol_dtype=np.float32 if dtype == np.float64 else None)
    if outputs == 2:
        assert ours[1].dtype == np.float32


@pytest.mark.parametrize("opsets", [{"": 17}, {"": 13, "com.microsoft": 1}, {"": 21}])
def test_simplified_layer_norm_imports_under_any_default_opset(opsets):
    """It is a default-domain operator of onnxruntime (since version 1), which onnx does not
    define: a model need not import com.microsoft to use it."""
    x, scale = rand(B, S, H), rand(H)
    model = one_node_model("SimplifiedLayerNormalization", [("X", x), ("scale", scale)], ["Y"], domain="",
                           opsets=opsets)
    (y,) = run_ours(model, {"X": x, "scale": scale})
    want = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + 1e-5) * scale
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_simplified_layer_norm_stash_double():
    """onnxruntime 1.32 has no CPU kernel of stash_type 11: checked against the formula."""
    x, scale = rand(B, S, H), rand(H)
    model = one_node_model("SimplifiedLayerNormalization", [("X", x), ("scale", scale)],
                           ["Y", "inv_std_var"], {"stash_type": 11}, domain="")
    y, inv = run_ours(model, {"X": x, "scale": scale})
    want = 1 / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + float(np.float32(1e-5)))
    assert inv.dtype == np.float64 and inv.shape == (B, S, 1)
    np.testing.assert_allclose(inv, want, rtol=1e-12)
    np.testing.assert_allclose(y, x * want * scale, rtol=1e-5, atol=1e-6)
