"""Tuning a shape range (issue 51): the whole-model ways (:mod:`dispatch.model_ways`) measured
at sample shapes across the range (:mod:`tuner.shapes.measure`), the range cut into buckets
where the winner changes (:mod:`tuner.shapes.buckets`), and the range plan stored under its
range (:mod:`tuner.shapes.tune_range`)."""
