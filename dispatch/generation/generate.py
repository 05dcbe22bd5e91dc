"""The step API a serving loop calls, and the token loop on top of it.

A :class:`Generator` holds one decoder compiled once by one step way
(:mod:`~dispatch.generation.step_ways`) and the buffers of a generation, allocated when it
starts at its maximum length and reused by every step: the token, mask and position inputs
(views of three preallocated arrays), the past keys and values (the ping-pong
:class:`~dispatch.generation.kv_cache.KVCache`, or the library's own state) and the logits.
:meth:`Generator.prefill` runs the prompt, :meth:`Generator.step` one or more new tokens,
:meth:`Generator.reset` forgets them; :meth:`Generator.generate` loops greedy or seeded sampling
until ``max_new_tokens`` or a stop token. Batch 1: one sequence per generator.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from dispatch.errors import ArgumentError, FeedError
from dispatch.generation.decoder_io import DecoderIO, read_decoder
from dispatch.generation.kv_cache import CapacityError
from dispatch.generation.sampling import Sampler
from dispatch.generation.step_ways import StepRunner, StepWay
from dispatch.generation.ways import default_step_way, step_way

#: the capacity of a generator made without one (prompt plus new tokens)
DEFAULT_MAX_LENGTH = 2048


class Generator:
    """A decoder stepping one sequence with its key/value cache (see the module docstring).

    Args:
        model: the decoder (a path, or an ``onnx.ModelProto``), exported with its cache.
        way: a :class:`~dispatch.generation.step_ways.StepWay` or its name; default the first
            available (``onnxruntime-iobinding`` where onnxruntime is installed).
        max_length: the most positions (prompt plus new tokens) a generation holds; the
            buffers are allocated for it when a generation starts.
        threads: the library's threads (``None``: every core this process may use).
        io: the decoder's signature, when already read.

    Attributes:
        io: the decoder's signature (:class:`~dispatch.generation.decoder_io.DecoderIO`).
        runner: the compiled model of the way.
        max_length: see above.
        length: the positions held (prompt and tokens run so far).
    """

    def __init__(self, model: Any, way: StepWay | str | None = None, *,
                 max_length: int = DEFAULT_MAX_LENGTH, threads: int | None = None,
                 io: DecoderIO | None = None) -> None:
        self.io = io or read_decoder(model)
        if way is None:
            way = default_step_way()
        elif isinstance(way, str):
            way = step_way(way)
        self.way: StepWay = way
        self.runner: StepRunner = way.build(self.io, threads)
        self.max_length = 0
        self._allocated = 0
        self._started = False
        self._resize(max_length)

    def _resize(self, max_length: int) -> None:
        if int(max_length) < 1:
            raise ArgumentError(f"max_length must be at least 1 position, received {max_length}")
        self.max_length = int(max_length)
        if self.max_length <= self._allocated:
            return
        self._ids = np.zeros(self.max_length, dtype=self.io.ids_dtype)
        self._mask = np.ones((1, self.max_length), dtype=np.int64)
        self._positions = np.arange(self.max_length, dtype=np.int64)[None]
        self._branch = np.ones(1, dtype=bool)
        self._one = np.zeros((1, 1), dtype=np.int64)
        self._allocated = self.max_length

    @property
    def length(self) -> int:
        return self.runner.length if self._started else 0

    def reset(self, max_length: int | None = None) -> None:
        """Forget the sequence; the next call is a :meth:`prefill`. ``max_length`` changes the
        capacity of the generations from now on (buffers grow only when it grows)."""
        if max_length is not None:
            self._resize(max_length)
        self._started = False

    def _tokens(self, token_ids: Any, what: str) -> np.ndarray:
        if isinstance(token_ids, list | tuple) and len(token_ids) == 1 and isinstance(
                token_ids[0], int | np.integer) and 0 <= token_ids[0] < self.io.vocab:
            self._one[0, 0] = token_ids[0]  # the usual step: one valid token, checked cheaply
            return self._one
        ids = np.asarray(token_ids)
        if ids.ndim == 1:
            ids = ids[None]
        if ids.ndim != 2 or ids.shape[1] < 1:
            raise FeedError(f"{what} must be token ids [sequence] or [1, sequence], received shape "
                            f"{list(np.shape(token_ids))}")
        if ids.shape[0] != 1:
            raise FeedError(f"{what} has {ids.shape[0]} rows: a generator runs batch 1 (one "
                            f"sequence); use one generator per sequence")
        if ids.dtype.kind not in "iu":
            raise FeedError(f"{what} must be integer token ids ({self.io.ids_dtype.name}), received "
                            f"{ids.dtype.name}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.io.vocab):
            raise FeedError(f"{what} holds token ids outside the vocabulary 0..{self.io.vocab - 1} "
                            f"(received {int(ids.min())}..{int(ids.max())})")
        return ids

    def _run(self, ids: np.ndarray) -> np.ndarray:
        start, new = self.runner.length, ids.shape[1]
        if start + new > self.max_length:
            raise CapacityError(
                f"the generation would hold {start + new} positions ({start} held, {new} new) and "
                f"the generator's maximum is {self.max_length} (max_length)")
        self._ids[:new] = ids[0]
        inputs = {self.io.input_ids: self._ids[:new].reshape(1, new)}
        if self.io.attention_mask is not None:
            inputs[self.io.attention_mask] = self._mask[:, : start + new]
        if self.io.position_ids is not None:
            inputs[self.io.position_ids] = self._positions[:, start:start + new]
        if self.io.cache_branch is not None:
            inputs[self.io.cache_branch] = self._branch
        return self.runner.run(inputs, new)

    def prefill(self, input_ids: Any) -> np.ndarray:
        """Start a generation with the prompt ``input_ids`` ([sequence] or [1, sequence]);
        returns the logits [1, sequence, vocabulary], a view of the generator's buffer that the
        next call overwrites (copy it to keep it)."""
        ids = self._tokens(input_ids, "the prompt")
        if ids.shape[1] > self.max_length:
            raise CapacityError(f"the prompt has {ids.shape[1]} tokens and the generator holds at "
                                f"most {self.max_length} positions (max_length)")
        self.runner.begin(self.max_length)
        self._started = True
        return self._run(ids)

    def step(self, token_ids: Any) -> np.ndarray:
        """Append ``token_ids`` (usually the one token just chosen) to the sequence; returns
        their logits [1, new, vocabulary] (a view, as :meth:`prefill`'s)."""
        if not self._started:
            raise ArgumentError("step() before prefill(): start a generation with the prompt")
        return self._run(self._tokens(token_ids, "the step's tokens"))

    def generate(self, input_ids: Any, max_new_tokens: int, *, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int | None = None, stop_tokens: Iterable[int] = ()) -> np.ndarray:
        """The new tokens after the prompt ``input_ids``: greedy, or sampled (``do_sample``)
        with ``temperature``, ``top_k`` (0: every token) and ``top_p`` (nucleus; 1: every
        token) from a generator seeded with ``seed``; a token of ``stop_tokens`` ends the
        generation early and is the last one returned. The capacity grows to the prompt plus
        ``max_new_tokens`` when it is smaller. Returns int64 [tokens]."""
        if int(max_new_tokens) < 1:
            raise ArgumentError(f"max_new_tokens must be at least 1, received {max_new_tokens}")
        sampler = Sampler(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                          seed=seed)
        stops = {int(t) for t in stop_tokens}
        ids = self._tokens(input_ids, "the prompt")
        need = ids.shape[1] + int(max_new_tokens)
        if need > self.max_length:
            self._resize(need)
        out = np.empty(int(max_new_tokens), dtype=np.int64)
        logits = self.prefill(ids)
        for i in range(int(max_new_tokens)):
            token = sampler.choose(logits[0, -1])
            out[i] = token
            if token in stops:
                return out[: i + 1]
            if i + 1 < max_new_tokens:
                logits = self.step([out[i]])
        return out

    def describe(self) -> str:
        return f"{self.io.describe()}; way {self.way.name}: {self.way.description}"
