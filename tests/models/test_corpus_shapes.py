"""One Session, many shapes, on a real export (issue 14): the TorchScript BERT of the corpus
(inputs ``[batch, sequence]``) runs feeds of (1, 7), (1, 128) and (4, 64) in one Session, each
matching onnxruntime on every output; with plans tuned for two of the shapes, a
``require_plan`` Session runs those two from the store and names the third, with the shapes
that are stored, in its error. Nothing is timed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.models.corpus import feeds_for
from dispatch import Session
from dispatch.errors import PlanNotFoundError
from tuner.tune import TuneOptions, tune

ort = pytest.importorskip("onnxruntime")

BERT = Path(__file__).resolve().parent / "corpus" / "bert_torchscript.onnx"
SHAPES = [(1, 7), (1, 128), (4, 64)]


def _feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
    return feeds_for(BERT, dims={"batch": batch, "sequence": seq})[1]


def _check(got: list[np.ndarray], feeds: dict[str, np.ndarray]) -> None:
    want = ort.InferenceSession(str(BERT), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4 * float(np.max(np.abs(w))))


def test_one_session_runs_three_shapes():
    sess = Session(str(BERT), store=False)
    assert sess.plan_source == "deferred"
    assert [i.shape for i in sess.get_inputs()] == [["batch", "sequence"]] * 3
    for batch, seq in SHAPES:
        feeds = _feeds(batch, seq)
        _check(sess.run(None, feeds), feeds)
    assert len(sess.planned_shapes()) == 3


@pytest.mark.slow
def test_stored_plans_for_two_shapes_and_the_third_named(tmp_path):
    store = tmp_path / "plans.sqlite"
    opts = TuneOptions(budget_s=4, top_k=1, validate_runs=3, progress=False)
    for batch, seq in SHAPES[:2]:
        result = tune(str(BERT), store=store, options=opts, input_shapes={"input_ids": [batch, seq]})
        assert result.plan_id is not None, result.store_error
    sess = Session(str(BERT), store=store, require_plan=True)
    for batch, seq in SHAPES[:2]:
        feeds = _feeds(batch, seq)
        _check(sess.run(None, feeds), feeds)
        assert sess.for_shapes({"input_ids": [batch, seq]}).plan_source == "store"
    with pytest.raises(PlanNotFoundError) as info:
        sess.run(None, _feeds(*SHAPES[2]))
    text = str(info.value)
    assert "at input shapes input_ids[4,64], attention_mask[4,64], token_type_ids[4,64]" in text
    assert ("stored for the input shapes input_ids[1,7], attention_mask[1,7], token_type_ids[1,7]"
            " | input_ids[1,128], attention_mask[1,128], token_type_ids[1,128]") in text
