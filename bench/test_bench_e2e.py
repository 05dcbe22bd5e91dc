"""End-to-end latency, side by side in one run: the default (untuned) native-first plan, the
all-numpy plan and onnxruntime (plain InferenceSession, all graph optimisations, default threads) on
the resnet50 and squeezenet architectures, batch 1, 224x224.

Groups are per model, so pytest-benchmark's table shows the three side by side; ratios and
medians go to bench/README.md (see bench/report.py).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from dispatch import Session
from dispatch.zoo import light_model

MODELS = ("resnet50", "squeezenet")
_cache: dict = {}


def _model(name):
    if name not in _cache:
        _cache[name] = light_model(name, seed=0)
    return _cache[name]


def _feeds(sess_inputs):
    rng = np.random.default_rng(0)
    return {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in sess_inputs}


@pytest.mark.parametrize("name", MODELS)
def test_native_plan(benchmark, name):
    """The untuned default plan: native first, numpy for what native does not implement."""
    benchmark.group = f"e2e-{name}"
    sess = Session(_model(name), backends=["native", "numpy"])
    feeds = _feeds(sess.get_inputs())
    benchmark.extra_info["plan"] = sess.plan.backends_used()
    benchmark.pedantic(sess.run, args=(None, feeds), warmup_rounds=2, rounds=15)


@pytest.mark.parametrize("name", MODELS)
def test_numpy_plan(benchmark, name):
    benchmark.group = f"e2e-{name}"
    sess = Session(_model(name), backends=["numpy"])
    feeds = _feeds(sess.get_inputs())
    benchmark.pedantic(sess.run, args=(None, feeds), warmup_rounds=2, rounds=15)


@pytest.mark.parametrize("name", MODELS)
def test_onnxruntime(benchmark, name):
    ort = pytest.importorskip("onnxruntime")
    benchmark.group = f"e2e-{name}"
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = len(os.sched_getaffinity(0))
    sess = ort.InferenceSession(_model(name).SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.random.default_rng(0).standard_normal(i.shape).astype(np.float32) for i in sess.get_inputs()}
    benchmark.pedantic(sess.run, args=(None, feeds), warmup_rounds=2, rounds=15)
