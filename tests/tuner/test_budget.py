"""The tuning budget is a limit: a stage that would take far longer than the budget is cut
short, what was skipped is said, and a plan is still validated and stored.

The slow stage is injected with a FAKE backend ("slow", defined here): its Relu is the numpy
one after a sleep, so validating a plan that uses it takes seconds per run. It makes no speed
claim, and the test asserts no speed: only that the run ends near its budget where, without
the limit, validating the slow plan alone would take about ten times as long.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from dispatch.backend import Backend, _activate, load_registry
from dispatch.registry import ImplTable, Priority, Registry
from tests.builders import ModelBuilder
from tuner.store import PlanStore
from tuner.tune import TuneOptions, tune
from tuner.validate import BUDGET_SKIP

#: seconds the FAKE slow Relu sleeps per call
SLEEP_S = 0.25
RELUS = 8

slow_table = ImplTable("slow")


@slow_table.register("Relu", "sleepy", priority=Priority.PREFERRED)
def _sleepy_relu(node):
    """FAKE: numpy's Relu after a sleep (a stand-in for a slow stage)."""

    def run(x: np.ndarray) -> np.ndarray:
        time.sleep(SLEEP_S)
        return np.maximum(x, 0)

    return run


class SlowBackend(Backend):
    """FAKE backend whose only kernel sleeps (see the module docstring)."""

    name = "slow"

    def version(self) -> str:
        return "slow 1"

    def register(self, registry: Registry) -> None:
        registry.add_table(slow_table)


@pytest.fixture(scope="module")
def reg():
    registry = load_registry(fresh=True)
    _activate(registry, SlowBackend, "tests.tuner.test_budget")
    return registry


def relu_chain():
    b = ModelBuilder(17, "relus")
    x = b.input("x", [1, 4, 8, 8])
    for _ in range(RELUS):
        x = b.op("Relu", [x])
    b.output(x)
    return b.build()


def test_a_slow_stage_does_not_take_the_run_past_its_budget(tmp_path, reg):
    budget = 4.0
    # without the limit: the slow-first plan's check, warm-up and at least three timed and
    # untimed rounds are 8 runs of RELUS * SLEEP_S = 2 s each
    t0 = time.monotonic()
    result = tune(relu_chain(), store=PlanStore(tmp_path / "plans.sqlite"), registry=reg,
                  options=TuneOptions(budget_s=budget, backends=["numpy", "slow"], top_k=2,
                                      validate_runs=10, per_candidate_cap_s=0.05, progress=False))
    elapsed = time.monotonic() - t0
    by_label = {pc.label: pc for pc in result.validated}
    assert by_label["slow first"].error == BUDGET_SKIP, {k: v.error for k, v in by_label.items()}
    assert "slow first" in result.stats["skipped_validation"]
    assert "not validated: slow first" in result.summary()
    # a plan was validated and stored all the same
    assert result.plan_id is not None and result.plan.backends_used() == {"numpy": RELUS}
    assert by_label["untuned (heuristic)"].error is None
    # loose on purpose (this is not a speed test): the unlimited run takes about 20 s
    assert elapsed < 2.5 * budget, (elapsed, result.stats)


def test_tuning_on_a_busy_machine_is_said(tmp_path, reg):
    """Other processes taking half of the machine's CPU time while tuning are measured
    (tuner.busy: /proc/stat against this process's own CPU time) and said in the summary."""
    import os
    import subprocess
    import sys

    from tuner import busy

    if busy.snapshot() is None:
        pytest.skip("no /proc/stat here: the share is not known")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(max(1, (os.cpu_count() or 2) // 2))]
    try:
        time.sleep(0.3)
        result = tune(relu_chain(), store=PlanStore(tmp_path / "plans.sqlite"), registry=reg,
                      options=TuneOptions(budget_s=3, backends=["numpy"], top_k=1, validate_runs=3,
                                          per_candidate_cap_s=0.05, progress=False))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    share = result.stats["others_cpu_share"]
    assert share is not None and share >= busy.BUSY_SHARE, result.stats
    assert "the machine was busy while tuning" in result.summary()
