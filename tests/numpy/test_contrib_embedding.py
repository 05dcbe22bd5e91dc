"""numpy reference of onnxruntime's EmbedLayerNormalization (com.microsoft) against onnxruntime,
through a Session (issue 52): segment embeddings or not, masks (mask_index counts the ones),
position_ids of the batch or shared, epsilon, the optional outputs, float16, ids outside a
table, the refused forms."""

from __future__ import annotations

import numpy as np
import pytest

from tests.numpy.contrib_support import check_against_ort, feeds_of, one_node_model, run_ours

RNG = np.random.default_rng(52053)
B, S, H, V, P = 2, 5, 16, 30, 12


def rand(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return np.asarray(RNG.standard_normal(shape), dtype=dtype)


def ids(high: int, shape: tuple[int, ...] = (B, S)) -> np.ndarray:
    return RNG.integers(0, high, shape).astype(np.int32)


def inputs(segments: bool = True, mask: np.ndarray | None = None, position_ids: np.ndarray | None = None,
           dtype: type = np.float32) -> list:
    return [("input_ids", ids(V)), ("segment_ids", ids(2) if segments else None),
            ("word_embedding", rand(V, H, dtype=dtype)), ("position_embedding", rand(P, H, dtype=dtype)),
            ("segment_embedding", rand(2, H, dtype=dtype) if segments else None),
            ("gamma", rand(H, dtype=dtype)),
            ("beta", rand(H, dtype=dtype)), ("mask", mask), ("position_ids", position_ids)]


CONST = ("word_embedding", "position_embedding", "segment_embedding", "gamma", "beta")
MASKS = {"none": None, "padding": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32),
         "other_values": np.array([[1, 2, 1, 1, -1], [0, 0, 1, 0, 1]], np.int32)}


@pytest.mark.parametrize("segments", [True, False])
@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("epsilon", [None, 1e-5])
def test_embed_layer_norm(segments, mask, epsilon):
    """output, mask_index (the ones of each mask row; zeros without a mask) and embedding_sum."""
    attrs = {} if epsilon is None else {"epsilon": epsilon}
    check_against_ort("EmbedLayerNormalization", inputs(segments, MASKS[mask]), ["out", "mask_index", "sum"],
                      attrs, const=CONST)


@pytest.mark.parametrize("shape", [(B, S), (1, S)], ids=["batch", "shared"])
def test_embed_layer_norm_position_ids(shape):
    check_against_ort("EmbedLayerNormalization", inputs(position_ids=ids(P, shape)), ["out", "mask_index"],
                      const=CONST)


def test_embed_layer_norm_mask_index_only_outputs():
    """Two outputs (what the optimizer writes), and float16 tables."""
    check_against_ort("EmbedLayerNormalization", inputs(mask=MASKS["padding"], dtype=np.float16),
                      ["out", "mask_index"], const=CONST)


def test_embed_layer_norm_id_outside_the_table_is_an_error():
    from dispatch.errors import OpDispatchError

    given = inputs()
    given[0] = ("input_ids", np.full((B, S), V, np.int32))
    model = one_node_model("EmbedLayerNormalization", given, ["out", "mask_index"], const=CONST)
    with pytest.raises(OpDispatchError, match=f"input id {V} is outside the embedding's {V} rows"):
        run_ours(model, feeds_of(model, given))


def test_embed_layer_norm_one_output_runs_on_the_reference():
    """onnxruntime 1.32 fails to load the node without its mask_index output (its type inference
    writes output 1): its regions refuse it and the reference runs it in a default Session."""
    from dispatch.onnx_import import import_model
    from impls.onnxruntime.region import node_reason

    given = inputs()
    model = one_node_model("EmbedLayerNormalization", given, ["out"], const=CONST)
    assert "without the mask_index output" in (node_reason(import_model(model).nodes[0]) or "")
    (ours,) = run_ours(model, feeds_of(model, given), backends=None)
    (two,) = run_ours(one_node_model("EmbedLayerNormalization", given, ["out", "mask_index"], const=CONST),
                      feeds_of(model, given), backends=("numpy",))[:1]
    np.testing.assert_allclose(ours, two, rtol=1e-6, atol=1e-6)


def test_embed_layer_norm_segment_ids_without_their_table_is_refused():
    from dispatch.errors import OpDispatchError

    given = inputs()
    given[4] = ("segment_embedding", None)
    model = one_node_model("EmbedLayerNormalization", given, ["out", "mask_index"], const=CONST)
    with pytest.raises(OpDispatchError, match="only one of segment_ids and segment_embedding"):
        run_ours(model, feeds_of(model, given))


def qtable(arr: np.ndarray, dtype: type) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``arr`` quantized per tensor to ``dtype`` (onnxruntime's dynamic quantizer's way)."""
    info = np.iinfo(dtype)
    lo, hi = min(float(arr.min()), 0.0), max(float(arr.max()), 0.0)
    scale = np.float32((hi - lo) / (int(info.max) - int(info.min)))
    zero = np.asarray(np.clip(np.rint(info.min - lo / scale), info.min, info.max), dtype)
    q = np.clip(np.rint(arr / scale) + zero.astype(np.float64), info.min, info.max).astype(dtype)
    return q, np.asarray(scale, np.float32), zero


def qinputs(segments: bool, mask: np.ndarray | None, dtype: type) -> tuple[list, tuple[str, ...]]:
    floats = dict(inputs(segments, mask))
    q = {k: qtable(floats[k], dtype) for k in CONST if floats[k] is not None}

    def part(k: int) -> list:
        return [(f"{name}{('_quant', '_scale', '_zero_point')[k]}", q[name][k] if name in q else None)
                for name in CONST]

    given = [("input_ids", floats["input_ids"]), ("segment_ids", floats["segment_ids"])]
    given += [*part(0), ("mask", mask), *part(1), *part(2)]
    return given, tuple(n for n, a in given[2:] if a is not None and n != "mask")


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("segments", [True, False])
@pytest.mark.parametrize("mask", ["none", "padding", "other_values"])
def test_qembed_layer_norm(dtype, segments, mask):
    """QEmbedLayerNormalization (the dynamic QOperator quantizer's form): tables, gamma and beta
    uint8 or int8 with their zero points; layernorm_out and mask_index_out as onnxruntime's."""
    given, const = qinputs(segments, MASKS[mask], dtype)
    check_against_ort("QEmbedLayerNormalization", given, ["out", "mask_index"], const=const)


def test_qembed_layer_norm_without_a_zero_point_is_a_load_error_that_names_it():
    from dispatch.errors import ModelLoadError
    from dispatch.onnx_import import import_model

    given, const = qinputs(True, None, np.uint8)
    given = [(n, None if n == "gamma_zero_point" else a) for n, a in given]
    model = one_node_model("QEmbedLayerNormalization", given, ["out", "mask_index"], const=const)
    with pytest.raises(ModelLoadError, match="input 16 is marked single"):
        import_model(model)
