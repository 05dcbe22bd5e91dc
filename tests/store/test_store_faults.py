"""Plan store faults: damaged files are detected on open and moved aside (never another
program's file), a Session on a damaged store runs the untuned plan and says where the store
went, the command line reports it without a traceback, a read-only store serves production
reads, older schemas migrate with their plans and measurements usable, and every statement
is parameterised (hostile names round-trip and never reach the SQL text)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from sqlite_utils import Database

from dispatch import Session
from dispatch.errors import PlanNotFoundError
from dispatch.plan import Plan, PlanStep
from tests.store.store_worker import tiny_model
from tuner import store as store_mod
from tuner.fingerprint import PlanKey
from tuner.store import (
    APPLICATION_ID,
    MIGRATIONS,
    SCHEMA_VERSION,
    PlanStore,
    StoreCorruptError,
    StoreError,
    StoreRecoveredWarning,
    move_aside,
)
from tuner.store.measurements import VERDICT_PREFIX
from tuner.tune import TuneOptions, tune

REPO = Path(__file__).resolve().parents[2]
MOVED = re.compile(r"plans\.sqlite\.corrupt-\d{8}T\d{6}Z(-\d+)?$")


def _opts() -> TuneOptions:
    return TuneOptions(budget_s=3, top_k=2, validate_runs=3, per_candidate_cap_s=0.02,
                       progress=False)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Path:
    """A closed (checkpointed) store holding a plan tuned here for :func:`tiny_model`."""
    path = tmp_path_factory.mktemp("tuned") / "plans.sqlite"
    with PlanStore(path) as store:
        tune(tiny_model(), store=store, options=_opts())
    assert not Path(f"{path}-wal").exists()
    return path


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.onnx"
    path.write_bytes(tiny_model().SerializeToString())
    return path


def _x() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32)


def _copy(tuned: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "plans.sqlite"
    shutil.copyfile(tuned, path)
    return path


def _siblings(path: Path) -> list[str]:
    """The files in the folder of ``path`` (SQLite's -wal and -shm index left out: a reader
    may leave them, empty, next to a WAL database)."""
    return sorted(p.name for p in path.parent.iterdir() if not p.name.endswith(("-shm", "-wal"))
                  or (p.stat().st_size > 0 and p.name.endswith("-wal")))


# ------------------------------------------------------------------------------------------
# damaged files
# ------------------------------------------------------------------------------------------


def _garbage(at: int | Callable[[bytearray], int], n: int) -> Callable[[bytearray], bytearray]:
    def damage(data: bytearray) -> bytearray:
        start = at(data) if callable(at) else at
        data[start:start + n] = random.Random(start).randbytes(n)
        return data
    return damage


DAMAGE: dict[str, Callable[[bytearray], bytearray]] = {
    "truncated to half": lambda d: d[: len(d) // 2],
    "truncated inside the header": lambda d: d[:10],
    "truncated after the header": lambda d: d[:100],
    "truncated by one byte": lambda d: d[:-1],
    "header overwritten": _garbage(0, 100),
    "second page overwritten": _garbage(4096, 4096),
    "last page overwritten": _garbage(lambda d: len(d) - 4096, 4096),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_store_is_detected_moved_aside_and_replaced(tmp_path, tuned, damage):
    path = _copy(tuned, tmp_path)
    bad = bytes(DAMAGE[damage](bytearray(path.read_bytes())))
    assert bad != tuned.read_bytes()
    path.write_bytes(bad)
    # read-only and recover=False: detected, reported, nothing moved
    for kwargs in ({"readonly": True}, {"recover": False}):
        with pytest.raises(StoreCorruptError, match="is corrupt") as info:
            PlanStore(path, **kwargs)
        assert info.value.path == str(path) and info.value.detail
        assert path.read_bytes() == bad and not any(MOVED.search(n) for n in _siblings(path))
    # writable: moved aside (the new name reported) and replaced by a fresh store
    with pytest.warns(StoreRecoveredWarning, match="moved aside to .*corrupt-") as caught:
        store = PlanStore(path)
    with store:
        moved = Path(store.recovery.moved_to)
        assert MOVED.search(moved.name) and moved.parent == path.parent
        assert str(moved) in str(caught[0].message) and str(moved) in store.recovery.message
        assert moved.read_bytes() == bad  # kept, byte for byte, for inspection
        assert store.all_plans() == [] and store.count_measurements() == 0
        assert store._conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        run = store.start_run("m" * 64)
        store.finish_run(run, "finished")
    with PlanStore(path, readonly=True) as again:
        assert again.recovery is None and [r.status for r in again.runs()] == ["finished"]


def test_a_truncated_store_says_it_was_truncated(tmp_path, tuned):
    path = _copy(tuned, tmp_path)
    assert path.stat().st_size > 8192
    path.write_bytes(tuned.read_bytes()[:8192])
    with pytest.raises(StoreCorruptError, match=r"truncated: 8192 bytes, its header declares "
                                                r"\d+ pages of 4096 bytes"):
        PlanStore(path, readonly=True)
    path.write_bytes(tuned.read_bytes()[:5000])
    with pytest.raises(StoreCorruptError, match=r"truncated: 5000 bytes, not a whole number of "
                                                r"4096-byte pages"):
        PlanStore(path, readonly=True)
    path.write_bytes(path.read_bytes()[:10])
    with pytest.raises(StoreCorruptError, match=r"truncated to 10 bytes, inside the SQLite header"):
        PlanStore(path, readonly=True)


def test_the_old_write_ahead_log_moves_with_the_damaged_store(tmp_path, tuned):
    """The -wal of a damaged store must never be replayed into the fresh one."""
    path = tmp_path / "plans.sqlite"
    writer = PlanStore(path)
    for k in range(20):
        writer.put_measurement(f"sig{k}", "c", "hw", "sw", median_s=1.0)
    writer.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    writer.db.execute("PRAGMA wal_autocheckpoint = 0")
    run = writer.start_run("w" * 64)
    for k in range(20, 40):
        writer.put_measurement(f"sig{k}", "c", "hw", "sw", median_s=1.0)
    snapshot = tmp_path / "snap"
    snapshot.mkdir()
    for suffix in ("", "-wal"):  # the files as a kill would leave them
        shutil.copyfile(f"{path}{suffix}", f"{snapshot / 'plans.sqlite'}{suffix}")
    writer.finish_run(run, "finished")
    writer.close()
    copy = snapshot / "plans.sqlite"
    assert Path(f"{copy}-wal").stat().st_size > 0
    copy.write_bytes(bytes(100) + copy.read_bytes()[100:])  # the header overwritten
    with pytest.warns(StoreRecoveredWarning), PlanStore(copy) as fresh:
        moved = fresh.recovery.moved_to
        assert fresh.count_measurements() == 0 and fresh.runs() == []
    assert Path(f"{moved}-wal").stat().st_size > 0


def test_move_aside_names_are_unique_and_only_the_damaged_file_moves(tmp_path):
    path = tmp_path / "plans.sqlite"
    path.write_bytes(b"one")
    first = move_aside(path)
    path.write_bytes(b"two")
    second = move_aside(path)
    assert first != second and MOVED.search(first.name) and MOVED.search(second.name)
    assert (first.read_bytes(), second.read_bytes()) == (b"one", b"two")
    # another process replaced the damaged file first: the replacement is left alone
    path.write_bytes(b"fresh")
    st = path.stat()
    assert move_aside(path, expect=(st.st_dev, st.st_ino + 1)) is None
    assert path.read_bytes() == b"fresh"
    assert move_aside(tmp_path / "missing.sqlite") is None


def _foreign_db(path: Path, application_id: int = 0) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        conn.executemany("INSERT INTO customers (name) VALUES (?)",
                         [(f"customer {k} " * 20,) for k in range(2000)])
        conn.execute(f"PRAGMA application_id = {application_id}")
        conn.execute("PRAGMA user_version = 1")
    conn.close()


FOREIGN: dict[str, Callable[[Path], None]] = {
    "a text file": lambda p: p.write_text("hello, this is not SQLite at all\n" * 100),
    "a text file holding the plan store's schema": lambda p: p.write_text(
        "CREATE TABLE plans (key_digest TEXT NOT NULL UNIQUE); CREATE TABLE measurements ();"
        * 50),
    "another program's SQLite database (user_version 1)": _foreign_db,
    "another program's truncated SQLite file": lambda p: (
        _foreign_db(p), p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])),
    "another application's damaged SQLite file": lambda p: (
        _foreign_db(p, 0x12345678),
        p.write_bytes(p.read_bytes()[:5000] + bytes(4096) + p.read_bytes()[9096:])),
}


@pytest.mark.parametrize("kind", list(FOREIGN))
def test_files_that_are_not_plan_stores_are_refused_and_left_in_place(tmp_path, kind):
    path = tmp_path / "plans.sqlite"
    FOREIGN[kind](path)
    before = path.read_bytes()
    for kwargs in ({}, {"readonly": True}):
        with pytest.raises(StoreError, match="not (recognisably )?an opdispatch plan store.* "
                                             "left as it is") as info:
            PlanStore(path, **kwargs)
        assert not isinstance(info.value, StoreCorruptError)
    sess = Session(tiny_model(), store=path)
    assert sess.plan_source == "heuristic"
    assert re.search("not (recognisably )?an opdispatch plan store", sess.plan_note)
    assert path.read_bytes() == before and _siblings(path) == ["plans.sqlite"]


def test_the_file_is_never_opened_behind_sqlites_back_while_a_connection_is(tmp_path,
                                                                            monkeypatch):
    """Closing any descriptor of a file drops every POSIX lock the process holds on it,
    SQLite's included: another process could then checkpoint the WAL away under this one's
    readers. The header checks therefore read the file only while no store of this process
    has it open."""
    path = tmp_path / "plans.sqlite"
    PlanStore(path).close()
    opened: list[str] = []
    real_open = open

    def spy(file, *args, **kwargs):
        opened.append(os.fspath(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(store_mod.integrity, "open", spy, raising=False)
    PlanStore(path).close()
    assert opened == [str(path)]  # the header check, with no connection open
    with PlanStore(path) as writer:
        opened.clear()
        writer.put_measurement("sig", "c", "hw", "sw", median_s=1.0)
        with PlanStore(path, readonly=True) as reader:
            assert reader.count_measurements() == 1
        PlanStore(path).close()
        assert store_mod._read_head(path, 100) is None
        assert opened == []
    assert store_mod._read_head(path, 16) == b"SQLite format 3\x00" and opened == [str(path)]
    gc_store = PlanStore(path)  # dropped without close(): released when collected
    del gc_store
    import gc

    gc.collect()
    assert store_mod._read_head(path, 16) is not None


def test_a_plan_store_is_marked_with_its_application_id(tmp_path):
    path = tmp_path / "plans.sqlite"
    PlanStore(path).close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA application_id").fetchone() == (APPLICATION_ID,)
        conn.execute("PRAGMA application_id = 0")  # as written before the mark existed
    conn.close()
    PlanStore(path, readonly=True).close()  # read-only never writes the mark
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA application_id").fetchone() == (0,)
    conn.close()
    PlanStore(path).close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA application_id").fetchone() == (APPLICATION_ID,)
    conn.close()


# ------------------------------------------------------------------------------------------
# a Session and the command line on a damaged store
# ------------------------------------------------------------------------------------------


def test_a_session_on_a_damaged_store_moves_it_aside_and_runs_the_untuned_plan(tmp_path, tuned):
    path = _copy(tuned, tmp_path)
    good = Session(tiny_model(), store=path)
    assert good.plan_source == "store"  # the key matches: the damage is what changes below
    expected = Session(tiny_model(), store=False).run(None, {"x": _x()})
    path.write_bytes(path.read_bytes()[:3000])
    sess = Session(tiny_model(), store=path)  # no warning: filterwarnings=error would raise
    assert sess.plan_source == "heuristic"
    note = sess.plan_note
    assert note.startswith("the plan store is corrupt (truncated: 3000 bytes")
    assert note.endswith("and replaced by a fresh store: running the untuned plan")
    moved = re.search(r"moved aside to (\S+)", note).group(1)
    assert MOVED.search(moved) and Path(moved).stat().st_size == 3000
    assert f"plan: heuristic ({note})" in sess.describe()
    np.testing.assert_allclose(sess.run(None, {"x": _x()})[0], expected[0], rtol=1e-4, atol=1e-5)
    with PlanStore(path, readonly=True) as fresh:
        assert fresh.all_plans() == []
    again = Session(tiny_model(), store=path)
    assert again.plan_source == "heuristic" and "never tuned here" in again.plan_note


def test_a_damaged_store_that_cannot_be_moved_is_reported(tmp_path, tuned, monkeypatch):
    """As in a read-only folder (simulated: the rename fails, which also bites as root)."""
    path = _copy(tuned, tmp_path)
    path.write_bytes(path.read_bytes()[:3000])

    def no_rename(src, dst):
        raise PermissionError(13, "Permission denied", str(src))

    monkeypatch.setattr(store_mod.os, "rename", no_rename)
    sess = Session(tiny_model(), store=path)
    assert sess.plan_source == "heuristic"
    assert "the plan store is corrupt" in sess.plan_note
    assert "it could not be moved aside ([Errno 13] Permission denied" in sess.plan_note
    assert sess.plan_note.count("corrupt") == 1, sess.plan_note
    assert sess.plan_note.endswith("running the untuned plan")
    assert _siblings(path) == ["plans.sqlite"] and path.stat().st_size == 3000
    with pytest.raises(StoreCorruptError, match="could not be moved aside .*move or delete it"):
        PlanStore(path)


def test_require_plan_on_a_damaged_store_says_where_it_went(tmp_path, tuned):
    path = _copy(tuned, tmp_path)
    path.write_bytes(path.read_bytes()[:3000])
    with pytest.raises(PlanNotFoundError, match=r"the plan store is corrupt .* moved aside to "
                                                r"\S+plans\.sqlite\.corrupt-"):
        Session(tiny_model(), store=path, require_plan=True)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True,
                          text=True, timeout=300, cwd=REPO)


def test_the_command_line_reports_a_damaged_store(tmp_path, tuned, model_file):
    path = _copy(tuned, tmp_path)
    path.write_bytes(path.read_bytes()[:3000])
    res = _cli("run", str(model_file), "--store", str(path), "--require-plan")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith("opdispatch run: error: no usable tuned plan")
    assert "the plan store is corrupt" in res.stderr and "moved aside to" in res.stderr
    path.write_bytes(tuned.read_bytes()[:3000])
    res = _cli("run", str(model_file), "--store", str(path))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "plan: heuristic (the plan store is corrupt (truncated" in res.stdout
    assert "running the untuned plan" in res.stdout
    path.write_bytes(tuned.read_bytes()[:3000])
    res = _cli("tune", str(model_file), "--store", str(path), "--budget", "3", "--no-progress")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert re.search(r"the plan store \S+ was corrupt \(truncated.*moved aside to \S+corrupt-",
                     res.stderr), res.stderr
    assert len([n for n in _siblings(path) if MOVED.search(n)]) == 3
    with PlanStore(path, readonly=True) as fresh:
        assert len(fresh.all_plans()) == 1


# ------------------------------------------------------------------------------------------
# read-only stores in production
# ------------------------------------------------------------------------------------------

_READ_SCRIPT = """
import json, sys
from dispatch import Session
from tests.store.store_worker import tiny_model
sess = Session(tiny_model(), store=sys.argv[1])
import numpy as np
out = sess.run(None, {"x": np.ones((1, 4, 8, 8), np.float32)})[0]
print(json.dumps({"source": sess.plan_source, "note": sess.plan_note, "out": out.ravel().tolist()}))
"""
#: Run as root, this drops the capabilities that let root write into read-only files and
#: folders, so that the chmod below binds it as it binds any other user.
_AS_ROOT = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all",
            "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]


def _unprivileged(folder: Path) -> list[str]:
    """The command prefix under which ``folder`` (made read-only) really is read-only; skips
    the test when this cannot be arranged (root without setpriv)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("run as root and no setpriv to drop CAP_DAC_OVERRIDE: chmod cannot make a "
                    "folder read-only for root")
    probe = subprocess.run([*_AS_ROOT, sys.executable, "-c",
                            f"open({str(folder / 'probe')!r}, 'w')"], capture_output=True)
    if probe.returncode == 0:
        os.unlink(folder / "probe")
        pytest.skip("setpriv could not drop root's CAP_DAC_OVERRIDE here")
    return _AS_ROOT


def test_a_session_runs_its_stored_plan_from_a_read_only_store(tmp_path, tuned):
    folder = tmp_path / "ro"
    path = _copy(tuned, folder)
    before = (path.read_bytes(), _siblings(path))
    path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
    try:
        prefix = _unprivileged(folder)
        res = subprocess.run([*prefix, sys.executable, "-c", _READ_SCRIPT, str(path)],
                             capture_output=True, text=True, timeout=300, cwd=REPO)
    finally:
        folder.chmod(stat.S_IRWXU)
        path.chmod(stat.S_IRUSR | stat.S_IWUSR)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.splitlines()[-1])
    assert got["source"] == "store", got["note"]
    assert got["note"].startswith("plan ") and str(path) in got["note"]
    assert (path.read_bytes(), _siblings(path)) == before  # nothing written, nothing created
    ref = Session(tiny_model(), store=False).run(None, {"x": np.ones((1, 4, 8, 8), np.float32)})
    np.testing.assert_allclose(np.array(got["out"]), ref[0].ravel(), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------
# older schemas
# ------------------------------------------------------------------------------------------


def _downgrade(tuned: Path, path: Path, version: int) -> tuple[int, int]:
    """Write at ``path`` a store of schema ``version`` (its frozen migrations) holding the
    plans and measurements of ``tuned`` (the columns that version has); returns their counts."""
    conn = sqlite3.connect(path, isolation_level=None)
    db = Database(conn)
    for step in MIGRATIONS[:version]:
        step(db)
    conn.execute(f"PRAGMA user_version = {version}")
    db.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", [str(version)])
    counts = []
    with sqlite3.connect(tuned) as src:
        for table in ("plans", "measurements"):
            columns = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
            rows = src.execute(f"SELECT {', '.join(columns)} FROM {table}").fetchall()
            conn.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
                             f"({', '.join('?' * len(columns))})", rows)
            # the tuner's NaN/Inf verdicts share the measurements table; they are no timings
            timings = [r for r in rows if table != "measurements"
                       or not r[columns.index("signature")].startswith(VERDICT_PREFIX)]
            counts.append(len(timings))
    src.close()
    conn.close()
    return counts[0], counts[1]


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION))
def test_an_older_store_migrates_and_its_plans_and_measurements_are_used(tmp_path, tuned,
                                                                         version):
    path = tmp_path / "old.sqlite"
    n_plans, n_measurements = _downgrade(tuned, path, version)
    assert n_plans == 1 and n_measurements > 0
    with pytest.raises(StoreError, match=f"schema version {version}, older"):
        PlanStore(path, readonly=True)
    sess = Session(tiny_model(), store=path)  # migrates it, then reads the old plan
    assert sess.plan_source == "store", sess.plan_note
    with PlanStore(path, readonly=True) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert store.meta()["schema_version"] == str(SCHEMA_VERSION)
        assert store.count_measurements() == n_measurements
        (plan,) = store.all_plans()
        if version < 2:  # tuning runs and notes came with version 2
            assert plan.run_id is None and plan.notes == {}
        assert plan.key.family == ""  # families came with version 3: unknown for older plans
    # the old measurements are reused by a new tuning run
    with PlanStore(path) as store:
        result = tune(tiny_model(), store=store, options=_opts())
        assert result.stats["reused"] > 0
        assert store.count_measurements() >= n_measurements


def test_an_older_store_that_cannot_be_migrated_is_explained(tmp_path, tuned, monkeypatch):
    """As in a read-only folder (simulated: the migration fails)."""
    path = tmp_path / "old.sqlite"
    _downgrade(tuned, path, 1)

    def cannot(self):
        raise StoreError("attempt to write a readonly database (simulated)")

    monkeypatch.setattr(PlanStore, "_migrate", cannot)
    sess = Session(tiny_model(), store=path)
    assert sess.plan_source == "heuristic"
    assert "schema version 1, older" in sess.plan_note
    assert "migrating it failed: attempt to write a readonly database" in sess.plan_note


# ------------------------------------------------------------------------------------------
# parameterised SQL
# ------------------------------------------------------------------------------------------

MARK = "DROP TABLE plans; --"
HOSTILE = f"it's \"x\"'); {MARK} OR 1=1; /* ? :name %s */ \\ ` ; SELECT * FROM meta"


class _Recording(sqlite3.Connection):
    """Records the text of every statement (parameters are passed separately)."""

    statements: list[str]

    def execute(self, sql, *args, **kwargs):
        type(self).statements.append(sql)
        return super().execute(sql, *args, **kwargs)

    def executemany(self, sql, *args, **kwargs):
        type(self).statements.append(sql)
        return super().executemany(sql, *args, **kwargs)

    def executescript(self, sql, *args, **kwargs):
        type(self).statements.append(sql)
        return super().executescript(sql, *args, **kwargs)


def test_hostile_names_round_trip_and_never_reach_the_sql_text(tmp_path, monkeypatch):
    real_connect = sqlite3.connect
    _Recording.statements = []
    monkeypatch.setattr(store_mod.sqlite3, "connect",
                        lambda *a, **kw: real_connect(*a, **{**kw, "factory": _Recording}))
    folder = tmp_path / "it's a \"store\" ?mode=rw#x %41; DROP"
    path = folder / "plans.sqlite"
    key = PlanKey(model=HOSTILE, inputs=HOSTILE, hardware={HOSTILE: HOSTILE, "t": [HOSTILE]},
                  software={"backends": {HOSTILE: HOSTILE}}, objective=HOSTILE)
    step = PlanStep(nodes=[HOSTILE], op="Relu", impl="Relu.numpy.basic", backend="numpy",
                    layouts_in=["std"], layouts_out=["std"])
    plan = Plan(graph=HOSTILE, steps=[step], conversions=[], provenance={HOSTILE: HOSTILE})
    with PlanStore(path) as store:
        run = store.start_run(HOSTILE, objective=HOSTILE, stats={HOSTILE: HOSTILE})
        pid = store.put_plan(key, plan, latency_ms=1.0, run_id=run, notes={HOSTILE: HOSTILE})
        store.put_measurement(HOSTILE, HOSTILE, HOSTILE, HOSTILE, median_s=1.0, error=HOSTILE)
        store.finish_run(run, "finished", {HOSTILE: HOSTILE})
        got = store.get_plan(key)
        assert got.id == pid and got.key == key and got.notes == {HOSTILE: HOSTILE}
        assert got.plan().to_dict() == plan.to_dict()
        assert [p.id for p in store.plans_for_model(HOSTILE)] == [pid]
        assert store.why_not(key) == []
        assert store.why_not(PlanKey(model=HOSTILE + "'", inputs=HOSTILE, hardware={},
                                     software={}, objective=HOSTILE))  # same inputs: explained
        m = store.get_measurement(HOSTILE, HOSTILE, HOSTILE, HOSTILE)
        assert (m.signature, m.candidate, m.error) == (HOSTILE, HOSTILE, HOSTILE)
        assert len(store.measurements_for(HOSTILE, HOSTILE, HOSTILE)) == 1
        (r,) = store.runs(HOSTILE)
        assert (r.model_fp, r.objective, r.stats) == (HOSTILE, HOSTILE, {HOSTILE: HOSTILE})
        bundle = store.export_plans()
    with PlanStore(tmp_path / "other.sqlite") as other:
        (new_id,) = other.import_plans(json.loads(json.dumps(bundle)))
        assert other.get_plan(key).id == new_id
        assert [p.plan.key for p in other.prune_plans(older_than_days=0, dry_run=True)] == [key]
    with PlanStore(path, readonly=True) as ro:  # the path itself goes into a file: URI
        assert ro.get_plan(key).id == pid
        assert set(ro.db.table_names()) >= {"meta", "plans", "measurements", "tuning_runs"}
    statements = _Recording.statements
    assert len(statements) > 30
    leaked = [s for s in statements if MARK in s or "it's" in s]
    assert leaked == [], f"values were spliced into SQL text: {leaked[:3]}"


def test_a_transient_read_error_is_retried_never_read_as_immutable(tmp_path, monkeypatch):
    """A read-only connection may fail for a moment while another process checkpoints and
    removes the WAL; reading the file as immutable then would skip pages that are still in
    the WAL. Only a WAL index that cannot be created (a read-only folder) allows that."""
    path = tmp_path / "plans.sqlite"
    with PlanStore(path) as s:
        s.put_measurement("sig", "c", "hw", "sw", median_s=1.0)
    real_connect = sqlite3.connect
    targets: list[str] = []
    failures = [2]

    class Flaky(sqlite3.Connection):
        def execute(self, sql, *args, **kwargs):
            if sql == "PRAGMA user_version" and failures[0]:
                failures[0] -= 1
                raise sqlite3.OperationalError("disk I/O error")
            return super().execute(sql, *args, **kwargs)

    def connect(target, **kwargs):
        targets.append(target)
        return real_connect(target, **{**kwargs, "factory": Flaky})

    monkeypatch.setattr(store_mod.sqlite3, "connect", connect)
    with PlanStore(path, readonly=True) as ro:
        assert ro.count_measurements() == 1
    assert len(targets) == 3 and all(t.endswith("?mode=ro") for t in targets)
    failures[0] = 100
    with pytest.raises(StoreError, match="cannot read the plan store .* read-only: disk I/O error"):
        PlanStore(path, readonly=True)
    assert not any("immutable" in t for t in targets)
