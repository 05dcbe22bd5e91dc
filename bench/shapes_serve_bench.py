"""A range plan served against the same plan in process, on mixed-shape traffic (issue 51).

    python bench/shapes_serve_bench.py --shape input_ids=1x1..128 [--tune-budget 180] \\
        [--concurrency 16] [--duration 10] [--rounds 3] [--json out.json]

Each round, in processes of their own, alternating:

* ``in-process``: a Session of the model (its stored range plan) run from ``--concurrency``
  threads, each sending the requests in turn from its own offset, one in flight per thread, for
  ``--duration`` seconds (:func:`tuner.throughput.load.run_load`);
* ``served``: ``opdispatch serve MODEL --shape ...`` on a free loopback port (127.0.0.1 only),
  loaded by as many client threads sending the same requests, each pre-encoded once, on one
  kept-alive connection each (bench/serve_load.py's raw client), for the same time.

Prints the medians of the rounds and the ratio served / in-process. The model and requests
default to those of bench/models/shapes_models.py; the store is the bench's own (tuned first
with ``--tune-budget``) unless ``--store`` names one. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_DIR = Path.home() / ".cache" / "opdispatch" / "bench-models" / "shapes"


def _requests(model: Path, data: Path) -> list[dict[str, Any]]:
    from dispatch.input_shapes import declared_in_file
    from tuner.replay import read_requests

    return read_requests(data, declared_in_file(str(model)))


def in_process(model: Path, data: Path, store: Path, concurrency: int, duration: float) -> dict:
    """The plan in this process from ``concurrency`` threads (run as a child: ``--child``)."""
    from dispatch import Session
    from tuner.throughput.load import run_load

    requests = _requests(model, data)
    session = Session(str(model), store=str(store))
    session.for_shapes({k: v.shape for k, v in requests[0].items()})
    n = len(requests)
    turns = [k * n // concurrency for k in range(concurrency)]

    def call(k: int) -> Any:
        feeds = requests[turns[k] % n]
        turns[k] += 1
        return session.run(None, feeds)

    result = run_load(call, concurrency, duration, warmup_s=1.0)
    return {"throughput": result.throughput, "p50_ms": result.p50_ms, "p99_ms": result.p99_ms,
            "errors": result.errors, "note": session.plan_note}


def served(model: Path, data: Path, store: Path, shape: str, concurrency: int,
           duration: float) -> dict:
    """The plan behind ``opdispatch serve`` on loopback, loaded by the raw client."""
    from bench.serve_load import run_closed
    from bench.test_bench_serve import server

    requests = _requests(model, data)
    cmd = [sys.executable, "-m", "tuner.cli", "serve", str(model), "--shape", shape,
           "--store", str(store), "--grpc-port", "0"]
    with server("shapes", cmd, model.stem) as port:
        report = run_closed(f"127.0.0.1:{port}", model.stem, concurrency, duration, 10**6,
                            warmup_s=1.0, requests=requests)
    return {"throughput": report.throughput, "p50_ms": report.p50_ms, "p99_ms": report.p99_ms,
            "errors": report.errors, "error": report.error, "client_cpu": report.client_cpu}


def _child(argv: list[str]) -> int:
    model, data, store, concurrency, duration = argv
    print(json.dumps(in_process(Path(model), Path(data), Path(store), int(concurrency),
                                float(duration))))
    return 0


def main(argv: list[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["--child"]:
        return _child(args_in[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=DEFAULT_DIR / "minilm_dyn.onnx")
    p.add_argument("--data", type=Path, default=DEFAULT_DIR / "minilm_requests")
    p.add_argument("--shape", default="input_ids=1x1..128")
    p.add_argument("--store", type=Path, default=None)
    p.add_argument("--tune-budget", type=float, default=None, metavar="S")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(args_in)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory(prefix="shapes-serve-") as tmp:
        store = args.store or Path(tmp) / "plans.sqlite"
        if args.tune_budget is not None:
            subprocess.run([sys.executable, "-m", "tuner.cli", "tune", str(args.model), "--shape",
                            args.shape, "--data", str(args.data), "--budget",
                            f"{args.tune_budget:g}", "--store", str(store)], cwd=ROOT, env=env,
                           check=True, capture_output=True)
        rounds: dict[str, list[dict]] = {"in-process": [], "served": []}
        for k in range(args.rounds):
            for way in (("in-process", "served") if k % 2 == 0 else ("served", "in-process")):
                if way == "in-process":
                    out = subprocess.run(
                        [sys.executable, __file__, "--child", str(args.model), str(args.data),
                         str(store), str(args.concurrency), str(args.duration)],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
                    if out.returncode:
                        raise SystemExit(f"in-process failed: {out.stderr[-2000:]}")
                    got = json.loads(out.stdout.strip().splitlines()[-1])
                else:
                    got = served(args.model, args.data, store, args.shape, args.concurrency,
                                 args.duration)
                rounds[way].append(got)
                print(f"round {k + 1} {way}: {got['throughput']:.1f} requests/s, p50 "
                      f"{got['p50_ms']:.1f} ms, p99 {got['p99_ms']:.1f} ms, errors "
                      f"{got['errors']}", flush=True)
    med = {w: statistics.median(r["throughput"] for r in rs) for w, rs in rounds.items()}
    print(f"\n{args.concurrency} clients, mixed shapes ({args.data}), medians of {args.rounds} "
          f"rounds: in-process {med['in-process']:.1f} requests/s, served "
          f"{med['served']:.1f} requests/s: {med['served'] / med['in-process']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(rounds, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
