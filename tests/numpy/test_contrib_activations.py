"""numpy references of onnxruntime's contrib activations (com.microsoft Gelu, FastGelu,
BiasGelu, QuickGelu, BiasSplitGelu) against onnxruntime, through a Session (issue 52)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.numpy.contrib_support import check_against_ort, one_node_model, run_ours

RNG = np.random.default_rng(52)


def rand(*shape: int, dtype: type = np.float32, scale: float = 3.0) -> np.ndarray:
    return np.asarray(RNG.standard_normal(shape) * scale, dtype=dtype)


def erf_gelu(z: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return 0.5 * z * (1 + erf(z / np.sqrt(2)))


def check_float64(op: str, inputs, want: np.ndarray) -> None:
    """onnxruntime's CPU provider has no double Erf, which its Gelu and BiasGelu expand to (the
    model fails to load): double is checked against the formula."""
    model = one_node_model(op, inputs, ["Y"])
    (y,) = run_ours(model, {n: a for n, a in inputs})
    assert y.dtype == np.float64 and y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("shape", [(2, 3, 8), (5,), (), (0, 4)], ids=["3d", "1d", "scalar", "empty"])
def test_gelu(dtype, shape):
    x = rand(*shape, dtype=dtype)
    if dtype == np.float64:
        check_float64("Gelu", [("X", x)], erf_gelu(x))
    else:
        check_against_ort("Gelu", [("X", x)], ["Y"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(2, 3, 8), (4, 8), (0, 8)], ids=["3d", "2d", "empty"])
def test_fast_gelu(dtype, bias, shape):
    inputs = [("X", rand(*shape, dtype=dtype)), ("bias", rand(shape[-1], dtype=dtype) if bias else None)]
    # onnxruntime's double FastGelu is float32-accurate only (2e-7 off): compared as float32
    check_against_ort("FastGelu", inputs, ["Y"], tol_dtype=np.float32 if dtype == np.float64 else None)


def test_fast_gelu_bias_as_initializer_and_large_values():
    x = np.array([[-30.0, -5.0, -0.5, 0.0, 0.5, 5.0, 30.0, 1e4]], np.float32)
    check_against_ort("FastGelu", [("X", x), ("bias", rand(8))], ["Y"], const=("bias",))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("shape", [(2, 3, 8), (8,), (0, 3, 8)], ids=["3d", "1d", "empty"])
def test_bias_gelu(dtype, shape):
    a, b = rand(*shape, dtype=dtype), rand(shape[-1], dtype=dtype)
    if dtype == np.float64:
        check_float64("BiasGelu", [("A", a), ("B", b)], erf_gelu(a + b))
    else:
        check_against_ort("BiasGelu", [("A", a), ("B", b)], ["C"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("alpha", [None, 1.0, -0.5, 2.5])
def test_quick_gelu(dtype, alpha):
    attrs = {} if alpha is None else {"alpha": alpha}
    check_against_ort("QuickGelu", [("X", rand(3, 7, dtype=dtype))], ["Y"], attrs)


def test_quick_gelu_empty():
    check_against_ort("QuickGelu", [("X", rand(0, 7))], ["Y"])


def test_bias_split_gelu_reference():
    """onnxruntime runs BiasSplitGelu on CUDA only: checked against the formula."""
    x, bias = rand(2, 3, 8), rand(8)
    model = one_node_model("BiasSplitGelu", [("X", x), ("bias", bias)], ["Y"])
    (y,) = run_ours(model, {"X": x, "bias": bias})
    from scipy.special import erf

    z = x.astype(np.float64) + bias
    want = z[..., :4] * 0.5 * z[..., 4:] * (1 + erf(z[..., 4:] / np.sqrt(2)))
    assert y.shape == (2, 3, 4) and y.dtype == np.float32
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_a_bias_of_the_wrong_size_is_refused_at_import():
    from dispatch.errors import OpDispatchError

    model = one_node_model("FastGelu", [("X", rand(2, 8)), ("bias", rand(5))], ["Y"])
    with pytest.raises(OpDispatchError, match="bias has 5 elements, expected 8"):
        run_ours(model, {})
