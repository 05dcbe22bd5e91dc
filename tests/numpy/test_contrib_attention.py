"""numpy references of onnxruntime's contrib attention operators (com.microsoft RotaryEmbedding,
MultiHeadAttention, Attention, GroupQueryAttention) against onnxruntime, through a Session
(issue 52): their attributes, masks, past state, rotary forms, empty and broadcast inputs, and
the forms the references refuse (the node then runs on onnxruntime)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.numpy.contrib_support import check_against_ort, one_node_model, run_ort, run_ours

RNG = np.random.default_rng(5252)
B, S, N, H = 2, 3, 2, 8


def rand(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return np.asarray(RNG.standard_normal(shape), dtype=dtype)


def refused(op: str, inputs: list, outputs: list[str], attrs: dict, match: str) -> None:
    """The numpy backend alone refuses the node with a reason matching ``match``; a default
    Session runs it (on onnxruntime) as onnxruntime does."""
    from dispatch.errors import OpDispatchError

    model = one_node_model(op, inputs, outputs, attrs)
    feeds = {n: a for n, a in inputs if a is not None}
    with pytest.raises(OpDispatchError, match=match):
        run_ours(model, feeds)
    for o, t in zip(run_ours(model, feeds, backends=None), run_ort(model, feeds)):
        np.testing.assert_allclose(o, t, rtol=1e-5, atol=1e-5)


# -- RotaryEmbedding -------------------------------------------------------------------------------


def rotary_inputs(x: np.ndarray, pos: np.ndarray, half: int, positions: int = 12) -> list:
    dtype = x.dtype
    return [("input", x), ("position_ids", pos), ("cos_cache", rand(positions, half, dtype=dtype)),
            ("sin_cache", rand(positions, half, dtype=dtype))]


POSITIONS = {"offset": np.array([2], np.int64), "scalar": np.array(3, np.int64),
             "ids": RNG.integers(0, 12, (B, S)).astype(np.int64)}


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout", ["bsd", "bnsh"])
@pytest.mark.parametrize("pos", sorted(POSITIONS))
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rotary_embedding(interleaved, layout, pos, dtype):
    x = rand(B, S, N * H, dtype=dtype) if layout == "bsd" else rand(B, N, S, H, dtype=dtype)
    check_against_ort("RotaryEmbedding", rotary_inputs(x, POSITIONS[pos], H // 2), ["output"],
                      {"interleaved": interleaved})


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout", ["bsd", "bnsh"])
def test_rotary_embedding_partial(interleaved, layout):
    """rotary_embedding_dim 4 of heads of 8: the last 4 features of each head pass through."""
    x = rand(B, S, N * H) if layout == "bsd" else rand(B, N, S, H)
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": 4, "num_heads": N}
    check_against_ort("RotaryEmbedding", rotary_inputs(x, POSITIONS["ids"], 2), ["output"], attrs)


@pytest.mark.parametrize("attrs", [{"num_heads": N}, {"scale": 2.0}, {"is_packed_batching": 1}])
def test_rotary_embedding_num_heads_and_ignored_attributes(attrs):
    x = rand(B, S, N * H)
    check_against_ort("RotaryEmbedding", rotary_inputs(x, POSITIONS["offset"], H // 2), ["output"], attrs)


@pytest.mark.parametrize("shape", [(B, 0, N * H), (0, S, N * H), (B, N, 0, H)])
def test_rotary_embedding_empty(shape):
    check_against_ort("RotaryEmbedding", rotary_inputs(rand(*shape), POSITIONS["offset"], H // 2), ["output"])


def test_rotary_embedding_position_outside_the_cache_fails():
    inputs = rotary_inputs(rand(B, S, N * H), np.array([11], np.int64), H // 2)
    model = one_node_model("RotaryEmbedding", inputs, ["output"])
    with pytest.raises(Exception, match="outside the cos/sin cache"):
        run_ours(model, dict(inputs))


def test_rotary_embedding_partial_with_a_wider_cache_is_refused():
    """onnxruntime 1.32 reads a cache wider than rotary_embedding_dim / 2 with the stride of
    rotary_embedding_dim / 2 (not the cache's rows): refused, onnxruntime runs it."""
    inputs = rotary_inputs(rand(B, S, N * H), POSITIONS["offset"], H // 2)
    refused("RotaryEmbedding", inputs, ["output"], {"rotary_embedding_dim": 4, "num_heads": N},
            "rotary_embedding_dim=4 and cos_cache of 4 columns")
