"""Tuning runs in the store: a run recorded when it starts (status ``running``, with the
process running it), how it ended (``finished``, ``interrupted`` or ``failed``) with its
statistics, and the runs listed newest first. Plans link the run that tuned them
(``plans.tuning_run_id``). A run whose process was killed (SIGKILL, a power cut) cannot say
how it ended: the next run started on the same host marks it ``interrupted`` once its process
is gone (:meth:`RunQueries.mark_stale_runs`)."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.store.connection import StoreConnection
from tuner.store.errors import StoreError
from tuner.store.rows import PROCESS_KEY, TuningRun, _dump, _now, _run_from_row
from tuner.store.schema import FINAL_RUN_STATUSES


def _start_token(pid: int) -> str | None:
    """What tells process ``pid`` from a later process given the same id: the boot and the
    start time (Linux ``/proc``); ``None`` where that cannot be read."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
        # the fields after the command name (which may hold spaces and parentheses)
        start = stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
    return f"{boot}:{start}"


def this_process() -> dict[str, Any]:
    """The record of the running process kept with a ``running`` tuning run."""
    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "start": _start_token(pid)}


def process_gone(process: Mapping[str, Any]) -> bool:
    """Whether the process recorded by :func:`this_process` (on this host) has ended: no
    process has its id, or the one that has started later (its id was reused)."""
    pid = process.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    except OSError:
        return False
    recorded, now = process.get("start"), _start_token(pid)
    return recorded is not None and now is not None and recorded != now


class RunQueries(StoreConnection):
    """The ``tuning_runs`` table of a :class:`~tuner.store.PlanStore`."""

    def start_run(
        self, model_fp: str, *, budget_s: float | None = None, objective: str = "latency",
        stats: Mapping[str, Any] | None = None,
    ) -> int:
        """Record the start of a tuning run (status ``running``, with this process); returns
        its id. The runs left ``running`` by processes of this host that have ended are
        marked ``interrupted`` first (:meth:`mark_stale_runs`)."""
        with self._write("start_run"):
            now = _now()
            cur = self._conn.execute(
                "INSERT INTO tuning_runs (model_fp, started_at, status, budget_s, objective, "
                "stats_json) VALUES (?, ?, 'running', ?, ?, ?)",
                [model_fp, now, None if budget_s is None else float(budget_s), objective,
                 _dump({**(stats or {}), PROCESS_KEY: this_process()})])
            run_id = int(cur.lastrowid or 0)
            self._mark_stale(f"run {run_id} started at {now}")
        return run_id

    def mark_stale_runs(self) -> list[int]:
        """Mark ``interrupted`` the runs still ``running`` whose process (on this host) has
        ended without saying how the run ended (killed); returns their ids. Runs of other
        hosts, and runs recorded without their process, are left as they are."""
        with self._write("mark_stale_runs"):
            return self._mark_stale(f"checked at {_now()}")

    def _mark_stale(self, when: str) -> list[int]:
        host = socket.gethostname()
        stale = []
        for row in self._conn.execute(
                "SELECT id, stats_json FROM tuning_runs WHERE status = 'running'").fetchall():
            try:
                stats = json.loads(row[1])
                process = stats.get(PROCESS_KEY) if isinstance(stats, dict) else None
            except (ValueError, RecursionError):
                continue
            if (isinstance(process, dict) and process.get("host") == host
                    and process.get("pid") != os.getpid() and process_gone(process)):
                stats["interrupted"] = (f"its process (pid {process.get('pid')}) had ended "
                                        f"without finishing it; found when {when}")
                self._conn.execute(
                    "UPDATE tuning_runs SET status = 'interrupted', finished_at = ?, "
                    "stats_json = ? WHERE id = ? AND status = 'running'",
                    [_now(), _dump(stats), int(row[0])])
                stale.append(int(row[0]))
        return stale

    def finish_run(self, run_id: int, status: str, stats: Mapping[str, Any] | None = None) -> None:
        """Record how run ``run_id`` ended: ``finished``, ``interrupted`` or ``failed``."""
        if status not in FINAL_RUN_STATUSES:
            raise StoreError(
                f"finish_run: status must be one of {', '.join(FINAL_RUN_STATUSES)}, "
                f"received {status!r}"
            )
        with self._write("finish_run"):
            cur = self._conn.execute(
                "UPDATE tuning_runs SET status = ?, finished_at = ?, stats_json = ? WHERE id = ?",
                [status, _now(), _dump(stats), int(run_id)])
            if cur.rowcount == 0:
                raise StoreError(f"finish_run: no tuning run with id {run_id} in {str(self.path)!r}")

    def runs(self, model_fp: str | None = None) -> list[TuningRun]:
        """Tuning runs, newest first (only those of ``model_fp`` when given)."""
        if model_fp is None:
            rows = self._query("SELECT * FROM tuning_runs ORDER BY id DESC")
        else:
            rows = self._query(
                "SELECT * FROM tuning_runs WHERE model_fp = ? ORDER BY id DESC", [model_fp])
        return [_run_from_row(r) for r in rows]
