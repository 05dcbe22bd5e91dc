"""The plan store's errors and warning: what it raises when a store cannot be opened, is
damaged, outdated or read-only, when a write fails, or when a plan bundle is malformed; and the
warning issued when a damaged store was replaced. Every error derives from
:class:`StoreError`, itself an :class:`~dispatch.errors.OpDispatchError`."""

from __future__ import annotations

from dispatch.errors import OpDispatchError


class StoreError(OpDispatchError):
    """The plan store cannot be opened, has an unknown schema, or refused an operation."""


class StoreWriteError(StoreError):
    """A write to the plan store failed for a reason other than another process's lock: a
    full disk, a file-size limit, a failing device. Everything committed before is kept (the
    failed transaction is rolled back)."""


class BundleError(StoreError):
    """A plan bundle is malformed or of a format version this opdispatch does not read."""


class StoreCorruptError(StoreError):
    """The plan store file is damaged (truncated, overwritten, malformed pages).

    Attributes:
        path: the damaged file.
        detail: what SQLite reported (an error message or integrity-check lines).
        inode: ``(st_dev, st_ino)`` of the file found damaged (``None`` if unknown), so that
            only that file is ever moved aside.
        move_error: why it could not be moved aside (``None`` when that was not tried).
    """

    def __init__(self, message: str, *, path: str, detail: str,
                 inode: tuple[int, int] | None = None, move_error: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.detail = detail
        self.inode = inode
        self.move_error = move_error


class StoreOutdatedError(StoreError):
    """A store of an older schema version was opened read-only (open it writable once to
    migrate it). ``version`` is its schema version."""

    def __init__(self, message: str, *, version: int) -> None:
        super().__init__(message)
        self.version = version


class StoreRecoveredWarning(UserWarning):
    """A damaged plan store was moved aside and replaced by a fresh, empty one."""
