"""The tuner's guarded view of the plan store: a failed write (a full disk) costs the cache,
never the tuning run."""

from __future__ import annotations

import warnings
from typing import Any

from tuner.store.errors import StoreWriteError
from tuner.store.plan_store import PlanStore


class GuardedStore:
    """The tuner's view of the plan store: reads go through; when a write fails for a reason
    other than a lock (:class:`StoreWriteError`: a full disk, a file-size limit), the run goes
    on with its measurements in memory (warned once) and nothing more is written, so a full
    disk costs the cache, never the tuning run. :attr:`error` says what failed."""

    def __init__(self, store: PlanStore) -> None:
        self._store = store
        self.error: str | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def _failed(self, exc: StoreWriteError) -> None:
        if self.error is None:
            self.error = str(exc)
            warnings.warn(f"opdispatch: {exc}; the tuning run goes on with its measurements "
                          f"in memory", RuntimeWarning, stacklevel=3)

    def put_measurement(self, *args: Any, **kwargs: Any) -> None:
        if self.error is not None:
            return
        try:
            self._store.put_measurement(*args, **kwargs)
        except StoreWriteError as exc:
            self._failed(exc)

    def start_run(self, *args: Any, **kwargs: Any) -> int | None:
        try:
            return self._store.start_run(*args, **kwargs)
        except StoreWriteError as exc:
            self._failed(exc)
            return None

    def finish_run(self, run_id: int | None, *args: Any, **kwargs: Any) -> None:
        if run_id is None or self.error is not None:
            return
        try:
            self._store.finish_run(run_id, *args, **kwargs)
        except StoreWriteError as exc:
            self._failed(exc)

    def put_plan(self, *args: Any, **kwargs: Any) -> int | None:
        try:  # tried even after a failed write: the plan is what the run is for
            return self._store.put_plan(*args, **kwargs)
        except StoreWriteError as exc:
            self._failed(exc)
            return None
