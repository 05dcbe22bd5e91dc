"""oneDNN 3.x against onnxruntime, side by side in one run (issue 20): ResNet-50 (onnx's light
architecture, ``dispatch.zoo``, seeded random weights, batch 1) and one transformer export
(bench/models/export.py: the first of :data:`TRANSFORMERS` found in the bench-models folder;
skipped when none is exported), one pytest-benchmark group per model (``onednn-NAME``):

* ``onnxruntime`` — a plain InferenceSession (all graph optimisations, intra-op threads =
  usable cores): the baseline;
* ``onednn_first`` — the untuned plan with oneDNN first:
  ``Session(path, backends=["onednn", "native", "numpy"], store=False)``, the native kernels
  and numpy for what oneDNN does not run. ``extra_info`` has the oneDNN version (the library
  loaded at run time, from PyPI's ``onednn-cpu-gomp`` in a pip install), the CPU ISA oneDNN
  dispatches to and the number of nodes each backend runs; skipped with the reason when the
  oneDNN backend is unavailable.

Every variant's start (model load and session creation, timed once) is in
``extra_info["start_s"]``. Models: ``OPDISPATCH_BENCH_MODELS`` or ~/.cache/opdispatch/bench-models/
(``python bench/models/export.py bert_eager``). Run it on a quiet machine:

    python -m pytest bench/test_bench_onednn.py -q --benchmark-enable \\
        --benchmark-columns=median,iqr,rounds --benchmark-json=onednn.json
"""

from __future__ import annotations

import gc
import os
import time

import numpy as np
import onnx
import pytest

from bench.models.export import MODELS, model_dir
from dispatch import Session
from dispatch.backend import load_registry
from dispatch.zoo import light_model

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: it is the baseline")

MODEL_DIR = model_dir()
#: transformer exports in order of preference; the first one exported is timed
TRANSFORMERS = ("bert_eager", "bert", "gpt2_eager", "gpt2", "vit")
TRANSFORMER = next((n for n in TRANSFORMERS if (MODEL_DIR / f"{n}.onnx").exists()), None)
CNN = "resnet50"
NAMES = [CNN, TRANSFORMERS[0] if TRANSFORMER is None else TRANSFORMER]
#: the oneDNN-first backend order (native, then numpy, for what oneDNN does not run)
ONEDNN_FIRST = ["onednn", "native", "numpy"]
WARMUP, ROUNDS = 2, 15


def _path(name: str) -> str:
    if name == CNN:
        path = MODEL_DIR / "light" / f"{name}.onnx"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            onnx.save(light_model(name, seed=0), str(path))
        return str(path)
    if name != TRANSFORMER:
        pytest.skip(f"no transformer export in {MODEL_DIR} (any of {', '.join(TRANSFORMERS)}): "
                    f"run `python bench/models/export.py {TRANSFORMERS[0]}`")
    return str(MODEL_DIR / f"{name}.onnx")


def _feeds(name: str) -> dict[str, np.ndarray]:
    """The same seeded inputs for both variants: a standard normal image for ResNet-50; token
    ids in [0, 1000) and all-ones attention masks for the transformer."""
    rng = np.random.default_rng(0)
    if name == CNN:
        graph = onnx.load(_path(name), load_external_data=False).graph
        weights = {i.name for i in graph.initializer}
        return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
                .astype(np.float32) for i in graph.input if i.name not in weights}
    out = {}
    for iname, (shape, dtype) in MODELS[name].inputs.items():
        if dtype == "int64":
            out[iname] = (np.ones(shape, np.int64) if "mask" in iname
                          else rng.integers(0, 1000, shape, dtype=np.int64))
        else:
            out[iname] = rng.standard_normal(shape).astype(np.float32)
    return out


def _time(benchmark, fn, *args) -> None:
    benchmark.pedantic(fn, args=args, warmup_rounds=WARMUP, rounds=ROUNDS)


@pytest.fixture(autouse=True)
def _collect_after():
    """Release each variant's sessions (and their thread pools and weights) before the next."""
    yield
    gc.collect()


@pytest.mark.parametrize("name", NAMES)
def test_onnxruntime(benchmark, name):
    """A plain InferenceSession: all graph optimisations, one intra-op thread per usable core."""
    benchmark.group = f"onednn-{name}"
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = len(os.sched_getaffinity(0))
    t0 = time.perf_counter()
    sess = ort.InferenceSession(_path(name), opts, providers=["CPUExecutionProvider"])
    benchmark.extra_info.update(variant="onnxruntime", start_s=round(time.perf_counter() - t0, 3),
                                version=ort.__version__, threads=opts.intra_op_num_threads)
    _time(benchmark, sess.run, None, _feeds(name))


@pytest.mark.parametrize("name", NAMES)
def test_onednn_first(benchmark, name):
    """The untuned plan with oneDNN first (native, then numpy, for the rest)."""
    path = _path(name)
    status = load_registry().backends["onednn"]
    if not status.available:
        pytest.skip(f"onednn unavailable: {status.reason}")
    from impls.onednn._module import onednn

    benchmark.group = f"onednn-{name}"
    t0 = time.perf_counter()
    sess = Session(path, backends=ONEDNN_FIRST, store=False)
    start = time.perf_counter() - t0
    used = sess.plan.backends_used()
    assert used.get("onednn", 0) > 0, f"the oneDNN-first plan of {name} runs no oneDNN step: {used}"
    benchmark.extra_info.update(variant="onednn_first", start_s=round(start, 3),
                                version=status.version, isa=onednn().cpu_isa(), plan=used)
    _time(benchmark, sess.run, None, _feeds(name))
