r"""Start-up of a restarting production process (issue 13): a Session created from the plan
store against onnxruntime's InferenceSession, each in a fresh process.

Each model is tuned once at the start of the run (budget ``OPDISPATCH_BENCH_BUDGET``, default
30 s, into a temporary store); the graph cache and the compiled cache (OpenVINO regions) live
in a temporary folder that the tuning fills, as a machine's caches are filled by its first
start. Then, for ``ROUNDS`` rounds, two fresh Python processes per model, one after the other:
one creates ``onnxruntime.InferenceSession(path)``, the other
``dispatch.Session(path, require_plan=True)``; each imports its libraries first (not timed)
and reports the seconds of the creation alone and of the first run. The benchmark's own
timing is that of the whole child process (Python and library imports included);
``extra_info`` holds the medians of the creation and first-run seconds and the stored
plan's backends (``python bench/report.py startup.json`` makes the table, with issue 13's
bound: 1.2x onnxruntime's creation or at most 100 ms above it).

Models: every model of the bench set (bench/test_bench_models.py); rounds:
``OPDISPATCH_BENCH_ROUNDS`` (default 5).

    OPDISPATCH_BENCH_BUDGET=30 python -m pytest bench/test_bench_startup.py -q \
        --benchmark-enable --benchmark-json=startup.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

import pytest

from bench.test_bench_models import ALL, _path

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: it is the baseline")

#: the bench set of bench/test_bench_models.py: the exported models found in MODEL_DIR and
#: onnx's light architectures (``OPDISPATCH_BENCH_LIGHT=0`` leaves those out)
MODELS = list(ALL)
BUDGET_S = float(os.environ.get("OPDISPATCH_BENCH_BUDGET", "30"))
ROUNDS = int(os.environ.get("OPDISPATCH_BENCH_ROUNDS", "5"))
_CACHES = tempfile.mkdtemp(prefix="opdispatch-bench-startup-")
_ENV = dict(os.environ, OPDISPATCH_GRAPH_CACHE=os.path.join(_CACHES, "graphs"),
            OPDISPATCH_COMPILED_CACHE=os.path.join(_CACHES, "compiled"))
# An installed package has its bytecode compiled (pip does it at install); an environment with
# PYTHONDONTWRITEBYTECODE would make every child compile opdispatch's sources from scratch
# (~0.1 s), which no deployment pays: the warm-up round writes the bytecode.
_ENV.pop("PYTHONDONTWRITEBYTECODE", None)
_stores: dict[str, str] = {}

CHILD = r"""
import json, sys, time
import numpy as np
kind, path, store = sys.argv[1:4]
if kind == "onnxruntime":
    import onnxruntime as ort
    t0 = time.perf_counter()
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    created = time.perf_counter() - t0
    feeds = {}
    for i in sess.get_inputs():
        dt = {"tensor(float)": np.float32, "tensor(int64)": np.int64}[i.type]
        feeds[i.name] = np.ones(i.shape, dt)
    t1 = time.perf_counter()
    sess.run(None, feeds)
else:
    import dispatch
    from dispatch import Session
    import onnxruntime, openvino  # the libraries a plan may use, imported before the clock
    t0 = time.perf_counter()
    sess = Session(path, store=store, require_plan=True)
    created = time.perf_counter() - t0
    feeds = {i.name: np.ones(i.shape, i.dtype) for i in sess.get_inputs()}
    t1 = time.perf_counter()
    sess.run(None, feeds)
    plan = ", ".join(f"{b} {n}" for b, n in sess.plan.backends_used().items())
    if sess.plan.nonfinite_fallback is not None:
        plan += " (guarded)"
print(json.dumps({"create_s": created, "first_run_s": time.perf_counter() - t1,
                  "plan": plan if kind != "onnxruntime" else ""}))
"""


@pytest.fixture(scope="module", autouse=True)
def _tune_first():
    """Tune every model before anything is timed (this fills the caches too)."""
    code = ("import sys\nfrom tuner.tune import TuneOptions, tune\n"
            "tune(sys.argv[1], store=sys.argv[2], "
            "options=TuneOptions(progress=False, budget_s=float(sys.argv[3])))")
    for name in MODELS:
        store = os.path.join(tempfile.mkdtemp(prefix="opdispatch-bench-startup-"), "plans.sqlite")
        subprocess.run([sys.executable, "-c", code, _path(name), store, str(BUDGET_S)], env=_ENV,
                       check=True, capture_output=True)
        _stores[name] = store


def _child(kind: str, name: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, kind, _path(name), _stores[name]], env=_ENV,
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("kind", ["onnxruntime", "tuned_from_store"])
def test_startup(benchmark, name, kind):
    benchmark.group = f"startup-{name}"
    seen: list[dict] = []
    benchmark.pedantic(lambda: seen.append(_child(kind, name)), rounds=ROUNDS, iterations=1,
                       warmup_rounds=1)
    seen = seen[-ROUNDS:]  # the warm-up round left out
    benchmark.extra_info.update(
        variant=kind,
        create_s=round(statistics.median(s["create_s"] for s in seen), 4),
        first_run_s=round(statistics.median(s["first_run_s"] for s in seen), 4),
        plan=seen[-1].get("plan", ""),
    )
