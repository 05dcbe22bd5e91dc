"""Tuning runs whose process was killed stay ``running`` only until the next run starts: it
marks them ``interrupted`` once their process is gone (same host; a reused process id is told
apart by the process's start time). Runs of live processes, of other hosts, and runs
recorded without their process are left alone."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from tests.store.store_worker import tiny_model
from tuner.store import PlanStore
from tuner.store.rows import PROCESS_KEY
from tuner.store.runs import process_gone, this_process

REPO = Path(__file__).resolve().parents[2]

_START_AND_HANG = """
import sys, time
from tuner.store import PlanStore
store = PlanStore(sys.argv[1])
print(store.start_run("m" * 64, budget_s=60), flush=True)
time.sleep(600)
"""


def _killed_run(path: Path) -> int:
    """A run started by a child process that is then SIGKILLed (it never finishes it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", _START_AND_HANG, str(path)], env=env,
                             stdout=subprocess.PIPE, text=True)
    run_id = int(child.stdout.readline())
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=60)
    child.stdout.close()
    return run_id


def test_a_killed_run_is_marked_interrupted_when_the_next_run_starts(tmp_path):
    path = tmp_path / "plans.sqlite"
    killed = _killed_run(path)
    with PlanStore(path) as store:
        (run,) = store.runs()
        assert run.id == killed and run.status == "running" and run.finished_at is None
        assert run.process is not None and run.process["host"] == socket.gethostname()
        assert PROCESS_KEY not in run.stats
        mine = store.start_run("n" * 64)
        by_id = {r.id: r for r in store.runs()}
    assert by_id[mine].status == "running"
    old = by_id[killed]
    assert old.status == "interrupted" and old.finished_at is not None
    assert f"its process (pid {run.process['pid']}) had ended" in old.stats["interrupted"]
    assert f"run {mine} started" in old.stats["interrupted"]


def test_a_killed_tune_is_marked_interrupted_by_the_next_tune(tmp_path):
    """A real ``tuner.tune`` killed mid-run (its run row is committed first)."""
    path = tmp_path / "plans.sqlite"
    import onnx

    model = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), model)
    script = ("import sys; from tuner.tune import tune, TuneOptions; "
              "tune(sys.argv[1], store=sys.argv[2], options=TuneOptions(budget_s=120, progress=False))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", script, str(model), str(path)], env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until its run is committed
        time.sleep(0.2)
        if path.exists():
            try:
                with PlanStore(path, readonly=True) as ro:
                    if ro.runs():
                        break
            except Exception:  # created but not yet migrated
                continue
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=60)
    from tuner.tune import TuneOptions, tune

    tune(tiny_model(), store=path, options=TuneOptions(budget_s=4, top_k=1, progress=False,
                                                       validate_runs=2))
    with PlanStore(path, readonly=True) as store:
        statuses = sorted(r.status for r in store.runs())
    assert statuses == ["finished", "interrupted"]


def test_live_foreign_host_and_unrecorded_runs_are_left_running(tmp_path):
    path = tmp_path / "plans.sqlite"
    with PlanStore(path) as store:
        live = store.start_run("a" * 64)  # this very process: alive
        other_host = store.start_run("b" * 64)
        unrecorded = store.start_run("c" * 64)
    with sqlite3.connect(path) as conn:
        gone = {**this_process(), "pid": 2**22 + 12345, "host": "another-host"}
        conn.execute("UPDATE tuning_runs SET stats_json = ? WHERE id = ?",
                     [json.dumps({PROCESS_KEY: gone}), other_host])
        conn.execute("UPDATE tuning_runs SET stats_json = '{}' WHERE id = ?", [unrecorded])
    conn.close()
    with PlanStore(path) as store:
        assert store.mark_stale_runs() == []
        assert {r.id: r.status for r in store.runs()} == {
            live: "running", other_host: "running", unrecorded: "running"}


def test_a_reused_process_id_is_told_apart_by_its_start_time():
    me = this_process()
    assert not process_gone(me)
    if me["start"] is not None:  # Linux: the start token is known
        assert process_gone({**me, "start": me["start"] + "0"})
    assert process_gone({**me, "pid": 2**22 + 4321})  # beyond pid_max: no such process
    assert not process_gone({"pid": "12"}) and not process_gone({})
