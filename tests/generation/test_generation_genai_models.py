"""Decoders as onnxruntime-genai's model builder writes them (issue 53): GroupQueryAttention with
the rotary inside, SkipSimplifiedLayerNormalization, past tensors whose head size is symbolic
(``kv_cache_dim``), and MatMulNBits 4-bit weights for ``int4`` (tests/models/decoders/
make_genai_tiny.py made them from the same seeded weights as llama_tiny.onnx)."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch.generation.decoder_io import read_decoder
from dispatch.generation.generate import Generator
from tests.generation.decoders import DECODERS, PROMPT, WAYS

GENAI = DECODERS / "llama_tiny_genai" / "model.onnx"
GENAI_INT4 = DECODERS / "llama_tiny_genai_int4" / "model.onnx"


def _reference(path, prompt: list[int], new_tokens: int, heads: int = 2, head: int = 16) -> list[int]:
    """Greedy tokens from onnxruntime's plain ``run``, presents fed back (the head size given:
    the file leaves it symbolic)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs = [o.name for o in session.get_outputs()]
    pasts = [i.name for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    past = {n: np.zeros((1, heads, 0, head), np.float32) for n in pasts}
    feed, length, tokens = np.array([prompt], np.int64), 0, []
    for _ in range(new_tokens):
        n = feed.shape[1]
        results = dict(zip(outputs, session.run(None, {
            "input_ids": feed, "attention_mask": np.ones((1, length + n), np.int64), **past})))
        past = {p: results[p.replace("past_key_values.", "present.")] for p in pasts}
        length += n
        tokens.append(int(results["logits"][0, -1].argmax()))
        feed = np.array([[tokens[-1]]], np.int64)
    return tokens


def test_the_builders_symbolic_head_size_is_read_from_its_attention_nodes():
    io = read_decoder(str(GENAI))
    assert len(io.cache) == 4  # 2 layers, key and value
    assert {t.shape[1] for t in io.cache} == {2} and {t.shape[3] for t in io.cache} == {16}


@pytest.mark.parametrize("way", WAYS)
def test_the_builders_float32_model_generates_the_exporters_tokens(way, reference_tokens):
    """Same weights as llama_tiny.onnx through another tool: the same 128 greedy tokens."""
    assert Generator(str(GENAI), way).generate(PROMPT, 128).tolist() == reference_tokens["llama"]


@pytest.mark.parametrize("way", ["onnxruntime-iobinding", "onnxruntime"])
def test_the_builders_int4_model_generates_onnxruntimes_tokens(way):
    """OpenVINO 2026.4 cannot convert this file (GatherBlockQuantized of the 4-bit embedding,
    SimplifiedLayerNormalization's scale type): its ways fail to build, which the tuner records
    as a rejection."""
    want = _reference(GENAI_INT4, PROMPT, 64)
    assert Generator(str(GENAI_INT4), way).generate(PROMPT, 64).tolist() == want
