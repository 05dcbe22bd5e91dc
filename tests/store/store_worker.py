"""A child process that writes into a plan store and logs every write it committed.

Used by the SIGKILL trials (``test_store_kill.py``) and the soak run (``test_store_soak.py``):
after a write (plan, measurement, tuning run) returns, i.e. after its transaction committed,
the child appends one JSON line describing it to its log with a single unbuffered
``os.write``. Whatever happens to the child afterwards (SIGKILL included), every line in the
log names a write that must be in the store; :func:`verify_committed` checks that it is.

Run as ``python -m tests.store.store_worker MODE STORE LOG [options]`` from the repository
root; modes:

- ``write``: plans, measurements and tuning runs in a loop, as a tuner writes them
  (``--trial`` makes its keys unique), until killed or ``--seconds`` pass.
- ``serve``: a fork server that runs ``write`` and ``tune`` children on request (see
  :func:`serve`), so that 50 kill trials need no 50 interpreter start-ups.
- ``tune``: a real :func:`tuner.tune.tune` of a tiny model through a store that logs its
  writes (``--trial`` makes its objective, hence its plan key, unique).
- ``soak``: ``--seconds`` of mixed work, as one of several processes sharing a store: tuner-like
  writes, read-only lookups, Session lookups of a tuned model and (``--tune``) real tuning;
  writes a JSON summary (counts and every error seen) to ``LOG.summary.json``.

The child prints ``ready PID`` once it has opened the store, then works.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import traceback
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from dispatch.plan import Plan, PlanStep
from tuner.fingerprint import PlanKey
from tuner.store import PlanStore

HW = {"arch": "x86_64", "cpu_model": "test CPU", "isa": ["avx2"], "physical_cores": 2,
      "logical_cores": 2, "threads": 2, "gpus": []}
SW = {"backends": {"numpy": "numpy 2.0.0"}, "opdispatch": "0.1.0", "plan_format": 1}
#: Base of the memory caps that give each real tuning run its own objective (plan key).
CAP_BASE = 1 << 40


def tiny_model(width: int = 6) -> onnx.ModelProto:
    """Conv-Relu-GlobalAveragePool on a 1x4x8x8 input with ``width`` output channels: quick
    to tune (each width has signatures, hence measurements, of its own)."""
    from tests.builders import ModelBuilder

    rng = np.random.default_rng(0)
    b = ModelBuilder(17, "tiny_cnn")
    x = b.input("x", [1, 4, 8, 8])
    c = b.op("Conv", [x, b.const(rng.normal(0, 0.3, (width, 4, 3, 3)).astype(np.float32))],
             pads=[1, 1, 1, 1])
    b.output(b.op("GlobalAveragePool", [b.op("Relu", [c])]))
    return b.build()


def tune_options(trial: int, budget_s: float) -> Any:
    """Options of a quick real tuning run whose objective (memory cap) is unique to ``trial``."""
    from tuner.tune import TuneOptions

    return TuneOptions(budget_s=budget_s, top_k=2, validate_runs=3, per_candidate_cap_s=0.02,
                       memory_cap_bytes=CAP_BASE + trial, progress=False)


def _plan(n: int) -> Plan:
    step = PlanStep(nodes=["relu"], op="Relu", impl="Relu.numpy.basic", backend="numpy",
                    layouts_in=["std"], layouts_out=["std"])
    return Plan(graph="g", steps=[step], conversions=[], provenance={"source": "worker", "n": n})


def _key_dict(key: PlanKey) -> dict[str, Any]:
    return {"model": key.model, "inputs": key.inputs, "hardware": key.hardware,
            "software": key.software, "objective": key.objective}


class Log:
    """Append-only JSON lines, each written with one unbuffered ``os.write``."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.lines = 0

    def __call__(self, **record: Any) -> None:
        os.write(self.fd, (json.dumps(record, sort_keys=True) + "\n").encode())
        self.lines += 1


class LoggingStore(PlanStore):
    """A :class:`PlanStore` that logs each write after it returned (committed)."""

    log: Log

    def put_plan(self, key: PlanKey, plan_json: Any, **kw: Any) -> int:
        text = plan_json.to_json() if isinstance(plan_json, Plan) else plan_json
        plan_id = super().put_plan(key, text, **kw)
        self.log(op="plan", id=plan_id, key=_key_dict(key), plan_json=text,
                 latency_ms=kw.get("latency_ms"))
        return plan_id

    def put_measurement(self, signature: str, candidate: str, hardware_digest: str,
                        software_digest: str, **kw: Any) -> None:
        super().put_measurement(signature, candidate, hardware_digest, software_digest, **kw)
        self.log(op="measurement", signature=signature, candidate=candidate,
                 hw=hardware_digest, sw=software_digest, median_s=kw.get("median_s"),
                 error=kw.get("error"))

    def start_run(self, model_fp: str, **kw: Any) -> int:
        run_id = super().start_run(model_fp, **kw)
        self.log(op="run", id=run_id, status="running")
        return run_id

    def finish_run(self, run_id: int, status: str, stats: Mapping[str, Any] | None = None) -> None:
        super().finish_run(run_id, status, stats)
        self.log(op="run", id=run_id, status=status)


def open_logging_store(path: str, log: Log, **kw: Any) -> LoggingStore:
    """A :class:`LoggingStore` on ``path`` that logs into ``log``."""
    store = LoggingStore(path, **kw)
    store.log = log
    return store


def tuner_like_writes(store: LoggingStore, owner: str, n: int, rng: random.Random) -> int:
    """One tuning run's worth of writes as the tuner makes them: start a run, a few
    measurements, a plan under a key unique to ``owner`` and ``n``, finish the run. Returns
    the number of transactions committed."""
    model = (owner * 64)[:64]
    run = store.start_run(model, budget_s=10.0, objective=f"latency{n}")
    count = rng.randint(1, 4)
    for m in range(count):
        store.put_measurement(f"{owner}|sig{n}.{m}", f"Relu.numpy.c{m}", "hw", "sw",
                              median_s=rng.uniform(1e-5, 1e-2), spread_s=1e-6, samples=m + 1)
    key = PlanKey(model=model, inputs="x:float32[1,8]", hardware=HW, software=SW,
                  objective=f"latency{n}")
    store.put_plan(key, _plan(n).to_json(), latency_ms=rng.uniform(0.1, 9.0), run_id=run,
                   notes={"owner": owner, "n": n})
    store.finish_run(run, "finished", {"n": n, "measured": count})
    return count + 3


# ------------------------------------------------------------------------------------------
# checking a log against the store
# ------------------------------------------------------------------------------------------


def read_log(paths: Iterable[str | os.PathLike]) -> list[dict[str, Any]]:
    """The records of every complete line of the logs (a torn last line is ignored: its write
    never finished, so nothing was claimed)."""
    records: list[dict[str, Any]] = []
    for path in paths:
        text = Path(path).read_text() if Path(path).exists() else ""
        for line in text.splitlines(keepends=True):
            if line.endswith("\n"):
                records.append(json.loads(line))
    return records


def verify_committed(store: PlanStore, records: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Check that every logged write is in ``store``; returns the counts checked
    (``plans``, ``measurements``, ``runs``: distinct keys). Raises ``AssertionError`` naming
    the first write that is missing or differs. A key written several times (a plan re-tuned,
    a measurement two processes made at once) must hold one of the values logged for it:
    the logs of several processes do not say which commit came last."""
    plans: dict[str, list[Mapping[str, Any]]] = {}
    measurements: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    runs: dict[int, str] = {}
    for r in records:
        if r["op"] == "plan":
            plans.setdefault(PlanKey(**r["key"]).digest(), []).append(r)
        elif r["op"] == "measurement":
            key = (r["signature"], r["candidate"], r["hw"], r["sw"])
            measurements.setdefault(key, []).append(r)
        elif r["op"] == "run":
            if r["status"] != "running" or r["id"] not in runs:
                runs[r["id"]] = r["status"]
        else:
            raise AssertionError(f"unknown log record {r!r}")
    for versions in plans.values():
        r = versions[-1]
        got = store.get_plan(PlanKey(**r["key"]))
        assert got is not None, f"committed plan {r['id']} ({r['key']['objective']}) is missing"
        logged = [(v["id"], v["plan_json"], v["latency_ms"]) for v in versions]
        assert (got.id, got.plan_json, got.latency_ms) in logged, (
            f"committed plan {r['id']} differs: stored id {got.id}, latency {got.latency_ms}; "
            f"logged {[(i, lat) for i, _, lat in logged]}")
    for k, versions in measurements.items():
        got = store.get_measurement(*k)
        assert got is not None, f"committed measurement {k} is missing"
        logged = [(v["median_s"], v["error"]) for v in versions]
        assert (got.median_s, got.error) in logged, (
            f"committed measurement {k} differs: stored {got.median_s}, logged {logged}")
    stored_runs = {run.id: run.status for run in store.runs()}
    for run_id, status in runs.items():
        assert run_id in stored_runs, f"committed tuning run {run_id} is missing"
        if status != "running":
            assert stored_runs[run_id] == status, (
                f"tuning run {run_id} was committed as {status}, stored as {stored_runs[run_id]}")
    return {"plans": len(plans), "measurements": len(measurements), "runs": len(runs)}


# ------------------------------------------------------------------------------------------
# modes
# ------------------------------------------------------------------------------------------


def _ready() -> None:
    os.write(1, f"ready {os.getpid()}\n".encode())


def work_write(store_path: str, log_path: str, trial: int, seed: int, seconds: float) -> None:
    """Tuner-like writes (:func:`tuner_like_writes`) for ``seconds`` or until killed, with a
    WAL checkpoint now and then (as closing a connection makes) so that kills also land
    inside checkpoints."""
    rng = random.Random(seed)
    store = open_logging_store(store_path, Log(log_path), timeout_s=60)
    _ready()
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        tuner_like_writes(store, f"t{trial:03d}", n, rng)
        n += 1
        if n % 7 == 0:
            store._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    store.close()


def work_tune(store_path: str, log_path: str, trial: int, budget_s: float,
              registry: Any = None) -> None:
    """A real tuning run of :func:`tiny_model` (of a width of its own, so that it measures
    rather than reuses) whose store writes are logged."""
    from tuner.tune import tune

    store = open_logging_store(store_path, Log(log_path), timeout_s=60)
    model = tiny_model(width=7 + trial)
    _ready()
    tune(model, store=store, registry=registry, options=tune_options(trial, budget_s))
    store.close()


def serve() -> int:
    """A fork server: imports everything once, then forks one child per command so that a
    trial costs no interpreter start-up. Commands are JSON lines on stdin:
    ``{"cmd": "fork", "mode": "write"|"tune", "store", "log", "trial", "seed", "seconds",
    "budget"}`` answers ``forked PID`` (the child itself prints ``ready PID`` once it has
    opened the store); ``{"cmd": "wait", "pid": PID}`` answers ``exited PID CODE`` (``-9``: killed
    by SIGKILL). A child that fails prints its traceback to stderr and exits 1."""
    from dispatch.backend import load_registry
    from tuner import tune as _preload  # noqa: F401  (imported once, before forking)

    registry = load_registry()
    tiny_model()
    os.write(1, b"serving\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "wait":
            _, status = os.waitpid(int(cmd["pid"]), 0)
            os.write(1, f"exited {cmd['pid']} {os.waitstatus_to_exitcode(status)}\n".encode())
            continue
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                if cmd["mode"] == "write":
                    work_write(cmd["store"], cmd["log"], cmd["trial"], cmd["seed"], cmd["seconds"])
                else:
                    work_tune(cmd["store"], cmd["log"], cmd["trial"], cmd["budget"], registry)
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stderr.flush()
                os._exit(code)
        os.write(1, f"forked {pid}\n".encode())
    return 0


def run_soak(args: argparse.Namespace) -> int:
    """Mixed work for ``--seconds``; every error is caught, counted and reported."""
    from dispatch import Session
    from dispatch.backend import load_registry
    from tuner.tune import tune

    rng = random.Random(args.seed)
    log = Log(args.log)
    summary: dict[str, Any] = {"index": args.trial, "tuner_like_runs": 0, "transactions": 0,
                               "real_tunes": 0, "store_reads": 0, "session_reads": 0,
                               "sessions_on_stored_plan": 0, "errors": []}
    registry = load_registry()
    model = tiny_model()
    owner = f"soak{args.trial}"
    mine: list[PlanKey] = []
    store = open_logging_store(args.store, log, timeout_s=60)
    _ready()
    deadline = time.monotonic() + args.seconds
    n = 0
    while time.monotonic() < deadline:
        roll = rng.random()
        action = ("tune" if args.tune and roll < 0.3 else
                  "write" if roll < 0.55 else "read" if roll < 0.85 else "session")
        try:
            if action == "tune":
                tune(model, store=store, registry=registry,
                     options=tune_options(1000 * args.trial + n, budget_s=1.0))
                summary["real_tunes"] += 1
            elif action == "write":
                summary["transactions"] += tuner_like_writes(store, owner, n, rng)
                summary["tuner_like_runs"] += 1
                mine.append(PlanKey(model=(owner * 64)[:64], inputs="x:float32[1,8]",
                                    hardware=HW, software=SW, objective=f"latency{n}"))
            elif action == "read":
                with PlanStore(args.store, readonly=True) as ro:
                    if mine:
                        key = rng.choice(mine)
                        if ro.get_plan(key) is None:
                            raise AssertionError(f"own committed plan {key.objective} not found")
                    ro.plans_for_model((f"soak{rng.randrange(8)}" * 64)[:64])
                    ro.count_measurements()
                summary["store_reads"] += 1
            else:
                sess = Session(model, registry=registry, store=args.store)
                summary["session_reads"] += 1
                if sess.plan_source != "store":  # the parent tuned this model before
                    raise AssertionError(f"the session did not use the stored plan: "
                                         f"{sess.plan_note}")
                summary["sessions_on_stored_plan"] += 1
                sess.run(None, {"x": np.ones((1, 4, 8, 8), np.float32)})
        except Exception as exc:
            summary["errors"].append({"action": action, "error": f"{type(exc).__name__}: {exc}",
                                      "traceback": traceback.format_exc(limit=6)})
        n += 1
    store.close()
    Path(f"{args.log}.summary.json").write_text(json.dumps(summary, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["write", "tune", "soak", "serve"])
    p.add_argument("store", nargs="?")
    p.add_argument("log", nargs="?")
    p.add_argument("--trial", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--budget", type=float, default=3.0)
    p.add_argument("--tune", action="store_true", help="soak: also tune for real")
    args = p.parse_args(argv)
    if args.mode == "serve":
        return serve()
    if not (args.store and args.log):
        p.error(f"{args.mode} needs STORE and LOG")
    if args.mode == "write":
        work_write(args.store, args.log, args.trial, args.seed, args.seconds)
    elif args.mode == "tune":
        work_tune(args.store, args.log, args.trial, args.budget)
    else:
        return run_soak(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
