"""The plan store's schema: the tables, frozen as the plain-SQL migrations that create them
(:data:`MIGRATIONS`, counted by ``PRAGMA user_version``), the :data:`SCHEMA_VERSION` they
reach, the tables a plan store owns and the ``application_id`` that marks the file as one. A
migration that has shipped never changes: a new version appends one."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # sqlite-utils is imported only where a migration runs (tuner/store/connection.py)
    from sqlite_utils import Database

#: The statuses of a tuning run (the ``tuning_runs.status`` CHECK constraint lists the same).
RUN_STATUSES = ("running", "finished", "interrupted", "failed")
#: The statuses a run can end with (:meth:`PlanStore.finish_run`).
FINAL_RUN_STATUSES = RUN_STATUSES[1:]


def _migrate_v1(db: Database) -> None:
    """Version 1: meta, plans and measurements."""
    for sql in (
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE plans (
            id INTEGER PRIMARY KEY,
            key_digest TEXT NOT NULL UNIQUE,
            model_fp TEXT NOT NULL,
            inputs_sig TEXT NOT NULL,
            hardware_digest TEXT NOT NULL,
            hardware_json TEXT NOT NULL,
            software_digest TEXT NOT NULL,
            software_json TEXT NOT NULL,
            objective TEXT NOT NULL,
            plan_json TEXT NOT NULL,
            latency_ms REAL,
            peak_bytes INTEGER,
            created_at TEXT NOT NULL
        )""",
        "CREATE INDEX plans_model_fp ON plans (model_fp)",
        """CREATE TABLE measurements (
            id INTEGER PRIMARY KEY,
            signature TEXT NOT NULL,
            candidate TEXT NOT NULL,
            hardware_digest TEXT NOT NULL,
            software_digest TEXT NOT NULL,
            median_s REAL,
            spread_s REAL,
            samples INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL,
            UNIQUE (signature, candidate, hardware_digest, software_digest)
        )""",
    ):
        db.execute(sql)


def _migrate_v2(db: Database) -> None:
    """Version 2: tuning runs; plans link their run and carry notes; measurements record the
    error of a rejected candidate."""
    for sql in (
        """CREATE TABLE tuning_runs (
            id INTEGER PRIMARY KEY,
            model_fp TEXT NOT NULL,
            started_at TEXT NOT NULL,
            finished_at TEXT,
            status TEXT NOT NULL
                CHECK (status IN ('running', 'finished', 'interrupted', 'failed')),
            budget_s REAL,
            objective TEXT NOT NULL,
            stats_json TEXT NOT NULL DEFAULT '{}'
        )""",
        "CREATE INDEX tuning_runs_model_fp ON tuning_runs (model_fp)",
        "ALTER TABLE plans ADD COLUMN tuning_run_id INTEGER "
        "REFERENCES tuning_runs (id) ON DELETE SET NULL",
        "ALTER TABLE plans ADD COLUMN notes_json TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE measurements ADD COLUMN error TEXT",
    ):
        db.execute(sql)


def _migrate_v3(db: Database) -> None:
    """Version 3: plans record their model's family (its structure with the input shapes
    left open), so that the plans of every input shape of one model can be found."""
    for sql in (
        "ALTER TABLE plans ADD COLUMN family TEXT NOT NULL DEFAULT ''",
        "CREATE INDEX plans_family ON plans (family)",
    ):
        db.execute(sql)


#: Schema migrations in order; ``MIGRATIONS[k]`` takes a store from version ``k`` to ``k + 1``.
#: Append only: never edit a migration that has shipped.
MIGRATIONS: tuple[Callable[[Database], None], ...] = (_migrate_v1, _migrate_v2, _migrate_v3)
SCHEMA_VERSION = len(MIGRATIONS)
#: The tables of a plan store (a store of a newer opdispatch, marked with
#: :data:`APPLICATION_ID`, may have more).
_OWN_TABLES = {"meta", "plans", "measurements", "tuning_runs"}
#: ``PRAGMA application_id`` of a plan store (the bytes ``OPDS``): marks the file as ours, so
#: that a damaged store can be told from another program's SQLite file.
APPLICATION_ID = 0x4F504453
