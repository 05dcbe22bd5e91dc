"""Reduced-precision weight plans of a decoder (issue 53): the int8 / 4-bit variants made by
onnxruntime's tools (dispatch/generation/weights.py), their accuracy against float32
(tuner/generation/precision.py), and the generation plan that runs one (tune_generate with an
accuracy budget, the store, the rebuilt variant). Tiny 2-layer decoders only; no timing."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

from dispatch.errors import PlanError
from dispatch.generation.generate import Generator
from dispatch.generation.plan import GenerationPlan, StepChoice
from dispatch.generation.weights import WeightRecipe, ensure_variant, file_digest, gemm_as_matmul
from tests.generation.decoders import MODELS, PROMPT
from tuner.generation import tune_generate as tg
from tuner.generation.precision import (
    GenerationAccuracy,
    Reference,
    load_prompts,
    reference_runs,
    variant_accuracy,
)
from tuner.tune_types import TuningError

INT8 = WeightRecipe("int8", head=True)
INT4 = WeightRecipe("int4", head=True, block_size=32, accuracy_level=4)


def _ops(path) -> Counter:
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node)


@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.parametrize("recipe", [INT8, INT4, WeightRecipe("int4", head=False, block_size=128,
                                                             accuracy_level=0)],
                         ids=lambda r: r.spec)
def test_variants_build_run_and_are_cached(family, recipe, tmp_path):
    path, made = ensure_variant(MODELS[family], recipe, folder=tmp_path)
    assert made and path.is_file() and path.parent == tmp_path
    ops = _ops(path)
    quantized = ops["MatMulInteger"] if recipe.kind == "int8" else ops["MatMulNBits"]
    assert quantized >= 2 * 4  # the 2 blocks' projections at least
    tokens = Generator(str(path), "onnxruntime-iobinding", max_length=32).generate(PROMPT, 8)
    assert len(tokens) == 8 and tokens.min() >= 0 and tokens.max() < 256
    again, made_again = ensure_variant(MODELS[family], recipe, folder=tmp_path)
    assert again == path and not made_again


def test_the_head_is_quantized_only_when_the_recipe_says_so(tmp_path):
    with_head, _ = ensure_variant(MODELS["gpt2"], INT8, folder=tmp_path)
    without, _ = ensure_variant(MODELS["gpt2"], WeightRecipe("int8", head=False), folder=tmp_path)
    names = {n.name: n.op_type for n in onnx.load(str(without)).graph.node}
    assert names.get("/model/lm_head/MatMul") == "MatMul"  # left in float32
    assert "/model/lm_head/MatMul" not in {n.name for n in onnx.load(str(with_head)).graph.node}
    assert _ops(with_head)["MatMulInteger"] == _ops(without)["MatMulInteger"] + 1


def test_gemm_rewritten_as_matmul_computes_the_same(tmp_path):
    model = onnx.load(str(MODELS["gpt2"]))
    assert gemm_as_matmul(model) == 8  # 4 Conv1D Gemms per block, 2 blocks
    assert not any(n.op_type == "Gemm" for n in model.graph.node)
    rewritten = tmp_path / "matmul.onnx"
    onnx.save(model, str(rewritten))
    a = Generator(str(MODELS["gpt2"]), "onnxruntime", max_length=16)
    b = Generator(str(rewritten), "onnxruntime", max_length=16)
    np.testing.assert_allclose(b.prefill(PROMPT).copy(), a.prefill(PROMPT).copy(), rtol=1e-5,
                               atol=1e-5)


def test_a_variant_identical_to_float32_agrees_fully():
    gen = Generator(str(MODELS["llama"]), "onnxruntime-iobinding", max_length=64)
    refs = reference_runs(gen, [np.array(PROMPT), np.arange(3, 20)], 12)
    same = Generator(str(MODELS["llama"]), "onnxruntime", max_length=64)
    acc = variant_accuracy(same, refs)
    assert acc.tokens == 1.0 and acc.prefix == 1.0 and acc.cosine == pytest.approx(1.0, abs=1e-6)
    assert len(acc.per_prompt) == 2


class _Scripted:
    """A generator whose logits at each position are float32's, except at ``wrong`` where
    another token wins: its teacher-forced agreement and free-running prefix are known."""

    def __init__(self, ref: Reference, wrong: int) -> None:
        self.ref, self.wrong, self.pos = ref, wrong, 0
        self.io = SimpleNamespace(vocab=ref.logits.shape[1])

    def _row(self) -> np.ndarray:
        row = self.ref.logits[self.pos].copy()
        if self.pos == self.wrong:
            row[(int(self.ref.tokens[self.pos]) + 1) % len(row)] = row.max() + 1.0
        self.pos += 1
        return row[None, None]

    def prefill(self, _prompt) -> np.ndarray:
        self.pos = 0
        return self._row()

    def step(self, _tokens) -> np.ndarray:
        return self._row()

    def generate(self, prompt, n) -> np.ndarray:
        out = [int(np.argmax(self.prefill(prompt)[0, -1]))]
        while len(out) < n:
            out.append(int(np.argmax(self.step([out[-1]])[0, -1])))
        return np.array(out)


def test_teacher_forced_and_free_running_figures():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(8, 50)).astype(np.float32)
    ref = Reference(np.array([1, 2, 3]), logits.argmax(-1), logits)
    acc = variant_accuracy(_Scripted(ref, wrong=2), [ref])
    assert acc.tokens == pytest.approx(7 / 8)  # one position of 8 differs when teacher-forced
    assert acc.prefix == pytest.approx(2 / 8)  # the free run differs first at step 3
    assert acc.cosine < 1.0
    assert GenerationAccuracy.parse("tokens:0.8").passes(acc)
    assert not GenerationAccuracy.parse("tokens:0.9").passes(acc)
    assert not GenerationAccuracy.parse("prefix:0.5").passes(acc)


@pytest.mark.parametrize("text", ["tokens:1.5", "loss:0.1", "cosine:0", "tokens"])
def test_an_accuracy_spec_out_of_range_says_what_is_expected(text):
    with pytest.raises(TuningError, match="expected METRIC:BUDGET") as err:
        GenerationAccuracy.parse(text)
    assert repr(text) in str(err.value)


def test_prompts_from_npz_drop_padding_and_fold_the_vocabulary(tmp_path):
    ids = np.array([[101, 7, 300, 102, 0, 0], [101, 5, 102, 0, 0, 0]])
    mask = (ids != 0).astype(np.int64)
    np.savez(tmp_path / "p.npz", input_ids=ids[:, None], attention_mask=mask[:, None])
    prompts = load_prompts(tmp_path / "p.npz", vocab=256)
    assert [p.tolist() for p in prompts] == [[101, 7, 300 % 256, 102], [101, 5, 102]]
    np.save(tmp_path / "p.npy", ids)
    assert len(load_prompts(tmp_path / "p.npy", vocab=256, limit=1)) == 1
    np.save(tmp_path / "f.npy", ids.astype(np.float32))
    with pytest.raises(TuningError, match="integer token ids"):
        load_prompts(tmp_path / "f.npy", vocab=256)


def test_the_plan_round_trips_its_recipe_and_stays_backward_compatible():
    plan = GenerationPlan(StepChoice("onnxruntime"), StepChoice("onnxruntime"),
                          precision=INT4.spec, recipe=INT4.to_dict(), accuracy={"tokens": 0.97})
    again = GenerationPlan.from_dict(plan.to_dict())
    assert again == plan and WeightRecipe.from_dict(again.recipe) == INT4
    old = {"prefill": {"way": "onnxruntime", "threads": None},
           "decode": {"way": "onnxruntime", "threads": None}}
    assert GenerationPlan.from_dict(old).precision == "float32"
    with pytest.raises(PlanError, match="precision"):
        GenerationPlan.from_dict({**old, "precision": "int8-pc-head"})
    with pytest.raises(PlanError, match="kind"):
        GenerationPlan.from_dict({**old, "precision": "x", "recipe": {"kind": "int3"}})


def _tune(tmp_path, accuracy: str, recipes, **kw):
    return tg.tune_generate(MODELS["gpt2"], prompt_len=4, new_tokens=4, budget_s=2.0,
                            store=str(tmp_path / "plans.sqlite"), accuracy=accuracy,
                            prompts=[np.array(PROMPT)], accuracy_steps=8, recipes=recipes,
                            variant_folder=tmp_path / "variants", **kw)


def test_an_impossible_budget_rejects_every_variant_and_keeps_float32(tmp_path):
    result = _tune(tmp_path, "cosine:1", [INT8, INT4], backends=["onnxruntime"])
    plan = result.generation
    assert plan.precision == "float32" and plan.recipe is None
    for recipe in (INT8, INT4):
        figures = plan.measured[f"weights {recipe.spec}"]
        assert "over the accuracy budget: cosine" in figures["rejected"]
        assert f"{figures['accuracy']['cosine']:.4f}" in figures["rejected"]
        assert recipe.spec in plan.why["precision"]
    assert not any(label.startswith(("int8", "int4")) for label in plan.measured)  # never timed
    assert result.plan_id is not None
    assert "+accuracy=cosine:1,data=" in result.key.objective


def test_a_variant_plan_is_stored_apart_and_rebuilt_when_its_file_is_gone(tmp_path, monkeypatch):
    from dispatch.backend import load_registry
    from dispatch.generation.planned import planned_generator

    choose = tg.choose_precision
    monkeypatch.setattr(tg, "choose_precision", lambda cands, p, n: choose(
        [c for c in cands if c.precision != "float32"], p, n))  # the variant wins, whatever its speed
    result = _tune(tmp_path, "tokens:0", [INT8])
    assert result.generation.precision == INT8.spec and result.plan_id is not None
    registry = load_registry(None)
    store = str(tmp_path / "plans.sqlite")
    plan, note = tg.stored_generation_plan(str(MODELS["gpt2"]), store, registry, result.key.objective)
    assert plan is not None and plan.recipe == INT8.to_dict(), note
    assert tg.stored_generation_plan(str(MODELS["gpt2"]), store, registry)[0] is None  # float32 key
    folder = tmp_path / "variants"
    gen = planned_generator(str(MODELS["gpt2"]), plan, max_length=32, registry=registry,
                            variant_folder=folder)
    variant = gen.io.path
    assert variant.startswith(str(folder)) and INT8.spec in variant
    first = gen.generate(PROMPT, 8)
    del gen
    (folder / variant.rsplit("/", 1)[1]).unlink()
    again = planned_generator(str(MODELS["gpt2"]), plan, max_length=32, registry=registry,
                              variant_folder=folder, digest=file_digest(MODELS["gpt2"]))
    assert again.io.path == variant and (folder / variant.rsplit("/", 1)[1]).is_file()
    assert np.array_equal(again.generate(PROMPT, 8), first)
