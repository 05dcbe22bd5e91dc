"""End-to-end latency, side by side in one run: the tuned plan (tuned once per model at the
start of the run into a temporary store, within the default 120 s budget), the default
(untuned) native-first plan, the all-numpy plan and onnxruntime (plain InferenceSession, all
graph optimisations, default threads) on the resnet50, squeezenet and inception_v1 architectures,
batch 1, 224x224; the untuned oneDNN-first plan; and the whole model as one onnxruntime region
through the dispatcher.

Groups are per model, so pytest-benchmark's table shows the three side by side; ratios and
medians go to bench/README.md (see bench/report.py).
"""

from __future__ import annotations

import gc
import os
import tempfile
import time

import numpy as np
import pytest

from dispatch import Session
from dispatch.zoo import light_model

MODELS = ("resnet50", "squeezenet", "inception_v1")
_cache: dict = {}


def _model(name):
    if name not in _cache:
        _cache[name] = light_model(name, seed=0)
    return _cache[name]


def _feeds(sess_inputs):
    rng = np.random.default_rng(0)
    return {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in sess_inputs}


def _tuned(name):
    """Tune ``name`` once into a fresh temporary store (no measurement reused from earlier runs)."""
    key = ("tuned", name)
    if key not in _cache:
        from tuner.tune import TuneOptions, tune

        store = os.path.join(tempfile.mkdtemp(prefix="opdispatch-bench-"), "plans.sqlite")
        t0 = time.monotonic()
        result = tune(_model(name), store=store, options=TuneOptions(progress=False))
        _cache[key] = (store, result, time.monotonic() - t0)
    return _cache[key]


@pytest.fixture(scope="module", autouse=True)
def _tune_first():
    """Tune every model before anything is timed, so that every variant is timed in the same
    process state (not one right after a minute of tuning and the others later)."""
    for name in MODELS:
        _tuned(name)
    gc.collect()


@pytest.mark.parametrize("name", MODELS)
def test_tuned_plan(benchmark, name):
    """The tuned plan, run by a Session that takes it from the store (no tuning in the timing)."""
    store, result, tune_s = _tuned(name)
    benchmark.group = f"e2e-{name}"
    sess = Session(_model(name), store=store)
    assert sess.plan_source == "store", sess.plan_note
    feeds = _feeds(sess.get_inputs())
    benchmark.extra_info.update(plan=sess.plan.backends_used(), tune_s=round(tune_s, 1),
                                validated={pc.label: pc.latency_ms for pc in result.validated})
    benchmark.pedantic(sess.run, args=(None, feeds), warmup_rounds=2, rounds=15)


@pytest.mark.parametrize("name", MODELS)
def test_native_plan(benchmark, name):
    """The untuned native-first plan (the default before onnxruntime became first), numpy for
    what native does not implement."""
    benchmark.group = f"e2e-{name}"
    sess = Session(_model(name), backends=["native", "numpy"], store=False)
    feeds = _feeds(sess.get_inputs())
    benchmark.extra_info["plan"] = sess.plan.backends_used()
    benchmark.pedantic(sess.run, args=(None, feeds), warmup_rounds=2, rounds=15)


@pytest.mark.parametrize("name", MODELS)
def test_onnxruntime_plan(benchmark, name):
    """The whole model as one onnxruntime region through the dispatcher (its overhead over a
    plain InferenceSession is the executor's and the IO binding's)."""
    pytest.importorskip("onnxruntime")
    benchmark.group = f"e2e-{name}"
    sess = Session(_model(name), backends=["onnxruntime"], store=False)
    feeds = _feeds(sess.get_inputs())
    benchmark.pedantic(sess.run, args=(None, feeds), warmup_rounds=2, rounds=15)


@pytest.mark.parametrize("name", MODELS)
def test_onednn_plan(benchmark, name):
    """The untuned oneDNN-first plan (numpy for what oneDNN does not run)."""
    sess = Session(_model(name), backends=["onednn", "numpy"], store=False)
    if "onednn" not in sess.registry.available_backends():
        pytest.skip(f"onednn unavailable: {sess.registry.backends['onednn'].reason}")
    benchmark.group = f"e2e-{name}"
    feeds = _feeds(sess.get_inputs())
    benchmark.extra_info["plan"] = sess.plan.backends_used()
    benchmark.pedantic(sess.run, args=(None, feeds), warmup_rounds=2, rounds=15)


@pytest.mark.parametrize("name", MODELS)
def test_numpy_plan(benchmark, name):
    benchmark.group = f"e2e-{name}"
    sess = Session(_model(name), backends=["numpy"], store=False)
    feeds = _feeds(sess.get_inputs())
    benchmark.pedantic(sess.run, args=(None, feeds), warmup_rounds=2, rounds=15)


@pytest.mark.parametrize("name", MODELS)
def test_onnxruntime(benchmark, name):
    ort = pytest.importorskip("onnxruntime")
    benchmark.group = f"e2e-{name}"
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = len(os.sched_getaffinity(0))
    sess = ort.InferenceSession(_model(name).SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.random.default_rng(0).standard_normal(i.shape).astype(np.float32)
             for i in sess.get_inputs()}
    benchmark.pedantic(sess.run, args=(None, feeds), warmup_rounds=2, rounds=15)
