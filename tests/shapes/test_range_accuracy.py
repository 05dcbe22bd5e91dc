"""Reduced precision per bucket (tuner/shapes/accuracy.py): a bucket takes a reduced-precision
way only where the user's requests of its sizes stay within the budget. The first tests use
FAKE figures and errors (made up, to check the rule exactly); the last tunes a real model."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch.objective import AccuracyTarget, Objective
from tests.shapes.test_range_plans import BACKENDS, _feeds, _model
from tuner.shapes.accuracy import judge
from tuner.shapes.buckets import Sample, cut
from tuner.shapes.tune_range import tune_range
from tuner.tune_types import TuningError

TARGET = AccuracyTarget("cosine", 0.999, "ab12")


def fake(size: int) -> Sample:
    """A made-up sample where the int8 way is twice as fast as the float32 one."""
    return Sample((size,), size, {"f32": 2.0, "int8": 1.0}, {"f32": 2.0, "int8": 1.0})


def test_a_bucket_takes_reduced_precision_only_where_the_requests_allow_it():
    samples = [fake(1), fake(16), fake(64), fake(128)]
    errors = {"int8": [(10, 1e-5), (20, 1e-5), (60, 5e-3), (100, 1e-5)]}  # 60: cosine 0.995
    judge(samples, TARGET, errors, 1, 128)
    why = {s.size: s.rejected.get("int8", "") for s in samples}
    assert why[1] == "accuracy: none of your requests has a size in 1..8 to check it on"
    assert why[16] == ""  # sizes 9..40 hold the requests of 10 and 20, both within
    assert why[64].startswith("accuracy: cosine 0.995 on 1 of your requests of sizes 41..96")
    assert why[128] == ""
    buckets = cut(samples, 1, 128, repeats=4)
    assert [(b.lo, b.hi, b.way) for b in buckets] == [
        (1, 8, "f32"), (9, 40, "int8"), (41, 96, "f32"), (97, 128, "int8")]


def test_an_accuracy_objective_needs_the_requests(tmp_path):
    model = _model(tmp_path)
    with pytest.raises(TuningError, match="give them"):
        tune_range(model, {"x": [1, "1..64", 8]}, store=str(tmp_path / "p.sqlite"),
                   budget_s=1, objective=Objective(accuracy=TARGET), backends=BACKENDS)


@pytest.mark.parametrize("budget", [0.9, 0.99999999])
def test_a_real_range_checks_reduced_precision_per_bucket(tmp_path, budget):
    model = _model(tmp_path)
    requests = [_feeds(n) for n in (3, 5, 17, 30, 45, 60)]
    target = AccuracyTarget("cosine", budget, "ab12")
    result = tune_range(model, {"x": [1, "1..64", 8]}, store=str(tmp_path / "p.sqlite"),
                        budget_s=3, objective=Objective(accuracy=target), backends=BACKENDS,
                        requests=requests)
    assert "accuracy=cosine" in result.key.objective
    assert "onnxruntime-int8" in result.range_plan.ways
    for b in result.range_plan.buckets:
        if b.way.startswith("onnxruntime-int8"):
            assert budget == 0.9 and "on the" in b.why and "request(s) of yours" in b.why
    rejected = [s.rejected.get("onnxruntime-int8") for s in result.samples]
    # judged against the budget only, never ruled out as "wrong outputs"
    assert all(r is None or r.startswith("accuracy:") for r in rejected), rejected
    assert rejected[0].startswith("accuracy: none of your requests has a size in 1..")
    if budget > 0.999:  # no int8 way keeps a cosine of 0.99999999 on every request
        assert not any(b.way.startswith("onnxruntime-int8") for b in result.range_plan.buckets)
        assert all(r.startswith("accuracy:") for r in rejected), rejected
    else:  # int8 keeps a cosine of 0.9 on every request: allowed wherever a request is
        assert rejected.count(None) >= 3, rejected
    got = np.asarray([s.size for s in result.samples])
    assert got.min() == 1 and got.max() == 64
