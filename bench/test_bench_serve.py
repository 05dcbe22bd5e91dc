"""Serving (issue 32): a tuned throughput plan behind ``opdispatch serve`` (the Open Inference
Protocol on kserve's ModelServer), against the same plan run in-process and against plain
onnxruntime behind the same server framework.

For each model:

* tuning first, before anything is timed, in a process of its own into a temporary store:
  ``opdispatch tune MODEL --objective throughput --concurrency N`` with N =
  ``OPDISPATCH_BENCH_SERVE_TUNE_N`` (default 16), budget ``OPDISPATCH_BENCH_BUDGET`` seconds
  (default 60);
* then, for each concurrency C (``OPDISPATCH_BENCH_CONCURRENCY``, default ``1,4,16``),
  ``OPDISPATCH_BENCH_ROUNDS`` rounds (default 3) in which every set-up runs in a process of
  its own, started and stopped around its measurement, the order rotated from round to round:

  - ``served``: ``opdispatch serve MODEL --store S --objective throughput@n=N --grpc-port 0``
    on a free loopback port, loaded by bench/serve_load.py (C threads, one request in flight
    each, with binary data; ``OPDISPATCH_BENCH_SERVE_CLIENT``, default ``raw``: Triton's
    request encoded once and re-sent, bench/raw_infer_client.py; ``triton``: Triton's HTTP
    client for every request), ``OPDISPATCH_BENCH_SERVE_WARMUP`` seconds of
    warm-up, default 1, then ``OPDISPATCH_BENCH_DURATION`` seconds, default 5, or at most
    ``OPDISPATCH_BENCH_SERVE_MAX_REQUESTS`` requests);
  - ``ort-kserve``: bench/ort_kserve_server.py MODEL (one onnxruntime InferenceSession with its
    default settings, or ``OPDISPATCH_BENCH_SERVE_ORT_THREADS`` intra-op threads, in a minimal
    kserve Model served by the same ``serve_models``), loaded the same way;
  - ``in-process``: the ceiling, ``opdispatch run MODEL --store S --objective throughput@n=N
    --concurrency C --duration D --require-plan --json -`` (the same plan called from C
    threads in one process: no HTTP, no encoding);

* then an open loop against ``served``: requests at a fixed rate, ``OPDISPATCH_BENCH_SERVE_OPEN``
  (default 0.7) times the model's saturated served throughput (the best of its concurrencies),
  for the p99 / p50 latency ratio at that load, one fresh server per round.

Per set-up the median over rounds of the throughput and the p50 / p99 latency; the ratios are
served over in-process and served over ort-kserve. They go to ``benchmark.extra_info``, to the
JSON file ``OPDISPATCH_BENCH_SERVE_JSON`` when set (rewritten after every test) and to two
markdown tables printed at the end (``-s`` shows them). Nothing is asserted about timings:
the README judges.

Models: ``OPDISPATCH_BENCH_SERVE_MODELS`` (default ``resnet50,mobilenet_v2,bert_eager``): names
of the bench's models (onnx's light architectures, written on first use, and the exports of
bench/models/export.py found in ``OPDISPATCH_BENCH_MODELS``) or paths of .onnx files; a model
that is not there is skipped with why. ``OPDISPATCH_BENCH_SERVE_SHAPES`` (``NAME=1x128,...``)
names the served shape of models with symbolic inputs. ``OPDISPATCH_BENCH_SERVE_ACCURACY``
(e.g. ``cosine:0.999``) tunes, serves and runs the plan with that accuracy budget on the
model's own samples (``--accuracy A --data D``: ``D`` is ``OPDISPATCH_BENCH_SERVE_DATA`` or
else ``MODEL_data.npz`` beside the model, as bench/models/accuracy_models.py writes them),
so that a plan in reduced precision is what is served. ``OPDISPATCH_BENCH_SERVE_BATCH=B`` (a
model whose inputs start with a symbolic batch dimension: bench/models/symbolic_batch.py; its
shapes at batch 1 in ``OPDISPATCH_BENCH_SERVE_SHAPES``) also tunes the plans of the batch sizes
the server forms up to B (2, 4, ... and B, each with the same objective) and serves with
``--max-batch-size B``: dynamic batching, which plain onnxruntime behind kserve and the
in-process set-up (the same plan called from C threads, one request per run) do not do.
Skipped unless ``--benchmark-enable``,
and when onnxruntime, kserve or tritonclient's HTTP client is not installed.

    OPDISPATCH_BENCH_BUDGET=60 python -m pytest bench/test_bench_serve.py -q -s --benchmark-enable
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: it is the baseline")

from bench.models.export import MODELS as EXPORTABLE
from bench.test_bench_models import EXPORTED, LIGHT, _path
from bench.test_bench_throughput import machine

# found, not imported: this process imports no kserve (the servers run in their own)
for _module, _why in (("kserve", "the serving extra (kserve)"),
                      ("tritonclient", "tritonclient[http] (the load generator's client)")):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_why} is not installed", allow_module_level=True)

ROOT = str(Path(__file__).resolve().parent.parent)
LOAD = str(Path(__file__).with_name("serve_load.py"))
ORT_SERVER = str(Path(__file__).with_name("ort_kserve_server.py"))


def _list(var: str, default: str) -> list[str]:
    return [x.strip() for x in os.environ.get(var, default).split(",") if x.strip()]


MODELS = _list("OPDISPATCH_BENCH_SERVE_MODELS", "resnet50,mobilenet_v2,bert_eager")
_unknown = [m for m in MODELS
            if not m.endswith(".onnx") and m not in LIGHT and m not in EXPORTABLE]
if _unknown:
    raise pytest.UsageError(f"OPDISPATCH_BENCH_SERVE_MODELS: unknown model(s) {_unknown}; "
                            f"known: {', '.join([*LIGHT, *EXPORTABLE])}, or a path to an .onnx")
CONCURRENCY = [int(n) for n in _list("OPDISPATCH_BENCH_CONCURRENCY", "1,4,16")]
TUNE_N = int(os.environ.get("OPDISPATCH_BENCH_SERVE_TUNE_N", "16"))
OBJECTIVE = f"throughput@n={TUNE_N}"
ROUNDS = int(os.environ.get("OPDISPATCH_BENCH_ROUNDS", "3"))
BUDGET_S = float(os.environ.get("OPDISPATCH_BENCH_BUDGET", "60"))
DURATION_S = float(os.environ.get("OPDISPATCH_BENCH_DURATION", "5"))
WARMUP_S = float(os.environ.get("OPDISPATCH_BENCH_SERVE_WARMUP", "1"))
CLIENT = os.environ.get("OPDISPATCH_BENCH_SERVE_CLIENT", "raw")
MAX_REQUESTS = int(os.environ.get("OPDISPATCH_BENCH_SERVE_MAX_REQUESTS", "100000"))
OPEN_FRACTION = float(os.environ.get("OPDISPATCH_BENCH_SERVE_OPEN", "0.7"))
OPEN_WORKERS = int(os.environ.get("OPDISPATCH_BENCH_SERVE_OPEN_WORKERS", "32"))
ORT_THREADS = os.environ.get("OPDISPATCH_BENCH_SERVE_ORT_THREADS")
SHAPES = _list("OPDISPATCH_BENCH_SERVE_SHAPES", "")
BATCH = int(os.environ.get("OPDISPATCH_BENCH_SERVE_BATCH", "1"))
ACCURACY = os.environ.get("OPDISPATCH_BENCH_SERVE_ACCURACY")
DATA = os.environ.get("OPDISPATCH_BENCH_SERVE_DATA")
JSON_PATH = os.environ.get("OPDISPATCH_BENCH_SERVE_JSON")
#: seconds a server may take from its start to its model's readiness (loading, warming)
READY_TIMEOUT_S = float(os.environ.get("OPDISPATCH_BENCH_SERVE_READY_TIMEOUT", "300"))
SETUPS = ("served", "ort-kserve", "in-process")

#: model -> its store; model -> the tuning error; the rows measured so far
_stores: dict[str, str] = {}
_tune_errors: dict[str, str] = {}
_rows: list[dict[str, Any]] = []
_open_rows: list[dict[str, Any]] = []
#: the servers' logs (a temporary folder made on the first start)
_logs: list[Path] = []


def _enabled(config: pytest.Config) -> bool:
    """pytest-benchmark's own rule: benches run unless disabled (the project's ``addopts``
    disable them) and not re-enabled with ``--benchmark-enable``."""
    return not (config.getoption("benchmark_disable", default=False)
                and not config.getoption("benchmark_enable", default=False))


def model_path(name: str) -> str | None:
    """The model's file, or ``None`` when it is not there (an export not made, a bad path)."""
    if name.endswith(".onnx"):
        return str(Path(name).resolve()) if Path(name).is_file() else None
    if name in LIGHT or name in EXPORTED:
        return _path(name)
    return None


def _absent(name: str) -> str:
    if name.endswith(".onnx"):
        return f"{name}: no such model file"
    return f"{name} is not exported: python bench/models/export.py {name}"


def _shape_args(batch: int = 1) -> list[str]:
    """``--shape NAME=DIMS`` of each served shape, at ``batch`` (its first dimension)."""
    if batch == 1:
        return [a for s in SHAPES for a in ("--shape", s)]
    sized = []
    for s in SHAPES:
        name, _, dims = s.partition("=")
        first, _, rest = dims.partition("x")
        if first != "1":
            raise pytest.UsageError(f"OPDISPATCH_BENCH_SERVE_SHAPES: {s} must start with 1 (the batch) "
                                    f"for OPDISPATCH_BENCH_SERVE_BATCH={BATCH}")
        sized += ["--shape", f"{name}={batch}" + (f"x{rest}" if rest else "")]
    return sized


def batch_sizes() -> list[int]:
    """The batch sizes above 1 the server forms with ``--max-batch-size BATCH`` (those it
    looks plans up for: :data:`tuner.serve.runner._PROBED_SIZES` below it, and it)."""
    if BATCH <= 1:
        return []
    from tuner.serve.runner import _PROBED_SIZES

    return sorted({*(s for s in _PROBED_SIZES if s < BATCH), BATCH})


def _accuracy_args(path: str) -> list[str]:
    """``--accuracy A --data D`` when the bench serves plans tuned with an accuracy budget."""
    if not ACCURACY:
        return []
    return ["--accuracy", ACCURACY,
            "--data", DATA or str(Path(path).with_name(f"{Path(path).stem}_data.npz"))]


def _tune(name: str, path: str) -> None:
    """``opdispatch tune`` in a process of its own into the model's store (at batch 1, then at
    each of :func:`batch_sizes`); a failure is kept."""
    limit = max(600.0, BUDGET_S * 10)
    for batch in [1, *batch_sizes()]:
        cmd = [sys.executable, "-m", "tuner.cli", "tune", path, "--store", _stores[name],
               "--objective", "throughput", "--concurrency", str(TUNE_N), "--budget", str(BUDGET_S),
               "--no-progress", *_shape_args(batch), *_accuracy_args(path)]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=limit)
        except subprocess.TimeoutExpired:
            _tune_errors[name] = f"`{' '.join(cmd[1:])}` did not finish in {limit:.0f} s"
            return
        if out.returncode != 0:
            _tune_errors[name] = (f"`{' '.join(cmd[1:])}` exited {out.returncode}: "
                                  + (out.stderr or out.stdout).strip()[-800:])
            return


@pytest.fixture(scope="module", autouse=True)
def _tune_first(request):
    """Tune every selected model before anything is timed; print the tables at the end."""
    if not _enabled(request.config):
        yield
        return
    here = request.module.__name__
    selected = [it.callspec.params["name"] for it in request.session.items
                if getattr(it, "module", None) is not None and it.module.__name__ == here
                and hasattr(it, "callspec")]
    for name in dict.fromkeys(selected):
        path = model_path(name)
        if path is not None:
            _stores[name] = os.path.join(tempfile.mkdtemp(prefix="opdispatch-bench-serve-"),
                                         "plans.sqlite")
            _tune(name, path)
    yield
    if _rows or _open_rows:
        print("\n" + tables())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class SetupFailed(Exception):
    """A set-up did not start, did not answer or failed; the message says why."""


@contextlib.contextmanager
def server(label: str, cmd: list[str], model: str) -> Iterator[int]:
    """``cmd --http-port P`` on a free loopback port, up once ``model`` is ready; yields P.
    Stopped with SIGTERM (killed after 60 s) whatever happens."""
    port = _free_port()
    if not _logs:
        _logs.append(Path(tempfile.mkdtemp(prefix="opdispatch-bench-serve-logs-")))
    log = _logs[0] / f"{label}-{model}-{port}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([*cmd, "--http-port", str(port)], stdout=out,
                                   stderr=subprocess.STDOUT, cwd=ROOT,
                                   env=dict(os.environ, PYTHONUNBUFFERED="1"))

    def tail() -> str:
        return log.read_text(errors="replace").strip()[-1500:]

    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise SetupFailed(f"{label} exited {process.returncode} before it was ready: "
                                  f"{tail()}")
            with contextlib.suppress(OSError):
                code, body = _get(port, f"/v2/models/{model}/ready")
                if code == 200:
                    break
                if code == 503:  # loaded but not ready: final (the plans are loaded first)
                    raise SetupFailed(f"{label}: {model} is not ready: "
                                      f"{body.decode(errors='replace')[:800]}")
            if time.monotonic() > deadline:
                raise SetupFailed(f"{label} was not ready within {READY_TIMEOUT_S:.0f} s: "
                                  f"{tail()}")
            time.sleep(0.2)
        yield port
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def _json_run(cmd: list[str], timeout: float, what: str) -> dict[str, Any]:
    """Run ``cmd`` (it prints its figures as JSON on stdout); ``{"failed": why}`` on failure."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"failed": f"{what}: no result in {timeout:.0f} s"}
    text = out.stdout
    start = text.find("{")
    try:
        result = json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        result = None
    if result is None or (out.returncode != 0 and not result.get("errors")):
        return {"failed": f"{what} exited {out.returncode}: "
                          f"{(out.stderr or out.stdout).strip()[-800:]}"}
    return result


def _load(port: int, model: str, concurrency: int, rate: float | None = None
          ) -> dict[str, Any]:
    """bench/serve_load.py against the server on ``port`` (a closed loop of ``concurrency``
    threads, or an open loop at ``rate`` requests per second)."""
    cmd = [sys.executable, LOAD, "--url", f"127.0.0.1:{port}", "--model", model,
           "--duration", str(DURATION_S), "--warmup", str(WARMUP_S), "--max-requests",
           str(MAX_REQUESTS), "--client", CLIENT, "--json", "-", *_shape_args()]
    if rate is None:
        cmd += ["--concurrency", str(concurrency)]
    else:
        cmd += ["--rate", f"{rate:.3f}", "--workers", str(OPEN_WORKERS)]
    return _json_run(cmd, WARMUP_S + DURATION_S + 180, "serve_load.py")


def served_cmd(path: str) -> list[str]:
    """``opdispatch serve`` of the model's throughput plan, HTTP only, on loopback."""
    return [sys.executable, "-m", "tuner.cli", "serve", path, "--store", "{store}",
            "--objective", OBJECTIVE, "--grpc-port", "0", "--host", "127.0.0.1",
            *(["--max-batch-size", str(BATCH)] if BATCH > 1 else []),
            *_shape_args(), *_accuracy_args(path)]


def ort_cmd(path: str) -> list[str]:
    """bench/ort_kserve_server.py: plain onnxruntime behind the same framework."""
    return [sys.executable, ORT_SERVER, path, *(["--threads", ORT_THREADS] if ORT_THREADS else [])]


def measure(setup: str, name: str, path: str, concurrency: int,
            rate: float | None = None) -> dict[str, Any]:
    """One set-up measured once, in processes of its own; ``{"failed": why}`` on failure."""
    model = Path(path).stem
    store = _stores[name]
    if setup == "in-process":
        cmd = [sys.executable, "-m", "tuner.cli", "run", path, "--store", store, "--objective",
               OBJECTIVE, "--concurrency", str(concurrency), "--duration", str(DURATION_S),
               "--require-plan", "--json", "-", *_shape_args(), *_accuracy_args(path)]
        return _json_run(cmd, DURATION_S + READY_TIMEOUT_S, "opdispatch run")
    cmd = served_cmd(path) if setup == "served" else ort_cmd(path)
    cmd = [store if a == "{store}" else a for a in cmd]
    try:
        with server(setup, cmd, model) as port:
            try:
                code, body = _get(port, f"/v2/models/{model}")
            except OSError:
                code, body = 0, b""
            result = _load(port, model, concurrency, rate)
    except SetupFailed as exc:
        return {"failed": str(exc)}
    if "failed" not in result and code == 200:  # what the server says it runs
        result["server"] = json.loads(body).get("parameters")
    if "failed" not in result and result.get("errors"):
        result["note"] = f"{result['errors']} request(s) failed: {result['error']}"
    return result


def _median(results: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in results if "failed" not in r and r.get(key) is not None]
    return statistics.median(values) if values else None


def _summary(name: str, concurrency: int, rounds: list[dict[str, dict]]) -> dict[str, Any]:
    """Medians per set-up over the rounds, and the ratios."""
    row: dict[str, Any] = {"model": name, "concurrency": concurrency, "setups": {}}
    for setup in SETUPS:
        runs = [r[setup] for r in rounds]
        failed = [r["failed"] for r in runs if "failed" in r]
        row["setups"][setup] = {
            **{k: _median(runs, k) for k in ("throughput", "p50_ms", "p90_ms", "p99_ms",
                                             "client_cpu")},
            "errors": sum(r.get("errors") or 0 for r in runs if "failed" not in r),
            "error": next((r.get("error") for r in runs if r.get("error")), None),
            "failed": failed[0] if failed else None,
            "rounds": [r.get("throughput") for r in runs],
            "server": next((r["server"] for r in runs if r.get("server")), None),
        }
    got = {s: v["throughput"] for s, v in row["setups"].items() if v["throughput"]}
    served = got.get("served")
    row["served_vs_in_process"] = served / got["in-process"] if served and "in-process" in got \
        else None
    row["served_vs_ort"] = served / got["ort-kserve"] if served and "ort-kserve" in got else None
    return row


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def tables() -> str:
    """The results as markdown tables, the machine above them."""
    from tabulate import tabulate

    m = machine()
    flags = ", ".join(f"{f} {'yes' if m[f] else 'no'}" for f in ("avx512f", "avx512_vnni",
                                                                   "amx_tile"))
    text = (f"Machine: {m['cpu']}, {m['cores']} usable cores; {flags}\n"
            f"Plan {OBJECTIVE}{f' within accuracy {ACCURACY}' if ACCURACY else ''}, budget {BUDGET_S:g} s; "
            f"{f'served with dynamic batching up to {BATCH}; ' if BATCH > 1 else ''}"
            f"{WARMUP_S:g} s warm-up + "
            f"{DURATION_S:g} s per measurement, median of {ROUNDS} round(s)\n\n")
    head = ["model", "C", "served inf/s", "in-process inf/s", "ort-kserve inf/s",
            "served / in-process", "served / ort", "served p50 ms", "served p99 ms",
            "ort p50 ms", "ort p99 ms", "in-process p99 ms", "client CPU", "errors",
            "served: requests at once", "served: batch sizes"]
    body = []
    for r in _rows:
        s = r["setups"]
        body.append([r["model"], r["concurrency"],
                     *(_fmt(s[x]["throughput"]) for x in ("served", "in-process", "ort-kserve")),
                     _fmt(r["served_vs_in_process"], 2), _fmt(r["served_vs_ort"], 2),
                     _fmt(s["served"]["p50_ms"], 2), _fmt(s["served"]["p99_ms"], 2),
                     _fmt(s["ort-kserve"]["p50_ms"], 2), _fmt(s["ort-kserve"]["p99_ms"], 2),
                     _fmt(s["in-process"]["p99_ms"], 2), _fmt(s["served"]["client_cpu"], 2),
                     sum(s[x]["errors"] for x in SETUPS),
                     (s["served"]["server"] or {}).get("concurrency", "-"),
                     ",".join(str(b) for b in (s["served"]["server"] or {}).get("batch_sizes") or [1])])
    if body:
        text += tabulate(body, head, tablefmt="github")
    if _open_rows:
        head = ["model", "saturated inf/s (C)", "offered /s", "achieved /s", "p50 ms",
                "p90 ms", "p99 ms", "p99 / p50", "sent late", "errors"]
        body = [[r["model"], f"{_fmt(r['saturated'])} ({r['saturated_at']})",
                 _fmt(r["rate"]), _fmt(r["throughput"]), _fmt(r["p50_ms"], 2),
                 _fmt(r["p90_ms"], 2), _fmt(r["p99_ms"], 2), _fmt(r["p99_over_p50"], 2),
                 r["late"], r["errors"]] for r in _open_rows]
        text += (f"\n\nOpen loop against served at {OPEN_FRACTION:g} x the saturated "
                 f"throughput:\n\n" + tabulate(body, head, tablefmt="github"))
    failures = [f"- {r['model']} C={r['concurrency']} {k}: {v['failed']}" for r in _rows
                for k, v in r["setups"].items() if v["failed"]]
    failures += [f"- {r['model']} C={r['concurrency']} {k}: {v['errors']} request(s) failed, "
                 f"the first: {v['error']}" for r in _rows for k, v in r["setups"].items()
                 if v["errors"]]
    failures += [f"- {r['model']} open loop: {r['failed'] or r['error']}" for r in _open_rows
                 if r["failed"] or r["errors"]]
    return text + ("\n\nFailures and errors:\n" + "\n".join(failures) if failures else "")


def _write_json() -> None:
    if JSON_PATH:
        data = {"machine": machine(), "objective": OBJECTIVE, "accuracy": ACCURACY, "budget_s": BUDGET_S,
                "duration_s": DURATION_S, "warmup_s": WARMUP_S, "rounds": ROUNDS,
                "open_fraction": OPEN_FRACTION, "results": _rows, "open_loop": _open_rows}
        Path(JSON_PATH).write_text(json.dumps(data, indent=1))


def _ready_to_run(request: pytest.FixtureRequest, name: str) -> str:
    """The model's path once the bench may run it; skips with why otherwise."""
    if not _enabled(request.config):
        pytest.skip("a bench: run it with --benchmark-enable")
    path = model_path(name)
    if path is None:
        pytest.skip(_absent(name))
    if name in _tune_errors:
        pytest.skip(f"tuning the {OBJECTIVE} plan of {name} failed: {_tune_errors[name]}")
    return path


def _id(name: str) -> str:
    return Path(name).stem if name.endswith(".onnx") else name


@pytest.mark.parametrize("concurrency", CONCURRENCY, ids=lambda n: f"c{n}")
@pytest.mark.parametrize("name", MODELS, ids=_id)
def test_serve(request, benchmark, name, concurrency):
    """served, ort-kserve and in-process at ``concurrency``, alternated over the rounds."""
    path = _ready_to_run(request, name)
    rounds: list[dict[str, dict]] = []

    def all_rounds() -> None:
        for k in range(ROUNDS):
            order = SETUPS[k % len(SETUPS):] + SETUPS[:k % len(SETUPS)]
            rounds.append({setup: measure(setup, name, path, concurrency) for setup in order})

    benchmark.group = f"serve-{_id(name)}"
    benchmark.pedantic(all_rounds, rounds=1, iterations=1)
    row = _summary(_id(name), concurrency, rounds)
    _rows.append(row)
    _write_json()
    benchmark.extra_info.update(variant=f"c={concurrency}", machine=machine(), budget_s=BUDGET_S,
                                duration_s=DURATION_S, **row)


@pytest.mark.parametrize("name", MODELS, ids=_id)
def test_serve_open_loop(request, benchmark, name):
    """Requests at ``OPEN_FRACTION`` x the saturated served throughput: p50, p99, p99 / p50."""
    path = _ready_to_run(request, name)
    measured = [(r["setups"]["served"]["throughput"], r["concurrency"]) for r in _rows
                if r["model"] == _id(name) and r["setups"]["served"]["throughput"]]
    if not measured:
        pytest.skip(f"no served throughput of {name} was measured (test_serve deselected or "
                    f"failed): nothing to take {OPEN_FRACTION:g} of")
    saturated, at = max(measured)
    rate = OPEN_FRACTION * saturated
    runs: list[dict[str, Any]] = []

    def all_rounds() -> None:
        for _ in range(ROUNDS):
            runs.append(measure("served", name, path, 0, rate=rate))

    benchmark.group = f"serve-{_id(name)}"
    benchmark.pedantic(all_rounds, rounds=1, iterations=1)
    ok = [r for r in runs if "failed" not in r]
    failed = [r["failed"] for r in runs if "failed" in r]
    ratios = [r["p99_ms"] / r["p50_ms"] for r in ok if r.get("p50_ms") and r.get("p99_ms")]
    row = {"model": _id(name), "saturated": saturated, "saturated_at": at, "rate": rate,
           **{k: _median(runs, k) for k in ("throughput", "p50_ms", "p90_ms", "p99_ms")},
           "p99_over_p50": statistics.median(ratios) if ratios else None,
           "late": sum(r.get("late") or 0 for r in ok),
           "errors": sum(r.get("errors") or 0 for r in ok),
           "error": next((r.get("error") for r in ok if r.get("error")), None),
           "failed": failed[0] if failed else None}
    _open_rows.append(row)
    _write_json()
    benchmark.extra_info.update(variant="open-loop", machine=machine(), **row)
