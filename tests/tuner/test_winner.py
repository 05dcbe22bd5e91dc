"""Choosing the winner among validated plans: a plan the optimiser made replaces the best
single-backend plan only when it is faster by more than the measured spread, so that noise
while tuning does not store a plan that won by chance (issue 13). Plans here are data: the
figures are given, nothing is timed."""

from __future__ import annotations

from dispatch.plan import Plan
from tuner.tune_types import PlanCandidate, TuneOptions
from tuner.validate import _winner, clearly_faster


def pc(label: str, ms: float, spread: float, *, baseline: bool, samples: int = 10,
       peak: int = 1) -> PlanCandidate:
    return PlanCandidate(label, Plan(graph="g", steps=[], conversions=[]), None, latency_ms=ms,
                         spread_ms=spread, peak_bytes=peak, samples=samples, baseline=baseline)


def test_a_lead_within_the_spread_keeps_the_single_backend_plan():
    base = pc("onnxruntime first", 10.0, 1.0, baseline=True)
    optimum = pc("optimum", 9.6, 1.0, baseline=False)  # notches: 9.1-10.1 and 9.5-10.5
    assert not clearly_faster(optimum, base)
    assert _winner([optimum, base], TuneOptions()) is base


def test_a_clear_lead_wins():
    base = pc("onnxruntime first", 10.0, 0.2, baseline=True)
    optimum = pc("optimum", 9.0, 0.2, baseline=False)
    assert clearly_faster(optimum, base)
    assert _winner([optimum, base], TuneOptions()) is optimum


def test_more_samples_narrow_the_margin_needed():
    base = pc("openvino first", 10.0, 1.0, baseline=True, samples=100)
    optimum = pc("optimum", 9.6, 1.0, baseline=False, samples=100)
    assert clearly_faster(optimum, base)


def test_the_fastest_baseline_is_chosen_among_baselines_and_failures_are_ignored():
    slow = pc("numpy only", 50.0, 5.0, baseline=True)
    fast = pc("openvino first", 8.0, 0.5, baseline=True)
    broken = pc("optimum", 1.0, 0.0, baseline=False)
    broken.error = "wrong result: ..."
    assert _winner([broken, slow, fast], TuneOptions()) is fast


def test_the_memory_objective_is_unchanged():
    small = pc("optimum", 12.0, 0.1, baseline=False, peak=10)
    big = pc("onnxruntime first", 10.0, 0.1, baseline=True, peak=100)
    assert _winner([small, big], TuneOptions(objective="memory")) is small


class _Clock:
    """A fake clock the fake plan below advances: nothing here is timed for real."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Wake:
    """A fake plan that runs 5 ms while what ran before it is still settling (the first
    30 ms: another library's spinning pool), then 1 ms: the steady state a production process
    runs it in."""

    def __init__(self, clock: _Clock) -> None:
        self.clock, self.start, self.runs = clock, None, 0

    def run(self, feeds):
        if self.start is None:
            self.start = self.clock.now
        self.runs += 1
        self.clock.now += 0.005 if self.clock.now - self.start < 0.03 else 0.001


def test_each_round_times_a_plan_in_its_steady_state(monkeypatch):
    """A validation round's sample of a plan is taken after it ran back to back for
    SETTLE_S (what the previous plan left behind has died down), as the median of its runs
    over TIMED_S: one number per round, so the rounds stay independent samples."""
    from tuner import validate

    clock = _Clock()
    monkeypatch.setattr(validate.time, "perf_counter", clock)
    plan = _Wake(clock)
    sample = validate._block(plan, {})
    assert abs(sample - 0.001) < 1e-9  # the slow runs of the first 30 ms are not in it
    assert clock.now >= validate.SETTLE_S + validate.TIMED_S
    assert plan.runs >= validate.TIMED_S / 0.001
