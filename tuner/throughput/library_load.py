"""Plain libraries under load, set up the way a user would, so that anyone can check the
throughput figures of a tuned plan (issue 30) against them.

:func:`measure_library` runs one of :data:`SETUPS` with N requests in flight: the three
thread-driven set-ups through :func:`tuner.throughput.load.run_load` (N Python threads, each sending its
next request as soon as its previous one returned), ``openvino-throughput`` through OpenVINO's
own asynchronous queue, as its ``benchmark_app`` does. Every set-up is built before the clock
starts (sessions created, models compiled) and measured after a warm-up; the figures are a
:class:`~tuner.throughput.load.LoadResult` (inferences per second, p50/p90/p99 latency).

onnxruntime and OpenVINO are imported inside the functions: the package never needs them, and
a set-up whose library is missing raises :class:`~dispatch.errors.ArgumentError` naming the
extra to install.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.errors import ArgumentError
from tuner.throughput.load import LoadResult, run_load

#: name -> what the set-up is, in the order the throughput bench shows them
SETUPS: dict[str, str] = {
    "onnxruntime": "one onnxruntime InferenceSession (intra-op threads = usable cores, defaults "
                   "otherwise) called from N threads: a latency set-up shared by every request",
    "onnxruntime-per-request": "N onnxruntime InferenceSessions of 1 intra-op thread each; "
                               "thread k runs session k",
    "openvino-latency": "an OpenVINO model compiled for the CPU with PERFORMANCE_HINT LATENCY "
                        "(float32 inference), one infer request per thread, request.infer() "
                        "from N threads",
    "openvino-throughput": "an OpenVINO model compiled with PERFORMANCE_HINT THROUGHPUT (float32 "
                           "inference), an "
                           "AsyncInferQueue of its OPTIMAL_NUMBER_OF_INFER_REQUESTS jobs kept "
                           "full (as benchmark_app does; the result's concurrency is that number)",
}

#: OpenVINO's CPU plugin computes in bf16 by default where the CPU has AVX512_BF16 or AMX
#: (measured here: squeezenet 1.5x faster, and not float32's outputs); every plan of this
#: project is float32, so the library set-ups it is compared with are pinned to float32 too
FLOAT32 = {"INFERENCE_PRECISION_HINT": "f32"}

#: the pip extra of each library
_EXTRAS = {"onnxruntime": "onnxruntime", "openvino": "openvino"}


def load_library(name: str) -> Any:
    """Import ``name`` (onnxruntime or openvino) or say which extra installs it."""
    try:
        if name == "onnxruntime":
            import onnxruntime as module
        else:
            import openvino as module
    except ImportError as exc:
        raise ArgumentError(
            f"{name} is not installed ({exc}); install it with "
            f'pip install "opdispatch[{_EXTRAS[name]}]"') from exc
    return module


def random_feeds(model_path: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs for the model's declared graph inputs (initializers left out):
    floats uniform in [0, 1) as float32 (float16/float64 inputs keep their type), integer
    inputs small values in [0, 100) (token ids below any vocabulary size) except inputs whose
    name holds ``mask``, which are all ones, booleans True; a symbolic dimension is 1."""
    import onnx
    from onnx import helper

    graph = onnx.load(model_path, load_external_data=False).graph
    weights = {i.name for i in graph.initializer}
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for value in graph.input:
        if value.name in weights:
            continue
        tensor = value.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1
                      for d in tensor.shape.dim)
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        if dtype.kind == "f":
            feeds[value.name] = rng.random(shape, dtype=np.float32).astype(dtype)
        elif dtype.kind in "iu" and "mask" in value.name.lower():
            feeds[value.name] = np.ones(shape, dtype)
        elif dtype.kind in "iu":
            feeds[value.name] = rng.integers(0, 100, shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[value.name] = np.ones(shape, dtype)
        else:
            raise ArgumentError(f"input {value.name!r} of {model_path} has type {dtype}: "
                                "random_feeds makes float, integer and boolean inputs only")
    return feeds


def _ort_sessions(model_path: str, count: int, threads: int) -> list[Any]:
    ort = load_library("onnxruntime")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    return [ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
            for _ in range(count)]


def _thread_call(model_path: str, setup: str, concurrency: int,
                 feeds: dict[str, np.ndarray], precision: dict[str, str]) -> Callable[[int], Any]:
    """``call(thread_index)`` of a thread-driven set-up, everything built."""
    if setup == "onnxruntime":
        (sess,) = _ort_sessions(model_path, 1, len(os.sched_getaffinity(0)))
        return lambda k: sess.run(None, feeds)
    if setup == "onnxruntime-per-request":
        sessions = _ort_sessions(model_path, concurrency, 1)
        return lambda k: sessions[k].run(None, feeds)
    ov = load_library("openvino")
    compiled = ov.Core().compile_model(model_path, "CPU", {"PERFORMANCE_HINT": "LATENCY",
                                                           **precision})
    requests = [compiled.create_infer_request() for _ in range(concurrency)]
    for request in requests:
        # each request's first run alone: first runs of several requests at once from
        # Python threads deadlocked OpenVINO 2026.4's binding in 11 of 25 processes here
        request.infer(feeds)
    return lambda k: requests[k].infer(feeds)


def _result(concurrency: int, latencies_s: list[float], window_s: float,
            errors: list[str]) -> LoadResult:
    """A :class:`LoadResult` from the measured latencies, as :func:`run_load` makes it."""
    window_s = max(1e-9, window_s)
    return LoadResult.measured(concurrency, np.asarray(latencies_s, dtype=np.float64) * 1e3, window_s,
                               len(latencies_s) / window_s, errors)


def _openvino_throughput(model_path: str, feeds: dict[str, np.ndarray], duration_s: float,
                         warmup_s: float, max_requests: int | None, precision: dict[str, str]) -> LoadResult:
    """OpenVINO's throughput set-up: an AsyncInferQueue of the compiled model's optimal number
    of jobs, a new request started as soon as a job is idle, for ``warmup_s`` (not counted)
    then ``duration_s`` seconds or ``max_requests`` completed requests. A request counts when
    it completes inside the window, as in :func:`tuner.throughput.load.run_load`; its latency runs from
    ``start_async`` to its callback."""
    ov = load_library("openvino")
    compiled = ov.Core().compile_model(model_path, "CPU", {"PERFORMANCE_HINT": "THROUGHPUT",
                                                           **precision})
    jobs = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
    queue = ov.AsyncInferQueue(compiled, jobs)
    lock = threading.Lock()
    latencies: list[float] = []
    errors: list[str] = []
    done = threading.Event()
    start_at = time.perf_counter() + warmup_s
    stop_at = [start_at + duration_s]

    def finished(request: Any, started: float) -> None:
        ended = time.perf_counter()
        if ended < start_at or ended > stop_at[0]:
            if ended > stop_at[0]:
                done.set()
            return
        with lock:
            latencies.append(ended - started)
            if max_requests is not None and len(latencies) >= max_requests:
                stop_at[0] = ended
                done.set()

    queue.set_callback(finished)
    try:
        while not done.is_set() and time.perf_counter() < stop_at[0]:
            queue.get_idle_request_id()  # waits for a free job, so the clock starts at the start
            queue.start_async(feeds, time.perf_counter())
        queue.wait_all()
    except Exception as exc:  # reported in the result, as run_load reports a failed call
        errors.append(f"{type(exc).__name__}: {exc}")
    end = min(stop_at[0], time.perf_counter())
    return _result(jobs, latencies, end - start_at, errors)


def measure_library(
    model_path: str,
    setup: str,
    concurrency: int,
    duration_s: float,
    *,
    feeds: dict[str, np.ndarray] | None = None,
    warmup_s: float = 0.5,
    max_requests: int | None = None,
    float32: bool = True,
) -> LoadResult:
    """Throughput and latency of ``model_path`` run by the plain library set-up ``setup`` (one
    of :data:`SETUPS`) with ``concurrency`` requests in flight, for ``warmup_s`` (not counted)
    then ``duration_s`` seconds or until ``max_requests`` requests completed.

    ``feeds`` defaults to :func:`random_feeds`. ``openvino-throughput`` keeps OpenVINO's
    optimal number of requests in flight instead of ``concurrency`` (its result's
    ``concurrency`` says how many). OpenVINO computes in float32 unless ``float32`` is false
    (then its default: bf16 on a CPU with AVX512_BF16 or AMX; what a model quantized to int8
    leaves in float follows the same setting). Raises :class:`~dispatch.errors.ArgumentError` for an
    unknown set-up, bad numbers, or a library that is not installed."""
    if setup not in SETUPS:
        raise ArgumentError(f"unknown library set-up {setup!r}; known: {', '.join(SETUPS)}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ArgumentError(f"concurrency must be a positive integer, received {concurrency!r}")
    if not duration_s > 0 or warmup_s < 0:
        raise ArgumentError(f"duration_s must be positive and warmup_s at least 0, received "
                            f"{duration_s!r} and {warmup_s!r}")
    if max_requests is not None and max_requests < 1:
        raise ArgumentError(f"max_requests must be positive, received {max_requests!r}")
    if feeds is None:
        feeds = random_feeds(model_path)
    precision = FLOAT32 if float32 else {}
    if setup == "openvino-throughput":
        return _openvino_throughput(model_path, feeds, duration_s, warmup_s, max_requests, precision)
    call = _thread_call(model_path, setup, concurrency, feeds, precision)
    return run_load(call, concurrency, duration_s, warmup_s=warmup_s, max_requests=max_requests)
