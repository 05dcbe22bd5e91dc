"""The SQLite plan store: round trips, exact keys and why_not, schema versions and
migrations, read-only use, WAL, measurements, tuning runs, and several processes at once."""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from dispatch.errors import PlanError
from dispatch.plan import Plan, PlanStep
from tuner import store as store_mod
from tuner.fingerprint import PlanKey, hardware_digest, software_digest
from tuner.store import SCHEMA_VERSION, PlanStore, StoreError

HW = {"arch": "x86_64", "cpu_model": "AMD EPYC 7B13", "isa": ["avx2", "fma"],
      "physical_cores": 2, "logical_cores": 2, "threads": 2, "gpus": []}
SW = {"backends": {"native": "native build 1a2b", "numpy": "numpy 2.0.0"},
      "opdispatch": "0.1.0", "plan_format": 1}


def _key(**changes) -> PlanKey:
    base = {"model": "m" * 64, "inputs": "x:float32[1,8]", "hardware": HW, "software": SW,
            "objective": "latency"}
    return PlanKey(**{**base, **changes})


def _plan(impl: str = "Relu.numpy.basic") -> Plan:
    step = PlanStep(nodes=["relu"], op="Relu", impl=impl, backend=impl.split(".")[1],
                    layouts_in=["std"], layouts_out=["std"])
    return Plan(graph="g", steps=[step], conversions=[], provenance={"source": "test"})


@pytest.fixture
def store(tmp_path):
    with PlanStore(tmp_path / "plans.sqlite") as s:
        yield s


# ------------------------------------------------------------------------------------------
# plans
# ------------------------------------------------------------------------------------------


def test_plan_round_trip(store):
    run = store.start_run("m" * 64, budget_s=10, objective="latency")
    pid = store.put_plan(_key(), _plan().to_json(), latency_ms=1.5, peak_bytes=4096, run_id=run,
                         notes={"winner": "optimum"})
    got = store.get_plan(_key())
    assert got is not None and got.id == pid
    assert got.key == _key()
    assert got.plan().to_dict() == _plan().to_dict()
    assert (got.latency_ms, got.peak_bytes, got.run_id) == (1.5, 4096, run)
    assert got.notes == {"winner": "optimum"} and got.created_at
    assert store.plan_by_id(pid) == got
    assert store.put_plan(_key(objective="memory"), _plan()) != pid  # a Plan is accepted too


def test_put_plan_upserts_on_the_key(store):
    first = store.put_plan(_key(), _plan(), latency_ms=2.0, notes={"n": 1})
    second = store.put_plan(_key(), _plan("Relu.native.avx2"), latency_ms=1.0)
    assert first == second
    got = store.get_plan(_key())
    assert got.latency_ms == 1.0 and got.notes == {} and got.plan().steps[0].impl == "Relu.native.avx2"
    assert len(store.all_plans()) == 1


def test_lookup_needs_the_exact_key(store):
    store.put_plan(_key(), _plan())
    assert store.get_plan(_key()) is not None
    for other in (_key(objective="memory"), _key(hardware={**HW, "threads": 4}),
                  _key(software={**SW, "opdispatch": "0.2.0"}), _key(inputs="x:float32[2,8]"),
                  _key(model="n" * 64)):
        assert store.get_plan(other) is None


def test_why_not_names_what_changed(store):
    pid = store.put_plan(_key(), _plan())
    assert store.why_not(_key()) == []
    newer = {**SW, "backends": {**SW["backends"], "native": "native build 3c4d"}}
    (line,) = store.why_not(_key(software=newer))
    assert line.startswith(f"plan {pid} (latency, stored ")
    assert line.endswith("native: build 1a2b -> build 3c4d")
    (line,) = store.why_not(_key(objective="memory"))
    assert "objective: latency -> memory" in line
    (line,) = store.why_not(_key(hardware={**HW, "cpu_model": "Intel Xeon 8488C", "threads": 8}))
    assert "hardware: CPU model AMD EPYC 7B13 -> Intel Xeon 8488C" in line
    assert "hardware: threads 2 -> 8" in line


def test_why_not_for_models_never_tuned(store):
    assert store.why_not(_key()) == []
    store.put_plan(_key(), _plan())
    (line,) = store.why_not(_key(model="n" * 64))  # same inputs: perhaps the model changed
    assert "model structure changed" in line
    assert store.why_not(_key(model="n" * 64, inputs="y:float32[3]")) == []


def test_one_line_per_stored_plan_of_the_model(store):
    store.put_plan(_key(), _plan())
    store.put_plan(_key(objective="memory"), _plan())
    lines = store.why_not(_key(objective="latency@cap=1000"))
    assert len(lines) == 2 and all("objective:" in line for line in lines)
    assert len(store.plans_for_model("m" * 64)) == 2
    assert store.plans_for_model("z" * 64) == []


def test_delete_and_missing_ids(store):
    pid = store.put_plan(_key(), _plan())
    assert store.delete_plan(pid) and not store.delete_plan(pid)
    with pytest.raises(StoreError, match=f"no plan with id {pid}.*stored ids: \\(none\\)"):
        store.plan_by_id(pid)


def test_bad_plans_and_keys_are_refused(store):
    with pytest.raises(PlanError, match="must be JSON"):
        store.put_plan(_key(), "{not json")
    with pytest.raises(PlanError, match="format version"):
        store.put_plan(_key(), json.dumps({**_plan().to_dict(), "version": 99}))
    with pytest.raises(StoreError, match="expects a PlanKey, received dict"):
        store.put_plan({"model": "m"}, _plan())  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="run_id 12345 is not a tuning run"):
        store.put_plan(_key(), _plan(), run_id=12345)
    assert store.all_plans() == []


# ------------------------------------------------------------------------------------------
# measurements and runs
# ------------------------------------------------------------------------------------------


def test_measurements_are_unique_and_reused(store):
    hw, sw = hardware_digest(HW), software_digest(SW)
    sig = "Conv|k3|1x64x56x56|float32|std"
    store.put_measurement(sig, "Conv.native.direct", hw, sw, median_s=2e-3, spread_s=1e-4, samples=20)
    store.put_measurement(sig, "Conv.native.direct", hw, sw, median_s=1e-3, spread_s=5e-5, samples=30)
    store.put_measurement(sig, "Conv.numpy.im2col", hw, sw, median_s=5e-3, samples=10)
    store.put_measurement(sig, "Conv.native.wrong", hw, sw, error="max abs error 0.3 > 1e-4")
    assert store.count_measurements() == 3
    got = store.get_measurement(sig, "Conv.native.direct", hw, sw)
    assert (got.median_s, got.spread_s, got.samples, got.error, got.ok) == (1e-3, 5e-5, 30, None, True)
    # a measurement is reused by any model with the same signature on the same machine/software
    assert [m.candidate for m in store.measurements_for(sig, hw, sw)] == [
        "Conv.native.direct", "Conv.numpy.im2col", "Conv.native.wrong"]
    assert not store.get_measurement(sig, "Conv.native.wrong", hw, sw).ok
    other_sw = software_digest({**SW, "opdispatch": "0.2.0"})
    assert store.get_measurement(sig, "Conv.native.direct", hw, other_sw) is None
    assert store.measurements_for(sig, hardware_digest({**HW, "threads": 4}), sw) == []
    with pytest.raises(StoreError, match="expected median_s or error"):
        store.put_measurement(sig, "Conv.x", hw, sw)


def test_tuning_runs(store):
    a = store.start_run("a" * 64, budget_s=120, objective="latency")
    b = store.start_run("b" * 64, objective="memory")
    assert [r.status for r in store.runs()] == ["running", "running"]
    store.finish_run(a, "finished", {"measured": 12})
    store.finish_run(b, "interrupted")
    ra, rb = store.runs("a" * 64)[0], store.runs("b" * 64)[0]
    assert (ra.status, ra.stats, ra.budget_s, ra.objective) == (
        "finished", {"measured": 12}, 120.0, "latency")
    assert ra.finished_at and rb.status == "interrupted" and rb.budget_s is None
    assert [r.id for r in store.runs()] == [b, a]
    with pytest.raises(StoreError,
                       match="status must be one of finished, interrupted, failed, received 'done'"):
        store.finish_run(a, "done")
    with pytest.raises(StoreError, match="no tuning run with id 999"):
        store.finish_run(999, "failed")


# ------------------------------------------------------------------------------------------
# opening, pragmas, schema
# ------------------------------------------------------------------------------------------


def test_wal_and_pragmas(store):
    assert store.journal_mode == "wal"
    with sqlite3.connect(store.path) as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn = store._conn
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30000
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert store.meta()["schema_version"] == str(SCHEMA_VERSION)
    assert {"meta", "plans", "measurements", "tuning_runs"} <= set(store.db.table_names())


def test_default_path_comes_from_the_configuration(tmp_path, monkeypatch):
    path = tmp_path / "deep" / "er" / "store.sqlite"
    monkeypatch.setenv("OPDISPATCH_STORE", str(path))
    with PlanStore() as s:
        assert s.path == path and path.is_file()


V1_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE plans (id INTEGER PRIMARY KEY, key_digest TEXT NOT NULL UNIQUE,
    model_fp TEXT NOT NULL, inputs_sig TEXT NOT NULL, hardware_digest TEXT NOT NULL,
    hardware_json TEXT NOT NULL, software_digest TEXT NOT NULL, software_json TEXT NOT NULL,
    objective TEXT NOT NULL, plan_json TEXT NOT NULL, latency_ms REAL, peak_bytes INTEGER,
    created_at TEXT NOT NULL);
CREATE INDEX plans_model_fp ON plans (model_fp);
CREATE TABLE measurements (id INTEGER PRIMARY KEY, signature TEXT NOT NULL,
    candidate TEXT NOT NULL, hardware_digest TEXT NOT NULL, software_digest TEXT NOT NULL,
    median_s REAL, spread_s REAL, samples INTEGER NOT NULL DEFAULT 0, created_at TEXT NOT NULL,
    UNIQUE (signature, candidate, hardware_digest, software_digest));
INSERT INTO meta VALUES ('schema_version', '1');
PRAGMA user_version = 1;
"""


def _v1_store(path: Path) -> None:
    key = _key()
    with sqlite3.connect(path) as conn:
        conn.executescript(V1_SCHEMA)
        conn.execute(
            "INSERT INTO plans (key_digest, model_fp, inputs_sig, hardware_digest, hardware_json, "
            "software_digest, software_json, objective, plan_json, latency_ms, peak_bytes, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [key.digest(), key.model, key.inputs, hardware_digest(HW), json.dumps(HW),
             software_digest(SW), json.dumps(SW), key.objective, _plan().to_json(), 3.0, 100,
             "2024-01-01T00:00:00+00:00"])
        conn.execute(
            "INSERT INTO measurements (signature, candidate, hardware_digest, software_digest, "
            "median_s, spread_s, samples, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            ["sig", "Relu.numpy.basic", "hw", "sw", 1e-3, 1e-5, 5, "2024-01-01T00:00:00+00:00"])
    conn.close()


def test_a_v1_store_is_migrated_on_open(tmp_path):
    path = tmp_path / "old.sqlite"
    _v1_store(path)
    with pytest.raises(StoreError, match="schema version 1, older.*open it once writable"):
        PlanStore(path, readonly=True)
    with PlanStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION == 3
        assert s.meta()["schema_version"] == "3"
        got = s.get_plan(_key())
        assert got is not None and got.latency_ms == 3.0 and got.run_id is None and got.notes == {}
        m = s.get_measurement("sig", "Relu.numpy.basic", "hw", "sw")
        assert m is not None and m.error is None and m.samples == 5
        run = s.start_run("m" * 64)
        s.put_plan(_key(), _plan(), run_id=run, notes={"after": "migration"})
        assert s.get_plan(_key()).run_id == run
    with PlanStore(path, readonly=True) as s:
        assert s.schema_version == SCHEMA_VERSION and s.get_plan(_key()).notes == {"after": "migration"}


def test_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "future.sqlite"
    PlanStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    for readonly in (False, True):
        with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}, newer than "
                                             f"the version {SCHEMA_VERSION}"):
            PlanStore(path, readonly=readonly)


def test_files_that_are_not_plan_stores(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello, this is not SQLite at all" * 10)
    with pytest.raises(StoreError, match="not a readable SQLite plan store"):
        PlanStore(text)
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER)")
    conn.close()
    with pytest.raises(StoreError, match=r"not an opdispatch plan store.*\['customers'\]"):
        PlanStore(other)
    with pytest.raises(StoreError, match="is a folder, not a regular file"):
        PlanStore(tmp_path)


# ------------------------------------------------------------------------------------------
# read-only
# ------------------------------------------------------------------------------------------


def _filled(path: Path) -> None:
    with PlanStore(path) as s:
        s.put_plan(_key(), _plan(), latency_ms=1.0)
        s.put_measurement("sig", "c", "hw", "sw", median_s=1.0)


def _assert_reads_but_never_writes(path: Path) -> None:
    with PlanStore(path, readonly=True) as s:
        assert s.get_plan(_key()).latency_ms == 1.0
        assert s.get_measurement("sig", "c", "hw", "sw").median_s == 1.0
        with pytest.raises(StoreError, match="put_plan: the plan store .* was opened read-only"):
            s.put_plan(_key(), _plan())
        with pytest.raises(StoreError, match="read-only"):
            s.start_run("m")
        with pytest.raises(sqlite3.OperationalError):
            s._conn.execute("DELETE FROM plans")


def test_readonly_store_reads(tmp_path):
    path = tmp_path / "plans.sqlite"
    _filled(path)
    _assert_reads_but_never_writes(path)
    with PlanStore(path) as s:
        assert len(s.all_plans()) == 1


def test_readonly_store_on_a_readonly_file_and_folder(tmp_path):
    folder = tmp_path / "ro"
    path = folder / "plans.sqlite"
    _filled(path)
    before = sorted(p.name for p in folder.iterdir())
    path.chmod(stat.S_IRUSR | stat.S_IRGRP)
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        _assert_reads_but_never_writes(path)
        if os.geteuid() != 0:  # root may write anywhere: SQLite then makes its WAL index
            assert sorted(p.name for p in folder.iterdir()) == before
    finally:
        folder.chmod(stat.S_IRWXU)
        path.chmod(stat.S_IRUSR | stat.S_IWUSR)


def test_readonly_falls_back_to_immutable_when_the_wal_index_cannot_be_made(tmp_path, monkeypatch):
    """What SQLite does for a non-root user in a read-only folder (the index file next to a
    WAL database cannot be created), simulated so that the test also bites when run as root."""
    path = tmp_path / "plans.sqlite"
    _filled(path)
    real_connect = sqlite3.connect
    targets: list[str] = []

    class NoShm(sqlite3.Connection):
        def execute(self, sql, *args, **kwargs):
            if "busy_timeout" in sql:  # touches no file
                return super().execute(sql, *args, **kwargs)
            raise sqlite3.OperationalError("attempt to write a readonly database")

    def connect(target, **kwargs):
        targets.append(target)
        if target.endswith("?mode=ro"):
            kwargs["factory"] = NoShm
        return real_connect(target, **kwargs)

    monkeypatch.setattr(store_mod.sqlite3, "connect", connect)
    with PlanStore(path, readonly=True) as s:
        assert s.get_plan(_key()).latency_ms == 1.0
    assert targets[-1].endswith("?mode=ro&immutable=1")


def test_readonly_never_creates_a_store(tmp_path):
    path = tmp_path / "missing" / "plans.sqlite"
    with pytest.raises(StoreError, match="no plan store at .*not created"):
        PlanStore(path, readonly=True)
    assert not path.parent.exists()


# ------------------------------------------------------------------------------------------
# several processes
# ------------------------------------------------------------------------------------------

WRITES = 300


def _writer(path: str, name: str, n: int, crash: bool) -> None:
    s = PlanStore(path, timeout_s=60)
    run = s.start_run(name * 64)
    for k in range(n):
        s.put_measurement(f"sig{k}", f"{name}.impl", "hw", "sw", median_s=k * 1e-6, samples=k)
        if k % 50 == 0:
            s.put_plan(_key(model=name * 64, objective=f"latency{k}"), _plan(), run_id=run)
    if crash:
        os._exit(3)  # as if killed: no finish_run, no close
    s.finish_run(run, "finished", {"writes": n})
    s.close()


def _reader(path: str, rounds: int) -> None:
    import time

    deadline = time.monotonic() + 60
    while not Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    for _ in range(rounds):
        try:
            s = PlanStore(path, readonly=True, timeout_s=60)
        except StoreError:  # created but not yet migrated by a writer
            time.sleep(0.01)
            continue
        with s:
            s.count_measurements()
            s.plans_for_model("a" * 64)


def test_two_writers_and_a_reader_at_once(tmp_path):
    path = str(tmp_path / "shared" / "plans.sqlite")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, name, WRITES, False)) for name in "ab"]
    procs.append(ctx.Process(target=_reader, args=(path, 200)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    with PlanStore(path, readonly=True) as s:
        assert s.count_measurements() == 2 * WRITES
        for name in "ab":
            assert len(s.plans_for_model(name * 64)) == WRITES // 50
            (run,) = s.runs(name * 64)
            assert run.status == "finished" and run.stats == {"writes": WRITES}


def test_an_interrupted_writer_keeps_what_it_committed(tmp_path):
    path = str(tmp_path / "plans.sqlite")
    proc = multiprocessing.get_context("spawn").Process(target=_writer, args=(path, "c", 40, True))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 3
    with PlanStore(path) as s:
        assert s.count_measurements() == 40
        assert s.get_measurement("sig39", "c.impl", "hw", "sw").samples == 39
        (run,) = s.runs()
        assert run.status == "running" and run.finished_at is None
