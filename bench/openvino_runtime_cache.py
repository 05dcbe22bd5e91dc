"""OpenVINO's runtime cache and warming every shape of a range (issue 51): one process compiles a
model with dynamic dimensions under the latency hint (float32), optionally runs it once at every
width of a range (``--warm LO..HI``), then replays a folder of requests twice, printing the
warm-up's seconds, the process's peak memory after each phase and each pass's seconds, p50 and
p99. ``--capacity N`` sets ``CPU_RUNTIME_CACHE_CAPACITY`` (the CPU plugin's per-shape kernels
and memory plans; OpenVINO's default is 5,000 entries).

    W=$VENV/lib/python3.11/site-packages/rapidocr_onnxruntime/models
    D=~/.cache/opdispatch/bench-models/shapes/ocr_requests      # bench/models/shapes_models.py
    python bench/openvino_runtime_cache.py $W/ch_PP-OCRv4_rec_infer.onnx $D                  # default
    python bench/openvino_runtime_cache.py $W/ch_PP-OCRv4_rec_infer.onnx $D --warm 100..800
    python bench/openvino_runtime_cache.py $W/ch_PP-OCRv4_rec_infer.onnx $D --warm 100..800 --capacity 10000

The warmed shapes are ``(1, 3, 48, W)`` (the recogniser's lines): the last axis of the
requests' shape runs over the range, the others as the first request's. Run each setting in a
process of its own, on a quiet machine, and name the CPU.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np


def requests(folder: Path) -> list[np.ndarray]:
    """The first input of every request in ``folder``'s ``.npz`` files, in file order."""
    out = []
    for f in sorted(folder.glob("*.npz")):
        with np.load(f) as z:
            arr = z[z.files[0]]
            out.extend(arr[i] for i in range(arr.shape[0]))
    return out


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("data", type=Path, help="a folder of .npz requests (first axis: requests)")
    parser.add_argument("--capacity", type=int, default=None, help="CPU_RUNTIME_CACHE_CAPACITY")
    parser.add_argument("--warm", default=None, metavar="LO..HI",
                        help="run once at every size of the last axis")
    args = parser.parse_args(argv)
    import openvino as ov

    config: dict = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    if args.capacity is not None:
        config["CPU_RUNTIME_CACHE_CAPACITY"] = args.capacity
    lines = requests(args.data)
    if not lines:
        parser.error(f"no .npz requests in {args.data}")
    t = time.perf_counter()
    request = ov.Core().compile_model(str(args.model), "CPU", config).create_infer_request()
    compile_s, before = time.perf_counter() - t, peak_mb()
    t = time.perf_counter()
    if args.warm:
        lo, hi = (int(v) for v in args.warm.split(".."))
        for size in range(lo, hi + 1):
            request.infer({0: np.zeros((*lines[0].shape[:-1], size), lines[0].dtype)})
    warm_s, warmed = time.perf_counter() - t, peak_mb()
    passes = []
    for _ in range(2):
        times = []
        start = time.perf_counter()
        for x in lines:
            t = time.perf_counter()
            request.infer({0: x})
            times.append(time.perf_counter() - t)
        passes.append((time.perf_counter() - start, np.percentile(times, 50) * 1e3,
                       np.percentile(times, 99) * 1e3))
    print(f"capacity {args.capacity or 'default'}, warm {args.warm or 'none'}: compile {compile_s:.2f} s, "
          f"warm-up {warm_s:.2f} s; peak {before:.0f} -> {warmed:.0f} -> {peak_mb():.0f} MB; "
          + "; ".join(f"pass {k + 1} {s:.3f} s p50 {p50:.2f} ms p99 {p99:.2f} ms"
                      for k, (s, p50, p99) in enumerate(passes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
