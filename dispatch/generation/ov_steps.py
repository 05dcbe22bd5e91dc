"""OpenVINO's step ways: the model compiled once for the CPU with dynamic dimensions, float32
(``INFERENCE_PRECISION_HINT f32``), the latency hint, one infer request, and no per-shape runtime
cache (``CPU_RUNTIME_CACHE_CAPACITY 0``).

Memory: every decode step is a new shape (the past grows by one), and OpenVINO's CPU plugin keeps
what it prepares per shape: with its default runtime cache (5,000 shapes) a 2-layer test decoder
grew the process by ~1.3 GB over 900 steps, and by ~0.25 GB with the runtime cache off, the rest
being the primitive cache of the oneDNN inside the plugin, which only the environment variable
``ONEDNN_PRIMITIVE_CACHE_CAPACITY=0`` set before OpenVINO loads turns off (process-wide: this
module does not set it; with both off the process stays flat over 2,000 steps, measured).

``openvino-stateful`` makes the model stateful offline before compiling it
(``apply_make_stateful_transformation``, OpenVINO's own pass: each past input and its present
output become one variable read and assigned inside the model); the cache then lives in the
infer request and never crosses into Python. A generation starts by resetting the variables to
an empty past of one row (the pass's default initial value has zero rows, which the model's
Concat refuses).

``openvino`` keeps the model as exported and passes the cache as tensors sharing the memory of
the :class:`~dispatch.generation.kv_cache.KVCache` buffers (``ov.Tensor(array,
shared_memory=True)``): pasts from the front views, presents set as the output tensors on the
back views (the CPU plugin writes into a user's output tensor of the right shape), then swapped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dispatch.generation.decoder_io import DecoderIO
from dispatch.generation.kv_cache import CacheHolder, CapacityError, KVCache
from dispatch.generation.step_ways import StepRunner, StepWay

CONFIG = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32",
          "CPU_RUNTIME_CACHE_CAPACITY": 0}


def _config(threads: int | None) -> dict[str, Any]:
    config: dict[str, Any] = dict(CONFIG)
    if threads:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    return config


class SharedRunner(CacheHolder):
    """OpenVINO on the ping-pong cache through shared-memory tensors (see the module docstring)."""

    def __init__(self, way: StepWay, io: DecoderIO, threads: int | None) -> None:
        import openvino as ov

        self._ov = ov
        self.way = way
        self.io = io
        self.compiled = ov.Core().compile_model(io.path, "CPU", _config(threads))
        self.request = self.compiled.create_infer_request()
        self.kv: KVCache | None = None
        self._logits = np.empty(0, dtype=io.logits_dtype)
        #: logits buffers allocated (once for the longest prompt seen)
        self.logits_allocations = 0
        #: steps whose outputs the plugin put in memory of its own (then copied into the cache)
        self.copied_steps = 0


    def _set(self, name: str, array: np.ndarray) -> None:
        self.request.set_tensor(name, self._ov.Tensor(array, shared_memory=True))

    def run(self, inputs: Mapping[str, np.ndarray], new: int) -> np.ndarray:
        kv = self.kv
        if kv is None:
            raise RuntimeError("begin() a generation before running a step")
        size = kv.batch * new * self.io.vocab
        if self._logits.size < size:
            self._logits = np.empty(size, dtype=self.io.logits_dtype)
            self.logits_allocations += 1
        logits = self._logits[:size].reshape(kv.batch, new, self.io.vocab)
        for name, array in inputs.items():
            self._set(name, array)
        for tensor, past in zip(self.io.cache, kv.pasts()):
            self._set(tensor.past, past)
        presents = kv.presents(new)
        for tensor, present in zip(self.io.cache, presents):
            self._set(tensor.present, present)
        self._set(self.io.logits, logits)
        self.request.infer(share_inputs=True, share_outputs=True)  # no copy of the outputs
        written = self.request.get_tensor(self.io.cache[0].present).data
        if written.ctypes.data != presents[0].ctypes.data:  # the plugin chose its own memory
            self.copied_steps += 1
            for tensor, present in zip(self.io.cache, presents):
                np.copyto(present, self.request.get_tensor(tensor.present).data)
            np.copyto(logits, self.request.get_tensor(self.io.logits).data)
        kv.advance(new)
        return logits


class StatefulRunner:
    """OpenVINO with the cache as the model's state (see the module docstring)."""

    def __init__(self, way: StepWay, io: DecoderIO, threads: int | None) -> None:
        import openvino as ov
        from openvino._offline_transformations import apply_make_stateful_transformation

        self._ov = ov
        self.way = way
        self.io = io
        core = ov.Core()
        model = core.read_model(io.path)
        apply_make_stateful_transformation(model, {t.past: t.present for t in io.cache})
        self.compiled = core.compile_model(model, "CPU", _config(threads))
        self.request = self.compiled.create_infer_request()
        self.kv: KVCache | None = None
        self.length = 0
        self.capacity = 0
        self._logits_port = next(o for o in self.compiled.outputs if io.logits in o.get_names())
        # the variables are named after their past and present ("past_key_values.0.keypresent...")
        by_name = {t.past + t.present: t for t in io.cache}
        self._empty = {}
        for state in self.request.query_state():
            tensor = by_name.get(state.name) or next(
                (t for t in io.cache if state.name.startswith(t.past)), io.cache[0])
            self._empty[state.name] = np.zeros(tensor.dims(1, 0), dtype=io.dtype)

    def begin(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self.length = 0
        self.request.reset_state()
        for state in self.request.query_state():
            state.state = self._ov.Tensor(self._empty[state.name])

    def run(self, inputs: Mapping[str, np.ndarray], new: int) -> np.ndarray:
        if self.length + new > self.capacity:
            raise CapacityError(f"the generation holds at most {self.capacity} positions; it holds "
                                f"{self.length} and {new} more were asked for")
        result = self.request.infer(dict(inputs), share_inputs=True, share_outputs=True)
        self.length += new
        return result[self._logits_port]


def _build(kind: type) -> Any:
    def build(io: DecoderIO, threads: int | None) -> StepRunner:
        return kind(_WAYS[kind], io, threads)

    return build


STATEFUL = StepWay(
    "openvino-stateful", "openvino",
    "OpenVINO CPU, latency hint, float32, no runtime cache, the model made stateful offline "
    "(past and present as one variable inside the compiled model), one infer request", _build(StatefulRunner),
    {**CONFIG, "cache": "model state (apply_make_stateful_transformation)"})
SHARED = StepWay(
    "openvino", "openvino",
    "OpenVINO CPU, latency hint, float32, no runtime cache, pasts and presents as tensors "
    "sharing the ping-pong buffers allocated once per generation", _build(SharedRunner),
    {**CONFIG, "cache": "shared-memory tensors, ping-pong buffers"}, binds_cache=True)
_WAYS: dict[type, StepWay] = {StatefulRunner: STATEFUL, SharedRunner: SHARED}


def ways() -> list[StepWay]:
    """OpenVINO's step ways."""
    return [STATEFUL, SHARED]
