"""How long other libraries' worker threads stay runnable after a run (issue 13, interleaved).

A service that holds a plain onnxruntime session and a plain OpenVINO compiled model next to
an opdispatch Session runs them between its requests. This script runs one of them (or both,
onnxruntime then OpenVINO, as bench/test_bench_load.py's interleaved variant does), then
samples the state of every thread of the process (``/proc/self/task/*/stat``) every 0.2 ms
for ``--window`` ms and reports, per case and round, how many of the library's threads were
runnable (state ``R``: spinning, since no work is queued) and when the last was seen. The
sampling thread itself is left out. Linux only.

    python bench/neighbour_spin.py PATH.onnx [--rounds 5] [--window 80]

A thread runnable for the whole of the next request takes one of the machine's cores from it:
on 2 cores, a request that needs both runs up to 2x slower, whatever the request runs on.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def _runnable(skip: int) -> int:
    count = 0
    for task in Path("/proc/self/task").iterdir():
        if int(task.name) == skip:
            continue
        try:
            text = (task / "stat").read_text()
        except OSError:
            continue  # the thread ended
        if text[text.rindex(")") + 2] == "R":
            count += 1
    return count


def _trace(window_s: float, skip: int) -> tuple[float, float]:
    """(ms after which no other thread was seen runnable, mean runnable threads) over the
    window."""
    start = time.perf_counter()
    last, seen = 0.0, []
    while (now := time.perf_counter() - start) < window_s:
        n = _runnable(skip)
        seen.append(n)
        if n:
            last = now
        time.sleep(0.0002)
    return last * 1e3, statistics.fmean(seen)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="an ONNX file with float inputs")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=float, default=80.0, help="ms sampled after each run")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = ap.parse_args(argv)
    if not Path("/proc/self/task").is_dir():
        print("needs Linux /proc/self/task", file=sys.stderr)
        return 2
    import onnxruntime as ort
    import openvino as ov

    cases = {}
    for spinning in ("1", "0"):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.add_session_config_entry("session.intra_op.allow_spinning", spinning)
        cases[f"onnxruntime spinning={spinning}"] = ort.InferenceSession(
            args.model, opts, providers=["CPUExecutionProvider"])
    sess = cases["onnxruntime spinning=1"]
    feeds = {i.name: np.ones([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
             for i in sess.get_inputs()}
    request = ov.Core().compile_model(args.model, "CPU",
                                      {"PERFORMANCE_HINT": "LATENCY"}).create_infer_request()
    runs = {
        "onnxruntime (spinning, its default)": lambda: cases["onnxruntime spinning=1"].run(None, feeds),
        "onnxruntime (allow_spinning=0)": lambda: cases["onnxruntime spinning=0"].run(None, feeds),
        "openvino (LATENCY hint)": lambda: request.infer(list(feeds.values())),
        "onnxruntime (spinning) then openvino": lambda: (
            cases["onnxruntime spinning=1"].run(None, feeds), request.infer(list(feeds.values()))),
    }
    for run in runs.values():  # warm-up: every pool created
        for _ in range(3):
            run()
    me = os.getpid()  # the main thread's id is the process id
    print(f"{Path(args.model).name}: other threads runnable after a run, {args.window:.0f} ms "
          f"sampled, {args.rounds} rounds (median)")
    for label, run in runs.items():
        lasts, means = [], []
        for _ in range(args.rounds):
            time.sleep(0.3)  # every pool asleep again
            run()
            last, mean = _trace(args.window / 1e3, me)
            lasts.append(last)
            means.append(mean)
        print(f"  {label:40s} last runnable at {statistics.median(lasts):6.1f} ms; "
              f"mean runnable threads {statistics.median(means):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
