"""Every step way generates what the exported model generates step by step with onnxruntime
(greedy, 128 tokens, float32), seeded sampling repeats itself, stop tokens end early, and the
step API a serving loop calls composes to the same tokens."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch.generation.generate import Generator
from dispatch.session import Session
from tests.generation.decoders import MODELS, PROMPT, WAYS


@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.parametrize("way", WAYS)
def test_greedy_tokens_equal_onnxruntime_step_by_step(family, way, reference_tokens):
    gen = Generator(MODELS[family], way, max_length=len(PROMPT) + 128)
    tokens = gen.generate(PROMPT, 128)
    assert tokens.dtype == np.int64
    assert tokens.tolist() == reference_tokens[family]
    assert len(set(reference_tokens[family])) > 10  # the tiny models do not repeat one token
    # a second generation on the same generator starts afresh
    assert gen.generate(PROMPT, 128).tolist() == reference_tokens[family]


@pytest.mark.parametrize("way", WAYS)
def test_step_api_composes_to_generate(way, reference_tokens):
    gen = Generator(MODELS["llama"], way, max_length=64)
    logits = gen.prefill(np.array([PROMPT]))
    assert logits.shape == (1, len(PROMPT), gen.io.vocab)
    assert gen.length == len(PROMPT)
    tokens = [int(logits[0, -1].argmax())]
    for _ in range(15):
        logits = gen.step([tokens[-1]])
        assert logits.shape == (1, 1, gen.io.vocab)
        tokens.append(int(logits[0, -1].argmax()))
    assert gen.length == len(PROMPT) + 15
    assert tokens == reference_tokens["llama"][:16]
    # several tokens in one step: the prompt's tail fed after its head gives the same next token
    gen.reset()
    gen.prefill(PROMPT[:3])
    logits = gen.step(PROMPT[3:])
    assert logits.shape == (1, len(PROMPT) - 3, gen.io.vocab)
    assert int(logits[0, -1].argmax()) == reference_tokens["llama"][0]


@pytest.mark.parametrize("way", WAYS)
def test_seeded_sampling_repeats_and_differs_by_seed(way):
    gen = Generator(MODELS["gpt2"], way, max_length=64)
    kwargs = {"do_sample": True, "temperature": 0.8, "top_k": 50, "top_p": 0.95}
    first = gen.generate(PROMPT, 40, seed=7, **kwargs)
    again = gen.generate(PROMPT, 40, seed=7, **kwargs)
    other = gen.generate(PROMPT, 40, seed=8, **kwargs)
    assert first.tolist() == again.tolist()
    assert first.tolist() != other.tolist()
    # same seed, another way (and a fresh generator): the same tokens
    assert Generator(MODELS["gpt2"], "onnxruntime").generate(PROMPT, 40, seed=7, **kwargs).tolist() \
        == first.tolist()


def test_top_k_one_is_greedy(reference_tokens):
    gen = Generator(MODELS["gpt2"], "onnxruntime-iobinding", max_length=64)
    sampled = gen.generate(PROMPT, 30, do_sample=True, top_k=1, seed=3)
    assert sampled.tolist() == reference_tokens["gpt2"][:30]


@pytest.mark.parametrize("way", WAYS)
def test_stop_tokens_end_early(way, reference_tokens):
    want = reference_tokens["llama"]
    stop = want[20]
    first = want.index(stop)  # the first time the stop token comes
    gen = Generator(MODELS["llama"], way)
    tokens = gen.generate(PROMPT, 128, stop_tokens=[stop, 100000])
    assert tokens.tolist() == want[: first + 1]
    assert gen.length == len(PROMPT) + first  # the stop token itself was never run


def test_session_generate_picks_iobinding_and_takes_the_way(reference_tokens):
    session = Session(str(MODELS["gpt2"]), backends=["onnxruntime", "numpy"])
    assert session.step_ways()[:2] == ["onnxruntime-iobinding", "onnxruntime"]
    assert session.generate(PROMPT, 128).tolist() == reference_tokens["gpt2"]
    assert session.generator().way.name == "onnxruntime-iobinding"
    assert session.generate(np.array([PROMPT]), 20, way="onnxruntime").tolist() \
        == reference_tokens["gpt2"][:20]
    # the generator of a way is built once per session
    assert session.generator("onnxruntime") is session.generator("onnxruntime")


def test_concurrent_session_generations_take_turns(reference_tokens):
    from concurrent.futures import ThreadPoolExecutor

    session = Session(str(MODELS["llama"]), backends=["onnxruntime"])
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda n: session.generate(PROMPT, n).tolist(), [64, 32, 64, 48]))
    assert results == [reference_tokens["llama"][:n] for n in (64, 32, 64, 48)]
