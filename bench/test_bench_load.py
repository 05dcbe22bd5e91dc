r"""Tuned plans under load (issue 13): inception_v1, resnet50, squeezenet (onnx's light
architectures) and a BERT export, each tuned once at the start of the run on the quiet machine
(budget ``OPDISPATCH_BENCH_BUDGET``, default 60 s, into a temporary store), then run by a
Session from the store next to a plain onnxruntime InferenceSession (2 intra-op threads, its
defaults otherwise), one pytest-benchmark group per model (``load-NAME``):

* ``onnxruntime_quiet`` / ``tuned_quiet``: nothing else running;
* ``onnxruntime_busy`` / ``tuned_busy``: a second process busy-looping on one core for the
  whole timing (started before, killed after);
* ``tuned_interleaved``: before every timed run of the tuned plan, one run of a plain
  onnxruntime session and one of a plain OpenVINO compiled model of the same model (untimed:
  a service holding several libraries' sessions in one process);
* ``onnxruntime_interleaved``: a second plain onnxruntime session in the same position (the
  baseline under the same neighbours);
* ``tuned_interleaved_nospin``: the tuned plan after the same neighbours, the onnxruntime one
  created with ``session.intra_op.allow_spinning=0``.

    OPDISPATCH_BENCH_BUDGET=60 python -m pytest bench/test_bench_load.py -q \
        --benchmark-enable --benchmark-json=load.json
    python bench/report.py load.json
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest

from bench.test_bench_models import MODEL_DIR, ROUNDS, WARMUP, _feeds, _path
from dispatch import Session

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: it is the baseline")

MODELS = [m for m in ("inception_v1", "resnet50", "squeezenet", "bert_eager")
          if m != "bert_eager" or (MODEL_DIR / "bert_eager.onnx").exists()]
BUDGET_S = float(os.environ.get("OPDISPATCH_BENCH_BUDGET", "60"))
_stores: dict[str, str] = {}


@pytest.fixture(scope="module", autouse=True)
def _tune_first():
    """Tune every model before anything is timed, on the quiet machine, each in a process of
    its own: the timing process holds none of tuning's leftovers (the executors, thread pools
    and library sessions of the candidate plans), as a production process that reuses a plan
    holds none."""
    code = ("import sys\nfrom tuner.tune import TuneOptions, tune\n"
            "tune(sys.argv[1], store=sys.argv[2], "
            "options=TuneOptions(progress=False, budget_s=float(sys.argv[3])))")
    for name in MODELS:
        store = os.path.join(tempfile.mkdtemp(prefix="opdispatch-bench-load-"), "plans.sqlite")
        subprocess.run([sys.executable, "-c", code, _path(name), store, str(BUDGET_S)], check=True,
                       capture_output=True)
        _stores[name] = store


@pytest.fixture()
def busy_core() -> Iterator[None]:
    """A second process busy-looping on one core while the test runs."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(0.5)
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def _onnxruntime(name: str, spinning: bool = True) -> Callable[[], object]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = len(os.sched_getaffinity(0))
    if not spinning:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(_path(name), opts, providers=["CPUExecutionProvider"])
    feeds = _feeds(name)
    return lambda: sess.run(None, feeds)


def _tuned(name: str) -> tuple[Callable[[], object], dict]:
    sess = Session(_path(name), store=_stores[name])
    assert sess.plan_source == "store", sess.plan_note
    feeds = _feeds(name)
    return (lambda: sess.run(None, feeds)), sess.plan.backends_used()


def _time(benchmark, name: str, variant: str, fn: Callable[[], object], setup=None, **info) -> None:
    benchmark.group = f"load-{name}"
    benchmark.extra_info.update(variant=variant, **info)
    for _ in range(WARMUP):
        fn()
    if setup is None:
        benchmark.pedantic(fn, rounds=ROUNDS, iterations=1)
    else:
        benchmark.pedantic(fn, setup=setup, rounds=ROUNDS, iterations=1)


@pytest.mark.parametrize("name", MODELS)
def test_onnxruntime_quiet(benchmark, name):
    _time(benchmark, name, "onnxruntime_quiet", _onnxruntime(name))


@pytest.mark.parametrize("name", MODELS)
def test_tuned_quiet(benchmark, name):
    fn, plan = _tuned(name)
    _time(benchmark, name, "tuned_quiet", fn, plan=plan)


@pytest.mark.parametrize("name", MODELS)
def test_onnxruntime_busy(benchmark, name, busy_core):
    _time(benchmark, name, "onnxruntime_busy", _onnxruntime(name))


@pytest.mark.parametrize("name", MODELS)
def test_tuned_busy(benchmark, name, busy_core):
    fn, plan = _tuned(name)
    _time(benchmark, name, "tuned_busy", fn, plan=plan)


def _neighbours(name: str, spinning: bool = True) -> Callable[[], None]:
    """One run of a plain onnxruntime session and one of a plain OpenVINO compiled model of the
    same model: what a service holding several libraries' sessions runs between two requests."""
    ov = pytest.importorskip("openvino", reason="openvino is not installed")
    plain = _onnxruntime(name, spinning=spinning)
    request = ov.Core().compile_model(_path(name), "CPU",
                                      {"PERFORMANCE_HINT": "LATENCY"}).create_infer_request()
    feeds = list(_feeds(name).values())

    def others() -> None:
        plain()
        request.infer(feeds)

    return others


@pytest.mark.parametrize("name", MODELS)
def test_tuned_interleaved(benchmark, name):
    fn, plan = _tuned(name)
    _time(benchmark, name, "tuned_interleaved", fn, setup=_neighbours(name), plan=plan)


@pytest.mark.parametrize("name", MODELS)
def test_onnxruntime_interleaved(benchmark, name):
    """The baseline in the same position: a second plain onnxruntime session timed right after
    the same neighbours."""
    _time(benchmark, name, "onnxruntime_interleaved", _onnxruntime(name), setup=_neighbours(name))


@pytest.mark.parametrize("name", MODELS)
def test_tuned_interleaved_nospin(benchmark, name):
    """The tuned plan after neighbours whose onnxruntime session does not spin
    (``session.intra_op.allow_spinning=0``, what bench/README.md advises a multi-model service)."""
    fn, plan = _tuned(name)
    _time(benchmark, name, "tuned_interleaved_nospin", fn, setup=_neighbours(name, spinning=False),
          plan=plan)
