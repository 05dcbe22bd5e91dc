"""A full disk: writes to the plan store fail while a tuning run is under way.

Each case runs in a subprocess whose file-size limit (``RLIMIT_FSIZE``, with ``SIGXFSZ``
ignored, so a write past it fails with ``EFBIG`` as a full disk fails with ``ENOSPC``) lets the
store be created but not grow. Tuning goes on with its measurements in memory, the tuned plan
is returned (and run) even though it cannot be stored, the store keeps what was committed
and passes its integrity check, and the command line says what happened and exits 2.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: bytes a file may grow to: the store's first pages fit, its write-ahead log soon does not
LIMIT = 60_000

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs RLIMIT_FSIZE (POSIX)")


def _limited(limit: int):
    def apply() -> None:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def _python(code: str, tmp_path: Path, limit: int = LIMIT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPDISPATCH_STORE": str(tmp_path / "plans.sqlite")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, preexec_fn=_limited(limit))


def _intact(path: Path) -> tuple[int, int]:
    """The store's (plans, measurements) after an integrity check that must pass."""
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        return (conn.execute("SELECT count(*) FROM plans").fetchone()[0],
                conn.execute("SELECT count(*) FROM measurements").fetchone()[0])


def test_tuning_onto_a_full_disk_returns_the_plan_and_keeps_the_store(tmp_path):
    proc = _python("""
        import warnings
        import numpy as np
        from dispatch import Session
        from tests.builders import small_cnn
        from tuner.tune import TuneOptions, tune

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = tune(small_cnn(), store="plans.sqlite",
                          options=TuneOptions(budget_s=8, progress=False, validate_runs=3,
                                              backends=["native", "numpy"]))
        print("PLAN_ID", result.plan_id)
        print("ERROR", result.store_error)
        print("WARNINGS", sum("goes on with its measurements in memory" in str(w.message)
                              for w in caught))
        x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
        tuned = Session(small_cnn(), store=False, plan=result.plan).run(None, {"x": x})[0]
        ref = Session(small_cnn(), store=False, backends=["numpy"]).run(None, {"x": x})[0]
        print("MATCH", bool(np.allclose(tuned, ref, rtol=1e-4, atol=1e-5)))
    """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert out["PLAN_ID"] == "None"
    assert "failed" in out["ERROR"] and "full disk" in out["ERROR"]
    assert out["WARNINGS"] == "1"
    assert out["MATCH"] == "True"
    _intact(tmp_path / "plans.sqlite")


def test_the_command_line_says_the_plan_was_not_stored(tmp_path):
    import onnx

    from tests.builders import small_cnn

    onnx.save(small_cnn(), tmp_path / "model.onnx")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "tune", "model.onnx", "--store", "plans.sqlite",
         "--budget", "8", "--backends", "native,numpy", "--no-progress"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=300, preexec_fn=_limited(LIMIT))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "NOT stored" in proc.stdout  # the summary of what was tuned is still shown
    assert "opdispatch: warning:" in proc.stderr
    assert "opdispatch tune: error: the tuned plan could not be stored" in proc.stderr
    _intact(tmp_path / "plans.sqlite")


def test_a_first_run_session_runs_the_tuned_plan_from_memory(tmp_path):
    proc = _python("""
        import warnings
        import numpy as np
        from dispatch import Session
        from tests.builders import small_cnn

        warnings.simplefilter("ignore")
        sess = Session(small_cnn(), store="plans.sqlite", tune="first-run", tune_budget_s=8,
                       backends=["native", "numpy"])
        x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
        sess.run(None, {"x": x})
        print("SOURCE", sess.plan_source)
        print("NOTE", sess.plan_note)
    """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert out["SOURCE"] == "tuned"
    assert "running from memory: it could not be stored" in out["NOTE"]


def test_a_store_that_cannot_be_created_says_why(tmp_path):
    proc = _python("""
        from tuner.store import PlanStore, StoreError
        try:
            PlanStore("plans.sqlite")
        except StoreError as exc:
            print("ERROR", exc)
    """, tmp_path, limit=1_000)
    assert proc.returncode == 0, proc.stderr
    assert "ERROR cannot use the plan store" in proc.stdout
    assert "full disk" in proc.stdout
