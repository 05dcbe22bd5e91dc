"""The SQLite plan store: tuned plans, measurements and tuning runs, in one file (default
``~/.cache/opdispatch/plans.sqlite``; ``OPDISPATCH_STORE`` or ``--store`` override it) shared
by every process on the machine: tuners write, production processes read. WAL with short
``BEGIN IMMEDIATE`` writes (readers never block writers, nothing committed is lost to a
SIGKILL), a versioned schema migrated on a writable open (:mod:`~tuner.store.schema`), damage
detected on open and a damaged store moved aside for a fresh one (:mod:`~tuner.store.integrity`)
while another program's file, or anything but a regular file, is refused before anything is
written to it (:mod:`~tuner.store.ownership`), values always bound as parameters,
plans as JSON text (never pickle), and JSON bundles to ship plans between machines of the same
kind (:mod:`~tuner.store.bundle`). :class:`PlanStore` (:mod:`~tuner.store.plan_store`) is the
entry point; docs/RELIABILITY.md lists the guarantees and the tests behind them."""

from __future__ import annotations

# tests patch ``tuner.store.os.rename`` and ``tuner.store.sqlite3.connect``
import os as os
import sqlite3 as sqlite3

from tuner.store.bundle import BUNDLE_FORMAT, BUNDLE_SCHEMA, BUNDLE_VERSION, validate_bundle
from tuner.store.connection import default_store_path
from tuner.store.errors import (
    BundleError,
    StoreCorruptError,
    StoreError,
    StoreOutdatedError,
    StoreRecoveredWarning,
    StoreWriteError,
)
from tuner.store.integrity import FULL_CHECK_MAX_BYTES, Recovery, move_aside
from tuner.store.integrity import _read_head as _read_head  # used by tests/store
from tuner.store.plan_store import PlanStore
from tuner.store.plans import MAX_OTHER_MODEL_LINES, key_here, stale_reasons
from tuner.store.rows import PrunedPlan, StoredMeasurement, StoredPlan, TuningRun
from tuner.store.schema import (
    APPLICATION_ID,
    FINAL_RUN_STATUSES,
    MIGRATIONS,
    RUN_STATUSES,
    SCHEMA_VERSION,
)

__all__ = [
    "APPLICATION_ID",
    "BUNDLE_FORMAT",
    "BUNDLE_SCHEMA",
    "BUNDLE_VERSION",
    "FINAL_RUN_STATUSES",
    "FULL_CHECK_MAX_BYTES",
    "MAX_OTHER_MODEL_LINES",
    "MIGRATIONS",
    "RUN_STATUSES",
    "SCHEMA_VERSION",
    "BundleError",
    "PlanStore",
    "PrunedPlan",
    "Recovery",
    "StoreCorruptError",
    "StoreError",
    "StoreOutdatedError",
    "StoreRecoveredWarning",
    "StoreWriteError",
    "StoredMeasurement",
    "StoredPlan",
    "TuningRun",
    "default_store_path",
    "key_here",
    "move_aside",
    "stale_reasons",
    "validate_bundle",
]
