"""OpenVINO's whole-model ways (:mod:`dispatch.model_ways`): the model file compiled once for
the CPU with its symbolic dimensions dynamic (OpenVINO prepares kernels per shape on first
sight and caches them), in float32 (``INFERENCE_PRECISION_HINT f32``: a float32 plan never
computes in bf16 behind the user's back), under the latency hint, one infer request; for an
accuracy objective, the same in bfloat16 (OpenVINO's own default on CPUs with BF16), which only a
bucket whose requests stay within the budget takes; for a throughput objective, the throughput
hint with a pool of infer requests."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import numpy as np

from dispatch.model_ways import ModelWay, WayRunner
from impls.openvino.settings import DYNAMIC_QUANTIZATION_GROUP, SETTINGS, dynamic_quantization

#: entries of the CPU plugin's runtime cache (its per-shape kernels and memory plans) a latency
#: way keeps: room for every shape a range plan warms when loaded
#: (:data:`tuner.shapes.buckets.WARM_MAX_SHAPES`, 1,024) at up to 16 entries each. OpenVINO's
#: default, 5,000, evicted what was warmed: PP-OCRv4's recogniser warmed at its 701 widths then
#: ran its 120 lines in 1.64 s at the default and in 0.78 s (its warm speed) with 10,000 or more
#: (Intel Xeon, Sapphire Rapids class, 2 cores; the process at 1.47 GB where an unwarmed one
#: reached 0.69 GB). A bound all the same: a stream of ever new shapes is not kept without end.
RUNTIME_CACHE_CAPACITY = 16 * 1024


def declares_int8_activations(model_path: str) -> bool:
    """Whether the file at ``model_path`` declares int8 activations for its compressed-weight
    MatMuls (:func:`impls.openvino.settings.dynamic_quantization`: MatMulNBits, every one at
    accuracy level 4, and no DequantizeLinear). A file without the bytes ``MatMulNBits`` (an
    op type is stored verbatim) is not parsed: ~0.16 s for a 90 MB model, on every build."""
    return _float32_config(model_path)["DYNAMIC_QUANTIZATION_GROUP_SIZE"] > 0


#: how the float32 ways' settings report it
DYNAMIC_QUANTIZATION_SETTING = (f"0 ({DYNAMIC_QUANTIZATION_GROUP} where every MatMulNBits declares "
                                "accuracy_level 4)")


def _float32_config(model_path: str) -> dict[str, int]:
    """What a float32 way adds: dynamic quantization off unless the file declares it."""
    import mmap

    with open(model_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data.find(b"MatMulNBits") < 0:
            return dynamic_quantization((), False)
    import onnx

    nodes = onnx.load(model_path, load_external_data=False).graph.node
    levels = [next((a.i for a in n.attribute if a.name == "accuracy_level"), 0) for n in nodes
              if n.op_type == "MatMulNBits" and n.domain == "com.microsoft"]
    return dynamic_quantization(levels, any(n.op_type == "DequantizeLinear" for n in nodes))


def _build_latency(model_path: str, precision: str = "f32") -> WayRunner:
    from impls.openvino.region import core

    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": precision,
              "CPU_RUNTIME_CACHE_CAPACITY": RUNTIME_CACHE_CAPACITY}
    if precision == "f32":
        config.update(_float32_config(model_path))
    if SETTINGS["threads"]:
        config["INFERENCE_NUM_THREADS"] = int(SETTINGS["threads"])
    compiled = core().compile_model(model_path, "CPU", config)
    request = compiled.create_infer_request()
    outputs = list(compiled.outputs)
    lock = threading.Lock()  # one infer request: concurrent callers take turns

    def run(feeds: Mapping[str, np.ndarray]) -> Sequence[np.ndarray]:
        with lock:
            # the caller's arrays are read in place (no copy in), the outputs copied once out
            # of the request's buffers, which the next request overwrites
            result = request.infer(dict(feeds), share_inputs=True, share_outputs=True)
            return [np.array(result[o], copy=True) for o in outputs]

    return run


def _build_throughput(model_path: str) -> WayRunner:
    """OpenVINO's throughput hint (its own streams splitting the cores) and as many infer
    requests as it advises: a caller takes a free one, runs, gives it back."""
    import queue

    from impls.openvino.region import core

    config = {"PERFORMANCE_HINT": "THROUGHPUT", "INFERENCE_PRECISION_HINT": "f32",
              **_float32_config(model_path)}
    if SETTINGS["threads"]:
        config["INFERENCE_NUM_THREADS"] = int(SETTINGS["threads"])
    compiled = core().compile_model(model_path, "CPU", config)
    count = max(1, int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
    free: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(count):
        free.put(compiled.create_infer_request())
    outputs = list(compiled.outputs)

    def run(feeds: Mapping[str, np.ndarray]) -> Sequence[np.ndarray]:
        request = free.get()
        try:
            result = request.infer(dict(feeds), share_inputs=True, share_outputs=True)
            return [np.array(result[o], copy=True) for o in outputs]
        finally:
            free.put(request)

    return run


def ways() -> list[ModelWay]:
    """The ways this backend offers."""
    return [ModelWay("openvino-latency", "openvino",
                     "OpenVINO CPU, PERFORMANCE_HINT LATENCY, float32, dynamic dimensions, one "
                     "infer request", _build_latency,
                     {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32",
                      "CPU_RUNTIME_CACHE_CAPACITY": RUNTIME_CACHE_CAPACITY,
                      "DYNAMIC_QUANTIZATION_GROUP_SIZE": DYNAMIC_QUANTIZATION_SETTING}),
            ModelWay("openvino-latency-bf16", "openvino",
                     "OpenVINO CPU, PERFORMANCE_HINT LATENCY, bfloat16 inference precision "
                     "(OpenVINO's default on CPUs with BF16), dynamic dimensions, one infer "
                     "request", lambda path: _build_latency(path, "bf16"),
                     {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "bf16",
                      "CPU_RUNTIME_CACHE_CAPACITY": RUNTIME_CACHE_CAPACITY},
                     precision="bf16"),
            ModelWay("openvino-throughput", "openvino",
                     "OpenVINO CPU, PERFORMANCE_HINT THROUGHPUT (its streams), float32, dynamic "
                     "dimensions, its advised number of infer requests shared by the callers",
                     _build_throughput,
                     {"PERFORMANCE_HINT": "THROUGHPUT", "INFERENCE_PRECISION_HINT": "f32",
                      "DYNAMIC_QUANTIZATION_GROUP_SIZE": DYNAMIC_QUANTIZATION_SETTING},
                     throughput_only=True)]
