"""The connection under every :class:`~tuner.store.PlanStore`: opening the file writable (WAL,
``synchronous=NORMAL``, foreign keys) or read-only (``mode=ro``, immutable in a read-only
folder), the checks of :mod:`tuner.store.ownership` (a regular file, ours, writable when
opened writable) and :mod:`tuner.store.integrity` before the first write, recovery of a
damaged store, the schema version check and migrations, and the short ``BEGIN IMMEDIATE``
write transactions every write goes through. :class:`StoreConnection` is the base class the
query mixins (plans, measurements, runs, bundles) build on."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import warnings
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from sqlite_utils import Database

from tuner.store.errors import (
    StoreCorruptError,
    StoreError,
    StoreOutdatedError,
    StoreRecoveredWarning,
    StoreWriteError,
)
from tuner.store.integrity import (
    _OPEN_HERE,
    Recovery,
    _Damage,
    _forget_inodes,
    _forget_inodes_later,
    _inode,
    _locked,
    check_header,
    check_integrity,
    damage_error,
    move_damaged_aside,
    unreadable_message,
)
from tuner.store.ownership import check_connection, check_owner, check_path_kind
from tuner.store.rows import _now
from tuner.store.schema import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION

#: SQLite's primary result codes for "another connection holds the lock"
_BUSY_CODES = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED
#: How often a read-only open is tried when SQLite reports a transient error.
_READ_ATTEMPTS = 8

_Store = TypeVar("_Store", bound="StoreConnection")


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _BUSY_CODES
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _no_wal_index(exc: sqlite3.OperationalError) -> bool:
    """True when a read-only connection failed because SQLite cannot create the ``-shm``
    index of a WAL database (a read-only folder), not for a busy or transient error."""
    name = getattr(exc, "sqlite_errorname", None)
    if name is not None:
        return name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN"))
    text = str(exc).lower()
    return "readonly" in text or "read-only" in text or "unable to open" in text


def default_store_path() -> str:
    """The configured store path (``OPDISPATCH_STORE``, the config file, else the user cache)."""
    from dispatch.config import Config

    return Config.load().store_path


class StoreConnection:
    """The opened, checked and migrated store file (see :class:`~tuner.store.PlanStore` for
    the arguments)."""

    def __init__(
        self, path: str | os.PathLike | None = None, *, readonly: bool = False,
        timeout_s: float = 30.0, recover: bool = True,
    ) -> None:
        if timeout_s <= 0:
            raise StoreError(f"timeout_s must be positive, received {timeout_s!r}")
        self.path = Path(os.fspath(path) if path else default_store_path()).expanduser()
        self.readonly = readonly
        self.timeout_s = float(timeout_s)
        #: Set when a damaged store was moved aside and replaced on open (else ``None``).
        self.recovery: Recovery | None = None
        self._inodes: dict[int, tuple[int, int] | None] = {}
        # a store dropped without close() releases its files in _OPEN_HERE when collected
        weakref.finalize(self, _forget_inodes_later, self._inodes)
        # a FIFO, socket, device or folder is refused before anything opens it
        self._existed = check_path_kind(self.path)
        try:
            self._conn = self._open_readonly() if readonly else self._open_writable()
        except StoreCorruptError as exc:
            if readonly or not recover:
                raise
            self.recovery = move_damaged_aside(self.path, exc)
            warnings.warn(self.recovery.message, StoreRecoveredWarning, stacklevel=2)
            self._conn = self._open_writable()
        self._db: Database | None = None
        try:
            self.schema_version = self._check_schema()
        except BaseException:
            self._disconnect(self._conn)
            raise

    @property
    def db(self) -> Database:
        """sqlite-utils' view of the connection, for the migrations (sqlite-utils is imported
        on first use: it imports pandas, ~0.15 s that a production Session looking up its plan
        would otherwise pay at start-up)."""
        if self._db is None:
            from sqlite_utils import Database

            self._db = Database(self._conn)
        return self._db

    def _query(self, sql: str, params: Sequence[Any] = ()) -> Iterator[dict[str, Any]]:
        """The rows of ``sql`` as dicts keyed by column name (what ``Database.query`` gives,
        through the plain connection)."""
        cursor = self._conn.execute(sql, params)
        keys = [d[0] for d in cursor.description]
        for row in cursor:
            yield dict(zip(keys, row))

    # -- opening -----------------------------------------------------------------------
    def _connect(self, target: str, *, uri: bool) -> sqlite3.Connection:
        with _locked():
            try:
                conn = sqlite3.connect(target, uri=uri, timeout=self.timeout_s,
                                       isolation_level=None)
            except sqlite3.Error as exc:
                raise StoreError(f"cannot open the plan store {str(self.path)!r}: {exc}") from None
            inode = _inode(self.path)
            if inode is not None:
                _OPEN_HERE[inode] = _OPEN_HERE.get(inode, 0) + 1
            self._inodes[id(conn)] = inode
        conn.execute(f"PRAGMA busy_timeout = {int(self.timeout_s * 1000)}")
        return conn

    def _disconnect(self, conn: sqlite3.Connection) -> None:
        """Close ``conn`` (opened by :meth:`_connect`)."""
        conn.close()
        _forget_inodes({0: self._inodes.pop(id(conn), None)})

    def _open_writable(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create the folder of the plan store {str(self.path)!r}: {exc}; "
                f"open it with readonly=True to only read it"
            ) from None
        # another program's SQLite file is refused before any connection is opened on it
        check_owner(self.path, check_header(self.path))
        self._check_writable()
        conn = self._connect(str(self.path), uri=False)
        with self._closed_on_damage(conn):
            # checked before the first write (the switch to WAL): a damaged store, or another
            # program's database, is never written to
            check_integrity(conn, self.path)
            check_connection(conn, self.path)
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
        self.journal_mode = str(mode).lower()
        return conn

    def _check_writable(self) -> None:
        """Refuse a writable open that could not write (before a tuning run spends its budget
        on measurements it cannot store): a read-only file, ``-wal`` or ``-shm``, or a folder
        where SQLite cannot create them."""
        folder = self.path.parent
        blocked = [str(p) for p in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm"))
                   if p.exists() and not os.access(p, os.W_OK)]
        if not os.access(folder, os.W_OK | os.X_OK):
            blocked.append(f"its folder {str(folder)!r}")
        if blocked:
            raise StoreError(
                f"the plan store {str(self.path)!r} cannot be written by this process (no write "
                f"permission on {', '.join(blocked)}; SQLite keeps its -wal and -shm files "
                f"beside the store): point --store / OPDISPATCH_STORE at a writable file, or "
                f"open it read-only (PlanStore(path, readonly=True)) to only read it")

    def _open_readonly(self) -> sqlite3.Connection:
        if not self._existed:
            raise StoreError(
                f"no plan store at {str(self.path)!r} (opened read-only, so it is not created)"
            )
        check_owner(self.path, check_header(self.path))
        base = self.path.resolve().as_uri()
        for attempt in range(1, _READ_ATTEMPTS + 1):
            conn = self._connect(f"{base}?mode=ro", uri=True)
            try:
                conn.execute("PRAGMA user_version").fetchone()
                break
            except sqlite3.OperationalError as exc:
                self._disconnect(conn)
                if not _no_wal_index(exc):
                    # transient: a read-only connection cannot wait out the moment another
                    # process, closing the last connection, checkpoints and removes the WAL
                    if attempt == _READ_ATTEMPTS:
                        raise StoreError(f"cannot read the plan store {str(self.path)!r} "
                                         f"read-only: {exc}") from None
                    time.sleep(0.01 * attempt)
                    continue
                wal = Path(f"{self.path}-wal")
                if wal.exists() and wal.stat().st_size > 0:
                    raise StoreError(
                        f"cannot read the plan store {str(self.path)!r} read-only: its "
                        f"write-ahead log is not checkpointed and its folder is not writable"
                    ) from None
                # a WAL-mode file whose folder is read-only: nothing can write it, so it may
                # be read as immutable (SQLite cannot create the -shm index next to it)
                conn = self._connect(f"{base}?mode=ro&immutable=1", uri=True)
                break
            except sqlite3.DatabaseError as exc:
                self._disconnect(conn)
                raise damage_error(self.path, exc) from None
        with self._closed_on_damage(conn):
            conn.execute("PRAGMA query_only = ON")
            self.journal_mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
            check_integrity(conn, self.path)
            check_connection(conn, self.path)
        return conn

    @contextlib.contextmanager
    def _closed_on_damage(self, conn: sqlite3.Connection) -> Iterator[None]:
        """Close ``conn`` when the block fails; damage found through it is judged (and
        raised as :func:`~tuner.store.integrity.damage_error`) only once it is closed."""
        try:
            yield
        except _Damage as damage:
            self._disconnect(conn)
            raise damage_error(self.path, None, damage.detail, app_id=damage.app_id) from None
        except sqlite3.DatabaseError as exc:
            self._disconnect(conn)
            raise damage_error(self.path, exc) from None
        except BaseException:
            self._disconnect(conn)
            raise

    # -- schema ------------------------------------------------------------------------
    def _user_version(self) -> int:
        try:
            return int(self._conn.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.DatabaseError as exc:
            raise StoreError(unreadable_message(self.path, exc)) from None

    def _check_schema(self) -> int:
        version = self._user_version()
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the plan store {str(self.path)!r} has schema version {version}, newer than the "
                f"version {SCHEMA_VERSION} this opdispatch knows; upgrade opdispatch or use "
                f"another store (OPDISPATCH_STORE / --store)"
            )
        if version < SCHEMA_VERSION:
            if self.readonly:
                if version == 0:
                    raise StoreError(f"{str(self.path)!r} is not an opdispatch plan store "
                                     f"(schema version 0, expected {SCHEMA_VERSION})")
                raise StoreOutdatedError(
                    f"the plan store {str(self.path)!r} has schema version {version}, older than "
                    f"the version {SCHEMA_VERSION} this opdispatch reads; open it once writable "
                    f"(readonly=False) to migrate it", version=version,
                )
            version = self._migrate()
        elif not self.readonly:
            self._mark_as_ours()
        return version

    def _migrate(self) -> int:
        """Apply the missing migrations in one transaction (re-checked under the write lock,
        since another process may have migrated meanwhile)."""
        with self._write("migrate"):
            version = self._user_version()
            if version == 0:  # checked again under the lock: a fresh store has no tables
                tables = self.db.table_names()
                if tables:
                    raise StoreError(
                        f"{str(self.path)!r} is a SQLite database but not an opdispatch plan "
                        f"store (it holds the tables {sorted(tables)}, schema version 0); it "
                        f"is left as it is")
            for step in range(version, SCHEMA_VERSION):
                MIGRATIONS[step](self.db)
            if version < SCHEMA_VERSION:
                self._set_meta("schema_version", str(SCHEMA_VERSION))
                if version == 0:
                    self._set_meta("created_at", _now())
                # PRAGMA takes no parameters; SCHEMA_VERSION is this package's own integer
                self._conn.execute(f"PRAGMA user_version = {int(SCHEMA_VERSION)}")
            self._conn.execute(f"PRAGMA application_id = {int(APPLICATION_ID)}")
        return SCHEMA_VERSION

    def _mark_as_ours(self) -> None:
        """Give a store written before :data:`APPLICATION_ID` existed its mark (once)."""
        if int(self._conn.execute("PRAGMA application_id").fetchone()[0]) == APPLICATION_ID:
            return
        with self._write("mark"):
            self._conn.execute(f"PRAGMA application_id = {int(APPLICATION_ID)}")

    def _set_meta(self, key: str, value: str) -> None:
        self._conn.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            [key, value],
        )

    # -- transactions ------------------------------------------------------------------
    @contextlib.contextmanager
    def _write(self, operation: str) -> Iterator[None]:
        """One short write transaction, taking the write lock up front (``BEGIN IMMEDIATE``)."""
        if self.readonly:
            raise StoreError(
                f"{operation}: the plan store {str(self.path)!r} was opened read-only"
            )
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc):
                raise StoreWriteError(self._write_failed(operation, exc)) from None
            raise StoreError(
                f"{operation}: could not lock the plan store {str(self.path)!r} within "
                f"{self.timeout_s:g} s: {exc}"
            ) from None
        try:
            yield
            self._conn.execute("COMMIT")
        except BaseException as exc:
            if self._conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):  # the error below says what happened
                    self._conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.OperationalError) and not _is_busy(exc):
                raise StoreWriteError(self._write_failed(operation, exc)) from None
            raise

    def _write_failed(self, operation: str, exc: sqlite3.Error) -> str:
        if (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == 8:  # SQLITE_READONLY
            return (f"{operation}: the plan store {str(self.path)!r} cannot be written: {exc} "
                    f"(check the permissions of the file, its -wal and -shm, and its folder); "
                    f"everything committed before is kept")
        return (f"{operation}: writing to the plan store {str(self.path)!r} failed: {exc} (a "
                f"full disk, a file-size limit or a failing device?); everything committed "
                f"before is kept")

    def meta(self) -> dict[str, str]:
        """The ``meta`` table (schema version, creation time)."""
        return {r["key"]: r["value"] for r in self._query("SELECT key, value FROM meta")}

    def close(self) -> None:
        """Close the connection (the store can no longer be used)."""
        self._disconnect(self._conn)

    def __enter__(self: _Store) -> _Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "read-only" if self.readonly else "writable"
        return f"PlanStore({str(self.path)!r}, {mode}, schema v{self.schema_version})"

