"""Tuned plans for the report tests, tuned once per test session with short budgets: the
resnet50 architecture (onnx's light model, seeded weights), a transformer-style block and the
small CNN. Each lives in its own plan store; tests that change a store copy it first.

Plans are tuned in this process with the default registry (the one the CLI loads), so that a
CLI subprocess computes the same plan keys."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest

from dispatch.backend import load_registry
from dispatch.graph import Graph
from dispatch.registry import Registry
from dispatch.zoo import light_model
from tests.builders import small_cnn
from tests.report.models import transformer_block
from tuner.report import PlanReport, build_report
from tuner.store import PlanStore, StoredPlan
from tuner.tune import TuneOptions, TuneResult, load_graph, tune


@dataclass
class Tuned:
    """A model tuned into its own store."""

    name: str
    model: Path
    store: Path
    result: TuneResult
    graph: Graph
    registry: Registry

    def stored(self) -> StoredPlan:
        with PlanStore(self.store, readonly=True) as s:
            return s.plan_by_id(self.result.plan_id)

    def report(self) -> PlanReport:
        return build_report(self.result.plan, self.graph, store=self.store, registry=self.registry)


def options(budget_s: float, **kw) -> TuneOptions:
    """Short tuning runs (every test tunes the untuned plan's candidates at least)."""
    base = {"budget_s": budget_s, "top_k": 2, "validate_runs": 2, "per_candidate_cap_s": 0.02,
            "progress": False}
    return TuneOptions(**{**base, **kw})


def tune_into(folder: Path, name: str, model: onnx.ModelProto, reg: Registry,
              opts: TuneOptions) -> Tuned:
    path = folder / f"{name}.onnx"
    onnx.save(model, str(path))
    store = folder / f"{name}.sqlite"
    with PlanStore(store) as s:
        result = tune(str(path), store=s, options=opts, registry=reg)
    graph = load_graph(str(path), reg, reg.available_backends())
    return Tuned(name, path, store, result, graph, reg)


@pytest.fixture(scope="session")
def reg() -> Registry:
    return load_registry()


@pytest.fixture(scope="session")
def resnet50(tmp_path_factory, reg) -> Tuned:
    folder = tmp_path_factory.mktemp("resnet50")
    return tune_into(folder, "resnet50", light_model("resnet50", seed=0), reg,
                     options(20.0, top_k=1, validate_runs=1))


@pytest.fixture(scope="session")
def transformer(tmp_path_factory, reg) -> Tuned:
    folder = tmp_path_factory.mktemp("transformer")
    return tune_into(folder, "transformer", transformer_block(), reg, options(20.0))


@pytest.fixture(scope="session")
def small(tmp_path_factory, reg) -> Tuned:
    folder = tmp_path_factory.mktemp("small")
    return tune_into(folder, "small", small_cnn(), reg, options(20.0))


@pytest.fixture(params=["resnet50", "transformer"])
def tuned(request) -> Tuned:
    """Each of the two architectures the reports must render for."""
    return request.getfixturevalue(request.param)
