"""Do the region libraries' settings change their speed on this machine? The exported models of
:mod:`bench.test_bench_models`, each run whole by a plain onnxruntime InferenceSession and a plain
OpenVINO compiled model under the settings issue 12 names as tuning candidates, side by side,
one pytest-benchmark group per model (``settings-NAME``):

* onnxruntime: ``onnxruntime`` (every graph optimisation, intra-op threads = usable cores,
  spinning workers: what a whole-graph ``Region.onnxruntime.session`` builds, and the baseline of
  every ratio), ``ort_extended`` (no layout optimisations: ``Region.onnxruntime.session_extended``),
  ``ort_no_spin`` (``session.intra_op.allow_spinning=0``: what the regions that are not the whole
  graph build), ``ort_1_thread``;
* OpenVINO (skipped when it is not installed): ``ov_default`` (``impls.openvino.region.compile_config``:
  latency hint, one stream, usable cores), ``ov_1_thread``, ``ov_no_pinning``
  (``ENABLE_CPU_PINNING=False``), ``ov_throughput`` (throughput hint: streams chosen by the
  plugin, one request at a time as a Session runs).

Settings that win here by more than their spread are worth registering as candidates (as
``session_extended`` is); the rest would only lengthen tuning.

    python -m pytest bench/test_bench_settings.py -q --benchmark-enable --benchmark-json=settings.json
    python bench/report.py settings.json
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from bench.test_bench_models import EXPORTED, ROUNDS, WARMUP, _feeds, _path
from impls.regions import usable_cores

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: it is the baseline")

ORT_VARIANTS: dict[str, dict[str, Any]] = {
    "onnxruntime": {},
    "ort_extended": {"level": "extended"},
    "ort_no_spin": {"spin": False},
    "ort_1_thread": {"threads": 1},
}
OV_VARIANTS: dict[str, dict[str, Any]] = {
    "ov_default": {},
    "ov_1_thread": {"INFERENCE_NUM_THREADS": 1},
    "ov_no_pinning": {"ENABLE_CPU_PINNING": False},
    "ov_throughput": {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": None},
}


def _ort_run(name: str, level: str = "all", spin: bool = True, threads: int = 0) -> Callable[[], Any]:
    so = ort.SessionOptions()
    so.graph_optimization_level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                   "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}[level]
    so.intra_op_num_threads = threads or usable_cores()
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(_path(name), so, providers=["CPUExecutionProvider"])
    feeds = _feeds(name)
    return lambda: sess.run(None, feeds)


def _ov_run(name: str, changes: dict[str, Any]) -> Callable[[], Any]:
    ov = pytest.importorskip("openvino", reason="openvino is not installed")
    from impls.openvino.region import compile_config

    config = {k: v for k, v in {**compile_config(), **changes}.items() if v is not None}
    core = ov.Core()
    compiled = core.compile_model(core.read_model(_path(name)), "CPU", config)
    request = compiled.create_infer_request()
    feeds = list(_feeds(name).values())
    return lambda: request.infer(feeds)


def _time(benchmark, name: str, variant: str, make: Callable[[], Callable[[], Any]]) -> None:
    benchmark.group = f"settings-{name}"
    t0 = time.perf_counter()
    fn = make()
    benchmark.extra_info.update(variant=variant, start_s=round(time.perf_counter() - t0, 3))
    benchmark.pedantic(fn, warmup_rounds=WARMUP, rounds=ROUNDS, iterations=1)


@pytest.mark.parametrize("variant", list(ORT_VARIANTS))
@pytest.mark.parametrize("name", EXPORTED)
def test_onnxruntime_settings(benchmark, name, variant):
    _time(benchmark, name, variant, lambda: _ort_run(name, **ORT_VARIANTS[variant]))


@pytest.mark.parametrize("variant", list(OV_VARIANTS))
@pytest.mark.parametrize("name", EXPORTED)
def test_openvino_settings(benchmark, name, variant):
    _time(benchmark, name, variant, lambda: _ov_run(name, OV_VARIANTS[variant]))
