"""End-to-end latency on exported real-architecture models (bench/models/export.py: BERT,
GPT-2, ViT, ConvNeXt-tiny, MobileNetV2, EfficientNet-B0; batch 1, random weights) and onnx's
nine light architectures (``dispatch.zoo``: AlexNet, DenseNet-121, Inception v1/v2, ResNet-50,
ShuffleNet, SqueezeNet, VGG-19, ZFNet-512; ``OPDISPATCH_BENCH_LIGHT=0`` leaves them out), every
library side by side in one run, one pytest-benchmark group per model (``models-NAME``):

* ``onnxruntime`` — a plain InferenceSession (all graph optimisations, intra-op threads =
  usable cores): the baseline of every ratio;
* ``openvino`` — a plain OpenVINO compiled model (CPU, ``PERFORMANCE_HINT: LATENCY``; skipped
  when openvino is not installed);
* ``default_session`` — ``Session(path, store=False)``: the untuned plan in the configured
  backend order;
* ``B_plan`` — the untuned plan of one backend (``backends=[B, "numpy"]``, numpy for what B does
  not run) for every registered backend B (skipped with the reason when B is unavailable), and
  ``numpy_plan`` (numpy alone);
* ``tuned_plan`` — tuned once per model before anything is timed, into a fresh temporary store
  (budget ``OPDISPATCH_BENCH_BUDGET`` seconds, default 120), then run by a Session from the
  store; ``extra_info`` holds the winner, its predicted latency (the optimiser's estimate,
  ``None`` when the winner is a baseline plan the optimiser did not produce), the tuner's own
  validation median and the tuning time.

Every variant's start (model load and session creation, timed once) is in
``extra_info["start_s"]``. Models: ``OPDISPATCH_BENCH_MODELS`` or ~/.cache/opdispatch/bench-models/
(``python bench/models/export.py``); the module is skipped when none is exported. A model
that opdispatch cannot load (an operator no backend implements) has every variant skipped with
the exact error, found when it is tuned at the start; when its ``tuned_plan`` is deselected
(``-k``), the dispatcher's variants skip with that error and the plain libraries still run.

    python -m pytest bench/test_bench_models.py -q --benchmark-enable --benchmark-json=models.json
    python bench/report.py models.json
"""

from __future__ import annotations

import gc
import os
import tempfile
import time

import numpy as np
import onnx
import pytest

from bench.models.export import MODELS, model_dir
from dispatch import Session
from dispatch.backend import load_registry
from dispatch.errors import ModelLoadError, OpDispatchError, UnsupportedOpError
from dispatch.zoo import LIGHT_MODELS, light_model

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: it is the baseline")

MODEL_DIR = model_dir()
EXPORTED = [n for n in MODELS if (MODEL_DIR / f"{n}.onnx").exists()]
#: onnx's light architectures (``dispatch.zoo``, seeded random weights), written to
#: MODEL_DIR/light/ on first use; ``OPDISPATCH_BENCH_LIGHT=0`` leaves them out
LIGHT = [] if os.environ.get("OPDISPATCH_BENCH_LIGHT", "1") == "0" else list(LIGHT_MODELS)
ALL = EXPORTED + LIGHT
if not ALL:
    pytest.skip(f"no exported model in {MODEL_DIR}: run `python bench/models/export.py` "
                "(or set OPDISPATCH_BENCH_MODELS)", allow_module_level=True)

BUDGET_S = float(os.environ.get("OPDISPATCH_BENCH_BUDGET", "120"))
WARMUP, ROUNDS = 2, 15
#: every registered backend but the reference (available or not: unavailable ones skip with why)
BACKENDS = [b for b in load_registry().backends if b != "numpy"]
#: (model, error) of models that opdispatch cannot load, and tuning results, per model
_load_errors: dict[str, str] = {}
_tuned: dict[str, tuple] = {}


def _path(name: str) -> str:
    if name in LIGHT:
        path = MODEL_DIR / "light" / f"{name}.onnx"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            onnx.save(light_model(name, seed=0), str(path))
        return str(path)
    return str(MODEL_DIR / f"{name}.onnx")


def _feeds(name: str) -> dict[str, np.ndarray]:
    """The same seeded inputs for every variant: token ids in [0, 1000), all-ones attention
    masks, standard normal images (the light architectures: every graph input)."""
    rng = np.random.default_rng(0)
    out = {}
    if name in LIGHT:
        graph = onnx.load(_path(name), load_external_data=False).graph
        weights = {i.name for i in graph.initializer}
        for i in graph.input:
            if i.name not in weights:
                shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
                out[i.name] = rng.standard_normal(shape).astype(np.float32)
        return out
    for iname, (shape, dtype) in MODELS[name].inputs.items():
        if dtype == "int64":
            out[iname] = (np.ones(shape, np.int64) if "mask" in iname
                          else rng.integers(0, 1000, shape, dtype=np.int64))
        else:
            out[iname] = rng.standard_normal(shape).astype(np.float32)
    return out


def _tune(name: str) -> None:
    """Tune ``name`` into a fresh temporary store (nothing reused from earlier runs); a model
    that does not load is recorded in :data:`_load_errors` instead."""
    from tuner.tune import TuneOptions, tune

    store = os.path.join(tempfile.mkdtemp(prefix="opdispatch-bench-models-"), "plans.sqlite")
    t0 = time.monotonic()
    try:
        result = tune(_path(name), store=store, options=TuneOptions(progress=False, budget_s=BUDGET_S))
    except (UnsupportedOpError, ModelLoadError) as exc:
        _load_errors[name] = f"{type(exc).__name__}: {exc}"
        return
    except OpDispatchError as exc:  # it loads, but tuning failed: only tuned_plan is skipped
        _tuned[name] = (None, f"{type(exc).__name__}: {exc}", time.monotonic() - t0)
        return
    _tuned[name] = (store, result, time.monotonic() - t0)


@pytest.fixture(scope="module", autouse=True)
def _tune_first(request):
    """Tune every model whose ``tuned_plan`` is selected before anything is timed, so that
    every variant is timed in the same process state (not one right after minutes of tuning
    and the others later)."""
    here = request.module.__name__
    selected = {it.callspec.params["name"] for it in request.session.items
                if getattr(it, "module", None) is not None and it.module.__name__ == here
                and it.originalname == "test_tuned_plan"}
    for name in ALL:
        if name in selected:
            _tune(name)
    gc.collect()


def _check_loads(name: str) -> None:
    if name in _load_errors:
        pytest.skip(f"{name} does not load in opdispatch: {_load_errors[name]}")


def _session(name: str, **kwargs) -> tuple[Session, float]:
    """A dispatcher Session and its start time; skipped with the exact error when the model
    uses an operator that none of the allowed backends implements."""
    t0 = time.perf_counter()
    try:
        sess = Session(_path(name), **kwargs)
    except UnsupportedOpError as exc:
        _load_errors.setdefault(name, f"{type(exc).__name__}: {exc}")
        pytest.skip(f"{name} does not load in opdispatch: {type(exc).__name__}: {exc}")
    return sess, time.perf_counter() - t0


def _time(benchmark, fn, *args) -> None:
    benchmark.pedantic(fn, args=args, warmup_rounds=WARMUP, rounds=ROUNDS)


@pytest.fixture(autouse=True)
def _collect_after():
    """Release each variant's sessions (and their thread pools and weights) before the next."""
    yield
    gc.collect()


@pytest.mark.parametrize("name", ALL)
def test_onnxruntime(benchmark, name):
    """A plain InferenceSession: all graph optimisations, one intra-op thread per usable core."""
    _check_loads(name)
    benchmark.group = f"models-{name}"
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = len(os.sched_getaffinity(0))
    t0 = time.perf_counter()
    sess = ort.InferenceSession(_path(name), opts, providers=["CPUExecutionProvider"])
    benchmark.extra_info.update(variant="onnxruntime", start_s=round(time.perf_counter() - t0, 3),
                                threads=opts.intra_op_num_threads)
    _time(benchmark, sess.run, None, _feeds(name))


@pytest.mark.parametrize("name", ALL)
def test_openvino(benchmark, name):
    """A plain OpenVINO compiled model on the CPU with the latency hint (one infer request)."""
    ov = pytest.importorskip("openvino", reason="openvino is not installed")
    _check_loads(name)
    benchmark.group = f"models-{name}"
    t0 = time.perf_counter()
    compiled = ov.Core().compile_model(_path(name), "CPU", {"PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    benchmark.extra_info.update(variant="openvino", start_s=round(time.perf_counter() - t0, 3))
    _time(benchmark, request.infer, _feeds(name))


@pytest.mark.parametrize("name", ALL)
def test_default_session(benchmark, name):
    """The untuned plan a plain ``Session(path, store=False)`` runs (configured backend order)."""
    _check_loads(name)
    sess, start = _session(name, store=False)
    benchmark.group = f"models-{name}"
    benchmark.extra_info.update(variant="default_session", start_s=round(start, 3),
                                plan=sess.plan.backends_used())
    _time(benchmark, sess.run, None, _feeds(name))


@pytest.mark.parametrize("backend", [*BACKENDS, "numpy"])
@pytest.mark.parametrize("name", ALL)
def test_backend_plan(benchmark, name, backend):
    """The untuned plan of one backend, numpy for what it does not run (numpy: alone)."""
    _check_loads(name)
    registry = load_registry()
    status = registry.backends[backend]
    if not status.available:
        pytest.skip(f"{backend} unavailable: {status.reason}")
    backends = [backend] if backend == "numpy" else [backend, "numpy"]
    sess, start = _session(name, backends=backends, store=False)
    benchmark.group = f"models-{name}"
    benchmark.extra_info.update(variant=f"{backend}_plan", start_s=round(start, 3),
                                plan=sess.plan.backends_used())
    _time(benchmark, sess.run, None, _feeds(name))


@pytest.mark.parametrize("name", ALL)
def test_tuned_plan(benchmark, name):
    """The tuned plan, run by a Session that takes it from the store (no tuning in the timing)."""
    _check_loads(name)
    store, result, tune_s = _tuned[name]
    if store is None:
        pytest.skip(f"tuning {name} failed: {result}")
    sess, start = _session(name, store=store)
    assert sess.plan_source == "store", sess.plan_note
    winner = next(pc for pc in result.validated if pc.plan is result.plan)
    benchmark.group = f"models-{name}"
    benchmark.extra_info.update(
        variant="tuned_plan", start_s=round(start, 3), plan=sess.plan.backends_used(),
        tune_s=round(tune_s, 1), budget_s=BUDGET_S, winner=winner.label,
        predicted_ms=None if winner.predicted_s is None else round(winner.predicted_s * 1e3, 3),
        validated_ms=round(result.latency_ms, 3),
        validated={pc.label: pc.latency_ms for pc in result.validated},
        predicted={pc.label: None if pc.predicted_s is None else round(pc.predicted_s * 1e3, 3)
                   for pc in result.validated})
    _time(benchmark, sess.run, None, _feeds(name))
