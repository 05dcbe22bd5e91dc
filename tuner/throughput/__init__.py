"""The throughput objective (issue 30): which plan, set up how, answers the most requests per
second with N requests in flight (``throughput@n=N[,p99=MS]``, :class:`dispatch.objective.Objective`).

It owns the stage that measures validated plans under load in their serving configurations and
chooses (:mod:`~tuner.throughput.stage`), requests grouped in batches as throughput candidates
(:mod:`~tuner.throughput.batch`), the one load loop of the project and its result type with the
latency percentiles (:mod:`~tuner.throughput.load`), plain libraries under the same load for
comparison (:mod:`~tuner.throughput.library_load`) and the stage's part of the tuning summary
(:mod:`~tuner.throughput.table`). The tuner runs the stage through
:class:`tuner.stages.throughput.ThroughputTuning`. The serving configurations themselves are the
core's (:mod:`dispatch.serving`, :mod:`dispatch.stream_pool`).

Nothing is imported here: a module of the package is imported by its own name, so that importing
one (the summary table, say) never imports the others.
"""
