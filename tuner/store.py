"""The SQLite plan store: tuned plans, measurements and tuning runs.

One file (default ``~/.cache/opdispatch/plans.sqlite``; ``OPDISPATCH_STORE`` or ``--store``
override it) shared by every process on the machine: tuners write, production processes read.

- WAL journal, ``busy_timeout`` and ``synchronous=NORMAL``: readers never block writers;
  writers queue up instead of failing with "database is locked".
- Every write is its own short ``BEGIN IMMEDIATE`` transaction, so an interrupted tuning run
  keeps every measurement it committed, and two writers never deadlock on a lock upgrade.
- Versioned schema: ``PRAGMA user_version`` (mirrored in the ``meta`` table) counts the
  :data:`MIGRATIONS` applied. An older store is migrated when opened writable; a store written
  by a newer opdispatch is refused with a clear error rather than misread.
- Read-only mode opens ``file:...?mode=ro`` and never writes; it also works on a read-only
  file in a read-only folder.
- Damage is detected on open (``PRAGMA integrity_check``, ``quick_check`` for large files):
  a truncated, overwritten or malformed store raises :class:`StoreCorruptError`; opened
  writable (the default ``recover=True``), the damaged file and its ``-wal``/``-shm`` are
  moved aside to ``NAME.corrupt-YYYYMMDDTHHMMSSZ`` (:func:`move_aside`), a fresh store takes
  its place, :attr:`PlanStore.recovery` says where the old one went and a
  :class:`StoreRecoveredWarning` is issued. Only files recognisably written by opdispatch (its
  ``application_id``, or its schema) are moved; another program's SQLite file or a file that
  is not SQLite at all is refused and left where it is (never switched to WAL, never
  migrated). A store is judged damaged only on two failed checks, and its bytes are read
  only while this process holds no connection on it (closing any descriptor of a file drops
  the process's POSIX locks on it, SQLite's included).
- A process killed at any point (SIGKILL) loses no committed write: WAL with
  ``synchronous=NORMAL`` is durable against process crashes (not against power loss).
- Plans are stored as JSON text (never pickle); every value reaches SQLite as a bound
  parameter, never in the SQL text (the PRAGMAs, which take no parameters, get only this
  module's integer constants, a timeout cast to ``int`` and one of two check names).
- Plans travel between machines of the same kind as JSON bundles
  (:meth:`PlanStore.export_plans` / :meth:`PlanStore.import_plans`, format
  :data:`BUNDLE_FORMAT` version :data:`BUNDLE_VERSION`): data only, validated on import.

The DDL of each migration is plain SQL frozen in this file (a past migration must never
change); queries go through sqlite-utils over the same ``sqlite3`` connection.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlite_utils import Database

from dispatch.errors import OpDispatchError
from dispatch.plan import Plan
from tuner.fingerprint import (
    FINGERPRINT_VERSION,
    PlanKey,
    hardware_digest,
    hardware_fingerprint,
    opdispatch_version,
    software_digest,
    software_fingerprint,
)

if TYPE_CHECKING:
    from dispatch.registry import Registry

RUN_STATUSES = ("running", "finished", "interrupted", "failed")
FINAL_RUN_STATUSES = RUN_STATUSES[1:]
#: Lines :meth:`PlanStore.why_not` gives at most about plans of other models.
MAX_OTHER_MODEL_LINES = 3


#: The ``format`` field of a plan bundle (:meth:`PlanStore.export_plans`).
BUNDLE_FORMAT = "opdispatch-plan-bundle"
#: The bundle format version written; a bundle of another version is refused on import.
BUNDLE_VERSION = 1


class StoreError(OpDispatchError):
    """The plan store cannot be opened, has an unknown schema, or refused an operation."""


class StoreWriteError(StoreError):
    """A write to the plan store failed for a reason other than another process's lock: a
    full disk, a file-size limit, a failing device. Everything committed before is kept (the
    failed transaction is rolled back)."""


#: SQLite's primary result codes for "another connection holds the lock"
_BUSY_CODES = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _BUSY_CODES
    text = str(exc).lower()
    return "locked" in text or "busy" in text


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


class _Damage(Exception):
    """Damage found through an open connection; turned into :class:`StoreCorruptError` or
    :class:`StoreError` once the connection is closed (see :data:`_OPEN_HERE`)."""

    def __init__(self, detail: str, app_id: int | None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.app_id = app_id


class StoreRecoveredWarning(UserWarning):
    """A damaged plan store was moved aside and replaced by a fresh, empty one."""


@dataclass(frozen=True)
class Recovery:
    """What happened to a damaged store: where it was, where it went and why."""

    path: str
    moved_to: str | None
    detail: str

    @property
    def message(self) -> str:
        """One line for the user: the store, the damage and the new name of the old file."""
        where = (f"moved aside to {self.moved_to}" if self.moved_to
                 else "already moved aside by another process")
        return (f"the plan store {self.path} was corrupt ({self.detail}); {where}, and a "
                f"fresh empty store replaces it")


# ------------------------------------------------------------------------------------------
# schema
# ------------------------------------------------------------------------------------------


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


#: Schema migrations in order; ``MIGRATIONS[k]`` takes a store from version ``k`` to ``k + 1``.
#: Append only: never edit a migration that has shipped.
MIGRATIONS: tuple[Callable[[Database], None], ...] = (_migrate_v1, _migrate_v2)
SCHEMA_VERSION = len(MIGRATIONS)
_OWN_TABLES = {"meta", "plans", "measurements", "tuning_runs"}
#: ``PRAGMA application_id`` of a plan store (the bytes ``OPDS``): marks the file as ours, so
#: that a damaged store can be told from another program's SQLite file.
APPLICATION_ID = 0x4F504453
#: Files up to this size get the full ``integrity_check`` on open, larger ones ``quick_check``.
FULL_CHECK_MAX_BYTES = 4 << 20
_SQLITE_MAGIC = b"SQLite format 3\x00"
#: SQLite error names and messages that mean a damaged file (not a busy or locked one).
_CORRUPT_NAMES = {"SQLITE_CORRUPT", "SQLITE_NOTADB"}
_CORRUPT_TEXT = ("malformed", "not a database", "corrupt")


# ------------------------------------------------------------------------------------------
# records
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredPlan:
    """A plan row: its key, the plan as JSON and what the tuner measured for it."""

    id: int
    key: PlanKey
    plan_json: str
    latency_ms: float | None
    peak_bytes: int | None
    created_at: str
    run_id: int | None
    notes: dict[str, Any] = field(default_factory=dict)

    def plan(self) -> Plan:
        """The stored plan as a :class:`dispatch.plan.Plan`."""
        return Plan.from_json(self.plan_json)


@dataclass(frozen=True)
class StoredMeasurement:
    """One candidate measured for one signature on one hardware/software combination."""

    signature: str
    candidate: str
    hardware_digest: str
    software_digest: str
    median_s: float | None
    spread_s: float | None
    samples: int
    error: str | None
    created_at: str

    @property
    def ok(self) -> bool:
        """True when the candidate ran and matched the reference."""
        return self.error is None and self.median_s is not None


@dataclass(frozen=True)
class TuningRun:
    """One tuning run: when, how it ended, its budget, objective and statistics."""

    id: int
    model_fp: str
    started_at: str
    finished_at: str | None
    status: str
    budget_s: float | None
    objective: str
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PrunedPlan:
    """A plan :meth:`PlanStore.prune_plans` removed (or would remove), and why."""

    plan: StoredPlan
    reasons: list[str]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _parse_time(text: str) -> datetime:
    """An ISO timestamp as an aware datetime (naive ones are taken as UTC)."""
    when = datetime.fromisoformat(text)
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def _json_dict(text: str | None) -> dict[str, Any]:
    data = json.loads(text) if text else {}
    return data if isinstance(data, dict) else {"value": data}


def _dump(data: Mapping[str, Any] | None) -> str:
    return json.dumps(dict(data or {}), sort_keys=True, default=str)


def _plan_from_row(row: Mapping[str, Any]) -> StoredPlan:
    key = PlanKey(
        model=row["model_fp"],
        inputs=row["inputs_sig"],
        hardware=_json_dict(row["hardware_json"]),
        software=_json_dict(row["software_json"]),
        objective=row["objective"],
    )
    return StoredPlan(
        id=int(row["id"]), key=key, plan_json=row["plan_json"], latency_ms=row["latency_ms"],
        peak_bytes=row["peak_bytes"], created_at=row["created_at"], run_id=row["tuning_run_id"],
        notes=_json_dict(row["notes_json"]),
    )


def _measurement_from_row(row: Mapping[str, Any]) -> StoredMeasurement:
    return StoredMeasurement(
        signature=row["signature"], candidate=row["candidate"],
        hardware_digest=row["hardware_digest"], software_digest=row["software_digest"],
        median_s=row["median_s"], spread_s=row["spread_s"], samples=int(row["samples"]),
        error=row["error"], created_at=row["created_at"],
    )


def _run_from_row(row: Mapping[str, Any]) -> TuningRun:
    return TuningRun(
        id=int(row["id"]), model_fp=row["model_fp"], started_at=row["started_at"],
        finished_at=row["finished_at"], status=row["status"], budget_s=row["budget_s"],
        objective=row["objective"], stats=_json_dict(row["stats_json"]),
    )


# ------------------------------------------------------------------------------------------
# the store
# ------------------------------------------------------------------------------------------


def _application_id(conn: sqlite3.Connection) -> int | None:
    """``PRAGMA application_id`` through ``conn``, or ``None`` when it cannot be read."""
    try:
        return int(conn.execute("PRAGMA application_id").fetchone()[0])
    except sqlite3.Error:
        return None


def _is_damage(exc: BaseException) -> bool:
    """True when a SQLite error means a damaged or foreign file, not a busy or locked one."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    name = getattr(exc, "sqlite_errorname", None)
    if name is not None:
        return name in _CORRUPT_NAMES
    text = str(exc).lower()
    return any(t in text for t in _CORRUPT_TEXT)


#: How often a read-only open is tried when SQLite reports a transient error.
_READ_ATTEMPTS = 8


def _no_wal_index(exc: sqlite3.OperationalError) -> bool:
    """True when a read-only connection failed because SQLite cannot create the ``-shm``
    index of a WAL database (a read-only folder), not for a busy or transient error."""
    name = getattr(exc, "sqlite_errorname", None)
    if name is not None:
        return name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN"))
    text = str(exc).lower()
    return "readonly" in text or "read-only" in text or "unable to open" in text


#: ``(st_dev, st_ino)`` -> how many connections the plan stores of this process hold on
#: that file. Closing *any* file descriptor of a file drops every POSIX lock the process
#: holds on it, SQLite's included (https://sqlite.org/howtocorrupt.html#_posix_advisory_locks_canceled_by_a_separate_thread_doing_close_),
#: so the file's own bytes are read (:func:`_read_head`) only while no connection of this
#: process has it open.
_OPEN_HERE: dict[tuple[int, int], int] = {}
_OPEN_LOCK = threading.Lock()


def _forget_inodes(inodes: dict[int, tuple[int, int] | None]) -> None:
    """Drop the entries of ``inodes`` (connection id -> inode) from :data:`_OPEN_HERE`."""
    with _OPEN_LOCK:
        for inode in inodes.values():
            if inode is not None and inode in _OPEN_HERE:
                _OPEN_HERE[inode] -= 1
                if _OPEN_HERE[inode] <= 0:
                    del _OPEN_HERE[inode]
        inodes.clear()


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _read_head(path: Path, size: int) -> bytes | None:
    """The first ``size`` bytes of ``path``; ``None`` when it cannot be read, or may not be
    because a plan store of this process has it open (see :data:`_OPEN_HERE`)."""
    with _OPEN_LOCK:
        inode = _inode(path)
        if inode is None or _OPEN_HERE.get(inode):
            return None
        try:
            with open(path, "rb") as f:
                return f.read(size)
        except OSError:
            return None


def _looks_like_a_plan_store(path: Path) -> bool:
    """Whether a damaged file at ``path`` is an opdispatch plan store, so that moving it aside
    is safe: a SQLite file with :data:`APPLICATION_ID` (or, from before it existed, the plan
    store's schema text), or one too short to be any SQLite database (its header says SQLite,
    the rest was truncated away). A file that is not SQLite, another program's SQLite file,
    or a file this process holds open (it is not read then) is never taken for one."""
    head = _read_head(path, 1 << 20)
    if head is None:
        return False
    schema_text = (b"key_digest TEXT NOT NULL UNIQUE" in head
                   and b"CREATE TABLE measurements" in head)
    if not head.startswith(_SQLITE_MAGIC):
        if 6 <= len(head) < len(_SQLITE_MAGIC) and _SQLITE_MAGIC.startswith(head):
            return True  # a SQLite file truncated inside its header
        # an overwritten header: binary pages (NUL bytes, which text never has) that hold the
        # plan store's schema
        return schema_text and b"\x00" in head
    if len(head) < 512:  # the smallest SQLite page: no database of any program is this short
        return True
    app_id = int.from_bytes(head[68:72], "big")
    if app_id:
        return app_id == APPLICATION_ID
    return schema_text


def _truncation(path: Path) -> str | None:
    """How the file at ``path`` is shorter than a SQLite file can be: cut inside its header,
    not a whole number of pages, or fewer pages than its header declares; ``None`` when it
    is not (or when it is not SQLite at all). Truncation that leaves whole, unused pages
    behind is for the integrity check to find."""
    head = _read_head(path, 100)
    try:
        size = path.stat().st_size
    except OSError:
        return None
    if head is None:
        return None
    if len(head) < 100:
        if len(head) >= 6 and _SQLITE_MAGIC.startswith(head[:16]):
            return f"truncated to {size} bytes, inside the SQLite header"
        return None
    if not head.startswith(_SQLITE_MAGIC):
        return None
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        return None  # a damaged header: SQLite's own error says so
    if size % page_size:
        return f"truncated: {size} bytes, not a whole number of {page_size}-byte pages"
    # the header's page count is valid only when its version-valid-for number matches
    pages = int.from_bytes(head[28:32], "big") if head[92:96] == head[24:28] else 0
    if pages and size < page_size * pages:
        return (f"truncated: {size} bytes, its header declares {pages} pages of {page_size} "
                f"bytes ({pages * page_size} bytes)")
    return None


def _describe_damage(path: Path, detail: str) -> str:
    """``detail`` (SQLite's words), saying first when the file is truncated."""
    truncated = _truncation(path)
    return f"{truncated}; {detail}" if truncated and truncated not in detail else detail


#: The files SQLite keeps next to a database; they move with it.
_SIDE_FILES = ("-wal", "-shm", "-journal")


def move_aside(path: str | os.PathLike, *, expect: tuple[int, int] | None = None) -> Path | None:
    """Rename the damaged store ``path`` and its ``-wal``/``-shm``/``-journal`` to
    ``NAME.corrupt-YYYYMMDDTHHMMSSZ`` (``-2``, ``-3``... when taken), next to it; returns the
    new path. With ``expect`` (``(st_dev, st_ino)`` of the file found damaged), nothing is moved
    and ``None`` returned when ``path`` is no longer that file (another process moved it aside
    and made a fresh store first). Raises ``OSError`` when the folder is not writable."""
    path = Path(os.fspath(path))
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    if expect is not None and (st.st_dev, st.st_ino) != tuple(expect):
        return None
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    n = 1
    while True:
        target = path.with_name(f"{path.name}.corrupt-{stamp}" + (f"-{n}" if n > 1 else ""))
        if not any(os.path.lexists(f"{target}{s}") for s in ("", *_SIDE_FILES)):
            break
        n += 1
    os.rename(path, target)
    for suffix in _SIDE_FILES:  # the old WAL must never be replayed into the fresh store
        with contextlib.suppress(FileNotFoundError):
            os.rename(f"{path}{suffix}", f"{target}{suffix}")
    return target


def default_store_path() -> str:
    """The configured store path (``OPDISPATCH_STORE``, the config file, else the user cache)."""
    from dispatch.config import Config

    return Config.load().store_path


class PlanStore:
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
        weakref.finalize(self, _forget_inodes, self._inodes)
        try:
            self._conn = self._open_readonly() if readonly else self._open_writable()
        except StoreCorruptError as exc:
            if readonly or not recover:
                raise
            self.recovery = self._move_aside(exc)
            warnings.warn(self.recovery.message, StoreRecoveredWarning, stacklevel=2)
            self._conn = self._open_writable()
        self.db = Database(self._conn)
        try:
            self.schema_version = self._check_schema()
        except BaseException:
            self._disconnect(self._conn)
            raise

    # -- opening -----------------------------------------------------------------------
    def _connect(self, target: str, *, uri: bool) -> sqlite3.Connection:
        with _OPEN_LOCK:
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
        if self.path.is_dir():
            raise StoreError(f"the plan store must be a file, received the folder {str(self.path)!r}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create the folder of the plan store {str(self.path)!r}: {exc}; "
                f"open it with readonly=True to only read it"
            ) from None
        self._check_header()
        conn = self._connect(str(self.path), uri=False)
        try:
            # checked before the first write (the switch to WAL): a damaged store, or another
            # program's database, is never written to
            self._check_integrity(conn)
            self._check_not_foreign(conn)
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
        except _Damage as damage:
            self._disconnect(conn)
            raise self._damaged(None, damage.detail, app_id=damage.app_id) from None
        except sqlite3.DatabaseError as exc:
            self._disconnect(conn)
            raise self._damaged(exc) from None
        except BaseException:
            self._disconnect(conn)
            raise
        self.journal_mode = str(mode).lower()
        return conn

    def _open_readonly(self) -> sqlite3.Connection:
        if not self.path.is_file():
            raise StoreError(
                f"no plan store at {str(self.path)!r} (opened read-only, so it is not created)"
            )
        self._check_header()
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
                raise self._damaged(exc) from None
        try:
            conn.execute("PRAGMA query_only = ON")
            self.journal_mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
            self._check_integrity(conn)
            self._check_not_foreign(conn)
        except _Damage as damage:
            self._disconnect(conn)
            raise self._damaged(None, damage.detail, app_id=damage.app_id) from None
        except sqlite3.DatabaseError as exc:
            self._disconnect(conn)
            raise self._damaged(exc) from None
        except BaseException:
            self._disconnect(conn)
            raise
        return conn

    def _unreadable(self, exc: BaseException) -> str:
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None and (code & 0xFF) in (10, 13):  # SQLITE_IOERR, SQLITE_FULL
            return (f"cannot use the plan store {str(self.path)!r}: {exc} (a full disk, a "
                    f"file-size limit or a failing device?)")
        return (f"{str(self.path)!r} is not a readable SQLite plan store "
                f"({type(exc).__name__}: {exc})")

    # -- damage ------------------------------------------------------------------------
    def _check_header(self) -> None:
        """Refuse a file without a whole SQLite header before SQLite opens it: closing a
        connection to such a file deletes the ``-wal`` next to it, and with it whatever the
        damaged store had committed since its last checkpoint (kept when it is moved aside)."""
        head = _read_head(self.path, 100)
        if not head:
            return  # missing, open here (so it was readable), or empty: a fresh store
        if len(head) < 100 or not head.startswith(_SQLITE_MAGIC):
            raise self._damaged(None, _truncation(self.path) or "file is not a database "
                                "(no SQLite header)")

    def _check_integrity(self, conn: sqlite3.Connection) -> None:
        """Raise :class:`StoreCorruptError` when SQLite's integrity check finds damage:
        ``integrity_check`` up to :data:`FULL_CHECK_MAX_BYTES`, ``quick_check`` above (both
        read every page; the quick one skips matching indexes against their tables)."""
        # a file shorter than its pages: SQLite reads the missing bytes as zeros, and may find
        # nothing wrong. Judged only while the WAL is empty: frames in it may hold pages a
        # checkpoint has not yet written into the file. (Sizes by stat: the file itself is
        # never opened while a connection is.)
        page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
        try:
            size = self.path.stat().st_size
            wal = os.path.getsize(f"{self.path}-wal") if os.path.exists(f"{self.path}-wal") else 0
        except OSError:
            size, wal = pages * page_size, 1
        if not wal and size and page_size:
            if size % page_size:
                raise _Damage(f"truncated: {size} bytes, not a whole number of {page_size}-byte "
                              f"pages", _application_id(conn))
            if size < pages * page_size:
                raise _Damage(f"truncated: {size} bytes, its header declares {pages} pages of "
                              f"{page_size} bytes ({pages * page_size} bytes)",
                              _application_id(conn))
        pragma = "integrity_check" if size <= FULL_CHECK_MAX_BYTES else "quick_check"
        problems: list[str] = []
        for attempt in range(2):  # damage is judged on two checks: a store is never moved
            if attempt:           # aside on one bad read
                time.sleep(0.05)
            # PRAGMA takes no parameters: the name is one of two literals, the limit a constant
            rows = conn.execute(f"PRAGMA {pragma}(5)").fetchall()
            problems = [" ".join(line.split()) for r in rows if str(r[0]).lower() != "ok"
                        for line in str(r[0]).splitlines() if "*** in database" not in line]
            if not problems:
                return
        raise _Damage(f"{pragma} failed: " + "; ".join(p for p in problems if p),
                      _application_id(conn))

    def _check_not_foreign(self, conn: sqlite3.Connection) -> None:
        """Refuse another program's SQLite database: tables other than the plan store's, and
        not marked with :data:`APPLICATION_ID` (a store of a newer opdispatch is marked, and
        may have more tables)."""
        if int(conn.execute("PRAGMA application_id").fetchone()[0]) == APPLICATION_ID:
            return
        tables = {r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'")}
        foreign = tables - _OWN_TABLES
        if foreign:
            raise StoreError(
                f"{str(self.path)!r} is a SQLite database but not an opdispatch plan store "
                f"(it holds the tables {sorted(foreign)}); it is left as it is"
            )

    def _damaged(self, exc: BaseException | None, detail: str | None = None, *,
                 app_id: int | None = None) -> StoreError:
        """The error for a file SQLite cannot read (``exc``) or whose integrity check failed
        (``detail``): :class:`StoreCorruptError` for a damaged plan store, a plain
        :class:`StoreError` for a file that is not (recognisably) one, or for an error that
        is not damage (a lock, a permission). ``app_id``: the file's application id, when
        SQLite could still read it. Called with no connection of this store open."""
        if exc is not None:
            if not _is_damage(exc):
                return StoreError(self._unreadable(exc))
            detail = f"{type(exc).__name__}: {exc}"
        detail = _describe_damage(self.path, detail or "damaged")
        ours = app_id == APPLICATION_ID if app_id else _looks_like_a_plan_store(self.path)
        if not ours:
            return StoreError(
                f"{str(self.path)!r} is not a readable SQLite plan store ({detail}); it is not "
                f"recognisably an opdispatch plan store, so it is left as it is: point "
                f"OPDISPATCH_STORE / --store at another file, or move it away yourself"
            )
        err = StoreCorruptError(
            f"the plan store {str(self.path)!r} is corrupt ({detail}); opened writable "
            f"(PlanStore(path), opdispatch tune) it is moved aside and replaced by a fresh store",
            path=str(self.path), detail=detail,
        )
        with contextlib.suppress(OSError):
            st = self.path.stat()
            err.inode = (st.st_dev, st.st_ino)
        return err

    def _move_aside(self, exc: StoreCorruptError) -> Recovery:
        """Move the damaged store aside (unless another process already has) for a fresh one."""
        try:
            moved = move_aside(self.path, expect=exc.inode)
        except OSError as err:
            raise StoreCorruptError(
                f"the plan store {str(self.path)!r} is corrupt ({exc.detail}) and could not be "
                f"moved aside ({err}): move or delete it yourself",
                path=exc.path, detail=exc.detail, inode=exc.inode, move_error=str(err),
            ) from None
        return Recovery(path=str(self.path), moved_to=None if moved is None else str(moved),
                        detail=exc.detail)

    def _user_version(self) -> int:
        try:
            return int(self._conn.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.DatabaseError as exc:
            raise StoreError(self._unreadable(exc)) from None

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
            if version == 0:
                foreign = set(self.db.table_names()) - _OWN_TABLES
                if foreign:
                    raise StoreError(
                        f"{str(self.path)!r} is a SQLite database but not an opdispatch plan "
                        f"store (it holds the tables {sorted(foreign)})"
                    )
            for step in range(version, SCHEMA_VERSION):
                MIGRATIONS[step](self.db)
            if version < SCHEMA_VERSION:
                self._set_meta("schema_version", str(SCHEMA_VERSION))
                if version == 0:
                    self._set_meta("created_at", _now())
                # PRAGMA takes no parameters; SCHEMA_VERSION is this module's own integer
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
        self.db.execute(
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
        return (f"{operation}: writing to the plan store {str(self.path)!r} failed: {exc} (a "
                f"full disk, a file-size limit or a failing device?); everything committed "
                f"before is kept")

    def meta(self) -> dict[str, str]:
        """The ``meta`` table (schema version, creation time)."""
        return {r["key"]: r["value"] for r in self.db.query("SELECT key, value FROM meta")}

    def close(self) -> None:
        """Close the connection (the store can no longer be used)."""
        self._disconnect(self._conn)

    def __enter__(self) -> PlanStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "read-only" if self.readonly else "writable"
        return f"PlanStore({str(self.path)!r}, {mode}, schema v{self.schema_version})"

    # -- plans -------------------------------------------------------------------------
    def put_plan(
        self,
        key: PlanKey,
        plan_json: str | Plan,
        *,
        latency_ms: float | None = None,
        peak_bytes: int | None = None,
        run_id: int | None = None,
        notes: Mapping[str, Any] | None = None,
    ) -> int:
        """Store ``plan_json`` under ``key``, replacing a plan stored under the same key;
        returns the plan's id (kept when replacing). The JSON is checked to be a valid plan."""
        if not isinstance(key, PlanKey):
            raise StoreError(f"put_plan expects a PlanKey, received {type(key).__name__}")
        text = plan_json.to_json() if isinstance(plan_json, Plan) else plan_json
        if not isinstance(text, str):
            raise StoreError(
                f"put_plan expects the plan as JSON text or a Plan, received {type(text).__name__}"
            )
        Plan.from_json(text)  # raises PlanError on a malformed plan: never store one
        digest = key.digest()
        row = [
            digest, key.model, key.inputs, hardware_digest(key.hardware), _dump(key.hardware),
            software_digest(key.software), _dump(key.software), key.objective, text,
            None if latency_ms is None else float(latency_ms),
            None if peak_bytes is None else int(peak_bytes),
            _now(), run_id, _dump(notes),
        ]
        with self._write("put_plan"), self._run_must_exist("put_plan", run_id):
            self.db.execute(
                """INSERT INTO plans (key_digest, model_fp, inputs_sig, hardware_digest,
                       hardware_json, software_digest, software_json, objective, plan_json,
                       latency_ms, peak_bytes, created_at, tuning_run_id, notes_json)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (key_digest) DO UPDATE SET
                       plan_json = excluded.plan_json, latency_ms = excluded.latency_ms,
                       peak_bytes = excluded.peak_bytes, created_at = excluded.created_at,
                       tuning_run_id = excluded.tuning_run_id, notes_json = excluded.notes_json""",
                row,
            )
            found = self._conn.execute(
                "SELECT id FROM plans WHERE key_digest = ?", [digest]).fetchone()
        return int(found[0])

    @contextlib.contextmanager
    def _run_must_exist(self, operation: str, run_id: int | None) -> Iterator[None]:
        try:
            yield
        except sqlite3.IntegrityError as exc:
            if run_id is None or "FOREIGN KEY" not in str(exc):
                raise
            raise StoreError(
                f"{operation}: run_id {run_id} is not a tuning run in {str(self.path)!r} "
                f"(expected an id returned by start_run)"
            ) from None

    def get_plan(self, key: PlanKey) -> StoredPlan | None:
        """The plan stored under exactly ``key``, or ``None`` (see :meth:`why_not`)."""
        rows = list(self.db.query("SELECT * FROM plans WHERE key_digest = ?", [key.digest()]))
        if not rows:
            return None
        stored = _plan_from_row(rows[0])
        return stored if stored.key == key else None

    def plan_by_id(self, plan_id: int) -> StoredPlan:
        """The plan with id ``plan_id``; raises :class:`StoreError` listing the ids that exist."""
        rows = list(self.db.query("SELECT * FROM plans WHERE id = ?", [int(plan_id)]))
        if not rows:
            ids = [r["id"] for r in self.db.query("SELECT id FROM plans ORDER BY id")]
            raise StoreError(f"no plan with id {plan_id} in {str(self.path)!r}; stored ids: "
                             f"{', '.join(map(str, ids[:50])) or '(none)'}")
        return _plan_from_row(rows[0])

    def plans_for_model(self, model_fp: str) -> list[StoredPlan]:
        """Every plan stored for the model fingerprint ``model_fp``, newest first."""
        return [_plan_from_row(r) for r in self.db.query(
            "SELECT * FROM plans WHERE model_fp = ? ORDER BY created_at DESC, id DESC", [model_fp])]

    def all_plans(self) -> list[StoredPlan]:
        """Every stored plan, newest first."""
        return [_plan_from_row(r) for r in self.db.query(
            "SELECT * FROM plans ORDER BY created_at DESC, id DESC")]

    def delete_plan(self, plan_id: int) -> bool:
        """Delete the plan with id ``plan_id``; False when there was none."""
        with self._write("delete_plan"):
            cur = self.db.execute("DELETE FROM plans WHERE id = ?", [int(plan_id)])
        return cur.rowcount > 0

    def why_not(self, key: PlanKey) -> list[str]:
        """Why no stored plan matches ``key``: one line per stored plan of the same model
        naming what differs (``plan 3 (latency, 2024-...): native: build 1a2b -> build 3c4d``).
        Empty when a plan matches, or when no plan of this model (nor of a model with the same
        inputs) was ever stored."""
        if self.get_plan(key) is not None:
            return []
        same_model = self.plans_for_model(key.model)
        if same_model:
            return [self._difference_line(p, key) for p in same_model]
        others = [_plan_from_row(r) for r in self.db.query(
            "SELECT * FROM plans WHERE inputs_sig = ? ORDER BY created_at DESC, id DESC LIMIT ?",
            [key.inputs, MAX_OTHER_MODEL_LINES])]
        return [self._difference_line(p, key) for p in others]

    @staticmethod
    def _difference_line(stored: StoredPlan, key: PlanKey) -> str:
        changes = stored.key.explain_difference(key) or ["identical key (digest mismatch)"]
        return (f"plan {stored.id} ({stored.key.objective}, stored {stored.created_at}): "
                + ", ".join(changes))

    # -- measurements ------------------------------------------------------------------
    def put_measurement(
        self,
        signature: str,
        candidate: str,
        hardware_digest: str,
        software_digest: str,
        *,
        median_s: float | None = None,
        spread_s: float | None = None,
        samples: int = 0,
        error: str | None = None,
    ) -> None:
        """Record (or replace) one measurement, committed at once so that an interrupted
        tuning run keeps it. ``error`` marks a candidate that failed or gave wrong results."""
        if median_s is None and error is None:
            raise StoreError(
                f"put_measurement({signature!r}, {candidate!r}): expected median_s or error, "
                f"received neither"
            )
        row = [signature, candidate, hardware_digest, software_digest,
               None if median_s is None else float(median_s),
               None if spread_s is None else float(spread_s), int(samples), error, _now()]
        with self._write("put_measurement"):
            self.db.execute(
                """INSERT INTO measurements (signature, candidate, hardware_digest,
                       software_digest, median_s, spread_s, samples, error, created_at)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (signature, candidate, hardware_digest, software_digest)
                   DO UPDATE SET median_s = excluded.median_s, spread_s = excluded.spread_s,
                       samples = excluded.samples, error = excluded.error,
                       created_at = excluded.created_at""",
                row,
            )

    def get_measurement(
        self, signature: str, candidate: str, hardware_digest: str, software_digest: str,
    ) -> StoredMeasurement | None:
        """The measurement of ``candidate`` for ``signature`` on this hardware and software."""
        rows = list(self.db.query(
            "SELECT * FROM measurements WHERE signature = ? AND candidate = ? "
            "AND hardware_digest = ? AND software_digest = ?",
            [signature, candidate, hardware_digest, software_digest]))
        return _measurement_from_row(rows[0]) if rows else None

    def measurements_for(
        self, signature: str, hardware_digest: str, software_digest: str,
    ) -> list[StoredMeasurement]:
        """Every candidate measured for ``signature`` on this hardware and software, fastest
        first (failed ones last)."""
        return [_measurement_from_row(r) for r in self.db.query(
            "SELECT * FROM measurements WHERE signature = ? AND hardware_digest = ? "
            "AND software_digest = ? ORDER BY error IS NOT NULL, median_s IS NULL, median_s, "
            "candidate", [signature, hardware_digest, software_digest])]

    def count_measurements(self) -> int:
        """How many measurements the store holds."""
        return int(self._conn.execute("SELECT count(*) FROM measurements").fetchone()[0])

    # -- tuning runs -------------------------------------------------------------------
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

    # -- bundles -----------------------------------------------------------------------
    def export_plans(self, ids: Iterable[int] | None = None) -> dict[str, Any]:
        """A JSON-able bundle of the plans ``ids`` (every plan when ``None``) with their keys,
        to ship with a model to other machines of the same kind (:meth:`import_plans`).

        Data only (no pickle): ``{"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION,
        "fingerprint_version", "exported_at", "opdispatch", "plans": [{"key": {model, inputs,
        hardware, software, objective}, "key_digest", "plan", "latency_ms", "peak_bytes",
        "created_at", "notes", "id"}]}``. Tuning runs and measurements stay behind. Raises
        :class:`StoreError` naming the stored ids when an id is unknown.
        """
        if ids is None:
            chosen = sorted(self.all_plans(), key=lambda p: p.id)
        else:
            seen: dict[int, StoredPlan] = {}
            for plan_id in ids:
                if isinstance(plan_id, bool) or not isinstance(plan_id, int):
                    raise StoreError(
                        f"export_plans expects integer plan ids, received {plan_id!r}")
                if plan_id not in seen:
                    seen[plan_id] = self.plan_by_id(plan_id)
            chosen = list(seen.values())
        return {
            "format": BUNDLE_FORMAT,
            "version": BUNDLE_VERSION,
            "fingerprint_version": FINGERPRINT_VERSION,
            "exported_at": _now(),
            "opdispatch": opdispatch_version(),
            "plans": [
                {
                    "id": p.id,
                    "key": {"model": p.key.model, "inputs": p.key.inputs,
                            "hardware": p.key.hardware, "software": p.key.software,
                            "objective": p.key.objective},
                    "key_digest": p.key.digest(),
                    "plan": json.loads(p.plan_json),
                    "latency_ms": p.latency_ms,
                    "peak_bytes": p.peak_bytes,
                    "created_at": p.created_at,
                    "notes": p.notes,
                }
                for p in chosen
            ],
        }

    def import_plans(self, bundle: Mapping[str, Any]) -> list[int]:
        """Insert the plans of a bundle written by :meth:`export_plans`; returns their ids
        here, in bundle order. A plan stored under the same key is replaced (as by
        :meth:`put_plan`). The whole bundle is validated first and inserted in one
        transaction: a malformed bundle raises :class:`BundleError` saying which field is
        wrong, and nothing is imported. Imported plans keep their creation time; their notes
        record ``imported_at``; they belong to no tuning run here."""
        entries = validate_bundle(bundle)
        now = _now()
        ids: list[int] = []
        with self._write("import_plans"):
            for e in entries:
                key: PlanKey = e["key"]
                digest = key.digest()
                self.db.execute(
                    """INSERT INTO plans (key_digest, model_fp, inputs_sig, hardware_digest,
                           hardware_json, software_digest, software_json, objective, plan_json,
                           latency_ms, peak_bytes, created_at, tuning_run_id, notes_json)
                       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?)
                       ON CONFLICT (key_digest) DO UPDATE SET
                           plan_json = excluded.plan_json, latency_ms = excluded.latency_ms,
                           peak_bytes = excluded.peak_bytes, created_at = excluded.created_at,
                           tuning_run_id = NULL, notes_json = excluded.notes_json""",
                    [digest, key.model, key.inputs, hardware_digest(key.hardware),
                     _dump(key.hardware), software_digest(key.software), _dump(key.software),
                     key.objective, e["plan_json"], e["latency_ms"], e["peak_bytes"],
                     e["created_at"] or now, _dump({**e["notes"], "imported_at": now})],
                )
                found = self._conn.execute(
                    "SELECT id FROM plans WHERE key_digest = ?", [digest]).fetchone()
                ids.append(int(found[0]))
        return ids

    # -- pruning -----------------------------------------------------------------------
    def prune_plans(
        self,
        *,
        older_than_days: float | None = None,
        stale: Callable[[StoredPlan], Sequence[str]] | None = None,
        dry_run: bool = False,
        now: datetime | None = None,
    ) -> list[PrunedPlan]:
        """Delete the plans created more than ``older_than_days`` days ago, and those for
        which ``stale(plan)`` returns reasons (e.g. :func:`stale_reasons`: the plan's hardware
        or software fingerprint does not match this machine); returns what was removed, oldest
        first. ``dry_run`` removes nothing. Selection and deletion happen in one write
        transaction, so a plan re-tuned meanwhile by another process is never removed by
        mistake."""
        if older_than_days is None and stale is None:
            raise StoreError("prune_plans: expected older_than_days and/or stale, received neither")
        if older_than_days is not None and (
            isinstance(older_than_days, bool) or not isinstance(older_than_days, int | float)
            or older_than_days < 0
        ):
            raise StoreError(
                f"prune_plans: older_than_days must be a number >= 0, received {older_than_days!r}")
        now = now or datetime.now(timezone.utc)
        cutoff = None
        if older_than_days is not None:
            cutoff = now - timedelta(days=float(older_than_days))
        removed: list[PrunedPlan] = []
        context = contextlib.nullcontext() if dry_run else self._write("prune_plans")
        with context:
            rows = list(self.db.query("SELECT * FROM plans ORDER BY created_at, id"))
            for row in rows:
                plan = _plan_from_row(row)
                reasons: list[str] = []
                if cutoff is not None:
                    try:
                        created = _parse_time(plan.created_at)
                    except ValueError:
                        reasons.append(f"unreadable creation time {plan.created_at!r}")
                    else:
                        if created < cutoff:
                            days = (now - created).total_seconds() / 86400
                            reasons.append(f"{days:.1f} days old (older than {older_than_days:g})")
                if stale is not None:
                    if row["key_digest"] != plan.key.digest():
                        reasons.append("fingerprint format changed")
                    reasons.extend(stale(plan))
                if not reasons:
                    continue
                removed.append(PrunedPlan(plan, reasons))
                if not dry_run:
                    self.db.execute("DELETE FROM plans WHERE id = ?", [plan.id])
        return removed


# ------------------------------------------------------------------------------------------
# this machine
# ------------------------------------------------------------------------------------------


def key_here(
    key: PlanKey, registry: Registry, hardware: Mapping[str, Any] | None = None,
) -> PlanKey:
    """``key`` with this machine's hardware fingerprint (or ``hardware``) and the software
    fingerprint of ``registry`` for the backends ``key`` names: the key a plan of the same
    model, inputs and objective would have if it were tuned here now."""
    backends = list((key.software.get("backends") or {}).keys())
    return PlanKey(
        model=key.model, inputs=key.inputs,
        hardware=dict(hardware) if hardware is not None else hardware_fingerprint(),
        software=software_fingerprint(registry, backends), objective=key.objective,
    )


def stale_reasons(
    stored: StoredPlan, registry: Registry, hardware: Mapping[str, Any] | None = None,
) -> list[str]:
    """Why the hardware or software fingerprint of ``stored`` does not match this machine
    (``["hardware: threads 2 -> 4", "native: build 1a2b -> build 3c4d"]``); empty when the
    plan could be used here."""
    return stored.key.explain_difference(key_here(stored.key, registry, hardware))


# ------------------------------------------------------------------------------------------
# bundle validation
# ------------------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def _expect(value: Any, types: type | tuple[type, ...], where: str, what: str) -> Any:
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in (
            types if isinstance(types, tuple) else (types,))):
        got = "nothing (missing or null)" if value is None else f"{_kind(value)} {_short(value)}"
        raise BundleError(f"malformed plan bundle: {where}: expected {what}, received {got}")
    return value


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validate_bundle(bundle: Any) -> list[dict[str, Any]]:
    """Check a plan bundle (format, version, and every entry's key parts, plan, numbers, times
    and notes); raises :class:`BundleError` naming the first wrong field (``plans[2].key.
    hardware: expected an object, received an array``). Returns the entries as
    ``{"key": PlanKey, "plan_json", "latency_ms", "peak_bytes", "created_at", "notes"}``."""
    _expect(bundle, dict, "the bundle", f"a JSON object with \"format\": \"{BUNDLE_FORMAT}\"")
    fmt = bundle.get("format")
    if fmt != BUNDLE_FORMAT:
        raise BundleError(
            f"not a plan bundle: \"format\" is {_short(fmt)}, expected {BUNDLE_FORMAT!r} "
            f"(write one with `opdispatch plans export` or PlanStore.export_plans)")
    version = _expect(bundle.get("version"), int, '"version"', "an integer")
    if version != BUNDLE_VERSION:
        newer = " (written by a newer opdispatch)" if version > BUNDLE_VERSION else ""
        raise BundleError(f"plan bundle format version {version} is not supported{newer}; "
                          f"this opdispatch reads version {BUNDLE_VERSION}")
    fp_version = bundle.get("fingerprint_version", FINGERPRINT_VERSION)
    if fp_version != FINGERPRINT_VERSION:
        raise BundleError(
            f"the plan bundle was written with fingerprint version {_short(fp_version)}, this "
            f"opdispatch computes version {FINGERPRINT_VERSION}: its plans could never match here")
    plans = _expect(bundle.get("plans"), list, '"plans"', "an array of plans")
    entries: list[dict[str, Any]] = []
    first_of: dict[str, int] = {}
    for k, item in enumerate(plans):
        at = f"plans[{k}]"
        _expect(item, dict, at, "an object")
        raw_key = _expect(item.get("key"), dict, f"{at}.key", "an object")
        for name, types, what in (("model", str, "a string"), ("inputs", str, "a string"),
                                  ("hardware", dict, "an object"), ("software", dict, "an object"),
                                  ("objective", str, "a string")):
            _expect(raw_key.get(name), types, f"{at}.key.{name}", what)
        extra = sorted(set(raw_key) - {"model", "inputs", "hardware", "software", "objective"})
        if extra:
            raise BundleError(f"malformed plan bundle: {at}.key: unknown field(s) {extra}")
        key = PlanKey(model=raw_key["model"], inputs=raw_key["inputs"],
                      hardware=raw_key["hardware"], software=raw_key["software"],
                      objective=raw_key["objective"])
        digest = item.get("key_digest")
        if digest is not None and digest != key.digest():
            raise BundleError(
                f"malformed plan bundle: {at}.key_digest does not match {at}.key (the key was "
                f"edited after export; drop key_digest to import an edited key)")
        if key.digest() in first_of:
            raise BundleError(f"malformed plan bundle: {at} has the same key as "
                              f"plans[{first_of[key.digest()]}]")
        first_of[key.digest()] = k
        raw_plan = _expect(item.get("plan"), dict, f"{at}.plan", "a plan object")
        try:
            plan = Plan.from_dict(raw_plan)
        except OpDispatchError as exc:
            raise BundleError(f"malformed plan bundle: {at}.plan: {exc}") from None
        latency = item.get("latency_ms")
        if latency is not None:
            _expect(latency, (int, float), f"{at}.latency_ms", "a number or null")
        peak = item.get("peak_bytes")
        if peak is not None:
            _expect(peak, int, f"{at}.peak_bytes", "an integer or null")
        created = item.get("created_at")
        if created is not None:
            _expect(created, str, f"{at}.created_at", "an ISO timestamp")
            try:
                _parse_time(created)
            except ValueError:
                raise BundleError(f"malformed plan bundle: {at}.created_at: expected an ISO "
                                  f"timestamp, received {_short(created)}") from None
        notes = item.get("notes") or {}
        _expect(notes, dict, f"{at}.notes", "an object")
        entries.append({
            "key": key, "plan_json": plan.to_json(),
            "latency_ms": None if latency is None else float(latency),
            "peak_bytes": peak, "created_at": created, "notes": notes,
        })
    return entries
