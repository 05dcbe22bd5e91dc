"""onnxruntime's step ways: one InferenceSession per model, two ways of passing the cache.

``onnxruntime-iobinding`` binds every input and output of a step to memory the generation owns:
the pasts to the front views of the :class:`~dispatch.generation.kv_cache.KVCache`, the presents
to its back views (so the present of step t is, after the swap, the past of step t+1), the
logits to a buffer allocated once for the longest prompt, the tokens, mask and positions to
views of the generator's buffers. onnxruntime writes its outputs straight into them: nothing
is allocated or copied per step outside the model's own Concat of past and new positions.

``onnxruntime`` is the yardstick every user's loop starts from: ``session.run`` with the presents
of one step fed back as the next step's past; onnxruntime allocates every present (and the
logits) afresh each step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dispatch.generation.decoder_io import DecoderIO
from dispatch.generation.kv_cache import CacheHolder, KVCache
from dispatch.generation.step_ways import StepRunner, StepWay, usable_cores


def _session(io: DecoderIO, threads: int | None) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    so.intra_op_num_threads = threads or usable_cores()
    so.inter_op_num_threads = 1
    return ort.InferenceSession(io.path, so, providers=["CPUExecutionProvider"])


class BoundRunner(CacheHolder):
    """onnxruntime with IO binding on the ping-pong cache (see the module docstring)."""

    def __init__(self, way: StepWay, io: DecoderIO, threads: int | None) -> None:
        self.way = way
        self.io = io
        self.session = _session(io, threads)
        self.binding = self.session.io_binding()
        self.kv: KVCache | None = None
        self._logits = np.empty(0, dtype=io.logits_dtype)
        #: logits buffers allocated (once for the longest prompt seen)
        self.logits_allocations = 0


    def _bind_input(self, name: str, array: np.ndarray) -> None:
        self.binding.bind_input(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)

    def _bind_output(self, name: str, array: np.ndarray) -> None:
        self.binding.bind_output(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)

    def run(self, inputs: Mapping[str, np.ndarray], new: int) -> np.ndarray:
        kv = self.kv
        if kv is None:
            raise RuntimeError("begin() a generation before running a step")
        batch = kv.batch
        size = batch * new * self.io.vocab
        if self._logits.size < size:
            self._logits = np.empty(size, dtype=self.io.logits_dtype)
            self.logits_allocations += 1
        logits = self._logits[:size].reshape(batch, new, self.io.vocab)
        for name, array in inputs.items():
            self._bind_input(name, array)
        for tensor, past in zip(self.io.cache, kv.pasts()):
            self._bind_input(tensor.past, past)
        for tensor, present in zip(self.io.cache, kv.presents(new)):
            self._bind_output(tensor.present, present)
        self._bind_output(self.io.logits, logits)
        self.session.run_with_iobinding(self.binding)
        kv.advance(new)
        return logits


class PlainRunner:
    """onnxruntime's ``run``, presents fed back as pasts (see the module docstring)."""

    def __init__(self, way: StepWay, io: DecoderIO, threads: int | None) -> None:
        self.way = way
        self.io = io
        self.session = _session(io, threads)
        self.kv: KVCache | None = None
        self.length = 0
        self.capacity = 0
        self._names = [o.name for o in self.session.get_outputs()]
        self._pasts: list[np.ndarray] = []

    def begin(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self.length = 0
        self._pasts = [np.zeros(t.dims(1, 0), dtype=self.io.dtype) for t in self.io.cache]

    def run(self, inputs: Mapping[str, np.ndarray], new: int) -> np.ndarray:
        from dispatch.generation.kv_cache import CapacityError

        if self.length + new > self.capacity:
            raise CapacityError(f"the generation holds at most {self.capacity} positions; it holds "
                                f"{self.length} and {new} more were asked for")
        feeds = dict(inputs)
        feeds.update((t.past, p) for t, p in zip(self.io.cache, self._pasts))
        results = dict(zip(self._names, self.session.run(None, feeds)))
        self._pasts = [results[t.present] for t in self.io.cache]
        self.length += new
        return results[self.io.logits]


def _build(kind: type) -> Any:
    def build(io: DecoderIO, threads: int | None) -> StepRunner:
        return kind(way_of[kind], io, threads)

    return build


_SETTINGS = {"graph_optimization_level": "all", "intra_op_threads": "usable cores"}
IOBINDING = StepWay(
    "onnxruntime-iobinding", "onnxruntime",
    "onnxruntime InferenceSession with IO binding: pasts, presents and logits bound to buffers "
    "allocated once per generation (presents written into the next step's past, swapped)",
    _build(BoundRunner), {**_SETTINGS, "cache": "io binding, ping-pong buffers"}, binds_cache=True)
PLAIN = StepWay(
    "onnxruntime", "onnxruntime",
    "onnxruntime InferenceSession.run, each step's presents (allocated by onnxruntime) fed back "
    "as the next step's past", _build(PlainRunner), {**_SETTINGS, "cache": "run outputs fed back"})
way_of: dict[type, StepWay] = {BoundRunner: IOBINDING, PlainRunner: PLAIN}


def ways() -> list[StepWay]:
    """onnxruntime's step ways, the preferred first."""
    return [IOBINDING, PLAIN]
