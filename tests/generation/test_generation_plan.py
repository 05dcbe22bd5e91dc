"""Generation plans (issue 53): tuned by measurement, stored, found by a Session and by
``opdispatch run --generate``, split between two ways sharing one cache, and the bandwidth bound.
Tiny decoders only; no timing is asserted (which way wins is the machine's business: the tests
check that whatever won reproduces the reference's tokens)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dispatch.errors import PlanError
from dispatch.generation.plan import GenerationPlan, StepChoice
from dispatch.generation.planned import planned_generator, split_way
from dispatch.plan import Plan
from dispatch.session import Session
from tests.generation.decoders import HAS_OPENVINO, MODELS, PROMPT
from tuner.generation.bandwidth import bound_tokens_per_s, bytes_per_token, stream_bandwidth
from tuner.generation.tune_generate import Candidate, choose, tune_generate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tuned_store(tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("generation") / "plans.sqlite"
    tune_generate(MODELS["gpt2"], prompt_len=8, new_tokens=24, budget_s=4.0, store=str(store))
    return store


def test_the_tuned_plan_is_stored_and_a_session_generates_the_reference_tokens_with_it(
        tuned_store, reference_tokens):
    session = Session(str(MODELS["gpt2"]), store=str(tuned_store))
    plan, note = session.generation_plan()
    assert plan is not None, note
    assert note.startswith("stored generation plan")
    got = session.generate(PROMPT, 128)
    assert got.tolist() == reference_tokens["gpt2"]
    assert "plan" in session._generators  # the stored plan's generator ran, not a default way


def test_a_session_without_a_stored_plan_says_why_and_generates_on_the_default_way(
        tmp_path, reference_tokens):
    session = Session(str(MODELS["llama"]), store=str(tmp_path / "none.sqlite"))
    plan, note = session.generation_plan()
    assert plan is None and "no generation plan" in note
    assert session.generate(PROMPT, 32).tolist() == reference_tokens["llama"][:32]


def test_every_candidate_is_recorded_with_figures_or_its_rejection(tuned_store):
    from dispatch.backend import load_registry
    from tuner.generation.tune_generate import stored_generation_plan

    plan, _ = stored_generation_plan(str(MODELS["gpt2"]), str(tuned_store), load_registry())
    assert plan is not None
    assert plan.measured and all(("rejected" in f) or f["step_ms"] > 0 for f in plan.measured.values())
    assert plan.notes["bound_tokens_per_s"] > 0 and plan.notes["weights_bytes_per_token"] > 0
    assert plan.why["prefill"] and plan.why["decode"]


def test_a_generation_plan_round_trips_the_plan_json():
    gen = GenerationPlan(StepChoice("onnxruntime-iobinding"), StepChoice("openvino", 1),
                         {"prefill": "a", "decode": "b"}, {"x": {"rejected": "no"}},
                         {"prompt_len": 8})
    plan = Plan("g", [], [], generation=gen.to_dict())
    back = Plan.from_json(plan.to_json())
    assert back.generation_plan() == gen
    assert back.generation_plan().split
    assert "generation" not in Plan("g", [], []).to_dict()  # absent from other plans' JSON


@pytest.mark.parametrize("data", [
    [], {"prefill": {"way": "onnxruntime"}}, {"prefill": {"way": 3}, "decode": {"way": "x"}},
    {"prefill": {"way": "a", "threads": 0}, "decode": {"way": "b"}},
])
def test_a_malformed_generation_plan_is_refused_saying_what_was_received(data):
    with pytest.raises(PlanError, match="received"):
        GenerationPlan.from_dict(data)


@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")
@pytest.mark.parametrize("prompt_way,step_way", [("onnxruntime-iobinding", "openvino"),
                                                 ("openvino", "onnxruntime-iobinding")])
def test_a_split_plan_hands_one_cache_from_the_prompt_to_the_steps(prompt_way, step_way,
                                                                     reference_tokens):
    plan = GenerationPlan(StepChoice(prompt_way), StepChoice(step_way, 1))
    gen = planned_generator(MODELS["gpt2"], plan, max_length=len(PROMPT) + 128)
    assert gen.generate(PROMPT, 128).tolist() == reference_tokens["gpt2"]
    runner = gen.runner
    assert runner.prompt.kv is runner.kv and runner.steps.kv is runner.kv
    allocated = runner.kv.allocations
    assert allocated == 2 * len(gen.io.cache)  # one pair of buffers per past tensor
    gen.generate(PROMPT, 64)
    assert runner.kv.allocations == allocated  # the second generation reuses them


def test_a_split_needs_both_ways_to_write_into_the_cache():
    with pytest.raises(PlanError, match=r"\['onnxruntime'\]"):
        split_way(StepChoice("onnxruntime"), StepChoice("onnxruntime-iobinding"))


def _cand(way: str, prefill: float, step: float, binds: bool = True) -> Candidate:
    """A candidate with fixed figures (a fake measurement: these tests check the choice, not a
    library)."""
    return Candidate(way, None, binds, [prefill, prefill], [step, step])


def test_the_choice_splits_only_when_two_ways_save_more_than_the_split_cost():
    fast_prompt, fast_steps = _cand("a", 10.0, 5.0), _cand("b", 40.0, 2.0)
    plan = choose([fast_prompt, fast_steps], prompt_len=32, new_tokens=128)
    assert (plan.prefill.way, plan.decode.way) == ("a", "b") and "split" in plan.why
    # steps that save almost nothing: one way for both
    plan = choose([_cand("a", 10.0, 2.01), _cand("b", 12.0, 2.0)], prompt_len=32, new_tokens=128)
    assert plan.prefill == plan.decode and "single" in plan.why
    # a way that keeps its own cache cannot take part in a split
    plan = choose([_cand("a", 10.0, 5.0, binds=False), _cand("b", 40.0, 2.0)], 32, 128)
    assert plan.prefill == plan.decode == StepChoice("b")


def test_the_choice_refuses_when_every_candidate_was_rejected():
    from tuner.tune_types import TuningError

    bad = Candidate("a", None, True, rejected="greedy tokens differ")
    with pytest.raises(TuningError, match="greedy tokens differ"):
        choose([bad], 8, 16)


def test_bytes_per_token_counts_a_gathered_table_as_one_row():
    weights = bytes_per_token(str(MODELS["gpt2"]))
    assert 0 < weights.per_token < weights.total
    assert weights.gathered > 0  # the token and position tables
    bandwidth = stream_bandwidth(nbytes=8 * 2**20, repeats=2)
    assert bandwidth.gb_per_s > 0 and bandwidth.threads >= 1
    assert bound_tokens_per_s(bandwidth, weights) == pytest.approx(
        bandwidth.gb_per_s * 1e9 / weights.per_token)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_run_generate_prints_the_figures_and_the_bound_from_the_stored_plan(tuned_store):
    proc = _cli("run", str(MODELS["gpt2"]), "--generate", "16", "--prompt-len", "8", "--runs", "1",
                "--store", str(tuned_store), "--require-plan", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["ways"].startswith("stored generation plan")
    assert got["new_tokens"] == 16 and got["prompt_tokens"] == 8
    assert got["tokens_per_s"] > 0 and got["bound_tokens_per_s"] > 0
    assert "bandwidth bound" in proc.stderr


def test_run_generate_user_errors_exit_2_without_a_traceback(tmp_path):
    proc = _cli("run", str(MODELS["llama"]), "--generate", "8", "--require-plan", "--store",
                str(tmp_path / "empty.sqlite"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--require-plan" in proc.stderr and "tune" in proc.stderr
    proc = _cli("run", str(MODELS["gpt2"]), "--generate", "8", "--library", "nope")
    assert proc.returncode == 2 and "available here" in proc.stderr
    proc = _cli("run", str(MODELS["gpt2"]), "--prompt-len", "8")
    assert proc.returncode == 2 and "--generate" in proc.stderr
    proc = _cli("run", str(ROOT / "tests" / "models" / "decoders" / "README.md"), "--generate", "8")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_generation_is_not_found_for_another_model(tuned_store):
    session = Session(str(MODELS["llama"]), store=str(tuned_store))
    plan, note = session.generation_plan()
    assert plan is None and "no generation plan stored" in note
    np.testing.assert_array_equal(session.generate(PROMPT, 4), session.generate(PROMPT, 4))
