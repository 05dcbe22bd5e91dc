"""The :class:`PlanStore` class: one object over one store file, put together from the
connection (:mod:`tuner.store.connection`) and one mixin per table or concern: plans
(:mod:`~tuner.store.plans`), measurements (:mod:`~tuner.store.measurements`), tuning runs
(:mod:`~tuner.store.runs`) and bundles (:mod:`~tuner.store.bundle`)."""

from __future__ import annotations

from tuner.store.bundle import BundleTransfer
from tuner.store.measurements import MeasurementQueries
from tuner.store.runs import RunQueries


class PlanStore(BundleTransfer, MeasurementQueries, RunQueries):
    """The plan store at ``path`` (default: :func:`default_store_path`).

    Args:
        path: the SQLite file; its parent folders are created unless ``readonly``.
        readonly: open with ``mode=ro``: never writes, never migrates, never creates the file;
            write methods raise :class:`StoreError`.
        timeout_s: how long a statement waits for another process's lock before failing.
        recover: opened writable, a damaged store is moved aside and replaced by a fresh one
            (:attr:`recovery`, :class:`StoreRecoveredWarning`); ``False`` raises
            :class:`StoreCorruptError` instead. Read-only opens always raise it.
    """
