"""Rows another program edited: ``plans list`` and ``plans show`` name the plan and the column
(exit 2, one line) instead of an internal error, and a Session runs the untuned plan with the
same reason. The store writes none of these values itself: put_plan refuses a non-finite
latency."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch.session import Session
from tests.store.store_worker import tiny_model
from tests.store.test_store import _key, _plan
from tuner.store import PlanStore, StoreError

REPO = Path(__file__).resolve().parents[2]

#: case -> (SQL setting a column of plan 1, text the error holds)
DAMAGE: dict[str, tuple[str, list, str]] = {
    "hardware_json not JSON": ("UPDATE plans SET hardware_json = ?", ["{not json"],
                               "the stored plan 1 is damaged: hardware_json is not JSON data"),
    "notes_json not JSON": ("UPDATE plans SET notes_json = ?", ["[[["],
                            "the stored plan 1 is damaged: notes_json is not JSON data"),
    "software_json a blob": ("UPDATE plans SET software_json = ?", [b"\x00\xff"],
                             "software_json holds bytes b'\\x00\\xff', expected JSON text"),
    "text in latency_ms": ("UPDATE plans SET latency_ms = ?", ["fast"],
                           "latency_ms holds 'fast', expected a finite number or NULL"),
    "infinite latency_ms": ("UPDATE plans SET latency_ms = ?", [float("inf")],
                            "latency_ms holds inf, expected a finite number or NULL"),
    "text in peak_bytes": ("UPDATE plans SET peak_bytes = ?", ["big"],
                           "peak_bytes holds 'big', expected an integer or NULL"),
    "a blob as created_at": ("UPDATE plans SET created_at = ?", [b"\x01"],
                             "created_at holds b'\\x01', expected an ISO timestamp"),
    "plan JSON nested 100,000 deep": ("UPDATE plans SET plan_json = ?",
                                      ["[" * 100_000 + "]" * 100_000],
                                      "plan_json is not a plan (RecursionError"),
    "plan version 1e400": ("UPDATE plans SET plan_json = replace(plan_json, '\"version\": 1', "
                           "'\"version\": 1e400')", [], "plan_json is not a plan (OverflowError"),
}


def _damaged(tmp_path: Path, case: str) -> Path:
    path = tmp_path / "plans.sqlite"
    with PlanStore(path) as store:
        store.put_plan(_key(), _plan(), latency_ms=1.0, peak_bytes=10)
    sql, params, _ = DAMAGE[case]
    with sqlite3.connect(path) as conn:
        assert conn.execute(sql, params).rowcount == 1
    conn.close()
    return path


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPDISPATCH_STORE": str(cwd / "unused.sqlite")}
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_row_is_a_user_error_naming_plan_and_column(tmp_path, case):
    path = _damaged(tmp_path, case)
    needle = DAMAGE[case][2]
    with PlanStore(path, readonly=True) as store:
        with pytest.raises(StoreError) as info:
            store.plan_by_id(1).plan()
        assert needle in str(info.value)
    for args in (["plans", "show", "1", "--store", str(path)],
                 ["plans", "list", "--store", str(path)]):
        if args[1] == "list" and "plan_json" in needle:
            continue  # list shows an unreadable plan as such (below)
        res = _cli(*args, cwd=tmp_path)
        assert res.returncode == 2, (args, res.stderr)
        assert needle in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and "internal error" not in res.stderr


@pytest.mark.parametrize("case", ["plan JSON nested 100,000 deep", "plan version 1e400"])
def test_plans_list_shows_an_unreadable_plan_and_goes_on(tmp_path, case):
    path = _damaged(tmp_path, case)
    res = _cli("plans", "list", "--store", str(path), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "(unreadable plan" in res.stdout


@pytest.mark.parametrize("case", ["hardware_json not JSON", "text in latency_ms",
                                  "plan JSON nested 100,000 deep"])
def test_a_session_runs_the_untuned_plan_and_says_why(tmp_path, case):
    path = tmp_path / "plans.sqlite"
    from tuner.tune import TuneOptions, tune

    tune(tiny_model(), store=path, options=TuneOptions(budget_s=5, top_k=1, progress=False,
                                                       validate_runs=2))
    assert Session(tiny_model(), store=path).plan_source == "store"
    sql, params, needle = DAMAGE[case]
    with sqlite3.connect(path) as conn:
        conn.execute(sql, params)
    conn.close()
    sess = Session(tiny_model(), store=path)
    assert sess.plan_source == "heuristic"
    assert needle in sess.plan_note, sess.plan_note


def test_put_plan_refuses_a_non_finite_latency(tmp_path):
    with PlanStore(tmp_path / "s.sqlite") as store:
        for bad in (float("nan"), float("inf")):
            with pytest.raises(StoreError, match="latency_ms must be a finite number"):
                store.put_plan(_key(), _plan(), latency_ms=bad)
        assert store.all_plans() == []
