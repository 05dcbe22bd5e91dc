"""Reading a decoder's signature, and the errors of everything that is not one or is fed wrongly:
each says what it received and what it expected."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from dispatch.errors import ArgumentError, FeedError, ModelLoadError, PlanError
from dispatch.generation.decoder_io import read_decoder
from dispatch.generation.generate import Generator
from dispatch.generation.kv_cache import CapacityError
from dispatch.generation.ways import available_step_ways, step_way
from dispatch.session import Session
from tests.generation.decoders import MODELS, PROMPT, WAYS, merged


def test_signatures_of_the_two_families():
    gpt2 = read_decoder(str(MODELS["gpt2"]))
    assert (gpt2.layers, gpt2.heads, gpt2.head_size, gpt2.vocab) == (2, 4, 16, 256)
    assert (gpt2.input_ids, gpt2.attention_mask, gpt2.position_ids) == \
        ("input_ids", "attention_mask", None)
    assert gpt2.dtype == np.float32 and {t.past_axis for t in gpt2.cache} == {2}
    assert [(t.layer, t.kind, t.present) for t in gpt2.cache[:2]] == \
        [(0, "key", "present.0.key"), (0, "value", "present.0.value")]
    llama = read_decoder(onnx.load(str(MODELS["llama"])))
    assert (llama.layers, llama.heads, llama.head_size) == (2, 2, 16)  # 2 key/value heads of 4
    assert llama.position_ids == "position_ids"
    assert llama.past_bytes(1, 10) == 4 * 2 * 10 * 16 * 4
    assert "2 layers" in llama.describe() and "position_ids" in llama.describe()


def _renamed(path, rename) -> onnx.ModelProto:
    """The model with its inputs and outputs renamed by ``rename(name) -> name``."""
    model = onnx.load(str(path))
    names = {v.name: rename(v.name) for v in [*model.graph.input, *model.graph.output]}
    for value in [*model.graph.input, *model.graph.output]:
        value.name = names[value.name]
    for node in model.graph.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        node.output[:] = [names.get(n, n) for n in node.output]
    return model


def test_other_spellings_of_the_cache_generate_the_same(reference_tokens):
    def older(name: str) -> str:  # past_key.0 / present_value.1, as some exporters write them
        parts = name.split(".")
        if parts[0] == "past_key_values":
            return f"past_{parts[2]}.{parts[1]}"
        if parts[0] == "present":
            return f"present_{parts[2]}.{parts[1]}"
        return name

    model = _renamed(MODELS["llama"], older)
    io = read_decoder(model)
    assert io.cache[1].past == "past_value.0" and io.cache[1].present == "present_value.0"
    assert Generator(model, "onnxruntime-iobinding").generate(PROMPT, 32).tolist() == \
        reference_tokens["llama"][:32]


@pytest.mark.parametrize("way", WAYS)
def test_an_optimum_style_merged_decoder_is_fed_its_cache_branch(way, reference_tokens):
    model = merged(MODELS["llama"])
    onnx.checker.check_model(model)
    assert read_decoder(model).cache_branch == "use_cache_branch"
    assert Generator(model, way).generate(PROMPT, 32).tolist() == reference_tokens["llama"][:32]


def test_a_model_that_is_no_decoder_says_what_it_has():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]))
    with pytest.raises(ModelLoadError, match=r"not a decoder.*no past key/value inputs.*Expected.*"
                                             r"past_key_values\.N\.key.*Found inputs: x float32\[1, 8\]"):
        read_decoder(model)
    with pytest.raises(ModelLoadError, match="no past key/value inputs"):
        Session(model, backends=["numpy"]).generate([1, 2], 3)


def test_a_present_missing_for_one_layer_is_named():
    model = onnx.load(str(MODELS["gpt2"]))
    kept = [o for o in model.graph.output if o.name != "present.1.value"]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    with pytest.raises(ModelLoadError, match=r"do not pair up \(unpaired: layer 1 value\)"):
        read_decoder(model)


def test_an_input_a_step_cannot_fill_is_named():
    model = onnx.load(str(MODELS["gpt2"]))
    model.graph.input.append(helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, [1, 3]))
    with pytest.raises(ModelLoadError, match=r"cannot fill: pixel_values float32\[1, 3\]"):
        read_decoder(model)


def test_prompts_beyond_the_capacity_are_refused_with_the_maximum():
    gen = Generator(MODELS["gpt2"], "onnxruntime-iobinding", max_length=10)
    with pytest.raises(CapacityError, match="the prompt has 11 tokens .* at most 10 positions"):
        gen.prefill(list(range(11)))
    gen.prefill(PROMPT)
    gen.step([1])
    gen.step([2])
    with pytest.raises(CapacityError, match=r"would hold 11 positions \(10 held, 1 new\).* maximum is 10"):
        gen.step([3])
    assert gen.length == 10  # the refused step changed nothing
    # generate makes room for the prompt and the new tokens
    assert len(gen.generate(PROMPT, 30)) == 30 and gen.max_length == len(PROMPT) + 30


@pytest.mark.parametrize("tokens, message", [
    (np.array(PROMPT, np.float32), "integer token ids .int64., received float32"),
    (np.array([PROMPT, PROMPT]), "2 rows: a generator runs batch 1"),
    ([5, 300], r"outside the vocabulary 0\.\.255 \(received 5\.\.300\)"),
    (np.zeros((1, 0), np.int64), r"received shape \[1, 0\]"),
])
def test_bad_prompts_say_what_was_received(tokens, message):
    gen = Generator(MODELS["llama"], "onnxruntime", max_length=32)
    with pytest.raises(FeedError, match=message):
        gen.prefill(tokens)
    with pytest.raises(FeedError, match=message):
        gen.generate(tokens, 4)


def test_misuse_of_the_step_api_and_the_sampler():
    gen = Generator(MODELS["llama"], "onnxruntime-iobinding", max_length=32)
    with pytest.raises(ArgumentError, match="step.. before prefill"):
        gen.step([1])
    with pytest.raises(ArgumentError, match="max_new_tokens must be at least 1, received 0"):
        gen.generate(PROMPT, 0)
    with pytest.raises(ArgumentError, match="top_p must be in .0, 1., received 1.5"):
        gen.generate(PROMPT, 4, do_sample=True, top_p=1.5)
    with pytest.raises(ArgumentError, match="temperature must be > 0, received 0"):
        gen.generate(PROMPT, 4, do_sample=True, temperature=0)


def test_unknown_and_unavailable_ways_list_the_available():
    with pytest.raises(PlanError, match=r"'onnxruntime-turbo': unknown; available here: .*"
                                        r"onnxruntime-iobinding.*every step way: "):
        step_way("onnxruntime-turbo")
    session = Session(str(MODELS["gpt2"]), backends=["numpy"])
    assert session.step_ways() == []
    with pytest.raises(PlanError, match="'onnxruntime': its library is not available here"):
        session.generate(PROMPT, 4, way="onnxruntime")
    with pytest.raises(PlanError, match="no step way is available here"):
        session.generate(PROMPT, 4)
    assert list(available_step_ways())[:2] == ["onnxruntime-iobinding", "onnxruntime"]
