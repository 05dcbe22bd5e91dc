"""Mixed-shape traffic replayed one request at a time (issue 51): ``opdispatch run MODEL --data
REQUESTS``, for the stored plan or a plain library, so that anyone can check a claim about
traffic whose shapes change from request to request (sentences of every length, OCR lines of
every width).

The requests come as the accuracy data does (:func:`tuner.accuracy.data.read_arrays`): an
``.npz`` file of arrays named like the model's inputs, first axis = requests, or a folder of
them — one file per shape, since one array holds one shape. A request whose arrays lack the
input's leading (batch) dimension gets a batch of 1. Every request is checked against the
model's declared inputs (symbolic dimensions take any size) before anything is timed.

The requests are replayed in the order given, one at a time, twice: the first pass meets every
shape for the first time in the process (what a freshly started server pays: a Session plans
each new shape, a library prepares its kernels for it), the second pass meets only shapes seen
before. Each pass is a :class:`~tuner.throughput.load.LoadResult` (requests per second, latency
p50/p90/p99) at concurrency 1.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dispatch.errors import OpDispatchError
from dispatch.feeds import check_declared_feeds
from dispatch.input_shapes import DeclaredInput
from tuner.accuracy.data import read_arrays
from tuner.throughput.load import LoadResult

Feeds = dict[str, np.ndarray]
#: what each pass of a replay is
PASSES = ("first pass: every shape new to the process", "second pass: every shape seen before")
#: the libraries a replay can run plainly, as their users set them up for one request at a time
LIBRARIES: dict[str, str] = {
    "onnxruntime": "one onnxruntime InferenceSession (intra-op threads = usable cores, defaults "
                   "otherwise), the model's symbolic dimensions left to it",
    "openvino-latency": "an OpenVINO model compiled once for the CPU with PERFORMANCE_HINT "
                        "LATENCY (float32 inference) and its symbolic dimensions dynamic, one "
                        "infer request",
    "openvino-default": "as openvino-latency, in OpenVINO's own default inference precision "
                        "(bf16 on CPUs with BF16: the anchor a user of reduced precision has)",
}


class ReplayError(OpDispatchError):
    """The requests cannot be replayed as given (unreadable, or not fitting the model)."""


@dataclass
class ReplayPass(LoadResult):
    """One pass over the requests: the figures of a load at concurrency 1, and how many
    distinct input shapes the pass met."""

    label: str = ""
    shapes: int = 0

    def describe(self) -> str:
        text = (f"{self.label}: {self.requests} requests of {self.shapes} shape(s) in "
                f"{self.seconds:.3f} s ({self.throughput:.1f} requests/s); latency p50 "
                f"{self.p50_ms:.2f} ms, p90 {self.p90_ms:.2f} ms, p99 {self.p99_ms:.2f} ms")
        if self.errors:
            text += f"; {self.errors} request(s) failed: {self.error}"
        return text


def read_requests(data: str | os.PathLike, declared: Sequence[DeclaredInput]) -> list[Feeds]:
    """The requests in ``data`` (an ``.npz`` file or a folder of them), one feeds dict each, in
    file-name order then array order, each checked against ``declared``. Raises
    :class:`ReplayError` saying what was received and what the model expects."""
    try:
        parts, source = read_arrays(data)
    except OpDispatchError as exc:
        raise ReplayError(str(exc).replace("accuracy data", "requests")) from None
    names = [d.name for d in declared]
    requests: list[Feeds] = []
    for where, arrays in parts:
        where = where.replace("accuracy data", "requests")
        missing = [n for n in names if n not in arrays]
        extra = sorted(set(arrays) - set(names))
        if missing or extra:
            raise ReplayError(
                f"{where}: arrays {sorted(arrays)}; the model's inputs are "
                + "; ".join(d.describe() for d in declared)
                + (f" (missing {missing})" if missing else "")
                + (f" (not inputs: {extra})" if extra else ""))
        counts = {n: int(np.asarray(arrays[n]).shape[0]) if np.ndim(arrays[n]) else 0
                  for n in names}
        if len(set(counts.values())) != 1 or not next(iter(counts.values()), 0):
            raise ReplayError(f"{where}: every array needs the same number of requests (its "
                              f"first axis, at least 1), received {counts}")
        for k in range(next(iter(counts.values()))):
            feeds = {d.name: _one_request(np.asarray(arrays[d.name])[k], d) for d in declared}
            try:
                requests.append(check_declared_feeds(declared, feeds))
            except OpDispatchError as exc:
                raise ReplayError(f"{where}, request {k}: {exc}") from None
    if not requests:
        raise ReplayError(f"requests from {source}: none found")
    return requests


def _one_request(array: np.ndarray, decl: DeclaredInput) -> np.ndarray:
    """A request's array for ``decl``: given without the leading batch dimension, a batch of 1."""
    if decl.dims is not None and array.ndim == len(decl.dims) - 1:
        array = array[None]
    return np.ascontiguousarray(array)


def shape_set(feeds: Mapping[str, np.ndarray]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The input shapes of one request, in a form that compares."""
    return tuple((name, tuple(np.shape(a))) for name, a in sorted(feeds.items()))


def replay(call: Callable[[Feeds], Any], requests: Sequence[Feeds],
           passes: int = len(PASSES)) -> list[ReplayPass]:
    """Run ``call(feeds)`` on every request in order, one at a time, ``passes`` times; a
    request that raises is counted as failed (the first error kept) and the replay goes on."""
    shapes = len({shape_set(r) for r in requests})
    results = []
    for k in range(passes):
        latencies: list[float] = []
        errors: list[str] = []
        start = time.perf_counter()
        for feeds in requests:
            t0 = time.perf_counter()
            try:
                call(feeds)
            except Exception as exc:  # a failed request is counted, not fatal to the replay
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            latencies.append(time.perf_counter() - t0)
        seconds = max(time.perf_counter() - start, 1e-9)
        figures = LoadResult.measured(1, np.asarray(latencies) * 1e3, seconds,
                                      len(latencies) / seconds, errors)
        results.append(ReplayPass(**vars(figures), shapes=shapes,
                                  label=PASSES[k] if k < len(PASSES) else f"pass {k + 1}"))
    return results


def library_call(model_path: str, library: str) -> Callable[[Feeds], Any]:
    """``call(feeds)`` of a plain library set up for one request at a time (:data:`LIBRARIES`),
    built before it is returned. Raises :class:`~dispatch.errors.ArgumentError` for an unknown
    set-up or a library that is not installed (naming the extra)."""
    from dispatch.errors import ArgumentError
    from tuner.throughput.library_load import FLOAT32, load_library

    if library not in LIBRARIES:
        raise ArgumentError(f"unknown library set-up {library!r} for a replay; known: "
                            + "; ".join(f"{k} ({v})" for k, v in LIBRARIES.items()))
    if library == "onnxruntime":
        ort = load_library("onnxruntime")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = len(os.sched_getaffinity(0))
        session = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
        return lambda feeds: session.run(None, feeds)
    ov = load_library("openvino")
    precision = FLOAT32 if library == "openvino-latency" else {}
    compiled = ov.Core().compile_model(model_path, "CPU", {"PERFORMANCE_HINT": "LATENCY",
                                                           **precision})
    request = compiled.create_infer_request()
    return lambda feeds: request.infer(feeds)


def pass_dicts(passes: Iterable[ReplayPass]) -> list[dict[str, Any]]:
    """The passes as plain JSON values."""
    return [p.to_dict() for p in passes]
