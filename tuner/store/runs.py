"""Tuning runs in the store: a run recorded when it starts (status ``running``), how it ended
(``finished``, ``interrupted`` or ``failed``) with its statistics, and the runs listed newest
first. Plans link the run that tuned them (``plans.tuning_run_id``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.store.connection import StoreConnection
from tuner.store.errors import StoreError
from tuner.store.rows import TuningRun, _dump, _now, _run_from_row
from tuner.store.schema import FINAL_RUN_STATUSES


class RunQueries(StoreConnection):
    """The ``tuning_runs`` table of a :class:`~tuner.store.PlanStore`."""

    def start_run(
        self, model_fp: str, *, budget_s: float | None = None, objective: str = "latency",
        stats: Mapping[str, Any] | None = None,
    ) -> int:
        """Record the start of a tuning run (status ``running``); returns its id."""
        with self._write("start_run"):
            cur = self.db.execute(
                "INSERT INTO tuning_runs (model_fp, started_at, status, budget_s, objective, "
                "stats_json) VALUES (?, ?, 'running', ?, ?, ?)",
                [model_fp, _now(), None if budget_s is None else float(budget_s), objective,
                 _dump(stats)])
        return int(cur.lastrowid or 0)

    def finish_run(self, run_id: int, status: str, stats: Mapping[str, Any] | None = None) -> None:
        """Record how run ``run_id`` ended: ``finished``, ``interrupted`` or ``failed``."""
        if status not in FINAL_RUN_STATUSES:
            raise StoreError(
                f"finish_run: status must be one of {', '.join(FINAL_RUN_STATUSES)}, "
                f"received {status!r}"
            )
        with self._write("finish_run"):
            cur = self.db.execute(
                "UPDATE tuning_runs SET status = ?, finished_at = ?, stats_json = ? WHERE id = ?",
                [status, _now(), _dump(stats), int(run_id)])
            if cur.rowcount == 0:
                raise StoreError(f"finish_run: no tuning run with id {run_id} in {str(self.path)!r}")

    def runs(self, model_fp: str | None = None) -> list[TuningRun]:
        """Tuning runs, newest first (only those of ``model_fp`` when given)."""
        if model_fp is None:
            rows = self.db.query("SELECT * FROM tuning_runs ORDER BY id DESC")
        else:
            rows = self.db.query(
                "SELECT * FROM tuning_runs WHERE model_fp = ? ORDER BY id DESC", [model_fp])
        return [_run_from_row(r) for r in rows]
