"""Tuning as a sequence of stages (:class:`~tuner.stages.base.TuningStage`), one per part of the
objective: every run has the latency stage (:mod:`~tuner.stages.latency`: measure, optimise,
validate whole plans one request at a time), then one stage for each further part the objective
names, in this order: reduced precision within an accuracy budget (:mod:`~tuner.stages.accuracy`),
measurement under load for throughput (:mod:`~tuner.stages.throughput`).
:func:`tuner.stages.sequence.stages_for` builds the list from the objective, and
:func:`tuner.tune.tune` runs it; the next objectives (shape-range buckets, decoding) slot in as one
more stage each.

The stage classes here are the tuner's side of each objective: what each measures, when, with
which share of the budget, and what it adds to the winner. The machinery they drive lives with
its objective (:mod:`tuner.accuracy`, :mod:`tuner.throughput`; the optimiser, :mod:`tuner.optimize`).

Nothing is imported here: each module is imported by its own name.
"""
