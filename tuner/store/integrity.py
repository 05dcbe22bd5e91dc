"""Damage detection and recovery of the plan store file. It owns the checks run on open (a
whole SQLite header, SQLite's integrity check judged on two runs, a file truncated below its
pages, another program's database), the errors they become (:func:`damage_error`:
:class:`StoreCorruptError` for a damaged plan store, a plain :class:`StoreError` for a file
that is not recognisably one), moving a damaged store aside (:func:`move_aside`,
:func:`move_damaged_aside`), and the registry of the files this process holds open
(:data:`_OPEN_HERE`): a file's own bytes are read (:func:`_read_head`) only while no
connection of this process has it open."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from tuner.store.errors import StoreCorruptError, StoreError
from tuner.store.schema import APPLICATION_ID

#: Files up to this size get the full ``integrity_check`` on open, larger ones ``quick_check``.
FULL_CHECK_MAX_BYTES = 4 << 20
_SQLITE_MAGIC = b"SQLite format 3\x00"
#: SQLite error names and messages that mean a damaged file (not a busy or locked one).
_CORRUPT_NAMES = {"SQLITE_CORRUPT", "SQLITE_NOTADB"}
_CORRUPT_TEXT = ("malformed", "not a database", "corrupt")
#: The files SQLite keeps next to a database; they move with it.
_SIDE_FILES = ("-wal", "-shm", "-journal")


class _Damage(Exception):
    """Damage found through an open connection; turned into :class:`StoreCorruptError` or
    :class:`StoreError` once the connection is closed (see :data:`_OPEN_HERE`)."""

    def __init__(self, detail: str, app_id: int | None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.app_id = app_id


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
# the files this process holds open
# ------------------------------------------------------------------------------------------

#: ``(st_dev, st_ino)`` -> how many connections the plan stores of this process hold on
#: that file. Closing *any* file descriptor of a file drops every POSIX lock the process
#: holds on it, SQLite's included
#: (https://sqlite.org/howtocorrupt.html#_posix_advisory_locks_canceled_by_a_separate_thread_doing_close_),
#: so the file's own bytes are read (:func:`_read_head`) only while no connection of this
#: process has it open.
_OPEN_HERE: dict[tuple[int, int], int] = {}
_OPEN_LOCK = threading.Lock()
#: the inodes of stores dropped without close() whose finalizer could not take
#: :data:`_OPEN_LOCK`: garbage collection may run a finalizer at any allocation, also inside a
#: region of this very thread that holds the lock, where waiting for it would never end. They
#: are forgotten by the next region that takes the lock (:func:`_locked`).
_PENDING: list[dict[int, tuple[int, int] | None]] = []


def _drop(inodes: dict[int, tuple[int, int] | None]) -> None:
    for inode in inodes.values():
        if inode is not None and inode in _OPEN_HERE:
            _OPEN_HERE[inode] -= 1
            if _OPEN_HERE[inode] <= 0:
                del _OPEN_HERE[inode]
    inodes.clear()


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """:data:`_OPEN_LOCK` held, after forgetting the inodes finalizers left in
    :data:`_PENDING`."""
    with _OPEN_LOCK:
        while _PENDING:
            _drop(_PENDING.pop())
        yield


def _forget_inodes(inodes: dict[int, tuple[int, int] | None]) -> None:
    """Drop the entries of ``inodes`` (connection id -> inode) from :data:`_OPEN_HERE`."""
    with _locked():
        _drop(inodes)


def _forget_inodes_later(inodes: dict[int, tuple[int, int] | None]) -> None:
    """:func:`_forget_inodes` for a finalizer: never waits for the lock (see
    :data:`_PENDING`)."""
    if not _OPEN_LOCK.acquire(blocking=False):
        _PENDING.append(dict(inodes))
        inodes.clear()
        return
    try:
        while _PENDING:
            _drop(_PENDING.pop())
        _drop(inodes)
    finally:
        _OPEN_LOCK.release()


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _read_head(path: Path, size: int) -> bytes | None:
    """The first ``size`` bytes of ``path``; ``None`` when it cannot be read, or may not be
    because a plan store of this process has it open (see :data:`_OPEN_HERE`)."""
    with _locked():
        inode = _inode(path)
        if inode is None or _OPEN_HERE.get(inode):
            return None
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                return None  # a FIFO would block open() until another process writes to it
            with open(path, "rb") as f:
                return f.read(size)
        except OSError:
            return None


# ------------------------------------------------------------------------------------------
# recognising damage
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


# ------------------------------------------------------------------------------------------
# the checks on open
# ------------------------------------------------------------------------------------------


def check_header(path: Path) -> bytes | None:
    """Refuse a file without a whole SQLite header before SQLite opens it: closing a
    connection to such a file deletes the ``-wal`` next to it, and with it whatever the
    damaged store had committed since its last checkpoint (kept when it is moved aside).
    Returns the header (``None`` or empty when there is none to read)."""
    head = _read_head(path, 100)
    if not head:
        return head  # missing, open here (so it was readable), or empty: a fresh store
    if len(head) < 100 or not head.startswith(_SQLITE_MAGIC):
        raise damage_error(path, None, _truncation(path) or "file is not a database "
                           "(no SQLite header)")
    return head


def check_integrity(conn: sqlite3.Connection, path: Path) -> None:
    """Raise :class:`_Damage` when SQLite's integrity check through ``conn`` finds damage in
    the store at ``path``: ``integrity_check`` up to :data:`FULL_CHECK_MAX_BYTES`,
    ``quick_check`` above (both read every page; the quick one skips matching indexes against
    their tables)."""
    # a file shorter than its pages: SQLite reads the missing bytes as zeros, and may find
    # nothing wrong. Judged only while the WAL is empty: frames in it may hold pages a
    # checkpoint has not yet written into the file. (Sizes by stat: the file itself is
    # never opened while a connection is.)
    page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
    try:
        size = path.stat().st_size
        wal = os.path.getsize(f"{path}-wal") if os.path.exists(f"{path}-wal") else 0
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


# ------------------------------------------------------------------------------------------
# what damage becomes
# ------------------------------------------------------------------------------------------


def unreadable_message(path: Path, exc: BaseException) -> str:
    """The message for a store SQLite cannot use for a reason other than damage."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and (code & 0xFF) in (10, 13):  # SQLITE_IOERR, SQLITE_FULL
        return (f"cannot use the plan store {str(path)!r}: {exc} (a full disk, a "
                f"file-size limit or a failing device?)")
    if code is not None and (code & 0xFF) in (8, 14):  # SQLITE_READONLY, SQLITE_CANTOPEN
        return (f"cannot use the plan store {str(path)!r}: {exc} (check the permissions of "
                f"the file, its -wal and -shm, and its folder)")
    return (f"{str(path)!r} is not a readable SQLite plan store "
            f"({type(exc).__name__}: {exc})")


def damage_error(path: Path, exc: BaseException | None, detail: str | None = None, *,
                 app_id: int | None = None) -> StoreError:
    """The error for the file at ``path`` that SQLite cannot read (``exc``) or whose
    integrity check failed (``detail``): :class:`StoreCorruptError` for a damaged plan store,
    a plain :class:`StoreError` for a file that is not (recognisably) one, or for an error
    that is not damage (a lock, a permission). ``app_id``: the file's application id, when
    SQLite could still read it. Called with no connection of this process open on it."""
    if exc is not None:
        if not _is_damage(exc):
            return StoreError(unreadable_message(path, exc))
        detail = f"{type(exc).__name__}: {exc}"
    detail = _describe_damage(path, detail or "damaged")
    ours = app_id == APPLICATION_ID if app_id else _looks_like_a_plan_store(path)
    if not ours:
        return StoreError(
            f"{str(path)!r} is not a readable SQLite plan store ({detail}); it is not "
            f"recognisably an opdispatch plan store, so it is left as it is: point "
            f"OPDISPATCH_STORE / --store at another file, or move it away yourself"
        )
    err = StoreCorruptError(
        f"the plan store {str(path)!r} is corrupt ({detail}); opened writable "
        f"(PlanStore(path), opdispatch tune) it is moved aside and replaced by a fresh store",
        path=str(path), detail=detail,
    )
    with contextlib.suppress(OSError):
        st = path.stat()
        err.inode = (st.st_dev, st.st_ino)
    return err


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


def move_damaged_aside(path: Path, exc: StoreCorruptError) -> Recovery:
    """Move the damaged store ``path`` aside (unless another process already has) for a
    fresh one; raises :class:`StoreCorruptError` saying why when it cannot be moved."""
    try:
        moved = move_aside(path, expect=exc.inode)
    except OSError as err:
        raise StoreCorruptError(
            f"the plan store {str(path)!r} is corrupt ({exc.detail}) and could not be "
            f"moved aside ({err}): move or delete it yourself",
            path=exc.path, detail=exc.detail, inode=exc.inode, move_error=str(err),
        ) from None
    return Recovery(path=str(path), moved_to=None if moved is None else str(moved),
                    detail=exc.detail)
