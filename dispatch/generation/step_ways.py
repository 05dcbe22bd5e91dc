"""Ways of running a decoder step: one library, built once per model, stepping with the cache.

A *step way* is the generation counterpart of a whole-model way (:mod:`dispatch.model_ways`):
the model file compiled once by a library with its dimensions dynamic, plus how the past and
present tensors travel between steps (bound to the ping-pong buffers of
:class:`~dispatch.generation.kv_cache.KVCache`, copied by the library each step, or kept inside
the compiled model as state). Its fields follow :class:`~dispatch.model_ways.ModelWay`'s: a
unique name, the backend whose library it uses, a one-line description and the settings it is
built with. The libraries are imported only when a way is built; :mod:`~dispatch.generation.ways`
lists the ways.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from dispatch.generation.decoder_io import DecoderIO
    from dispatch.generation.kv_cache import KVCache


class StepRunner(Protocol):
    """A decoder compiled by one library, stepping one generation at a time.

    Attributes:
        way: the way it was built by.
        io: the decoder's signature.
        kv: the ping-pong past buffers when the way binds them, else ``None`` (the library
            allocates its presents, or keeps them as state).
        length: the positions in the cache (prompt and tokens run so far).
    """

    way: StepWay
    io: DecoderIO
    kv: KVCache | None
    length: int

    def begin(self, capacity: int) -> None:
        """Start a generation of at most ``capacity`` positions with an empty past."""

    def run(self, inputs: Mapping[str, np.ndarray], new: int) -> np.ndarray:
        """Run one step adding ``new`` positions: ``inputs`` holds every input but the pasts
        (tokens, and mask, positions where the model takes them); returns the logits
        ``[batch, new, vocabulary]``, which the next call may overwrite."""


@dataclass(frozen=True)
class StepWay:
    """One way of running decoder steps.

    Attributes:
        name: unique among the step ways (``onnxruntime-iobinding``, ``openvino-stateful``).
        backend: the backend whose library it runs (its availability is the way's).
        description: one line for reports: the library, its settings and how the cache travels.
        build: ``build(io, threads) -> runner``, the model compiled once for every step;
            ``threads`` ``None`` is every core this process may use.
        settings: the library settings it is built with (reported).
        precision: ``float32`` (the model's own precision) or the one it computes in.
        binds_cache: whether the runner writes its presents into the
            :class:`~dispatch.generation.kv_cache.KVCache` buffers (no per-step allocation).
    """

    name: str
    backend: str
    description: str
    build: Callable[[DecoderIO, int | None], StepRunner]
    settings: Mapping[str, Any] = field(default_factory=dict)
    precision: str = "float32"
    binds_cache: bool = False


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
