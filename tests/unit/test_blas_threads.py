"""The BLAS and OpenMP thread settings in force while a plan's steps run are the plan's, whatever
the program imported first and whatever ran before in the process (issue 19, dispatch/blas.py):
set around each run, the caller's restored after it; the tuner measures and validates under the
same settings and records them in the plan. No speed is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import dispatch
from dispatch import Plan, Session, blas
from dispatch.errors import KernelError, PlanError
from dispatch.executor import Executor
from tests.builders import ModelBuilder

ROOT = Path(__file__).resolve().parents[2]
threadpoolctl = pytest.importorskip("threadpoolctl")


def _model(seed: int = 0):
    """MatMul (numpy's BLAS when numpy runs it) -> Relu -> MatMul -> Softmax, 1x64 -> 1x32."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder(17, "blas_threads")
    x = b.input("x", [1, 64])
    h = b.op("MatMul", [x, b.const(rng.standard_normal((64, 128)).astype(np.float32))])
    h = b.op("Relu", [h])
    h = b.op("MatMul", [h, b.const(rng.standard_normal((128, 32)).astype(np.float32))])
    b.output(b.op("Softmax", [h], axis=-1))
    return b.build()


# the program a user writes: numpy first (without OPENBLAS_THREAD_TIMEOUT), its own BLAS and
# OpenMP settings (3 threads, neither the plans' BLAS setting nor their OpenMP one), a warm
# OpenBLAS pool; then a default Session run, Session.tune, a Session from the store run from
# this thread and from four others. A spy on every executor call and every timed measurement
# records the settings in force there (threadpoolctl's view, on the thread that runs it).
_SCRIPT = textwrap.dedent("""
    import numpy as np
    import threadpoolctl
    threadpoolctl.threadpool_limits(limits=3)
    a = np.random.default_rng(0).standard_normal((256, 256))
    a @ a
    import json, sys, threading
    from concurrent.futures import ThreadPoolExecutor
    import dispatch
    import tuner.measure as tm
    from dispatch import Session
    from dispatch.executor import Executor

    seen = {}
    lock = threading.Lock()
    ctl = []

    def settings():
        if not ctl or len(ctl[0].lib_controllers) < 2:
            ctl[:] = [threadpoolctl.ThreadpoolController()]
        return sorted({(i["internal_api"], i["num_threads"]) for i in ctl[0].info()})

    def snapshot(where):
        with lock:
            seen.setdefault(where, set()).add(tuple(settings()))

    phase = ["default"]
    invoke = Executor._invoke
    def spy_invoke(call, slots):
        main = threading.current_thread() is threading.main_thread()
        snapshot(phase[0] + (":main" if main else ":worker"))
        return invoke(call, slots)
    Executor._invoke = staticmethod(spy_invoke)
    timer = tm.time_calls
    def spy_time(fn, **kw):
        snapshot("measure")
        return timer(fn, **kw)
    tm.time_calls = spy_time

    model, store = sys.argv[1], sys.argv[2]
    feeds = {"x": np.ones((1, 64), np.float32)}
    Session(model, store=False, backends=["native", "numpy"]).run(None, feeds)
    a @ a
    phase[0] = "tune"
    result = Session(model, store=store, backends=["native", "numpy"]).tune(budget_s=8, progress=False)
    a @ a
    phase[0] = "stored"
    sess = Session(model, store=store, backends=["native", "numpy"], require_plan=True)
    threadpoolctl.threadpool_limits(limits=3)  # now every library loaded: OpenMP too
    before = settings()
    sess.run(None, feeds)
    after_run = settings()
    a @ a
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: [sess.run(None, feeds) for _ in range(5)], range(4)))
    after_threads = settings()
    print(json.dumps({
        "seen": {k: sorted(v) for k, v in seen.items()}, "before": before,
        "after_run": after_run, "after_threads": after_threads,
        "provenance": sess.plan.provenance.get("threading"),
        "summary": result.summary(),
    }))
""")


def test_plan_steps_run_with_the_tuned_settings_whatever_ran_before(tmp_path):
    """numpy imported first, OpenBLAS left spinning (no OPENBLAS_THREAD_TIMEOUT), the caller's
    BLAS and OpenMP at 3 threads and a warm pool: every step the tuner measured, every plan it
    validated and every step of the stored plan (from the main thread and from four threads at
    once) ran with the plan's recorded settings, and the caller's came back after each run."""
    import onnx

    model = tmp_path / "m.onnx"
    onnx.save(_model(), str(model))
    script = tmp_path / "user.py"
    script.write_text(_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != blas.BLAS_SPIN_ENV[0]}
    env.update(OPDISPATCH_THREADS="2", PYTHONPATH=f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}")
    res = subprocess.run([sys.executable, str(script), str(model), str(tmp_path / "plans.sqlite")],
                         capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr[-4000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    rec = out["provenance"]
    assert rec is not None and rec["blas_threads"] == blas.PLAN_BLAS_THREADS and rec["openmp_threads"] == 2
    tuned = {"openblas": rec["blas_threads"], "openmp": rec["openmp_threads"]}
    assert {"default:main", "measure", "tune:main", "stored:main", "stored:worker"} <= set(out["seen"])
    for where, snapshots in out["seen"].items():
        for snap in snapshots:
            for api, threads in snap:
                if api in tuned:
                    assert threads == tuned[api], (where, snap, tuned)
    # the caller's own settings, back after a run and after concurrent runs from other threads
    assert {api for api, n in out["before"] if n == 3} >= {"openblas", "openmp"}, out["before"]
    assert out["after_run"] == out["before"] and out["after_threads"] == out["before"]
    assert [lib["api"] for lib in rec["libraries"] if lib["api"] == "openblas"]
    assert rec["process"]["blas_workers_sleep"] is False
    summary = out["summary"]
    assert "threads: measured, validated and run with 1 BLAS thread(s) (openblas" in summary
    assert "this process's own BLAS/OpenMP settings differ" in summary
    assert "outside plan runs openblas (" in summary and "OpenBLAS workers spin" in summary


# ------------------------------------------------------------------------------------------
# in process
# ------------------------------------------------------------------------------------------


def _openblas() -> list[blas.Library]:
    libs = [lib for lib in blas.libraries(refresh=True) if lib.internal == "openblas" and lib.process_wide]
    if not libs:
        pytest.skip("numpy does not use an OpenBLAS with its own threads here")
    return libs


@pytest.fixture()
def caller_at_3():
    """The caller's OpenBLAS at 3 threads (neither the plans' setting nor, usually, the
    default) for the test, then back as it was."""
    libs = _openblas()
    before = [lib.get() for lib in libs]
    for lib in libs:
        lib.set(3)
    yield libs
    for lib, n in zip(libs, before):
        lib.set(n)


def _executor(provenance=None) -> Executor:
    sess = Session(_model(), store=False, backends=["numpy"])
    plan = Plan.from_json(sess.plan.to_json())
    if provenance is not None:
        plan.provenance = dict(plan.provenance, **provenance)
    return Executor(sess.graph, plan, sess.registry)


def test_a_run_sets_the_plans_blas_threads_and_restores_the_callers(caller_at_3):
    ex = _executor()
    assert ex.threads == blas.ThreadSettings(blas.PLAN_BLAS_THREADS, blas.configured_threads())
    during = []
    call = ex.calls[0]
    fn = call.fn
    call.fn = lambda *a: (during.append([lib.get() for lib in caller_at_3]), fn(*a))[1]
    ex.run({"x": np.ones((1, 64), np.float32)})
    assert during == [[blas.PLAN_BLAS_THREADS] * len(caller_at_3)]
    assert [lib.get() for lib in caller_at_3] == [3] * len(caller_at_3)


def test_a_plan_on_libraries_with_their_own_pools_sets_no_thread_counts(caller_at_3):
    """An onnxruntime-only plan (its region runs on onnxruntime's pool, not BLAS or OpenMP)
    leaves the caller's settings alone during the run; a numpy plan holds its own."""
    pytest.importorskip("onnxruntime")
    sess = Session(_model(), store=False, backends=["onnxruntime"])
    assert {s.backend for s in sess.plan.steps} == {"onnxruntime"}
    ex = Executor(sess.graph, sess.plan, sess.registry)
    assert not ex.uses_process_pools and _executor().uses_process_pools
    during = []
    fn = ex.calls[0].fn
    ex.calls[0].fn = lambda *a: (during.append([lib.get() for lib in caller_at_3]), fn(*a))[1]
    ex.run({"x": np.ones((1, 64), np.float32)})
    assert during == [[3] * len(caller_at_3)]


def test_the_callers_setting_comes_back_when_a_step_raises(caller_at_3):
    ex = _executor()

    def boom(*_):
        raise RuntimeError("broken kernel")

    ex.calls[-1].fn = boom
    with pytest.raises(KernelError, match="broken kernel"):
        ex.run({"x": np.ones((1, 64), np.float32)})
    assert [lib.get() for lib in caller_at_3] == [3] * len(caller_at_3)


def test_a_recorded_setting_is_the_one_a_run_uses(caller_at_3):
    ex = _executor({"threading": {"blas_threads": 2, "openmp_threads": 1}})
    assert ex.threads == blas.ThreadSettings(2, 1)
    seen = []
    fn = ex.calls[0].fn
    ex.calls[0].fn = lambda *a: (seen.append(caller_at_3[0].get()), fn(*a))[1]
    ex.run({"x": np.ones((1, 64), np.float32)})
    assert seen == [2]


@pytest.mark.parametrize("bad", [{"blas_threads": 0, "openmp_threads": 1}, {"blas_threads": "1"}, [1, 2]])
def test_a_malformed_threading_record_is_refused_with_what_was_received(bad):
    with pytest.raises(PlanError, match="threading must be an object with positive integer"):
        _executor({"threading": bad})


def test_nested_and_concurrent_blocks_restore_the_callers_setting_once(caller_at_3):
    settings = blas.ThreadSettings(1, blas.configured_threads())
    with blas.in_force(settings):
        assert caller_at_3[0].get() == 1
        with blas.in_force():  # inherits the enclosing block's settings
            assert blas.current() == settings
            assert caller_at_3[0].get() == 1
        assert caller_at_3[0].get() == 1
        state = blas.process_state()  # the caller's own setting, even inside a block
        assert any(lib["api"] == "openblas" and lib["threads"] == 3 for lib in state["libraries"])
    assert blas.current() is None
    assert caller_at_3[0].get() == 3


def test_record_and_differences_name_the_library_and_the_setting():
    settings = blas.ThreadSettings(1, 2)
    outside = {"libraries": [{"api": "openblas", "file": "libopenblas.so", "version": "0.3.9", "threads": 4},
                             {"api": "openmp", "file": "libgomp.so.1", "version": None, "threads": 2}],
               "blas_workers_sleep": False, "env": {}}
    rec = {"blas_threads": 1, "openmp_threads": 2, "process": outside,
           "libraries": [{"api": "openblas", "file": "libopenblas.so", "version": "0.3.9", "threads": 1},
                         {"api": "openmp", "file": "libgomp.so.1", "version": None, "threads": 2}]}
    assert blas.describe(rec) == ("1 BLAS thread(s) (openblas 0.3.9 (libopenblas.so)) and 2 OpenMP "
                                  "thread(s) (openmp (libgomp.so.1)), set around each run")
    diffs = blas.differences(rec, outside)
    assert len(diffs) == 2
    assert diffs[0].startswith("outside plan runs openblas (libopenblas.so) 4 thread(s), plans 1 (")
    assert "OpenBLAS workers spin" in diffs[1]
    later = dict(outside, blas_workers_sleep=True, env={"OMP_WAIT_POLICY": "active"}, libraries=[
        dict(outside["libraries"][0], version="0.3.30", threads=1)])
    assert blas.differences(rec, later) == [
        "openblas (libopenblas.so): version 0.3.9 when tuned, 0.3.30 now",
        "openmp (libgomp.so.1) was loaded when the plan was tuned, not now",
        "OMP_WAIT_POLICY: unset when tuned, active now",
    ]
    real = blas.record(settings)
    assert real["blas_threads"] == 1 and real["openmp_threads"] == 2
    assert all(lib["threads"] == (2 if lib["api"] == "openmp" else 1) for lib in real["libraries"])


def test_the_import_order_caveat_is_gone():
    assert not hasattr(dispatch, "blas_threads_settled")
    assert "blas_threads_settled" not in dispatch.__all__
