"""Which stages a run has (:func:`stages_for`): the latency stage, then one stage for each
further part of the objective. The next objectives (shape-range buckets, decoding) add a line
here and a module beside this one."""

from __future__ import annotations

from dispatch.objective import Objective
from tuner.stages.accuracy import AccuracyTuning
from tuner.stages.base import TuningStage
from tuner.stages.latency import LatencyTuning
from tuner.stages.throughput import ThroughputTuning
from tuner.tune_types import TuneOptions


def stages_for(opts: TuneOptions, objective: Objective) -> list[TuningStage]:
    """The stages that tune for ``objective`` (resolved, float32: the accuracy part comes from
    ``opts``), in the order they run; each checks its options here, before anything is imported
    or measured."""
    stages: list[TuningStage] = [LatencyTuning()]
    if opts.accuracy:  # reduced precision, before a stage that chooses under load
        stages.append(AccuracyTuning(opts, objective, served=objective.is_throughput))
    if objective.is_throughput:
        stages.append(ThroughputTuning(objective))
    return stages
