"""numpy references of onnxruntime's contrib attention operators (com.microsoft RotaryEmbedding,
MultiHeadAttention, Attention, GroupQueryAttention) against onnxruntime, through a Session
(issue 52): their attributes, masks, past state, rotary forms, empty and broadcast inputs, and
the forms the references refuse (the node then runs on onnxruntime)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.numpy.contrib_support import check_against_ort, one_node_model, run_ort, run_ours

RNG = np.random.default_rng(5252)
MS = "com.microsoft"
B, S, N, H = 2, 3, 2, 8


def rand(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return np.asarray(RNG.standard_normal(shape), dtype=dtype)


def refused(op: str, inputs: list, outputs: list[str], attrs: dict, match: str,
            ort_runs: bool = True) -> None:
    """The numpy backend alone refuses the node with a reason matching ``match``; a default
    Session runs it (on onnxruntime) as onnxruntime does (where ``ort_runs``: onnxruntime's CPU
    provider fails some forms too)."""
    from dispatch.errors import OpDispatchError

    model = one_node_model(op, inputs, outputs, attrs)
    feeds = {n: a for n, a in inputs if a is not None}
    with pytest.raises(OpDispatchError, match=match):
        run_ours(model, feeds)
    if not ort_runs:
        return
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


# -- MultiHeadAttention ----------------------------------------------------------------------------

L, P = 4, 5


def mha(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, bias=None, mask=None, attn_bias=None, past=None,
        attrs: dict | None = None, outputs: int = 1) -> list[np.ndarray]:
    inputs = [("query", q), ("key", k), ("value", v), ("bias", bias), ("key_padding_mask", mask),
              ("attention_bias", attn_bias), ("past_key", None if past is None else past[0]),
              ("past_value", None if past is None else past[1])]
    names = ["output", "present_key", "present_value"][:outputs]
    return check_against_ort("MultiHeadAttention", inputs, names, {"num_heads": N, **(attrs or {})})


def qkv(s: int = S, t: int = L, dtype: type = np.float32, b: int = B, dv: int = N * H) -> tuple:
    return rand(b, s, N * H, dtype=dtype), rand(b, t, N * H, dtype=dtype), rand(b, t, dv, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("bias", [False, True])
def test_mha(dtype, scale, bias):
    attrs = {} if scale is None else {"scale": scale}
    mha(*qkv(dtype=dtype), bias=rand(3 * N * H, dtype=dtype) if bias else None, attrs=attrs)


MASKS = {
    "lengths": np.array([2, 4], np.int32),
    "raw_2d": np.array([[1, 1, 0, 1], [1, 0, 0, 0]], np.int32),
    "raw_3d": (RNG.random((B, S, L)) > 0.3).astype(np.int32),
    "all_masked_row": np.array([[0, 0, 0, 0], [1, 1, 1, 1]], np.int32),
    "zero_length": np.array([0, 4], np.int32),
}


@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("filter_value", [None, -1e9])
def test_mha_key_padding_mask(mask, filter_value):
    attrs = {} if filter_value is None else {"mask_filter_value": filter_value}
    mha(*qkv(), mask=MASKS[mask], attrs=attrs)


@pytest.mark.parametrize("shape", [(B, N, S, L), (1, 1, S, L), (B, 1, S, L), (1, N, S, L)])
def test_mha_attention_bias_broadcast(shape):
    mha(*qkv(), attn_bias=rand(*shape), mask=MASKS["raw_2d"])


@pytest.mark.parametrize("mask", [None, "raw_2d", "lengths"])
@pytest.mark.parametrize("uni", [0, 1])
@pytest.mark.parametrize("s", [1, S])
def test_mha_past(mask, uni, s):
    q, k, v = qkv(s, s)
    m = {None: None, "raw_2d": (RNG.random((B, P + s)) > 0.3).astype(np.int32),
         "lengths": np.array([P + s - 1, P + s], np.int32)}[mask]
    mha(q, k, v, past=(rand(B, N, P, H), rand(B, N, P, H)), mask=m, attn_bias=rand(1, N, s, P + s),
        bias=rand(3 * N * H), attrs={"unidirectional": uni}, outputs=3)


@pytest.mark.parametrize("mask", ["lengths", "raw_2d", "all_masked_row", "zero_length"])
def test_mha_unidirectional_with_masks(mask):
    """The causal mask excludes future keys even in a row whose visible keys are all masked."""
    mha(*qkv(L, L), mask=MASKS[mask], attrs={"unidirectional": 1})


def test_mha_unidirectional_self_attention_and_value_width():
    q, k, v = qkv(S, S, dv=N * 4)
    mha(q, k, v, attrs={"unidirectional": 1}, outputs=3)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("mask", [None, "raw_2d", "lengths"])
def test_mha_key_and_value_as_heads(bias, mask):
    """key and value (B, N, L, H), as a cross attention's cache: present is them; the packed
    bias applies to the query only."""
    q = rand(B, S, N * H)
    mha(q, rand(B, N, L, H), rand(B, N, L, H), bias=rand(3 * N * H) if bias else None,
        mask=None if mask is None else MASKS[mask], outputs=3)


@pytest.mark.parametrize("s,t,b", [(0, L, B), (S, 0, B), (S, L, 0)])
def test_mha_empty(s, t, b):
    mha(*qkv(s, t, b=b))


@pytest.mark.parametrize("case,match", [
    ("unidirectional_cross", "unidirectional=1 and query / key sequence lengths 3 / 4"),
    ("mask_3b2", "1-D key_padding_mask of 8 elements"),
    ("bnsh_with_past", "\\(B, N, L, H\\) key and value and a past: not supported"),
])
def test_mha_refused_forms(case, match):
    q, k, v = qkv()
    attrs = {"num_heads": N}
    if case == "unidirectional_cross":
        attrs["unidirectional"] = 1
        inputs = [("query", q), ("key", k), ("value", v)]
    elif case == "mask_3b2":
        inputs = [("query", q), ("key", k), ("value", v), ("bias", None),
                  ("key_padding_mask", np.array([2, 4, 0, 1, 0, 1, 4, 4], np.int32))]
    else:
        inputs = [("query", q), ("key", rand(B, N, L, H)), ("value", rand(B, N, L, H)), ("bias", None),
                  ("key_padding_mask", None), ("attention_bias", None), ("past_key", rand(B, N, 2, H)),
                  ("past_value", rand(B, N, 2, H))]
    refused("MultiHeadAttention", inputs, ["output"], attrs, match)


# -- Attention --------------------------------------------------------------------------------------

DIN = 12


def attention(x: np.ndarray, *, sizes: tuple[int, int, int] = (N * H,) * 3, bias: bool = True, mask=None,
              past=None, attn_bias=None, attrs: dict | None = None, outputs: int = 1,
              const: tuple[str, ...] = ()) -> list[np.ndarray]:
    dtype = x.dtype
    inputs = [("input", x), ("weights", rand(x.shape[-1], sum(sizes), dtype=dtype) * 0.5),
              ("bias", rand(sum(sizes), dtype=dtype) if bias else None), ("mask_index", mask), ("past", past),
              ("attention_bias", attn_bias)]
    attrs = {"num_heads": N, **(attrs or {})}
    if sizes[0] != sizes[2] or sizes[1] != sizes[2]:
        attrs["qkv_hidden_sizes"] = list(sizes)
    return check_against_ort("Attention", inputs, ["output", "present"][:outputs], attrs, const=const)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("uni", [0, 1])
@pytest.mark.parametrize("bias", [False, True])
def test_attention(dtype, uni, bias):
    attention(rand(B, S, DIN, dtype=dtype), bias=bias, attrs={"unidirectional": uni}, outputs=2)


ATT_MASKS = {
    "lengths": np.array([2, 3], np.int32),
    "ends_starts": np.array([3, 2, 1, 0], np.int32),
    "raw_2d": np.array([[1, 0, 1], [1, 1, 0]], np.int32),
    "raw_3d": (RNG.random((B, S, S)) > 0.3).astype(np.int32),
    "all_masked": np.array([[0, 0, 0], [1, 1, 1]], np.int32),
}


@pytest.mark.parametrize("mask", sorted(ATT_MASKS))
@pytest.mark.parametrize("uni", [0, 1])
def test_attention_mask_index(mask, uni):
    attention(rand(B, S, DIN), mask=ATT_MASKS[mask], attrs={"unidirectional": uni})


@pytest.mark.parametrize("attrs", [{"scale": 0.2}, {"mask_filter_value": -1e4 * 3}])
def test_attention_scale_and_filter_value(attrs):
    attention(rand(B, S, DIN), mask=ATT_MASKS["raw_2d"], attrs=attrs)


@pytest.mark.parametrize("sizes", [(16, 16, 8), (8, 8, 24)])
def test_attention_qkv_hidden_sizes(sizes):
    attention(rand(B, S, DIN), sizes=sizes, mask=ATT_MASKS["lengths"], const=("weights", "bias"))


@pytest.mark.parametrize("shape", [(B, N, S, S), (1, 1, S, S), (B, 1, S, S)])
def test_attention_bias_broadcast(shape):
    attention(rand(B, S, DIN), attn_bias=rand(*shape))


@pytest.mark.parametrize("uni", [0, 1])
@pytest.mark.parametrize("s", [1, S])
@pytest.mark.parametrize("mask", [False, True])
def test_attention_past(uni, s, mask):
    m = (RNG.random((B, P + s)) > 0.2).astype(np.int32) if mask else None
    attention(rand(B, s, DIN), past=rand(2, B, N, P, H), mask=m, attrs={"unidirectional": uni}, outputs=2)


@pytest.mark.parametrize("shape", [(B, 0, DIN), (0, S, DIN)])
def test_attention_empty(shape):
    attention(rand(*shape), outputs=2)


@pytest.mark.parametrize("case,match", [
    ("megatron_mask", "mask_index of shape \\[2, 1, 4, 4\\]: supported are"),
    ("do_rotary", "do_rotary=1: supported is 0"),
])
def test_attention_refused_forms(case, match):
    """Forms onnxruntime's CPU provider fails as well ("4D mask in attention cpu kernel is not
    supported", "Rotary embedding is not supported in Attention CPU kernel")."""
    x = rand(B, S, DIN)
    inputs = [("input", x), ("weights", rand(DIN, 3 * N * H)), ("bias", rand(3 * N * H))]
    attrs = {"num_heads": N}
    if case == "megatron_mask":
        inputs.append(("mask_index", np.tril(np.ones((B, 1, 4, 4), np.int32))))
    else:
        attrs["do_rotary"] = 1
    refused("Attention", inputs, ["output"], attrs, match, ort_runs=False)


# -- GroupQueryAttention -------------------------------------------------------------------------------

NQ, NKV, HG = 4, 2, 16  # onnxruntime's rotary wants heads of a multiple of 16
BUFFER = 8


def gqa(q: np.ndarray, k: np.ndarray | None, v: np.ndarray | None, seqlens: list[int], total: int, *,
        past: tuple | None = None, rotary: tuple | None = None, attn_bias=None, head_sink=None,
        attrs: dict | None = None, kv_heads: int = NKV, position_ids=None) -> list[np.ndarray]:
    inputs = [("query", q), ("key", k), ("value", v), ("past_key", None if past is None else past[0]),
              ("past_value", None if past is None else past[1]),
              ("seqlens_k", np.array(seqlens, np.int32)),
              ("total_sequence_length", np.array(total, np.int32)),
              ("cos_cache", None if rotary is None else rotary[0]),
              ("sin_cache", None if rotary is None else rotary[1]), ("position_ids", position_ids),
              ("attention_bias", attn_bias), ("head_sink", head_sink)]
    attrs = {"num_heads": NQ, "kv_num_heads": kv_heads, **(attrs or {})}
    if rotary is not None:
        attrs.setdefault("do_rotary", 1)
    return check_against_ort("GroupQueryAttention", inputs, ["output", "present_key", "present_value"], attrs)


def gqa_qkv(b: int = B, s: int = S, dtype: type = np.float32, kv_heads: int = NKV) -> tuple:
    return rand(b, s, NQ * HG, dtype=dtype), rand(b, s, kv_heads * HG, dtype=dtype), rand(b, s, kv_heads * HG,
                                                                                            dtype=dtype)


def gqa_past(b: int = B, buffer: int = BUFFER, dtype: type = np.float32) -> tuple:
    return rand(b, NKV, buffer, HG, dtype=dtype), rand(b, NKV, buffer, HG, dtype=dtype)


def cache(dtype: type = np.float32, half: int = HG // 2) -> tuple:
    return rand(32, half, dtype=dtype), rand(32, half, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("seqlens", [[S - 1, S - 1], [1, S - 1]], ids=["full", "right_padded"])
@pytest.mark.parametrize("kv_heads", [NKV, NQ, 1])
def test_gqa_prompt(dtype, seqlens, kv_heads):
    gqa(*gqa_qkv(dtype=dtype, kv_heads=kv_heads), seqlens, S, kv_heads=kv_heads)


def test_gqa_packed_qkv():
    q, k, v = gqa_qkv()
    gqa(np.concatenate([q, k, v], axis=-1), None, None, [S - 1, S - 1], S)


@pytest.mark.parametrize("total", [5, 7, 12])
@pytest.mark.parametrize("buffer", [4, BUFFER])
def test_gqa_decode_with_past(total, buffer):
    """One new position after a past of seqlens_k positions; total_sequence_length above the
    past buffer grows present, below it present is the buffer's length (shared buffer)."""
    if total - 1 > buffer + 1:
        buffer = total
    gqa(*gqa_qkv(s=1), [total - 1, total - 3], total, past=gqa_past(buffer=buffer))


def test_gqa_prompt_with_a_past_buffer_and_a_chunk():
    """total_sequence_length equal to S: a first prompt (past ignored); a later chunk of S > 1
    (onnxruntime wants batch 1 then)."""
    gqa(*gqa_qkv(), [S - 1, S - 2], S, past=gqa_past())
    gqa(*gqa_qkv(b=1), [6], 7, past=gqa_past(b=1))


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("step", ["prompt", "decode", "packed"])
def test_gqa_rotary(interleaved, step):
    attrs = {"rotary_interleaved": interleaved}
    if step == "decode":
        gqa(*gqa_qkv(s=1), [4, 2], 5, past=gqa_past(), rotary=cache(), attrs=attrs)
    elif step == "packed":
        gqa(np.concatenate(gqa_qkv(), axis=-1), None, None, [S - 1, 1], S, rotary=cache(), attrs=attrs)
    else:
        gqa(*gqa_qkv(), [S - 1, 1], S, rotary=cache(), attrs=attrs)


@pytest.mark.parametrize("attrs", [{"local_window_size": 2}, {"softcap": 2.0}, {"scale": 0.2}, {"causal": 0},
                                   {"smooth_softmax": 1}])
@pytest.mark.parametrize("step", ["prompt", "decode"])
def test_gqa_attributes(attrs, step):
    if step == "prompt":
        gqa(*gqa_qkv(s=5), [4, 3], 5, attrs=attrs)
    else:
        gqa(*gqa_qkv(s=1), [6, 2], 7, past=gqa_past(), attrs=attrs)


@pytest.mark.parametrize("shape", [(B, NQ, 1, 7), (1, 1, 1, 7), (B, 1, 1, 7)])
def test_gqa_attention_bias_over_the_total_length(shape):
    gqa(*gqa_qkv(s=1), [6, 4], 7, past=gqa_past(), attn_bias=rand(*shape))


@pytest.mark.parametrize("rotary", [True, False])
def test_gqa_position_ids(rotary):
    """position_ids (B, S) place the rotary angles (onnxruntime uses them); without do_rotary
    they change nothing."""
    ids = np.array([[7], [3]], np.int64)
    gqa(*gqa_qkv(s=1), [4, 2], 5, past=gqa_past(), rotary=cache() if rotary else None, position_ids=ids)
    gqa(*gqa_qkv(b=1), [S - 1], S, rotary=cache() if rotary else None,
        position_ids=np.array([[5, 6, 7]], np.int64))


def test_gqa_head_sink():
    gqa(*gqa_qkv(), [S - 1, S - 1], S, head_sink=rand(NQ))


@pytest.mark.parametrize("case,match", [
    ("quantized_cache", "k_quant_type='PER_TENSOR': supported is 'NONE'"),
    ("qk_output", "qk_output=1: supported is 0"),
    ("window_and_softcap", "local_window_size=3 and softcap=5.0 together"),
    ("position_ids_per_batch", "position_ids and query of shape \\[2, 3, 64\\]: supported with batch 1"),
])
def test_gqa_refused_forms(case, match):
    q, k, v = gqa_qkv()
    inputs = [("query", q), ("key", k), ("value", v), ("past_key", None), ("past_value", None),
              ("seqlens_k", np.array([S - 1, S - 1], np.int32)),
              ("total_sequence_length", np.array(S, np.int32))]
    attrs = {"num_heads": NQ, "kv_num_heads": NKV}
    if case == "quantized_cache":
        attrs["k_quant_type"] = "PER_TENSOR"
    elif case == "qk_output":
        attrs["qk_output"] = 1
    elif case == "window_and_softcap":
        attrs.update(local_window_size=3, softcap=5.0)
    else:
        cos, sin = cache()
        inputs += [("cos_cache", cos), ("sin_cache", sin), ("position_ids", np.array([[0, 1, 2], [5, 6, 7]]))]
        attrs["do_rotary"] = 1
    refused("GroupQueryAttention", inputs, ["output"], attrs, match,
            ort_runs=case in ("window_and_softcap", "position_ids_per_batch"))


# -- in a model -------------------------------------------------------------------------------------


def decoder_step() -> tuple:
    """A decoder step as the generative-model builders write it: MatMulNBits projections,
    RotaryEmbedding of queries and keys, GroupQueryAttention over a past cache, then
    MultiHeadAttention over the result (cross attention to an encoder's states)."""
    import onnx
    from onnx import helper

    from tests.numpy.contrib_support import OPSETS
    from tests.numpy.test_contrib_quantized import quantize

    d, kv, s, past = NQ * HG, NKV * HG, 2, 5
    wq, sq, zq = quantize(rand(d, d), 4, 32, "uint8")
    wk, sk, _ = quantize(rand(kv, d), 4, 32, "none")
    cos, sin = cache()
    consts = {"wq": wq, "sq": sq, "zq": zq, "wk": wk, "sk": sk, "cos": cos, "sin": sin,
              "pos": np.array([past], np.int64), "seqlens": np.array([past + s - 1], np.int32),
              "total": np.array(past + s, np.int32)}
    n = helper.make_node
    nodes = [
        n("MatMulNBits", ["x", "wq", "sq", "zq"], ["q"], domain=MS, K=d, N=d, bits=4, block_size=32),
        n("MatMulNBits", ["x", "wk", "sk"], ["k"], domain=MS, K=d, N=kv, bits=4, block_size=32),
        n("RotaryEmbedding", ["q", "pos", "cos", "sin"], ["qr"], domain=MS, num_heads=NQ),
        n("RotaryEmbedding", ["k", "pos", "cos", "sin"], ["kr"], domain=MS, num_heads=NKV),
        n("GroupQueryAttention", ["qr", "kr", "k", "past_k", "past_v", "seqlens", "total"],
          ["attn", "present_k", "present_v"], domain=MS, num_heads=NQ, kv_num_heads=NKV),
        n("MultiHeadAttention", ["attn", "enc", "enc"], ["y"], domain=MS, num_heads=NQ),
    ]
    f = onnx.TensorProto.FLOAT
    feeds = {"x": rand(1, s, d), "past_k": rand(1, NKV, past, HG), "past_v": rand(1, NKV, past, HG),
             "enc": rand(1, 4, d)}
    graph = helper.make_graph(
        nodes, "decoder_step", [helper.make_tensor_value_info(k, f, list(v.shape)) for k, v in feeds.items()],
        [helper.make_tensor_value_info(o, f, None) for o in ("y", "present_k", "present_v")],
        [onnx.numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(dm, v) for dm, v in OPSETS.items()])
    return model, feeds


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("backends", [None, ["numpy"]], ids=["default", "numpy"])
def test_a_decoder_step_runs_as_onnxruntime_runs_it(backends, dynamic):
    model, feeds = decoder_step()
    if dynamic:  # the sequence, past and encoder lengths named, not fixed
        for i in model.graph.input:
            axis = {"x": 1, "past_k": 2, "past_v": 2, "enc": 1}[i.name]
            i.type.tensor_type.shape.dim[axis].dim_param = f"{i.name}_len"
    ours, theirs = run_ours(model, feeds, backends), run_ort(model, feeds)
    for o, t in zip(ours, theirs):
        assert o.shape == t.shape and o.dtype == t.dtype
        np.testing.assert_allclose(o, t, rtol=1e-4, atol=1e-4)
