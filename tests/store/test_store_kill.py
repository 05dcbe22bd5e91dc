"""A process writing into the plan store, killed with SIGKILL at random points, never costs a
committed write and never damages the store.

50 trials (``OPDISPATCH_KILL_TRIALS`` overrides): each forks a child (from a fork server, so
that a trial costs no interpreter start-up) that writes plans, measurements and tuning runs
into one shared store, or runs a real :func:`tuner.tune.tune` of a tiny model, logging each
write after it committed (:mod:`tests.store.store_worker`); the child is killed with SIGKILL
after a random delay. After every kill the store must open without damage (the integrity
check of :class:`~tuner.store.PlanStore`, with recovery off) and hold every write the child
logged as committed; every 10th trial and after the last, every write any child logged."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.store.store_worker import read_log, verify_committed
from tuner.store import PlanStore

REPO = Path(__file__).resolve().parents[2]
TRIALS = int(os.environ.get("OPDISPATCH_KILL_TRIALS", "50"))
#: Every this many trials is a real tuning run instead of the write loop.
TUNE_EVERY = 10
TUNE_BUDGET_S = 3.0

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")


class ForkServer:
    """Talks to ``python -m tests.store.store_worker serve``."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.store.store_worker", "serve"], cwd=REPO,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            bufsize=1)
        self._expect("serving")

    def _line(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the fork server ended: {self.proc.stderr.read()[-3000:]}")
        return line.strip()

    def _expect(self, text: str) -> None:
        line = self._line()
        assert line == text, f"fork server said {line!r}, expected {text!r}"

    def start(self, **cmd) -> int:
        """Fork a child; returns its pid once it is ready (has opened the store)."""
        self.proc.stdin.write(json.dumps({"cmd": "fork", **cmd}) + "\n")
        self.proc.stdin.flush()
        forked = ready = None
        while forked is None or ready != forked:
            word, pid = self._line().split()
            if word == "forked":
                forked = int(pid)
            elif word == "ready":
                ready = int(pid)
            else:
                raise AssertionError(f"unexpected line from the fork server: {word} {pid}")
        return forked

    def wait(self, pid: int) -> int:
        """Reap the child ``pid``; its exit code (``-9`` when SIGKILL ended it)."""
        self.proc.stdin.write(json.dumps({"cmd": "wait", "pid": pid}) + "\n")
        self.proc.stdin.flush()
        word, got, code = self._line().split()
        assert (word, int(got)) == ("exited", pid)
        return int(code)

    def close(self) -> str:
        """Stop the server; returns what it (and its children) wrote to stderr."""
        self.proc.stdin.close()
        errors = self.proc.stderr.read()
        self.proc.wait(60)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return errors


def test_sigkill_while_writing_keeps_every_committed_write(tmp_path):
    path = str(tmp_path / "plans.sqlite")
    PlanStore(path).close()
    rng = random.Random(20261123)
    server = ForkServer()
    logs: list[Path] = []
    kills = finished = tune_kills = tune_writes = 0
    checked: dict[str, int] = {}
    try:
        for trial in range(TRIALS):
            log = tmp_path / f"trial{trial:03d}.log"
            logs.append(log)
            tuning = trial % TUNE_EVERY == TUNE_EVERY - 1
            if tuning:
                pid = server.start(mode="tune", store=path, log=str(log), trial=trial,
                                   budget=TUNE_BUDGET_S)
                delay = rng.uniform(0.05, 0.5)  # the tiny model's run lasts about 0.5-2 s
            else:
                pid = server.start(mode="write", store=path, log=str(log), trial=trial,
                                   seed=trial, seconds=3600)
                delay = rng.uniform(0.0, 0.3)
            time.sleep(delay)
            os.kill(pid, signal.SIGKILL)
            code = server.wait(pid)
            assert code in (-signal.SIGKILL, 0), (
                f"trial {trial}: the child failed (exit {code}) before it was killed")
            kills += code == -signal.SIGKILL
            finished += code == 0
            if tuning and code == -signal.SIGKILL:
                tune_kills += 1
                tune_writes += len(read_log([log]))
            # the store opens undamaged (recover=False: damage would raise, not be repaired)
            # and holds what this child committed; every 10th trial and after the last, what
            # every child so far committed
            with PlanStore(path, recover=False) as store:
                assert store.recovery is None
                assert store._conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
                everything = trial % 10 == 9 or trial == TRIALS - 1
                checked = verify_committed(store, read_log(logs if everything else [log]))
    finally:
        errors = server.close()
    assert "Traceback" not in errors, errors
    print(f"\nSIGKILL trials: {TRIALS} ({TRIALS // TUNE_EVERY} real tuning runs); killed "
          f"while writing: {kills} (tuning runs: {tune_kills}, which had committed "
          f"{tune_writes} writes); finished first: {finished}; "
          f"committed writes checked after the last trial: {checked}")
    # the trials must have killed writers, and the children must have committed writes
    assert kills >= TRIALS * 0.8, f"only {kills} of {TRIALS} children were killed while writing"
    assert checked["plans"] > TRIALS and checked["measurements"] > TRIALS
    # a killed tuning run stays 'running'; the store still opens read-only as well
    with PlanStore(path, readonly=True) as ro:
        assert any(r.status == "running" for r in ro.runs())
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()


def test_the_check_notices_a_lost_or_changed_write(tmp_path):
    """verify_committed is what the trials rely on: a logged write that the store lacks, or
    holds with other values, fails it."""
    from tests.store.store_worker import Log, open_logging_store, tuner_like_writes

    path, log = str(tmp_path / "plans.sqlite"), tmp_path / "w.log"
    with open_logging_store(path, Log(log)) as store:
        tuner_like_writes(store, "chk", 0, random.Random(0))
        tuner_like_writes(store, "chk", 1, random.Random(1))
        counts = verify_committed(store, read_log([log]))
        assert counts["plans"] == 2 and counts["runs"] == 2 and counts["measurements"] >= 2
        records = read_log([log])
        plan = next(r for r in records if r["op"] == "plan")
        store.delete_plan(plan["id"])
        with pytest.raises(AssertionError, match=f"committed plan {plan['id']} .* is missing"):
            verify_committed(store, records)
        m = next(r for r in records if r["op"] == "measurement")
        changed = [{**r, "median_s": 123.0} if r is m else r for r in records if r is not plan]
        with pytest.raises(AssertionError, match="committed measurement .* differs"):
            verify_committed(store, changed)
    with open(log, "a") as f:
        f.write('{"op": "plan", "torn')  # a line cut by the kill claims nothing
    assert len(read_log([log])) == len(records)
