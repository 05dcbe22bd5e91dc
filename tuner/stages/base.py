"""What every tuning stage is (:class:`TuningStage`), what the stages of one run share
(:class:`TuneContext`) and how the budget is split between them (:class:`StageBudget`).

A run calls each stage's hooks in phases (:func:`tuner.tune._tune`):

1. :meth:`TuningStage.prepare`, once the model is loaded: the objective as the plan key will
   spell it (an accuracy stage adds its data's digest);
2. :meth:`~TuningStage.run`, in order: what the stage measures before the winner is chosen (the
   latency stage validates whole plans; a later stage may add contenders and take over the
   choice: :attr:`TuneContext.contenders`, :attr:`TuneContext.choose`);
3. the winner is chosen among the validated plans and the contenders, its NaN/Inf behaviour
   checked (:meth:`TuneContext.winner`);
4. :meth:`~TuningStage.refine`, in order: what the stage adds to the winner;
5. :meth:`~TuningStage.serve`, in reverse order: the winner as it will be stored (the last stage
   sets up its serving configuration first, then each earlier one checks the plan as served and
   refuses what it must never store);
6. :meth:`~TuningStage.summary`, in order: the stage's part of the run's summary;
7. :meth:`~TuningStage.stored`, once the winner is stored: rows stored beside it.

Each stage owns its :attr:`~TuningStage.share` of the budget: the stages are given their
deadlines from the last one back (:meth:`StageBudget.split`), so a stage's share is of what the
stages after it left.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dispatch.graph import Graph
from dispatch.objective import Objective
from dispatch.plan import Plan
from dispatch.registry import Registry
from tuner import busy
from tuner.fingerprint import PlanKey
from tuner.nonfinite import nonfinite_winner
from tuner.plan_candidate import PlanCandidate
from tuner.store.guarded import GuardedStore
from tuner.tune_types import TuneOptions
from tuner.validate import _winner

#: how a winner is chosen among plans: ``choose(plans, options) -> plan``
#: (:func:`tuner.validate._winner`: by the latency or memory objective)
Chooser = Callable[[Sequence[PlanCandidate], TuneOptions], PlanCandidate]


@dataclass(frozen=True)
class StageBudget:
    """The run's budget and when each stage ends (seconds from :attr:`start`)."""

    #: when the run started (``time.monotonic()``)
    start: float
    #: the whole run's budget, seconds
    total_s: float
    #: stage name -> seconds from the start at which that stage ends
    ends_s: Mapping[str, float]

    @classmethod
    def split(cls, start: float, total_s: float, stages: Sequence[TuningStage]) -> StageBudget:
        """The budget split between ``stages``: the last one ends at the budget's end and takes
        its :attr:`~TuningStage.share` of it; each earlier one ends where the next begins and
        takes its share of what is left; the first one (the latency stage) has the rest."""
        ends: dict[str, float] = {}
        left = total_s
        for stage in reversed(stages):
            ends[stage.name] = left
            left = left * (1 - stage.share)
        return cls(start, total_s, ends)

    def seconds(self, stage: TuningStage) -> float:
        """Seconds from the start at which ``stage`` ends."""
        return self.ends_s[stage.name]

    def deadline(self, stage: TuningStage) -> float:
        """When ``stage`` ends (``time.monotonic()``)."""
        return self.start + self.ends_s[stage.name]


@dataclass
class TuneContext:
    """What the stages of one tuning run share: the model, the registry, the store and the plan
    key, the options the per-request stages run with, and what the stages have found so far."""

    graph: Graph
    registry: Registry
    backends: Sequence[str]
    store: GuardedStore
    key: PlanKey
    #: digests of the key's hardware and software (the measurements table's keys)
    hw: str
    sw: str
    #: the options the latency stage runs with: the per-request objective (latency or memory)
    #: and its share of the budget (:func:`tuner.stages.latency.request_options`)
    opts: TuneOptions
    #: the whole objective, as the plan key spells it
    objective: Objective
    budget: StageBudget
    run_id: int | None
    say: Callable[[str], None]
    #: the model imported for other input shapes, as a Session would import it
    load: Callable[[Mapping[str, Sequence[int]]], Graph]
    #: the store key of the same model imported as ``graph`` (a plan stored beside the winner)
    key_for: Callable[[Graph], PlanKey]
    cpu_start: busy.CpuSnapshot | None = None
    #: the thread settings measured under (:func:`dispatch.blas.record`)
    threading: dict[str, Any] | None = None
    #: the model file the user gave (for ``opdispatch plans list``)
    model_file: str | None = None
    #: when the per-request stages end (validation's deadline)
    deadline: float = 0.0
    # -- what the stages found ------------------------------------------------------------
    #: the plans validated end to end (the latency stage)
    plans: list[PlanCandidate] = field(default_factory=list)
    #: plans besides the validated ones that the winner is chosen among (an accuracy stage's
    #: reduced-precision plans within budget, when a later stage chooses)
    contenders: list[PlanCandidate] = field(default_factory=list)
    #: how the winner is chosen; ``None``: by the per-request objective (the latency stage's)
    choose: Chooser | None = None
    #: a stage that chose sets up a plan as it serves (the winner's replacement, when a check
    #: as served rules the winner out)
    serve_again: Callable[[PlanCandidate], Plan] | None = None
    #: seconds a stage that chooses keeps for the checks of its winner among ``contenders`` as
    #: served, at most
    reserve_for: Callable[[Sequence[PlanCandidate]], float] | None = None
    #: the all-numpy plan the others are checked against, its inputs and outputs
    reference_plan: Plan | None = None
    feeds: dict[str, np.ndarray] = field(default_factory=dict)
    reference: list[np.ndarray] = field(default_factory=list)
    #: seconds each stage took, for the summary (``measure_s``, ...)
    stage_s: dict[str, float] = field(default_factory=dict)
    #: what the NaN/Inf check of the winner said (:func:`tuner.nonfinite.nonfinite_winner`)
    nonfinite: str = ""
    #: the CPU times when the winner was settled (for the summary's share of other processes)
    cpu_end: busy.CpuSnapshot | None = None

    def winner(self, plans: Sequence[PlanCandidate],
               choose: Chooser | None = None) -> tuple[PlanCandidate, str]:
        """The plan ``choose`` (default: the per-request objective's) picks among ``plans``, its
        NaN/Inf behaviour checked against the reference (:func:`tuner.nonfinite.nonfinite_winner`),
        and what that check said."""
        assert self.reference_plan is not None, "the latency stage runs first"
        return nonfinite_winner(self.graph, self.registry, plans, self.reference_plan, self.opts,
                                choose or _winner)


class TuningStage:
    """One stage of tuning (see the module docstring for when each hook runs). Every hook does
    nothing by default; a stage overrides the ones it needs."""

    #: the stage's name (its deadline in :class:`StageBudget`)
    name: str = ""
    #: the share of the budget the stage takes (of what the stages after it left)
    share: float = 0.0

    def prepare(self, graph: Graph, objective: Objective) -> Objective:
        """The objective as the plan key spells it once this stage has seen the model."""
        return objective

    def run(self, ctx: TuneContext) -> None:
        """Measure what this stage measures before the winner is chosen."""

    def refine(self, ctx: TuneContext, winner: PlanCandidate) -> PlanCandidate:
        """What this stage adds to the chosen ``winner``: the plan that wins now."""
        return winner

    def serve(self, ctx: TuneContext, winner: PlanCandidate) -> PlanCandidate:
        """``winner`` as it will be stored (raises :class:`~tuner.errors.TuningError` for a plan
        that must never be stored)."""
        return winner

    def summary(self, ctx: TuneContext, winner: PlanCandidate) -> dict[str, Any]:
        """This stage's entries in the run's summary (``TuneResult.stats``)."""
        return {}

    def stored(self, ctx: TuneContext, winner: PlanCandidate, plan_id: int | None) -> None:
        """Store what goes beside the winner (stored under ``plan_id``)."""
