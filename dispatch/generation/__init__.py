"""Autoregressive generation with a reused key/value cache (issue 53).

This package owns decoding a decoder model exported with its cache (``past_key_values.N.key``
inputs, ``present.N.key`` outputs): reading such a model's signature
(:mod:`~dispatch.generation.decoder_io`), the past buffers allocated once per generation at the
maximum length and swapped, never copied, between steps (:mod:`~dispatch.generation.kv_cache`),
one step runner per library built once per model (:mod:`~dispatch.generation.step_ways` defines
a way, :mod:`~dispatch.generation.ort_steps` and :mod:`~dispatch.generation.ov_steps` hold them,
:mod:`~dispatch.generation.ways` lists those available), the choice of the next token
(:mod:`~dispatch.generation.sampling`), and the step API and the token loop a serving loop or
:meth:`dispatch.session.Session.generate` calls (:mod:`~dispatch.generation.generate`).

It plans nothing per step: each library compiles the model once with its dynamic dimensions, as
the whole-model ways of :mod:`dispatch.model_ways` do. The libraries are called directly here,
imported only when a way is built (the core's other modules reach them through ``impls/``).
Choosing the way by measurement is the tuner's business, not this package's.
"""

from __future__ import annotations
