"""Generation from a :class:`~dispatch.session.Session` of a decoder exported with its cache.

:meth:`GenerateMixin.generate` runs the session's model token by token on one step way of
:mod:`dispatch.generation` (the library compiles the model once with its dynamic dimensions; no
plan is made per step or per past length), and :meth:`GenerateMixin.generator` hands a serving
loop the step API itself. Without a ``way``, the session runs the generation plan stored for its
model on this machine (``opdispatch tune MODEL --generate N``: the prompt's way and the steps'
way chosen by measurement, :mod:`tuner.generation`), found through its plan source; without
one, the untuned choice: the first available of ``onnxruntime-iobinding``, ``onnxruntime``,
``openvino-stateful``, ``openvino`` (among the session's backends). A session keeps one
generator per way, so each way compiles the model once per session.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from dispatch.generation.decoder_io import DecoderIO, read_decoder
from dispatch.generation.generate import DEFAULT_MAX_LENGTH, Generator
from dispatch.generation.planned import planned_generator
from dispatch.generation.step_ways import StepWay
from dispatch.generation.ways import (
    available_step_ways,
    default_step_way,
    step_way,
)
from dispatch.model_ways import model_file


class GenerateMixin:
    """Decoding on a :class:`~dispatch.session.Session` (see the module docstring)."""

    _model: Any
    _store: Any
    registry: Any
    source: Any
    store_path: str | None
    objective: Any
    backend_order: list[str]
    config: Any

    def step_ways(self) -> list[str]:
        """The step ways available to this session's backends, the untuned choice first."""
        return list(available_step_ways(self.registry, self.backend_order))

    def _step_way(self, way: str | None) -> StepWay:
        if way is None:
            return default_step_way(self.registry, self.backend_order)
        return step_way(way, self.registry, self.backend_order)

    def _decoder_io(self) -> DecoderIO:
        """The session's model read as a decoder (once): a model that is not one raises
        :class:`~dispatch.errors.ModelLoadError` before any way is looked for."""
        io = self.__dict__.get("_generation_io")
        if io is None:
            io = self.__dict__["_generation_io"] = read_decoder(model_file(self._model))
        return io

    def generation_plan(self) -> tuple[Any, str]:
        """The generation plan stored for this session's model on this machine (looked up
        once through the session's plan source, :mod:`tuner.generation`), else ``None``, and a
        note: where it came from, or why none is used."""
        found = self.__dict__.get("_generation_plan")
        if found is None:
            lookup = getattr(self.source, "lookup_generation", None)
            if lookup is None or self._store is False or self.store_path is None:
                why = ("no plan source" if lookup is None else "the session takes no stored plans")
                found = (None, f"no generation plan ({why})")
            else:
                found = lookup(self._store, self.store_path, self._decoder_io().path,
                               self.registry, str(self.objective))
            self.__dict__["_generation_plan"] = found
        return found

    def _built(self, way: str | None, max_length: int) -> tuple[Generator, threading.Lock]:
        """The generator of ``way`` (built on first use, then kept; ``None``: the stored
        generation plan's ways, else the untuned choice) and the lock its generations take
        turns by."""
        io = self._decoder_io()
        plan = self.generation_plan()[0] if way is None else None
        chosen = None if plan is not None else self._step_way(way)
        name = "plan" if chosen is None else chosen.name
        lock = self.__dict__.setdefault("_generate_lock", threading.Lock())
        with lock:
            generators: dict[str, tuple[Generator, threading.Lock]] = \
                self.__dict__.setdefault("_generators", {})
            if name not in generators:
                if chosen is None:
                    gen = planned_generator(io.path, plan, max_length=max_length,
                                            registry=self.registry, io=io)
                else:
                    threads = int(getattr(self.config, "threads", 0) or 0) or None
                    gen = Generator(io.path, chosen, max_length=max_length, threads=threads, io=io)
                generators[name] = (gen, threading.Lock())
            return generators[name]

    def generator(self, way: str | None = None, *, max_length: int = DEFAULT_MAX_LENGTH) -> Generator:
        """The session's :class:`~dispatch.generation.generate.Generator` on ``way`` (built on
        the first call for that way, then kept), reset, holding at least ``max_length``
        positions: the step API (``prefill``, ``step``, ``reset``) for a serving loop. One
        generator runs one sequence at a time, and :meth:`generate` on the same way uses it
        too; a loop running several sequences makes a ``Generator`` per sequence."""
        gen, _ = self._built(way, max_length)
        gen.reset(max(max_length, gen.max_length))
        return gen

    def generate(self, input_ids: Any, max_new_tokens: int, *, way: str | None = None,
                 do_sample: bool = False, temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int | None = None,
                 stop_tokens: Iterable[int] | Sequence[int] = ()) -> np.ndarray:
        """The tokens a decoder generates after the prompt ``input_ids`` (batch 1: ``[sequence]``
        or ``[1, sequence]``): greedy, or sampled (``do_sample``) with ``temperature``,
        ``top_k``, ``top_p`` and ``seed``; ``stop_tokens`` end it early (the stop token is the
        last one returned). ``way`` names the step way (:meth:`step_ways` lists them; default
        the stored generation plan's ways, else the first available). Returns int64
        ``[new tokens]``. Concurrent calls on one way take turns on its one generator.

        The model must be exported with its cache (``past_key_values.N.key`` inputs,
        ``present.N.key`` outputs); another model raises
        :class:`~dispatch.errors.ModelLoadError` saying what it has and what was expected."""
        need = int(np.shape(input_ids)[-1]) + int(max_new_tokens)
        gen, turn = self._built(way, need)
        with turn:
            return gen.generate(input_ids, max_new_tokens, do_sample=do_sample,
                                temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                stop_tokens=stop_tokens)
