"""Autoregressive generation with a reused key/value cache (issue 53).

This package owns decoding a decoder model exported with its cache (``past_key_values.N.key``
inputs, ``present.N.key`` outputs): reading such a model's signature
(:mod:`~dispatch.generation.decoder_io`), the past buffers allocated once per generation at the
maximum length and swapped, never copied, between steps (:mod:`~dispatch.generation.kv_cache`),
one step runner per library built once per model (:mod:`~dispatch.generation.step_ways`,
:mod:`~dispatch.generation.ort_steps`, :mod:`~dispatch.generation.ov_steps`), and the step API and
the token loop a serving loop or :meth:`dispatch.session.Session.generate` calls
(:mod:`~dispatch.generation.generate`). It plans nothing per step: each library compiles the
model once with its dynamic dimensions, as the whole-model ways of :mod:`dispatch.model_ways` do.
Choosing the way by measurement is the tuner's business, not this package's.
"""

from __future__ import annotations
