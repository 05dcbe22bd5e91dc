"""Throughput under load (issue 30): a plan tuned for inferences per second with N requests in
flight, against the latency plan and the plain libraries set up as a user would.

For each model and each concurrency N:

* tuning first, before anything is timed, each run in a process of its own into a temporary
  store per model: ``opdispatch tune MODEL --objective throughput --concurrency N`` for every N
  and once ``opdispatch tune MODEL`` (the latency plan), budget ``OPDISPATCH_BENCH_BUDGET``
  seconds each (default 60);
* then ``OPDISPATCH_BENCH_ROUNDS`` rounds (default 3); in each round every set-up is timed in a
  fresh process of its own (bench/throughput_child.py: build, warm up 0.5 s, then N requests in
  flight for ``OPDISPATCH_BENCH_DURATION`` seconds, default 5), the order of the set-ups
  rotated from round to round:

  - ``tuned-throughput``: ``Session(MODEL, store=S, objective=f"throughput@n={N}",
    require_plan=True)`` run from N threads;
  - ``tuned-latency``: the same Session with ``objective="latency"``, run from N threads;
  - the plain library set-ups of :data:`tuner.throughput.library_load.SETUPS`: ``onnxruntime`` (one
    InferenceSession, intra-op threads = usable cores, from N threads),
    ``onnxruntime-per-request`` (N sessions of one thread), ``openvino-latency`` (one infer
    request per thread) and ``openvino-throughput`` (an AsyncInferQueue of OpenVINO's optimal
    number of jobs, whatever N is);
  - ``tuned-batched`` (N >= 2): the same model with a symbolic batch dimension, as a user who
    serves it with a batcher exports it (``NAME.batch.onnx`` in the bench folder, written by
    bench/models/export.py for the specs with ``batch_copy``; else a copy made by
    bench/models/symbolic_batch.py, which refuses a model that bakes its batch size into its
    graph), tuned for ``throughput@n=N`` at batch 1 (``--shape``) into a store of its own, so
    that the tuner may group requests in batches (tuner/throughput/batch.py), and run as
    ``tuned-throughput`` is (in batches when its plan says so). The library set-ups run the
    static batch-1 file, as their users would. ``OPDISPATCH_BENCH_THROUGHPUT_BATCHED=0`` leaves
    it out.

Per set-up the median over rounds of the inferences per second and of the p99 latency; the
ratios are tuned-throughput over the best library set-up and over tuned-latency. They go to
``benchmark.extra_info`` (pytest-benchmark's own timing is that of all rounds, meaningless),
to the JSON file ``OPDISPATCH_BENCH_THROUGHPUT_JSON`` when set (rewritten after every test),
and to a table printed at the end (``-s`` shows it) with the machine's CPU.

Models: onnx's light squeezenet, resnet50, inception_v1, shufflenet, densenet121 and the
exports mobilenet_v2, efficientnet_b0, bert_eager, minilm found in the bench folder
(bench/models/export.py); ``OPDISPATCH_BENCH_THROUGHPUT_MODELS=squeezenet,minilm`` picks some
(``OPDISPATCH_BENCH_MODELS`` is the bench folder). Concurrencies: ``OPDISPATCH_BENCH_CONCURRENCY``
(default ``1,2,4,8``). Skipped when onnxruntime or openvino is missing.

    OPDISPATCH_BENCH_BUDGET=40 python -m pytest bench/test_bench_throughput.py -q -s --benchmark-enable
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: its set-ups are baselines")
pytest.importorskip("openvino", reason="openvino is not installed: its set-ups are baselines")

from bench.test_bench_models import EXPORTED, LIGHT, _path
from tuner.throughput.library_load import SETUPS

CANDIDATES = ("squeezenet", "resnet50", "inception_v1", "shufflenet", "densenet121",
              "mobilenet_v2", "efficientnet_b0", "bert_eager", "minilm", "distilbert_s8")
_AVAILABLE = [m for m in CANDIDATES if m in LIGHT or m in EXPORTED]
_PICKED = [m.strip() for m in os.environ.get("OPDISPATCH_BENCH_THROUGHPUT_MODELS", "").split(",")
           if m.strip()]
if _PICKED and set(_PICKED) - set(CANDIDATES):
    raise pytest.UsageError(f"OPDISPATCH_BENCH_THROUGHPUT_MODELS: unknown model(s) "
                            f"{sorted(set(_PICKED) - set(CANDIDATES))}; known: {', '.join(CANDIDATES)}")
MODELS = [m for m in _AVAILABLE if not _PICKED or m in _PICKED]
if not MODELS:
    pytest.skip(f"none of {_PICKED or CANDIDATES} is available (exported models: "
                "python bench/models/export.py)", allow_module_level=True)
CONCURRENCY = [int(n) for n in os.environ.get("OPDISPATCH_BENCH_CONCURRENCY", "1,2,4,8").split(",")
               if n.strip()]
ROUNDS = int(os.environ.get("OPDISPATCH_BENCH_ROUNDS", "3"))
BUDGET_S = float(os.environ.get("OPDISPATCH_BENCH_BUDGET", "60"))
DURATION_S = float(os.environ.get("OPDISPATCH_BENCH_DURATION", "5"))
JSON_PATH = os.environ.get("OPDISPATCH_BENCH_THROUGHPUT_JSON")
BATCHED = "tuned-batched"
TUNED = ("tuned-throughput", "tuned-latency",
         *((BATCHED,) if os.environ.get("OPDISPATCH_BENCH_THROUGHPUT_BATCHED", "1") != "0" else ()))
ORDER = (*TUNED, *SETUPS)
LIBRARIES = tuple(SETUPS)
CHILD = str(Path(__file__).with_name("throughput_child.py"))
SYMBOLIC_BATCH = str(Path(__file__).with_name("models") / "symbolic_batch.py")
ROOT = str(Path(__file__).resolve().parent.parent)

#: model -> its store; (model, objective label) -> the tuning error; the rows measured so far
_stores: dict[str, str] = {}
_tune_errors: dict[tuple[str, str], str] = {}
#: model -> (its symbolic-batch file, that file's store), or why it has none
_batched: dict[str, tuple[str, str] | str] = {}
_rows: list[dict[str, Any]] = []


def machine(extensions: tuple[str, ...] = ("avx512f", "avx512_vnni", "amx_tile")) -> dict[str, Any]:
    """The CPU model, the usable cores and whether it has each of ``extensions`` (the vector
    extensions that decide the kernels)."""
    name, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name == "unknown":
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {"cpu": name, "cores": len(os.sched_getaffinity(0)),
            **{f: f in flags for f in extensions}}


def _tune(name: str, objective: str, *extra: str, model: str | None = None,
          store: str | None = None) -> None:
    """``opdispatch tune`` in a process of its own into the model's store; a failure is kept."""
    cmd = [sys.executable, "-m", "tuner.cli", "tune", model or _path(name), "--store",
           store or _stores[name], "--budget", str(BUDGET_S), "--no-progress", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        _tune_errors[(name, objective)] = (f"`{' '.join(cmd[1:])}` exited {out.returncode}: "
                                           + (out.stderr or out.stdout).strip()[-800:])


def _batch_file(name: str) -> tuple[str, str] | str:
    """The model with a symbolic batch and a store for its plans, or why there is none (see
    the module docstring)."""
    folder = Path(_stores[name]).parent
    exported = Path(_path(name)).with_name(f"{name}.batch.onnx")
    path = exported if exported.exists() else folder / f"{name}.batch.onnx"
    if not exported.exists():
        out = subprocess.run([sys.executable, SYMBOLIC_BATCH, _path(name), str(path)],
                             capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            return (out.stderr or out.stdout).strip()[-400:]
    return str(path), str(folder / "batched.sqlite")


def _shape_args(name: str) -> list[str]:
    """``--shape NAME=1x...`` for every input: the batch-1 shapes of the static file."""
    from tuner.throughput.library_load import random_feeds

    return [a for n, x in random_feeds(_path(name)).items()
            for a in ("--shape", f"{n}={'x'.join(map(str, x.shape))}")]


@pytest.fixture(scope="module", autouse=True)
def _tune_first(request):
    """Tune every selected model and concurrency before anything is timed, on the quiet
    machine; print the table when the module is done."""
    here = request.module.__name__
    selected = [(it.callspec.params["name"], it.callspec.params["concurrency"])
                for it in request.session.items
                if getattr(it, "module", None) is not None and it.module.__name__ == here]
    for name in dict.fromkeys(n for n, _ in selected):
        _stores[name] = os.path.join(tempfile.mkdtemp(prefix="opdispatch-bench-throughput-"), "plans.sqlite")
        _tune(name, "latency")
    for name, n in selected:
        _tune(name, f"throughput@n={n}", "--objective", "throughput", "--concurrency", str(n))
        if BATCHED in TUNED and n >= 2:
            if name not in _batched:
                _batched[name] = _batch_file(name)
            if not isinstance(_batched[name], str):
                model, store = _batched[name]
                _tune(name, f"batched throughput@n={n}", "--objective", "throughput",
                      "--concurrency", str(n), *_shape_args(name), model=model, store=store)
    yield
    if _rows:
        print("\n" + table(_rows))


def _child(name: str, setup: str, concurrency: int) -> dict[str, Any]:
    """One timed set-up in a fresh process; a failure is returned as ``{"failed": why}``, a
    set-up that does not apply as ``{"skipped": why}``."""
    model, store = _path(name), _stores[name]
    if setup == BATCHED:
        found = _batched.get(name, "one request in flight: nothing to group")
        if isinstance(found, str):
            return {"skipped": found}
        if (name, f"batched throughput@n={concurrency}") in _tune_errors:
            return {"failed": _tune_errors[(name, f"batched throughput@n={concurrency}")]}
        model, store = found
    cmd = [sys.executable, CHILD, model, setup, str(concurrency), str(DURATION_S), store]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=DURATION_S + 300)
    except subprocess.TimeoutExpired:
        return {"failed": f"{setup}: hung, no result in {DURATION_S + 300:.0f} s"}
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return {"failed": f"{setup} exited {out.returncode}: {(out.stderr or out.stdout).strip()[-800:]}"}
    result = json.loads(lines[-1])
    if result.get("errors"):
        return {"failed": f"{setup}: {result['errors']} request(s) failed: {result['error']}"}
    return result


def _summary(name: str, concurrency: int, rounds: list[dict[str, dict]]) -> dict[str, Any]:
    """Medians per set-up over the rounds, and the ratios."""
    row: dict[str, Any] = {"model": name, "concurrency": concurrency, "setups": {}}
    for setup in ORDER:
        ok = [r[setup] for r in rounds if "failed" not in r[setup] and "skipped" not in r[setup]]
        failed = [r[setup]["failed"] for r in rounds if "failed" in r[setup]]
        row["setups"][setup] = {
            "throughput": statistics.median(r["throughput"] for r in ok) if ok else None,
            "p99_ms": statistics.median(r["p99_ms"] for r in ok) if ok else None,
            "p50_ms": statistics.median(r["p50_ms"] for r in ok) if ok else None,
            "in_flight": ok[-1]["concurrency"] if ok else None,
            "plan": ok[-1].get("plan") if ok else None,
            "serving": ok[-1].get("serving") if ok else None,
            "failed": failed[0] if failed else None,
            "skipped": next((r[setup]["skipped"] for r in rounds if "skipped" in r[setup]), None),
            "rounds": [r.get("throughput") for r in (x[setup] for x in rounds)],
        }
    got = {s: v["throughput"] for s, v in row["setups"].items() if v["throughput"]}
    libs = {s: got[s] for s in LIBRARIES if s in got}
    best = max(libs, key=libs.get) if libs else None
    tuned = got.get("tuned-throughput")
    row["best_library"] = best
    row["vs_best_library"] = tuned / libs[best] if tuned and best else None
    row["vs_tuned_latency"] = tuned / got["tuned-latency"] if tuned and "tuned-latency" in got else None
    batched = got.get(BATCHED)
    row["batched_vs_best_library"] = batched / libs[best] if batched and best else None
    row["batched_vs_tuned"] = batched / tuned if batched and tuned else None
    return row


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def table(rows: list[dict[str, Any]]) -> str:
    """The results as a markdown table, the machine above it."""
    from tabulate import tabulate

    m = machine()
    flags = ", ".join(f"{f} {'yes' if m[f] else 'no'}" for f in ("avx512f", "avx512_vnni", "amx_tile"))
    head = ["model", "n"] + [f"{s} inf/s" for s in ORDER] + [f"{s} p99 ms" for s in ORDER] + [
        "ov-throughput jobs", "tuned-thr / best library", "best library", "tuned-thr / tuned-lat",
        "tuned-thr serving", *((f"{BATCHED} / best library", f"{BATCHED} / tuned-thr",
                                f"{BATCHED} serving") if BATCHED in ORDER else ())]
    body = []
    for r in rows:
        s = r["setups"]
        body.append([r["model"], r["concurrency"], *(_fmt(s[x]["throughput"]) for x in ORDER),
                     *(_fmt(s[x]["p99_ms"], 2) for x in ORDER), s["openvino-throughput"]["in_flight"] or "-",
                     _fmt(r["vs_best_library"], 2), r["best_library"] or "-", _fmt(r["vs_tuned_latency"], 2),
                     s["tuned-throughput"]["serving"] or "-",
                     *((_fmt(r["batched_vs_best_library"], 2), _fmt(r["batched_vs_tuned"], 2),
                        s[BATCHED]["serving"] or "-") if BATCHED in ORDER else ())])
    failures = [f"- {r['model']} n={r['concurrency']}: {v['failed']}" for r in rows
                for v in r["setups"].values() if v["failed"]]
    skipped = [f"- {r['model']} n={r['concurrency']} {k}: {v['skipped']}" for r in rows
               for k, v in r["setups"].items() if v.get("skipped")]
    text = (f"Machine: {m['cpu']}, {m['cores']} usable cores; {flags}\n"
            f"Budget {BUDGET_S:g} s per tuning, {DURATION_S:g} s per timing, median of {ROUNDS} round(s)\n\n"
            + tabulate(body, head, tablefmt="github"))
    return (text + ("\n\nFailed:\n" + "\n".join(failures) if failures else "")
            + ("\n\nNot measured:\n" + "\n".join(skipped) if skipped else ""))


def _write_json() -> None:
    if JSON_PATH:
        data = {"machine": machine(), "budget_s": BUDGET_S, "duration_s": DURATION_S,
                "rounds": ROUNDS, "results": _rows}
        Path(JSON_PATH).write_text(json.dumps(data, indent=1))


@pytest.mark.parametrize("concurrency", CONCURRENCY, ids=lambda n: f"n{n}")
@pytest.mark.parametrize("name", MODELS)
def test_throughput(benchmark, name, concurrency):
    """Every set-up of ``name`` at ``concurrency``, alternated over the rounds."""
    objective = f"throughput@n={concurrency}"
    if (name, objective) in _tune_errors:  # the latency plan's failure is shown in the table
        pytest.skip(f"tuning the {objective} plan of {name} failed: {_tune_errors[(name, objective)]}")
    rounds: list[dict[str, dict]] = []

    def all_rounds() -> None:
        for k in range(ROUNDS):
            order = ORDER[k % len(ORDER):] + ORDER[:k % len(ORDER)]
            seen = {}
            for setup in order:
                if setup == "tuned-latency" and (name, "latency") in _tune_errors:
                    seen[setup] = {"failed": _tune_errors[(name, "latency")]}
                else:
                    seen[setup] = _child(name, setup, concurrency)
            rounds.append(seen)

    benchmark.group = f"throughput-{name}"
    benchmark.pedantic(all_rounds, rounds=1, iterations=1)
    row = _summary(name, concurrency, rounds)
    _rows.append(row)
    _write_json()
    benchmark.extra_info.update(variant=f"n={concurrency}", machine=machine(), budget_s=BUDGET_S,
                                duration_s=DURATION_S, **row)
    failed = row["setups"]["tuned-throughput"]["failed"]
    if failed:
        pytest.fail(f"the tuned throughput plan of {name} did not run: {failed}")
