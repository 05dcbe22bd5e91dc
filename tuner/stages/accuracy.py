"""The accuracy stage: regions in reduced precision (int8, bf16) where the user's accuracy
budget, measured on the user's data, allows (:mod:`tuner.accuracy`; the machinery is
:class:`tuner.accuracy.stage.AccuracyStage`).

Alone, it runs on the float32 winner (:meth:`AccuracyTuning.refine`). When a later stage chooses
under load, it runs first on the float32 latency winner up to its plans within budget on the
held-out samples, which then contend beside the float32 plans (:meth:`AccuracyTuning.run`); a
reduced winner is checked once more on the held-out samples as served (:meth:`AccuracyTuning.serve`).
Without data it only says so: reduced precision is never chosen.
"""

from __future__ import annotations

import time
from typing import Any

from dispatch.graph import Graph
from dispatch.objective import AccuracyTarget, Objective
from tuner.accuracy.data import AccuracyData, load_data
from tuner.accuracy.metrics import AccuracyObjective
from tuner.accuracy.stage import AccuracyStage
from tuner.accuracy.summary import accuracy_summary, held_out_within
from tuner.errors import TuningError
from tuner.plan_candidate import PlanCandidate
from tuner.stages.base import TuneContext, TuningStage
from tuner.tune_types import TuneOptions

#: the share of the budget an accuracy objective's stage takes: the float32 stages run in the rest
ACCURACY_SHARE = 0.5


def accuracy_objective(opts: TuneOptions) -> AccuracyObjective:
    """The options' accuracy objective, checked."""
    if not opts.accuracy:
        raise TuningError("no accuracy objective was given")
    return AccuracyObjective.parse(opts.accuracy, opts.accuracy_fn)


class AccuracyTuning(TuningStage):
    """Reduced precision within the accuracy budget (see the module docstring)."""

    name = "accuracy"

    def __init__(self, opts: TuneOptions, objective: Objective, *, served: bool) -> None:
        """``objective``: the float32 objective (checked: an accuracy objective goes with latency
        or throughput); ``served``: a later stage chooses the winner under load."""
        if objective.memory_cap is not None or objective.name not in ("latency", "throughput"):
            raise TuningError(f"an accuracy objective ({opts.accuracy}) goes with the latency or the "
                              f"throughput objective, not {str(objective)!r}")
        self.spec = opts.accuracy
        self.metric = accuracy_objective(opts)  # checked before anything is imported or measured
        self.source = opts.accuracy_data
        self.share = ACCURACY_SHARE if self.source is not None else 0.0
        self.served = served
        self.data: AccuracyData | None = None
        #: the machinery, once it ran
        self.stage: AccuracyStage | None = None

    def prepare(self, graph: Graph, objective: Objective) -> Objective:
        """The user's samples loaded and checked against the model; the objective names the
        metric, the budget and the data's digest."""
        if self.source is None:
            return objective
        self.data = load_data(self.source, graph)
        return objective.replace(accuracy=AccuracyTarget(self.metric.metric, self.metric.budget,
                                                         self.data.digest))

    def _stage(self, ctx: TuneContext) -> AccuracyStage:
        assert self.data is not None
        self.stage = AccuracyStage(ctx.graph, ctx.registry, ctx.backends, self.metric, self.data,
                                   ctx.budget.deadline(self), ctx.say)
        return self.stage

    def run(self, ctx: TuneContext) -> None:
        """When a later stage chooses under load: the stage on the float32 latency winner up to
        its plans within budget on the held-out samples (:meth:`AccuracyStage.within_budget`);
        the reduced ones, each with its float32 fallback for NaN/Inf requests, contend."""
        if not self.served or self.data is None:
            return
        t_stage = time.monotonic()
        float32 = ctx.winner(ctx.plans)[0]
        stage = self._stage(ctx)
        ctx.contenders += stage.within_budget(float32, ctx.plans, ctx.opts.validate_runs)[1:]
        ctx.stage_s["accuracy_s"] = time.monotonic() - t_stage
        ctx.reserve_for = stage.served_check_s  # the winner's check as served, after that stage

    def refine(self, ctx: TuneContext, winner: PlanCandidate) -> PlanCandidate:
        """The plan chosen in reduced precision (its evidence in the provenance): the stage run
        on the float32 ``winner``, or, chosen under load, the winner's evidence."""
        if self.data is None:
            return winner
        if self.stage is not None:
            return self.stage.finish(winner)
        t_stage = time.monotonic()
        chosen = self._stage(ctx).run(winner, ctx.plans, ctx.opts.validate_runs)
        ctx.stage_s["accuracy_s"] = time.monotonic() - t_stage
        return chosen

    def serve(self, ctx: TuneContext, winner: PlanCandidate) -> PlanCandidate:
        """A reduced winner set up to serve is checked once more on the held-out samples as a
        server builds it (streams and library settings can change a library's kernels): over the
        budget there, the float32 plan the later stage picks replaces it, and the notes say why.
        A plan over its budget on the held-out samples is never stored."""
        if self.data is None:
            return winner
        if self.stage is not None and ctx.serve_again is not None \
                and not set(winner.plan.precisions()) <= {"float32"}:
            winner = self._served_within(ctx, self.stage, winner)
        held_out_within(winner.plan)  # never stored over its budget
        return winner

    def _served_within(self, ctx: TuneContext, stage: AccuracyStage, win: PlanCandidate) -> PlanCandidate:
        assert ctx.serve_again is not None
        served = stage.check_served(win.plan)
        win.plan.provenance["accuracy"]["held_out_served"] = served
        if served["within"]:
            return win
        stage.notes.append(f"{win.label} as served ({(win.plan.serving or {}).get('mode', '?')} "
                           f"configuration): {stage.objective.describe(served['error'])} on the held-out "
                           f"samples, over the budget; the best float32 plan under load is stored instead")
        alt = stage.finish(ctx.winner(ctx.plans, ctx.choose)[0])
        alt.plan = ctx.serve_again(alt)
        return alt

    def summary(self, ctx: TuneContext, winner: PlanCandidate) -> dict[str, Any]:
        """``accuracy``: what the stage chose and measured, or why it did not run."""
        if self.data is None:
            return {"accuracy": {"note": f"accuracy {self.spec} asked without data: reduced precision "
                                         "is never chosen (accuracy measured on random inputs means "
                                         "nothing); give your samples with --data FILE.npz"}}
        return {"accuracy": accuracy_summary(winner.plan)}
