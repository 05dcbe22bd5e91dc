"""Whose file is at the store path, decided before anything is written to it.

Only a regular file (or a missing path, created as a fresh store) is ever opened: a folder, a
FIFO, a socket or a device is refused at once (:func:`check_path_kind`), since opening a FIFO
blocks until another process writes to it. A SQLite file is taken for a plan store only when
it carries :data:`~tuner.store.schema.APPLICATION_ID`, when it is empty (no pages; or no
tables, ``application_id`` 0 and ``user_version`` 0), or when it is a plan store written
before the mark existed: ``application_id`` 0 and exactly the tables and columns the frozen
migrations give the schema version in its ``user_version``. Anything else is another
program's file, refused with a message saying whose it looks like (:func:`check_owner`)
before any connection that could write, change a pragma or switch the journal mode is
opened: the decision is made from the 100-byte header and, for unmarked files, from a
lock-free read-only look at the schema (``immutable=1``: no lock, no ``-wal``/``-shm``
created, no hot journal rolled back). :func:`refusal` is the same rule, also applied through
the store's own connection before its first write (:mod:`tuner.store.connection`)."""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import stat
from pathlib import Path

from tuner.store.errors import StoreError
from tuner.store.integrity import _OPEN_HERE, _inode, _locked
from tuner.store.schema import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION

#: ``application_id`` values of other programs' SQLite files (SQLite's magic.txt)
KNOWN_APPLICATIONS: dict[int, str] = {
    0x47504B47: "an OGC GeoPackage",
    0x47503130: "an OGC GeoPackage (version 1.0)",
    0x47503131: "an OGC GeoPackage (version 1.1)",
    0x4D504258: "an MBTiles tileset",
    0x0F055111: "a Fossil checkout",
    0x0F055112: "a Fossil repository",
    0x0F055113: "a Fossil global configuration",
    0x42654462: "a Bentley BeSQLite database",
    0x45737269: "an Esri spatially-enabled database",
}
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))
#: the files SQLite keeps next to a database
_SIDE_FILES = ("-wal", "-shm", "-journal")
_ADVICE = ("it is left as it is: point OPDISPATCH_STORE / --store at another file, or move "
           "it away yourself")


def _kind(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def check_path_kind(path: Path) -> bool:
    """Refuse at once a store path that is not a regular file (a folder, a FIFO, a socket, a
    device; followed through symbolic links), or a ``-wal``/``-shm``/``-journal`` beside it
    that is not one, without opening anything; returns whether the file exists. A path that
    cannot be reached (a folder without search permission, a file in place of a folder) is
    refused with what stands in the way."""
    exists = False
    for suffix in ("", *_SIDE_FILES):
        where = Path(f"{path}{suffix}")
        try:
            st = os.stat(where)
        except FileNotFoundError:
            continue
        except NotADirectoryError:
            raise StoreError(f"the plan store {str(path)!r} cannot be created: a part of its "
                             f"folder path is a file, not a folder") from None
        except PermissionError as exc:
            raise StoreError(f"cannot reach the plan store {str(path)!r}: {exc.strerror} on "
                             f"a folder of its path") from None
        except OSError as exc:  # ELOOP, ENAMETOOLONG, ...
            raise StoreError(f"cannot reach the plan store {str(path)!r}: "
                             f"{exc.strerror or exc}") from None
        if not stat.S_ISREG(st.st_mode):
            what = ("the plan store" if not suffix
                    else f"{str(where)!r}, the SQLite side file of the plan store")
            raise StoreError(f"{what} {str(path)!r} is {_kind(st.st_mode)}, not a regular "
                             f"file; point OPDISPATCH_STORE / --store at a file")
        exists = exists or not suffix
    return exists


def _describe_id(app_id: int) -> str:
    raw = app_id.to_bytes(4, "big")
    text = raw.decode("ascii") if all(0x20 < b < 0x7F for b in raw) else ""
    shown = f"application_id 0x{app_id:08X}" + (f" {text!r}" if text else "")
    known = KNOWN_APPLICATIONS.get(app_id)
    return f"{known} ({shown})" if known else f"another program's SQLite file ({shown})"


@functools.cache
def schema_tables(version: int) -> dict[str, tuple[str, ...]]:
    """The tables, with their columns in order, that the frozen migrations give a plan store
    of schema ``version`` (built once in memory)."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        from sqlite_utils import Database  # imported here: it imports pandas (start-up)

        db = Database(conn)
        for step in MIGRATIONS[:version]:
            step(db)
        return _tables(conn)
    finally:
        conn.close()


def _tables(conn: sqlite3.Connection) -> dict[str, tuple[str, ...]]:
    """Table name -> its column names, through ``conn`` (names bound as parameters); a view
    or a trigger counts as a table without columns (a plan store has none), and SQLite's own
    tables (``sqlite_stat1`` after an ANALYZE) count too: a database holding them is not
    empty."""
    rows = conn.execute(
        "SELECT type, name FROM sqlite_master WHERE type IN ('table', 'view', 'trigger')"
    ).fetchall()
    return {(n if t == "table" else f"{t} {n}"): tuple(
        r[0] for r in conn.execute("SELECT name FROM pragma_table_info(?)", [n])
    ) if t == "table" else () for t, n in rows}


def refusal(path: Path, app_id: int, user_version: int,
            tables: dict[str, tuple[str, ...]] | None) -> str | None:
    """Why the SQLite file at ``path`` is not a plan store (``None`` when it is one, or may be
    as far as the arguments tell): ``tables`` is ``None`` when the schema was not read."""
    if app_id == APPLICATION_ID:
        return None
    where = repr(str(path))
    if app_id:
        return f"{where} is {_describe_id(app_id)}, not an opdispatch plan store; {_ADVICE}"
    if not 0 <= user_version <= SCHEMA_VERSION:
        return (f"{where} is a SQLite database but not an opdispatch plan store (no opdispatch "
                f"mark, and user_version {user_version}, which another program set); {_ADVICE}")
    if tables is None:
        return None
    if user_version == 0:
        if not tables:
            return None  # an empty database: a fresh store
        return (f"{where} is a SQLite database but not an opdispatch plan store (it holds the "
                f"tables {sorted(tables)} and no opdispatch mark); {_ADVICE}")
    analyzed = {k: v for k, v in tables.items() if not k.startswith("sqlite_stat")}
    if analyzed == schema_tables(user_version):
        return None  # a plan store written before the mark existed (perhaps ANALYZEd)
    if not tables:
        return (f"{where} is a SQLite database but not an opdispatch plan store (no tables, "
                f"no opdispatch mark, and user_version {user_version}, which another program "
                f"set); {_ADVICE}")
    return (f"{where} is a SQLite database but not an opdispatch plan store (it holds the "
            f"tables {sorted(tables)}, not those of a plan store of schema version "
            f"{user_version}, and no opdispatch mark); {_ADVICE}")


def _probe(path: Path) -> tuple[int, int, dict[str, tuple[str, ...]]] | None:
    """``(application_id, user_version, tables)`` read without a lock or a side file
    (``immutable=1``); ``None`` when SQLite cannot read the file that way (damage is then
    judged by the store's own checks) or this process has it open."""
    with _locked():
        inode = _inode(path)
        if inode is None or _OPEN_HERE.get(inode):
            return None
        try:
            conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True,
                                   isolation_level=None)
        except sqlite3.Error:
            return None
        try:
            return (int(conn.execute("PRAGMA application_id").fetchone()[0]),
                    int(conn.execute("PRAGMA user_version").fetchone()[0]), _tables(conn))
        except sqlite3.Error:
            return None
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.close()


def check_owner(path: Path, head: bytes | None) -> None:
    """Refuse another program's SQLite file at ``path`` (see the module docstring), given its
    first 100 bytes ``head`` (:func:`~tuner.store.integrity.check_header`), before any
    connection that could write to it is opened. A missing, empty or non-SQLite file, or one
    this process already has open (``head`` is ``None``), passes here (the store's own checks
    judge it)."""
    if not head or len(head) < 100 or not head.startswith(b"SQLite format 3\x00"):
        return
    app_id = int.from_bytes(head[68:72], "big")
    user_version = int.from_bytes(head[60:64], "big", signed=True)
    why = refusal(path, app_id, user_version, None)
    if why is None and app_id != APPLICATION_ID:
        probed = _probe(path)
        if probed is not None:
            why = refusal(path, *probed)
    if why is not None:
        raise StoreError(why)


def check_connection(conn: sqlite3.Connection, path: Path) -> None:
    """:func:`refusal` through the store's own connection, before its first write (it sees
    what a lock-free look at the file may not: pages still in the write-ahead log)."""
    app_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
    if app_id == APPLICATION_ID:
        return
    user_version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    why = refusal(path, app_id, user_version, _tables(conn))
    if why is not None:
        raise StoreError(why)
