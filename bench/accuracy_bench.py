"""Reduced precision within an accuracy budget (issue 33), side by side on real data.

For each model of ``bench/models/accuracy_models.py`` (MiniLM-L6 with its real weights on real
sentences, the YOLOv8n detector shipped in nudenet on real photographs, BERT-base and ResNet-50
exports with random weights): ``opdispatch tune MODEL --accuracy cosine:BUDGET --data DATA`` in
a process of its own, then every set-up timed in processes of its own, alternating, one round
after another (production runs one plan per process):

- ``tuned plan``: the plan just tuned, from the store (``opdispatch run``'s Session);
- ``onnxruntime f32`` and ``openvino f32`` (the float32 libraries; OpenVINO with its f32 hint:
  its default on a bf16 CPU is bf16, listed as ``openvino default``);
- ``ort dynamic int8`` (``quantize_dynamic``, whole model), ``ort static int8`` and ``openvino
  static int8`` (``quantize_static``'s QDQ model with per-channel weights, calibrated on the
  same calibration half of the data, run by each library; OpenVINO's with the f32 hint for
  what stays in float and with its default, ``openvino static int8 default``);
- ``nncf accuracy control``: NNCF's ``quantize_with_accuracy_control`` for OpenVINO (when
  ``nncf`` installs), calibrated and validated on the calibration half with the same metric,
  run with OpenVINO's default precision as NNCF validated it.

Each set-up's accuracy is the worst held-out sample's cosine of every output to float32
(onnxruntime f32's outputs), on the held-out half the tuner never chose on. The figures: the
median latency over the rounds (each round's figure the median of its timed runs), its ratio to
the best float32 library, and the cosine. The CPU and its flags are named.

Under load, ``--concurrency N``: the plan is tuned with ``--objective throughput --concurrency
N`` as well, and every set-up is measured with N requests in flight for ``--duration`` seconds
(``tuner.throughput.library_load``, the set-ups of the throughput bench): the tuned plan's Session called
from N threads; float32 onnxruntime one session shared (``onnxruntime f32``) and one session of
one thread per request (``... per request``), float32 OpenVINO with its LATENCY and its
THROUGHPUT hint; OpenVINO's default precision, the int8 models and NNCF's with the THROUGHPUT
hint, the onnxruntime int8 models a session per request. The figures are then inferences per
second (median over rounds), the p99 latency, and the ratio to the best float32 library set-up
(higher is better). Accuracy is measured as above, one request at a time, with the same model
and settings built once more (OpenVINO with its LATENCY hint).

Run: ``python bench/models/accuracy_models.py`` once, then
``python bench/accuracy_bench.py [--models minilm_real,resnet50] [--budget S] [--rounds R]
[--concurrency N [--duration S]]``.
Nothing here is run by the tests; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("OPDISPATCH_ACCURACY_MODELS",
                          "~/.cache/opdispatch/bench-models/accuracy")).expanduser()
MODELS = ("minilm_real", "yolov8n", "bert_base", "resnet50")
SETUPS = ("tuned plan", "onnxruntime f32", "openvino f32", "openvino default", "ort dynamic int8",
          "ort static int8", "openvino static int8", "openvino static int8 default",
          "nncf accuracy control")
#: timed runs per set-up and round (after warm-up)
RUNS = 20
#: ``--skip-nncf``: NNCF's accuracy control not run (it took 863 s on MiniLM here, and failed)
SKIP_NNCF = False
#: under load (``--concurrency``): set-up -> (library set-up of tuner.throughput.library_load, model file,
#: OpenVINO pinned to float32, the single-request set-up whose outputs give its accuracy)
LOAD_SETUPS: dict[str, tuple[str, str, bool, str]] = {
    "tuned plan": ("", "", True, "tuned plan"),
    "onnxruntime f32": ("onnxruntime", "float.onnx", True, "onnxruntime f32"),
    "onnxruntime f32 per request": ("onnxruntime-per-request", "float.onnx", True, "onnxruntime f32"),
    "openvino f32 latency": ("openvino-latency", "float.onnx", True, "openvino f32"),
    "openvino f32 throughput": ("openvino-throughput", "float.onnx", True, "openvino f32"),
    "openvino default throughput": ("openvino-throughput", "float.onnx", False, "openvino default"),
    "ort dynamic int8 per request": ("onnxruntime-per-request", "dynamic.onnx", True, "ort dynamic int8"),
    "ort static int8 per request": ("onnxruntime-per-request", "static.onnx", True, "ort static int8"),
    "openvino static int8 throughput": ("openvino-throughput", "static.onnx", True, "openvino static int8"),
    "openvino static int8 default throughput": ("openvino-throughput", "static.onnx", False,
                                                "openvino static int8 default"),
    "nncf throughput": ("openvino-throughput", "nncf.xml", False, "nncf accuracy control"),
}
#: the float32 library set-ups under load (the best of them is the comparison)
LOAD_FLOAT32 = ("onnxruntime f32", "onnxruntime f32 per request", "openvino f32 latency",
                "openvino f32 throughput")


def machine() -> dict[str, Any]:
    """The CPU model, the usable cores and the extensions reduced precision depends on."""
    from bench.test_bench_throughput import machine as cpu

    return cpu(("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"))


def load_split(name: str) -> tuple[list[dict], list[dict]]:
    """The model's samples split as the tuner splits them (first half calibration)."""
    from dispatch.backend import load_registry
    from tuner.accuracy.data import load_data
    from tuner.tune import load_graph

    registry = load_registry()
    graph = load_graph(str(DATA / f"{name}.onnx"), registry, ["numpy"], _shapes(name))
    data = load_data(str(DATA / f"{name}_data.npz"), graph)
    return data.calibration, data.held_out


def _shapes(name: str) -> dict[str, list[int]] | None:
    return {"images": [1, 3, 320, 320]} if name == "yolov8n" else None


def prepare(name: str, work: Path, calibration: list[dict], accuracy: float) -> None:
    """The whole-model quantized variants: onnxruntime's tools and NNCF's accuracy control,
    calibrated on the tuner's calibration half."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    src = str(DATA / f"{name}.onnx")
    if name == "resnet50":  # random weights: the final Softmax saturates; compare the logits
        from dispatch.zoo import drop_final_softmax

        model = drop_final_softmax(onnx.load(src))
        src = str(work / "resnet50_logits.onnx")
        onnx.save(model, src)
    model = onnx.load(src)
    if next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) < 13:
        # per-channel QDQ needs opset 13; quantize_static does not convert (an invalid model)
        from onnx import version_converter

        onnx.save(version_converter.convert_version(model, 13), str(work / "float13.onnx"))
        src = str(work / "float13.onnx")
    (work / "float.onnx").write_bytes(Path(src).read_bytes())
    quantize_dynamic(src, str(work / "dynamic.onnx"), weight_type=QuantType.QInt8)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(calibration)

        def get_next(self) -> dict | None:
            return next(self._it, None)

    quantize_static(src, str(work / "static.onnx"), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    nncf_quantize(src, work, calibration, accuracy, transformer=name in ("minilm_real", "bert_base"))


def nncf_quantize(src: str, work: Path, calibration: list[dict], accuracy: float,
                  transformer: bool = False) -> None:
    """NNCF's accuracy-controlled quantization (``quantize_with_accuracy_control``) of the
    float model for OpenVINO, written to ``nncf.xml``: calibrated and validated on the same
    calibration half the tuner chooses on, the metric the worst sample's cosine to float32 (its
    own compile of the float model: OpenVINO's default precision), the allowed drop what keeps
    the level at ``accuracy``; run with OpenVINO's default precision, as NNCF validated it.
    Records why when NNCF is not installed or fails (the set-up is then shown failed with that
    reason)."""
    if SKIP_NNCF:
        (work / "nncf.error").write_text("skipped (--skip-nncf)")
        return
    try:
        import nncf
        import openvino as ov
    except ImportError as exc:
        (work / "nncf.error").write_text(f"nncf is not installed ({exc}): pip install nncf")
        return
    from tuner.accuracy.metrics import cosine_error

    # NNCF's advice for transformer encoders (its own recipe, as a user of it would run it)
    model_type = nncf.ModelType.TRANSFORMER if transformer else None
    try:
        model = ov.convert_model(src)
        reference = ov.Core().compile_model(src, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        want = [[np.asarray(o) for o in reference(f).values()] for f in calibration]

        def validate(compiled: Any, items: Any) -> float:
            got = [[np.asarray(o) for o in compiled(f).values()] for f in items]
            return 1.0 - cosine_error(want, got)

        # NNCF measures the drop from its own compile of the float model (OpenVINO's default
        # precision, bf16 on a bf16 CPU): the drop allowed keeps the level at ``accuracy``
        baseline = validate(ov.Core().compile_model(src, "CPU"), calibration)
        quantized = nncf.quantize_with_accuracy_control(
            model, nncf.Dataset(calibration), nncf.Dataset(calibration), validate,
            max_drop=max(0.0, baseline - accuracy), drop_type=nncf.DropType.ABSOLUTE,
            subset_size=len(calibration), model_type=model_type)
        ov.save_model(quantized, str(work / "nncf.xml"))
    except Exception as exc:  # a comparator that fails is shown failed, with its reason
        (work / "nncf.error").write_text(f"nncf failed: {type(exc).__name__}: {str(exc)[:300]}")


def worker(setup: str, work: Path, store: str, data_npz: str, budget: str, load: str = "0,0") -> None:
    """One set-up in this process: outputs on the held-out samples (saved), then timed runs on
    the first held-out sample; prints the median in milliseconds. Under load (``load`` =
    ``N,SECONDS``, N > 0), the set-up of :data:`LOAD_SETUPS` measured with N requests in flight
    instead; prints its throughput and percentiles."""
    held = [dict(np.load(work / "held.npz", allow_pickle=False))]
    held = [{k: v[i] for k, v in held[0].items()} for i in range(len(next(iter(held[0].values()))))]
    n, seconds = int(load.split(",")[0]), float(load.split(",")[1])
    if n:
        library, model, float32, single = LOAD_SETUPS[setup]
        run = _single(single, work, store, data_npz, budget, n)
        outs = [[np.asarray(o) for o in run(f)] for f in held]
        np.savez(work / f"out-{setup.replace(' ', '_')}.npz", **{f"{i}_{j}": o for i, os_ in enumerate(outs)
                                                                 for j, o in enumerate(os_)})
        if library:
            from tuner.throughput.library_load import measure_library

            del run  # (its sessions and compiled models go before the measured ones are built)
            result = measure_library(str(work / model), library, n, seconds, feeds=held[0], float32=float32)
        else:
            from tuner.throughput.load import run_load

            result = run_load(lambda _k: run(held[0]), n, seconds, warmup_s=0.5)
        if result.errors:
            sys.exit(f"{result.errors} request(s) failed: {result.error}")
        print(json.dumps({"throughput": result.throughput, "p50_ms": result.p50_ms, "p99_ms": result.p99_ms,
                          "in_flight": result.concurrency}))
        return
    run = _single(setup, work, store, data_npz, budget, 0)
    outs = [[np.asarray(o) for o in run(f)] for f in held]
    np.savez(work / f"out-{setup.replace(' ', '_')}.npz", **{f"{i}_{j}": o for i, os_ in enumerate(outs)
                                                             for j, o in enumerate(os_)})
    for _ in range(3):
        run(held[0])
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        run(held[0])
        times.append(time.perf_counter() - t0)
    print(json.dumps({"ms": float(np.median(times)) * 1e3}))


def _single(setup: str, work: Path, store: str, data_npz: str, budget: str, concurrency: int) -> Any:
    """``run(feeds)`` of one set-up, one request at a time (the tuned plan: the one tuned for
    ``concurrency`` requests in flight when it is not 0)."""
    if setup == "tuned plan":
        from dispatch.session import Session

        sess = Session(str(work / "float.onnx"), store=store, require_plan=True,
                       objective=_objective(budget, data_npz, concurrency),
                       input_shapes=_shapes(work.name.split("-")[1]))
        return lambda f: sess.run(None, f)
    elif setup.startswith(("openvino", "nncf")):
        import openvino as ov

        if (work / "nncf.error").exists() and setup.startswith("nncf"):
            sys.exit((work / "nncf.error").read_text())
        path = work / ("nncf.xml" if setup.startswith("nncf") else
                       "static.onnx" if "int8" in setup else "float.onnx")
        config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1"}
        if setup in ("openvino f32", "openvino static int8"):  # else OpenVINO's default (bf16 on a bf16 CPU)
            config["INFERENCE_PRECISION_HINT"] = "f32"
        compiled = ov.Core().compile_model(str(path), "CPU", config)
        request = compiled.create_infer_request()
        return lambda f: [np.array(o) for o in request.infer(f).values()]
    import onnxruntime as ort

    path = work / {"onnxruntime f32": "float.onnx", "ort dynamic int8": "dynamic.onnx",
                   "ort static int8": "static.onnx"}[setup]
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda f: sess.run(None, f)


def _objective(budget: str, data_npz: str, concurrency: int = 0) -> str:
    from dispatch.objective import AccuracyTarget, Objective
    from tuner.accuracy.data import data_digest

    accuracy = AccuracyTarget("cosine", float(budget), data_digest(data_npz))
    if concurrency:
        return str(Objective("throughput", concurrency=concurrency, accuracy=accuracy))
    return str(Objective("latency", accuracy=accuracy))


def worst_cosine(reference: np.lib.npyio.NpzFile, got: np.lib.npyio.NpzFile) -> float:
    from tuner.accuracy.metrics import cosine_error

    keys = sorted(reference.files)
    samples = sorted({k.split("_")[0] for k in keys}, key=int)
    ref = [[reference[k] for k in keys if k.split("_")[0] == s] for s in samples]
    out = [[got[k] for k in keys if k.split("_")[0] == s] for s in samples]
    return 1.0 - cosine_error(ref, out)


def bench_model(name: str, budget_s: float, rounds: int, accuracy: float, concurrency: int = 0,
                duration_s: float = 3.0) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix=f"acc-{name.replace('-', '_')}-"))
    calibration, held = load_split(name)
    prepare(name, work, calibration, accuracy)
    np.savez(work / "held.npz", **{k: np.stack([f[k] for f in held]) for k in held[0]})
    # the tuner gets the same samples: the float model it runs and the data file it digests
    data_npz = str(work / "data.npz")
    np.savez(data_npz, **{k: np.stack([f[k] for f in calibration + held]) for k in held[0]})
    store = str(work / "plans.db")
    tuned = subprocess.run([sys.executable, "-m", "tuner.cli", "tune", str(work / "float.onnx"),
                            "--store", store,
                            "--budget", str(budget_s), "--no-progress", "--accuracy", f"cosine:{accuracy}",
                            "--data", data_npz,
                            *[f"--shape={k}={'x'.join(map(str, v))}"
                              for k, v in (_shapes(name) or {}).items()],
                            *(["--objective", "throughput", "--concurrency", str(concurrency)]
                              if concurrency else [])],
                           capture_output=True, text=True, cwd=ROOT)
    (work / "tune.log").write_text(tuned.stdout + tuned.stderr)
    print(tuned.stdout[-3000:], flush=True)
    setups = tuple(LOAD_SETUPS) if concurrency else SETUPS
    figures: dict[str, list[dict[str, float]]] = {s: [] for s in setups}
    errors: dict[str, str] = {}
    for r in range(rounds):
        order = setups[r % len(setups):] + setups[:r % len(setups)]  # rotated from round to round
        for setup in order:
            if setup in errors:
                continue
            cmd = [sys.executable, __file__, "--worker", setup, str(work), store, data_npz, str(accuracy),
                   f"{concurrency},{duration_s}"]
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            try:
                figures[setup].append(json.loads(done.stdout.strip().splitlines()[-1]))
            except (IndexError, ValueError, KeyError):
                errors[setup] = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        print(f"{name}: round {r + 1}/{rounds} done", flush=True)
    reference = np.load(work / "out-onnxruntime_f32.npz")
    rows = []
    for setup in setups:
        row: dict[str, Any] = {"model": name, "setup": setup, "concurrency": concurrency}
        if setup in errors or not figures[setup]:
            row["error"] = errors.get(setup, "not measured")
        else:
            for field in figures[setup][0]:
                row[field] = float(np.median([f[field] for f in figures[setup]]))
            row["cosine"] = worst_cosine(reference, np.load(work / f"out-{setup.replace(' ', '_')}.npz"))
        rows.append(row)
    if concurrency:  # the best float32 library set-up under load: the highest throughput
        best = max((r["throughput"] for r in rows if r["setup"] in LOAD_FLOAT32 and "throughput" in r),
                   default=float("nan"))
        for row in rows:
            if "throughput" in row:
                row["vs_best_f32"] = row["throughput"] / best
                row["within"] = row["cosine"] >= accuracy
        return rows
    best = min(r["ms"] for r in rows if r["setup"] in ("onnxruntime f32", "openvino f32") and "ms" in r)
    for row in rows:
        if "ms" in row:
            row["vs_best_f32"] = row["ms"] / best
            row["within"] = row["cosine"] >= accuracy
    return rows


def table(rows: list[dict[str, Any]], accuracy: float) -> str:
    if rows and rows[0].get("concurrency"):
        return load_table(rows, accuracy)
    lines = [f"| model | set-up | latency ms (median) | vs best float32 library | held-out worst cosine "
             f"| within {accuracy} |",
             "|---|---|---:|---:|---:|---|"]
    for r in rows:
        if "ms" not in r:
            lines.append(f"| {r['model']} | {r['setup']} | failed: {r['error']} | | | |")
            continue
        lines.append(f"| {r['model']} | {r['setup']} | {r['ms']:.2f} | {r['vs_best_f32']:.2f} | "
                     f"{r['cosine']:.5f} | {'yes' if r['within'] else 'no'} |")
    return "\n".join(lines)


def load_table(rows: list[dict[str, Any]], accuracy: float) -> str:
    lines = [f"| model | N | set-up | inferences/s (median) | p99 ms | vs best float32 library | "
             f"held-out worst cosine | within {accuracy} |", "|---|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        if "throughput" not in r:
            lines.append(f"| {r['model']} | {r['concurrency']} | {r['setup']} | failed: {r['error']} "
                         "| | | | |")
            continue
        lines.append(f"| {r['model']} | {r['concurrency']} | {r['setup']} | {r['throughput']:.1f} | "
                     f"{r['p99_ms']:.1f} | {r['vs_best_f32']:.2f}x | {r['cosine']:.5f} | "
                     f"{'yes' if r['within'] else 'no'} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--budget", type=float, default=240.0, help="tuning budget per model (seconds)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--accuracy", type=float, default=0.999, help="the cosine budget")
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--concurrency", type=int, default=0,
                   help="measure under load with N requests in flight (the plan tuned for it)")
    p.add_argument("--duration", type=float, default=3.0,
                   help="with --concurrency: seconds per set-up and round")
    p.add_argument("--skip-nncf", action="store_true", help="leave NNCF's accuracy control out")
    p.add_argument("--worker", nargs=6, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        setup, work, store, data_npz, budget, load = args.worker
        worker(setup, Path(work), store, data_npz, budget, load)
        return
    global SKIP_NNCF
    SKIP_NNCF = args.skip_nncf
    print(json.dumps(machine()), flush=True)
    rows = []
    for name in args.models.split(","):
        rows += bench_model(name.strip(), args.budget, args.rounds, args.accuracy, args.concurrency,
                            args.duration)
        print(table(rows, args.accuracy), flush=True)
    print(json.dumps(machine()))
    print(table(rows, args.accuracy))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
