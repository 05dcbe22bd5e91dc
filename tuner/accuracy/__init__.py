"""The accuracy objective (issue 33): regions computed in reduced precision (int8, bf16) where
the user's accuracy budget, measured on the user's data, allows.

It owns the metrics and their budgets (:mod:`~tuner.accuracy.metrics`), the user's samples
(:mod:`~tuner.accuracy.data`), the blocks a precision is chosen for
(:mod:`~tuner.accuracy.blocks`) and the tuning stage that measures each block's variants alone,
chooses, checks on held-out samples and backs off (:mod:`~tuner.accuracy.stage`). The
reduced-precision implementations themselves are the backends' (``precision`` of a region
implementation: :mod:`impls.openvino.reduced`, :mod:`impls.onnxruntime.quantized`), and the
objective's part of the plan key is the core's (:func:`dispatch.plan_policy.accuracy_string`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from dispatch.graph import Graph
from dispatch.plan import Plan
from dispatch.plan_policy import (
    NONSTRICT_NAN_SUFFIX,
    accuracy_string,
    nonstrict_nan,
    split_accuracy,
)
from dispatch.registry import Registry
from tuner.accuracy.data import AccuracyData, load_data
from tuner.accuracy.metrics import AccuracyObjective
from tuner.accuracy.stage import AccuracyStage
from tuner.tune_types import PlanCandidate, TuneOptions, TuningError

__all__ = ["ACCURACY_SHARE", "AccuracyData", "AccuracyObjective", "AccuracyStage", "accuracy_budget",
           "accuracy_key", "accuracy_objective", "accuracy_stage", "accuracy_summary", "held_out_within",
           "load_data", "reduced_contenders", "served_within"]

#: the share of the budget an accuracy objective's stage takes: the float32 stages run in the rest
ACCURACY_SHARE = 0.5
#: ``(objective, data, deadline)`` of a run with an accuracy stage
Accuracy = tuple[AccuracyObjective, AccuracyData, float]


def accuracy_budget(opts: TuneOptions, objective: str) -> tuple[TuneOptions, float]:
    """The options the float32 stages run with (their share of the budget) and the accuracy
    stage's share (0 without an accuracy objective or without data); the objective checked."""
    if not opts.accuracy:
        return opts, 0.0
    base = split_accuracy(objective)[0].removesuffix(NONSTRICT_NAN_SUFFIX)
    if opts.memory_cap_bytes is not None or base.partition("@")[0] not in ("latency", "throughput"):
        raise TuningError(f"an accuracy objective ({opts.accuracy}) goes with the latency or the "
                          f"throughput objective, not {objective!r}")
    accuracy_objective(opts)  # checked before anything is imported or measured
    share = ACCURACY_SHARE if opts.accuracy_data is not None else 0.0
    return dataclasses.replace(opts, budget_s=opts.budget_s * (1 - share)), share


def accuracy_key(opts: TuneOptions, graph: Graph, objective: str, deadline: float) -> tuple[str, Accuracy]:
    """The objective as the plan key spells it (the metric, budget and data digest added) and
    the accuracy stage's ``(objective, data, deadline)``."""
    data = load_data(opts.accuracy_data, graph)
    metric = accuracy_objective(opts)
    base = split_accuracy(objective)[0].removesuffix(NONSTRICT_NAN_SUFFIX)
    spelled = base + accuracy_string(metric.metric, metric.budget, data.digest) + (
        NONSTRICT_NAN_SUFFIX if nonstrict_nan(objective) else "")
    return spelled, (metric, data, deadline)


def accuracy_stage(graph: Graph, registry: Registry, backends: Sequence[str], opts: TuneOptions,
                   accuracy: Accuracy | None, winner: PlanCandidate, validated: Sequence[PlanCandidate],
                   say: Callable[[str], None]) -> tuple[PlanCandidate, dict[str, Any] | None]:
    """The accuracy stage run on the float32 ``winner`` (:class:`AccuracyStage`): the plan
    chosen and what the summary says of it (``None`` without an accuracy objective)."""
    if accuracy is None:
        if not opts.accuracy:
            return winner, None
        return winner, {"note": f"accuracy {opts.accuracy} asked without data: reduced precision is "
                                "never chosen (accuracy measured on random inputs means nothing); "
                                "give your samples with --data FILE.npz"}
    stage = AccuracyStage(graph, registry, backends, accuracy[0], accuracy[1], accuracy[2], say)
    chosen = stage.run(winner, validated, opts.validate_runs)
    return chosen, accuracy_summary(chosen.plan)


def reduced_contenders(graph: Graph, registry: Registry, backends: Sequence[str], opts: TuneOptions,
                       accuracy: Accuracy, winner: PlanCandidate, validated: Sequence[PlanCandidate],
                       say: Callable[[str], None]) -> tuple[AccuracyStage, list[PlanCandidate]]:
    """For a throughput objective: the accuracy stage run on the float32 latency ``winner`` up
    to its plans within budget on the held-out samples (:meth:`AccuracyStage.within_budget`);
    the reduced ones, each with its float32 fallback for NaN/Inf requests, are then measured
    under load beside the float32 plans (:class:`tuner.throughput.ThroughputStage`)."""
    stage = AccuracyStage(graph, registry, backends, accuracy[0], accuracy[1], accuracy[2], say)
    plans = stage.within_budget(winner, validated, opts.validate_runs)
    return stage, plans[1:]


def served_within(stage: AccuracyStage, win: PlanCandidate, finish: Callable[[PlanCandidate], Plan],
                  float32_winner: Callable[[], PlanCandidate]) -> PlanCandidate:
    """The throughput winner given its serving configuration (``finish``:
    :meth:`tuner.throughput.ThroughputStage.finish`) and, when it computes in reduced
    precision, checked once more on the held-out samples as a server builds it (streams and
    library settings can change a library's kernels): over the budget there, the float32 plan
    that ``float32_winner`` picks under load replaces it, and the notes say why."""
    win.plan = finish(win)
    if set(win.plan.precisions()) <= {"float32"}:
        return win
    served = stage.check_served(win.plan)
    win.plan.provenance["accuracy"]["held_out_served"] = served
    if served["within"]:
        return win
    stage.notes.append(f"{win.label} as served ({(win.plan.serving or {}).get('mode', '?')} configuration): "
                       f"{stage.objective.describe(served['error'])} on the held-out samples, over the "
                       f"budget; the best float32 plan under load is stored instead")
    alt = stage.finish(float32_winner())
    alt.plan = finish(alt)
    return alt


def accuracy_objective(opts: TuneOptions) -> AccuracyObjective:
    """The options' accuracy objective, checked."""
    if not opts.accuracy:
        raise TuningError("no accuracy objective was given")
    return AccuracyObjective.parse(opts.accuracy, opts.accuracy_fn)


def held_out_within(plan: Plan) -> None:
    """Raise :class:`TuningError` unless ``plan`` computes in float32 alone or its accuracy
    on the held-out samples (its provenance) is within its budget: what the tuner checks
    before it stores a plan."""
    if set(plan.precisions()) <= {"float32"}:
        return
    held = (plan.provenance.get("accuracy") or {}).get("held_out") or {}
    if held.get("within") is not True:
        raise TuningError(f"refusing to store a reduced-precision plan whose accuracy on the held-out "
                          f"samples is not within its budget ({held or 'not measured'})")
    served = (plan.provenance.get("accuracy") or {}).get("held_out_served")
    if plan.serving is not None and (served is None or served.get("within") is not True):
        raise TuningError(f"refusing to store a reduced-precision plan whose accuracy on the held-out "
                          f"samples, run with its serving configuration, is not within its budget "
                          f"({served or 'not measured'})")


def accuracy_summary(plan: Plan) -> dict[str, Any]:
    """What the tuning summary says of the accuracy stage (from the plan's provenance)."""
    acc = plan.provenance.get("accuracy") or {}
    return {k: acc.get(k) for k in ("metric", "budget", "data", "held_out", "winner", "precisions",
                                     "speed", "timed", "candidates", "notes", "seconds")}
