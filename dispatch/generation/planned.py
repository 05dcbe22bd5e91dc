"""A generator built from a :class:`~dispatch.generation.plan.GenerationPlan`.

One phase's way on one thread count is a plain :class:`~dispatch.generation.generate.Generator`.
Two (the prompt on one way, the token steps on another) run through :class:`SplitRunner`: both
ways are built once, both write their presents into one
:class:`~dispatch.generation.kv_cache.KVCache`, and the runner hands each call to the prompt's
way when the sequence is empty, to the steps' way after: the prompt's cache becomes the steps'
past in place, nothing copied.

A plan of reduced-precision weights (``plan.recipe``) runs on the variant file
(:mod:`dispatch.generation.weights`): the cached one, or one made again from the recipe when the
cache lost it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dispatch.errors import PlanError
from dispatch.generation.decoder_io import DecoderIO, read_decoder
from dispatch.generation.generate import DEFAULT_MAX_LENGTH, Generator
from dispatch.generation.kv_cache import CacheHolder, KVCache
from dispatch.generation.plan import GenerationPlan, StepChoice
from dispatch.generation.step_ways import StepRunner, StepWay
from dispatch.generation.ways import step_way


class SplitRunner(CacheHolder):
    """The prompt on one runner, the steps on another, one cache (see the module docstring)."""

    def __init__(self, way: StepWay, io: DecoderIO, prompt: StepRunner, steps: StepRunner) -> None:
        self.way = way
        self.io = io
        self.prompt = prompt
        self.steps = steps
        self.kv: KVCache | None = None

    def begin(self, capacity: int) -> None:
        super().begin(capacity)
        # both runners step the one cache (their own begin() would make one each)
        self.prompt.kv = self.steps.kv = self.kv

    def run(self, inputs: Mapping[str, np.ndarray], new: int) -> np.ndarray:
        runner = self.prompt if self.length == 0 else self.steps
        return runner.run(inputs, new)


def split_way(prompt: StepChoice, steps: StepChoice, registry: Any = None) -> StepWay:
    """The step way that runs the prompt on ``prompt``'s way and the steps on ``steps``'s; both
    must write their presents into the generation's cache (``binds_cache``)."""
    a, b = step_way(prompt.way, registry), step_way(steps.way, registry)
    unbound = [w.name for w in (a, b) if not w.binds_cache]
    if unbound:
        raise PlanError(f"a generation split between two ways needs both to write into one "
                        f"key/value cache; {unbound} keep their own (ways that do: io binding, "
                        f"shared tensors)")

    def build(io: DecoderIO, _threads: int | None) -> StepRunner:
        return SplitRunner(way, io, a.build(io, prompt.threads), b.build(io, steps.threads))

    way = StepWay(f"{prompt.label()} then {steps.label()}", a.backend,
                  f"the prompt on {a.description}; the token steps on {b.description}; one cache",
                  build, {"prompt": dict(a.settings), "steps": dict(b.settings)},
                  binds_cache=True)
    return way


def planned_generator(model: Any, plan: GenerationPlan, *, max_length: int = DEFAULT_MAX_LENGTH,
                      registry: Any = None, io: DecoderIO | None = None, digest: str | None = None,
                      variant_folder: Any = None) -> Generator:
    """A generator running ``plan``'s ways on the decoder ``model`` (a path), or on its
    weight-reduced variant when the plan names one (``digest``: the model file's sha256 when
    known; ``variant_folder``: the variant cache, default
    :func:`~dispatch.generation.weights.variant_folder`)."""
    io = io or read_decoder(model)
    if plan.recipe is not None:
        from dispatch.generation.weights import WeightRecipe, ensure_variant

        variant, _made = ensure_variant(io.path, WeightRecipe.from_dict(plan.recipe), digest=digest,
                                        folder=variant_folder)
        io = read_decoder(str(variant))
    if not plan.split:
        return Generator(io.path, step_way(plan.decode.way, registry), max_length=max_length,
                         threads=plan.decode.threads, io=io)
    return Generator(io.path, split_way(plan.prefill, plan.decode, registry),
                     max_length=max_length, io=io)
