"""One Session served to many callers: thread safety, output ownership, determinism, memory.

A production process (a web server, a batch worker pool) shares one Session between threads
and keeps the arrays it returns. For the plan of every backend (native-first, oneDNN-first,
onnxruntime regions, numpy), on a small CNN and on squeezenet (Concat, pooling, fire
modules):

* 8 threads x 4 runs, each thread with its own input, all at once, return what one thread
  running alone returns;
* an array a run returned is never overwritten by a later run;
* running the same input twice gives bit-identical outputs;
* 100 runs after a warm-up do not grow the C heap's in-use bytes (glibc mallinfo2: numpy,
  the native and oneDNN buffers and onnxruntime's arena all allocate there) by 8 MiB, which a
  leak of 0.1 MB per run would exceed (a control leaks that much and is caught).
"""

from __future__ import annotations

import ctypes
import gc
import threading

import numpy as np
import pytest

from dispatch import Session
from dispatch.backend import load_registry
from dispatch.zoo import drop_final_softmax, light_model
from tests.builders import small_cnn

THREADS = 8
RUNS_PER_THREAD = 4

PLANS = {
    "default": None,
    "native": ["native", "numpy"],
    "onednn": ["onednn", "native", "numpy"],
    "onnxruntime": ["onnxruntime", "numpy"],
    "openvino": ["openvino", "numpy"],
    "numpy": ["numpy"],
}


def _models():
    return {"small_cnn": small_cnn(), "squeezenet": drop_final_softmax(light_model("squeezenet", seed=3))}


_MODELS: dict = {}


def _session(model: str, plan: str) -> Session:
    backends = PLANS[plan]
    available = load_registry().available_backends()
    if backends and backends[0] not in available:
        pytest.skip(f"backend {backends[0]} is not available here: "
                    f"{load_registry().backends[backends[0]].reason}")
    if not _MODELS:
        _MODELS.update(_models())
    return Session(_MODELS[model], store=False, backends=backends)


def _inputs(sess: Session, n: int) -> list[dict[str, np.ndarray]]:
    return [
        {i.name: np.random.default_rng(k).standard_normal(i.shape).astype(i.dtype)
         for i in sess.get_inputs()}
        for k in range(n)
    ]


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("model", ["small_cnn", "squeezenet"])
def test_concurrent_runs_from_threads_match_single_threaded_runs(model, plan):
    sess = _session(model, plan)
    feeds = _inputs(sess, THREADS)
    expected = [sess.run(None, f) for f in feeds]
    start = threading.Barrier(THREADS)
    problems: list[str] = []

    def work(k: int) -> None:
        try:
            start.wait()
            for r in range(RUNS_PER_THREAD):
                got = sess.run(None, feeds[k])
                for g, e in zip(got, expected[k]):
                    if not np.allclose(g, e, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(e).max()))):
                        problems.append(f"thread {k} run {r}: max difference {np.abs(g - e).max():.3g}")
        except Exception as exc:
            problems.append(f"thread {k}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a run did not finish within 300 s (deadlock?)"
    assert problems == [], "\n".join(problems[:10])


@pytest.mark.parametrize("plan", PLANS)
def test_returned_arrays_are_the_callers(plan):
    sess = _session("squeezenet", plan)
    a, b = _inputs(sess, 2)
    first = sess.run(None, a)
    kept = [x.copy() for x in first]
    sess.run(None, b)
    sess.run(None, a)
    for x, k in zip(first, kept):
        np.testing.assert_array_equal(x, k)


@pytest.mark.parametrize("plan", PLANS)
def test_the_same_input_gives_bit_identical_outputs(plan):
    sess = _session("squeezenet", plan)
    (feed,) = _inputs(sess, 1)
    first = sess.run(None, feed)
    for _ in range(3):
        for x, y in zip(sess.run(None, feed), first):
            np.testing.assert_array_equal(x, y)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _heap_in_use() -> int | None:
    """Bytes the C heap has handed out and not taken back (glibc ``mallinfo2``: in-use
    ordinary blocks of every arena + mmapped blocks); None where unavailable. Unlike the
    resident set size, this grows with a leak even while the leak reuses freed memory."""
    try:
        libc = ctypes.CDLL(None)
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    info = fn()
    return int(info.uordblks + info.hblkhd)


WARM_UP, RUNS = 20, 100
#: a leak of ~0.1 MB per run (half of squeezenet's smallest fire-module output) exceeds it
LEAK_BOUND = 8 * 2**20


def _growth(run) -> int:
    """Heap bytes gained over RUNS calls of ``run`` after WARM_UP calls (allocator pools,
    primitive caches and lazy builds settle in the warm-up)."""
    for _ in range(WARM_UP):
        run()
    gc.collect()
    before = _heap_in_use()
    for _ in range(RUNS):
        run()
    gc.collect()
    return _heap_in_use() - before


needs_mallinfo = pytest.mark.skipif(_heap_in_use() is None, reason="needs glibc's mallinfo2")


@needs_mallinfo
@pytest.mark.parametrize("plan", PLANS)
def test_repeated_runs_do_not_leak(plan):
    sess = _session("squeezenet", plan)
    (feed,) = _inputs(sess, 1)
    grown = _growth(lambda: sess.run(None, feed))
    assert grown < LEAK_BOUND, f"the heap grew by {grown / 2**20:.1f} MiB over {RUNS} runs"


@needs_mallinfo
def test_the_leak_check_sees_a_leak_of_the_size_it_claims():
    """Control: a run that keeps 0.1 MB per call is caught by the same measurement."""
    kept: list[np.ndarray] = []
    grown = _growth(lambda: kept.append(np.ones(25_000, np.float32)))
    assert grown >= LEAK_BOUND
