"""Soak: several processes tune into and read from one plan store at once; no "database is
locked" (nor any other error) reaches them, and no committed plan is lost.

The default run is bounded (8 processes for 8 s, so that CI stays within its time limit);
the full run is on demand::

    OPDISPATCH_SOAK_SECONDS=60 python -m pytest tests/store/test_store_soak.py -m soak -s

``OPDISPATCH_SOAK_PROCESSES`` sets the number of processes (default 8). Each process
(:func:`tests.store.store_worker.run_soak`) mixes tuner-like write transactions (a tuning run,
its measurements and a plan under a key of its own), read-only lookups, Session lookups of a
model tuned before the start (which must find its stored plan) and, in two of them, real
tuning runs; it catches and reports every error. The figures (processes, seconds, plans
written, reads, errors) are printed (``-s`` shows them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.store.store_worker import read_log, tiny_model, verify_committed
from tuner.store import PlanStore
from tuner.tune import TuneOptions, tune

REPO = Path(__file__).resolve().parents[2]
SECONDS = float(os.environ.get("OPDISPATCH_SOAK_SECONDS", "8"))
PROCESSES = int(os.environ.get("OPDISPATCH_SOAK_PROCESSES", "8"))
#: How many of the processes also run real tuning runs.
TUNERS = 2


@pytest.mark.soak
def test_processes_tuning_and_reading_one_store(tmp_path):
    if SECONDS <= 0 or PROCESSES < 2:
        raise ValueError(f"OPDISPATCH_SOAK_SECONDS must be > 0 and OPDISPATCH_SOAK_PROCESSES "
                         f">= 2, received {SECONDS} and {PROCESSES}")
    path = str(tmp_path / "plans.sqlite")
    with PlanStore(path) as store:  # the model every Session lookup must find
        tune(tiny_model(), store=store, options=TuneOptions(
            budget_s=3, top_k=2, validate_runs=3, per_candidate_cap_s=0.02, progress=False))
    logs = [tmp_path / f"proc{i}.log" for i in range(PROCESSES)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.store.store_worker", "soak", path, str(log),
             "--trial", str(i), "--seed", str(i), "--seconds", str(SECONDS),
             *(["--tune"] if i < TUNERS else [])],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i, log in enumerate(logs)
    ]
    outputs = [p.communicate(timeout=SECONDS + 300) for p in procs]
    for i, (p, (_out, err)) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"soak process {i} exited {p.returncode}: {err[-3000:]}"
        assert "database is locked" not in err, err[-3000:]
    summaries = [json.loads(Path(f"{log}.summary.json").read_text()) for log in logs]
    errors = [(s["index"], e["action"], e["error"]) for s in summaries for e in s["errors"]]
    total = {k: sum(s[k] for s in summaries) for k in (
        "tuner_like_runs", "transactions", "real_tunes", "store_reads", "session_reads",
        "sessions_on_stored_plan")}
    with PlanStore(path, recover=False) as store:
        assert store._conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        checked = verify_committed(store, read_log(logs))
        stored_plans = len(store.all_plans())
    print(f"\nsoak: {PROCESSES} processes ({TUNERS} also tuning for real) for {SECONDS:g} s "
          f"each; {total['tuner_like_runs']} tuner-like runs ({total['transactions']} write "
          f"transactions), {total['real_tunes']} real tuning runs; committed plans checked "
          f"{checked['plans']}, measurements {checked['measurements']}, runs {checked['runs']}; "
          f"plans in the store {stored_plans}; store reads {total['store_reads']}, Session "
          f"lookups {total['session_reads']} ({total['sessions_on_stored_plan']} on the "
          f"stored plan); errors {len(errors)}")
    assert errors == [], "\n".join(f"process {i} {a}: {e}" for i, a, e in errors[:20])
    # every process did both kinds of work (the counts, not their speed, are checked)
    assert all(s["tuner_like_runs"] > 0 and s["store_reads"] + s["session_reads"] > 0
               for s in summaries), summaries
    assert total["sessions_on_stored_plan"] == total["session_reads"] > 0
    assert checked["plans"] >= total["tuner_like_runs"]
