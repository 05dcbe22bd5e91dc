"""The throughput stage: the validated plans (and the contenders an earlier stage added) measured
under load in their serving configurations, the winner chosen on its throughput and stored with
its best configuration (:mod:`tuner.throughput`; the machinery is
:class:`tuner.throughput.stage.ThroughputStage`).
"""

from __future__ import annotations

import time
from typing import Any

from dispatch.objective import Objective
from tuner.plan_candidate import PlanCandidate
from tuner.stages.base import TuneContext, TuningStage
from tuner.throughput.batch import BatchedGraphs
from tuner.throughput.stage import MAX_REDUCED, ThroughputStage, throughput_share


class ThroughputTuning(TuningStage):
    """Measure under ``objective``'s concurrency and choose (see the module docstring)."""

    name = "throughput"

    def __init__(self, objective: Objective) -> None:
        """``objective``: a resolved throughput objective (its concurrency named)."""
        assert objective.concurrency is not None, "a resolved objective names its concurrency"
        self.concurrency, self.max_latency_ms = objective.concurrency, objective.p99_ms
        self.share = throughput_share(self.concurrency)
        self.serving: ThroughputStage | None = None

    def run(self, ctx: TuneContext) -> None:
        """Every serving configuration the budget allows measured; the choice is this stage's."""
        t_stage = time.monotonic()
        serving = self.serving = ThroughputStage(
            ctx.graph, ctx.registry, ctx.feeds, ctx.reference, self.concurrency, self.max_latency_ms,
            ctx.budget.deadline(self), ctx.say, batched=BatchedGraphs(ctx.graph, ctx.load))
        if ctx.reserve_for is not None:  # the winner's checks as served, after this stage
            serving.extra_reserve_s = ctx.reserve_for(ctx.contenders[:MAX_REDUCED])
        serving.measure(ctx.plans, ctx.contenders)
        ctx.choose, ctx.serve_again = serving.choose, serving.finish
        ctx.stage_s["throughput_s"] = time.monotonic() - t_stage

    def serve(self, ctx: TuneContext, winner: PlanCandidate) -> PlanCandidate:
        """The winner with its best configuration, validated under load and measured again."""
        assert self.serving is not None
        winner.plan = self.serving.finish(winner)
        return winner

    def summary(self, ctx: TuneContext, winner: PlanCandidate) -> dict[str, Any]:
        """``throughput``: every configuration measured, the winner's figures and why it won."""
        assert self.serving is not None
        return {"throughput": self.serving.stats()}

    def stored(self, ctx: TuneContext, winner: PlanCandidate, plan_id: int | None) -> None:
        """A winner run in batches: the plan its batched runs load, under its batch's key."""
        serving = self.serving
        if serving is None or serving.batch_plan is None:
            return
        batch, graph_b, plan_b = serving.batch_plan
        ctx.store.put_plan(ctx.key_for(graph_b), plan_b.to_json(),
                           latency_ms=serving.final.p50_ms if serving.final else None, run_id=ctx.run_id,
                           notes={"winner": f"{winner.label}, batches of {batch}", "batch_of": plan_id})
