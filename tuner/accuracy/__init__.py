"""The accuracy objective (issue 33): regions computed in reduced precision (int8, bf16) where
the user's accuracy budget, measured on the user's data, allows.

It owns the metrics and their budgets (:mod:`~tuner.accuracy.metrics`), the user's samples
(:mod:`~tuner.accuracy.data`), the blocks a precision is chosen for
(:mod:`~tuner.accuracy.blocks`) and the tuning stage that measures each block's variants alone,
chooses, checks on held-out samples and backs off (:mod:`~tuner.accuracy.stage`). The
reduced-precision implementations themselves are the backends' (``precision`` of a region
implementation: :mod:`impls.openvino.reduced`, :mod:`impls.onnxruntime.quantized`), and the
objective's part of the plan key is the core's (:class:`dispatch.objective.AccuracyTarget`).
What the stage recorded, the summary's lines and the refusal to store a plan over its budget are
:mod:`~tuner.accuracy.summary`'s. The tuner runs the stage through
:class:`tuner.stages.accuracy.AccuracyTuning`.

Nothing is imported here: a module of the package is imported by its own name, so that importing
one (the summary, say) never imports the others.
"""
