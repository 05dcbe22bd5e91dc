"""Other programs' SQLite files at the store path are refused and never modified.

A file is taken for a plan store only when it carries opdispatch's ``application_id``, is
empty (no pages; or no tables, ``application_id`` 0 and ``user_version`` 0), or is a plan
store written before the mark existed (exactly the tables of its schema version). Every other
SQLite file is refused before anything is written to it, a pragma set or its journal mode
switched: each case compares every byte of the file, and the absence of ``-wal``, ``-shm``
and ``-journal`` beside it, before and after a writable open, a read-only open, a Session and
the command line (``opdispatch tune``, ``plans import``, ``plans list``).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from dispatch.session import Session
from tests.store.store_worker import tiny_model
from tuner.store import APPLICATION_ID, PlanStore, StoreCorruptError, StoreError
from tuner.store.schema import MIGRATIONS

REPO = Path(__file__).resolve().parents[2]
GPKG = 0x47504B47  # b"GPKG"


def _sqlite(path: Path, *statements: str, wal: bool = False) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    if wal:
        conn.execute("PRAGMA journal_mode = WAL")
    for sql in statements:
        conn.execute(sql)
    conn.close()


def _customers(path: Path) -> None:
    _sqlite(path, "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)",
            "INSERT INTO customers (name) VALUES ('x')", "PRAGMA user_version = 1")


#: kind -> a function writing another program's SQLite file at a path
FOREIGN: dict[str, Callable[[Path], None]] = {
    # the GeoPackage: application_id "GPKG", no tables yet
    "a GeoPackage with no tables yet": lambda p: _sqlite(
        p, f"PRAGMA application_id = {GPKG}", "PRAGMA user_version = 10300"),
    "a GeoPackage with no tables and user_version 0": lambda p: _sqlite(
        p, f"PRAGMA application_id = {GPKG}"),
    "a GeoPackage with a table": lambda p: _sqlite(
        p, f"PRAGMA application_id = {GPKG}", "CREATE TABLE gpkg_contents (table_name TEXT)"),
    "a Fossil repository": lambda p: _sqlite(
        p, "PRAGMA application_id = 252006674", "CREATE TABLE blob (rid INTEGER)"),
    "an unknown application_id": lambda p: _sqlite(
        p, "PRAGMA application_id = 305419896"),
    "only a table named meta": lambda p: _sqlite(p, "CREATE TABLE meta (x)"),
    "only a table named plans": lambda p: _sqlite(p, "CREATE TABLE plans (x)"),
    "the plan store's table names with other columns": lambda p: _sqlite(
        p, "CREATE TABLE meta (a)", "CREATE TABLE plans (b)", "CREATE TABLE measurements (c)",
        "PRAGMA user_version = 1"),
    "no tables and user_version 7": lambda p: _sqlite(p, "PRAGMA user_version = 7"),
    "no tables and user_version 2": lambda p: _sqlite(p, "PRAGMA user_version = 2"),
    "no tables and a negative user_version": lambda p: _sqlite(p, "PRAGMA user_version = -1"),
    "another program's table (user_version 1)": _customers,
    "another program's WAL-mode database": lambda p: _sqlite(
        p, "CREATE TABLE customers (id INTEGER)", "INSERT INTO customers VALUES (1)", wal=True),
    "a WAL-mode database with only a meta table": lambda p: _sqlite(
        p, "CREATE TABLE meta (x)", wal=True),
    "a GeoPackage in WAL mode": lambda p: _sqlite(
        p, f"PRAGMA application_id = {GPKG}", "CREATE TABLE t (x)", wal=True),
    "a table whose name starts with sqlite": lambda p: _sqlite(p, "CREATE TABLE sqlitefoo (x)"),
    "only a view": lambda p: _sqlite(p, "CREATE VIEW v AS SELECT 1"),
    "only sqlite_stat1 (ANALYZE, then the table dropped)": lambda p: _sqlite(
        p, "CREATE TABLE t (x)", "CREATE INDEX i ON t (x)", "INSERT INTO t VALUES (1)",
        "ANALYZE", "DROP TABLE t"),
}


def _state(path: Path) -> tuple[bytes, list[str]]:
    """Every byte of the file and the names beside it (a -wal, -shm or -journal appears)."""
    return path.read_bytes(), sorted(p.name for p in path.parent.iterdir())


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.onnx"
    onnx.save(tiny_model(), path)
    return path


@pytest.mark.parametrize("kind", list(FOREIGN))
def test_a_foreign_sqlite_file_is_refused_and_left_byte_for_byte(tmp_path, kind):
    path = tmp_path / "plans.sqlite"
    FOREIGN[kind](path)
    before = _state(path)
    assert before[1] == ["plans.sqlite"]
    for kwargs in ({}, {"readonly": True}, {"recover": False}):
        with pytest.raises(StoreError, match="not an opdispatch plan store.*left as it is") as info:
            PlanStore(path, **kwargs)
        assert not isinstance(info.value, StoreCorruptError)
        assert "full disk" not in str(info.value) and "internal error" not in str(info.value)
        assert _state(path) == before, kwargs
    sess = Session(tiny_model(), store=path)
    assert sess.plan_source == "heuristic" and "not an opdispatch plan store" in sess.plan_note
    assert _state(path) == before


def test_the_message_says_whose_file_it_looks_like(tmp_path):
    path = tmp_path / "g.gpkg"
    FOREIGN["a GeoPackage with no tables yet"](path)
    with pytest.raises(StoreError, match=r"is an OGC GeoPackage \(application_id 0x47504B47 "
                                         r"'GPKG'\), not an opdispatch plan store"):
        PlanStore(path)
    path = tmp_path / "meta.sqlite"
    FOREIGN["only a table named meta"](path)
    with pytest.raises(StoreError, match=r"holds the tables \['meta'\] and no opdispatch mark"):
        PlanStore(path)
    path = tmp_path / "uv.sqlite"
    FOREIGN["no tables and user_version 7"](path)
    with pytest.raises(StoreError, match="user_version 7, which another program set"):
        PlanStore(path)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPDISPATCH_STORE": str(cwd / "unused.sqlite")}
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("kind", ["a GeoPackage with no tables yet", "only a table named meta",
                                  "only a table named plans", "no tables and user_version 7",
                                  "another program's WAL-mode database"])
def test_the_command_line_refuses_a_foreign_file_without_touching_it(tmp_path, kind,
                                                                     model_file):
    path = tmp_path / "g.gpkg"
    FOREIGN[kind](path)
    bundle = tmp_path / "bundle.json"
    with PlanStore(tmp_path / "source.sqlite") as source:
        bundle.write_text(json.dumps(source.export_plans()))
    before = _state(path)
    for args in (["tune", str(model_file), "--store", str(path), "--budget", "2", "--no-progress"],
                 ["plans", "import", str(bundle), "--store", str(path)],
                 ["plans", "list", "--store", str(path)]):
        res = _cli(*args, cwd=tmp_path)
        assert res.returncode == 2, (args, res.stderr)
        assert "not an opdispatch plan store" in res.stderr, res.stderr
        assert "internal error" not in res.stderr and "Traceback" not in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert _state(path) == before, args


# ------------------------------------------------------------------------------------------
# what is still taken for a plan store
# ------------------------------------------------------------------------------------------

OURS: dict[str, Callable[[Path], None]] = {
    "a missing file": lambda p: None,
    "an empty file (no pages)": lambda p: p.write_bytes(b""),
    "an empty database (no tables, application_id 0, user_version 0)": lambda p: _sqlite(
        p, "PRAGMA page_size = 4096", "VACUUM"),
    "an empty database in WAL mode": lambda p: _sqlite(p, wal=True),
}


@pytest.mark.parametrize("kind", list(OURS))
def test_a_missing_or_empty_file_becomes_a_plan_store(tmp_path, kind):
    path = tmp_path / "plans.sqlite"
    OURS[kind](path)
    with PlanStore(path) as store:
        assert store.schema_version == len(MIGRATIONS)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA application_id").fetchone() == (APPLICATION_ID,)
    conn.close()


@pytest.mark.parametrize("version", range(1, len(MIGRATIONS) + 1))
def test_a_plan_store_written_before_the_mark_is_still_ours(tmp_path, version):
    """Exactly the tables of its schema version, application_id 0: migrated and marked."""
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    from sqlite_utils import Database

    for step in MIGRATIONS[:version]:
        step(Database(conn))
    conn.execute(f"PRAGMA user_version = {version}")
    conn.close()
    with PlanStore(path) as store:
        assert store.schema_version == len(MIGRATIONS)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA application_id").fetchone() == (APPLICATION_ID,)
    conn.close()


def test_an_unmarked_store_with_one_foreign_table_more_is_refused(tmp_path):
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    from sqlite_utils import Database

    for step in MIGRATIONS:
        step(Database(conn))
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")
    conn.execute("CREATE TABLE customers (id INTEGER)")
    conn.close()
    before = _state(path)
    with pytest.raises(StoreError, match="not those of a plan store of schema version"):
        PlanStore(path)
    assert _state(path) == before
