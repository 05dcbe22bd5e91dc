"""Tuning as a sequence of stages (:mod:`tuner.stages`): the list built from the objective, the
budget split once between them, and :mod:`tuner.tune` naming no objective's own stage."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dispatch.objective import Objective
from tuner.stages.base import StageBudget
from tuner.stages.sequence import stages_for
from tuner.tune import TuneOptions, TuningError, objective_of

ROOT = Path(__file__).resolve().parents[2]


def test_the_stages_follow_the_objective():
    def names(opts: TuneOptions) -> list[str]:
        return [s.name for s in stages_for(opts, objective_of(opts))]

    assert names(TuneOptions()) == ["latency"]
    assert names(TuneOptions(objective="memory")) == ["latency"]
    assert names(TuneOptions(objective="throughput", concurrency=4)) == ["latency", "throughput"]
    assert names(TuneOptions(accuracy="cosine:0.999")) == ["latency", "accuracy"]
    assert names(TuneOptions(objective="throughput", concurrency=2, accuracy="cosine:0.999")) == [
        "latency", "accuracy", "throughput"]
    with pytest.raises(TuningError, match="not 'latency@cap=1000'"):
        stages_for(TuneOptions(memory_cap_bytes=1000, accuracy="cosine:0.999"),
                   Objective("latency", memory_cap=1000))


def test_the_budget_is_split_once_from_the_last_stage_back():
    opts = TuneOptions(budget_s=100.0, objective="throughput", concurrency=4, accuracy="cosine:0.999",
                       accuracy_data="samples.npz")
    stages = stages_for(opts, objective_of(opts))
    budget = StageBudget.split(10.0, opts.budget_s, stages)
    latency, accuracy, throughput = stages
    assert budget.seconds(throughput) == 100.0 and budget.deadline(throughput) == 110.0
    assert budget.seconds(accuracy) == 100.0 * (1 - 0.4)
    assert budget.seconds(latency) == 100.0 * (1 - 0.4) * (1 - 0.5)
    alone = stages_for(TuneOptions(budget_s=100.0), objective_of(TuneOptions()))
    assert StageBudget.split(0.0, 100.0, alone).seconds(alone[0]) == 100.0


def test_the_tuner_names_no_objective_of_its_own():
    """tuner/tune.py runs the stage list: no identifier there is about throughput or accuracy."""
    tree = ast.parse((ROOT / "tuner" / "tune.py").read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not [n for n in names if re.search("throughput|accuracy", n, re.I)]
