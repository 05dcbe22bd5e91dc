"""Mixed-shape traffic, side by side (issue 51): the same real requests replayed one at a time by
the plan and by plain libraries, each way in a process of its own, ways alternating by round.

    python bench/models/shapes_models.py                     # the model and the requests, once
    python bench/shapes_bench.py [--rounds 3] [--tune-budget 60] [--json out.json]

Each way is one ``opdispatch run MODEL --data REQUESTS --json FILE`` process (:mod:`tuner.replay`:
the requests in file order, twice; the first pass meets every shape for the first time in the
process, the second meets only shapes seen before):

* ``plan``: the stored plan of the model (with ``--tune-budget S``: first tuned at the shape
  ``--tune-shape``, default ``input_ids=1x128``, into the bench's own store; a range such as
  ``input_ids=1x1..128`` tunes one range plan, sampling the requests' shapes; without it, the
  untuned plan), i.e. a Session of the model with symbolic inputs, loaded before the clock
  starts (its load time is a column of its own);
* ``onnxruntime``, ``openvino-latency``: :data:`tuner.replay.LIBRARIES`;
* ``--plan-of NAME=PATH`` (repeatable): a way ``NAME`` that replays the stored plan of another
  file of the same model (``model_optimized.onnx``, a 4-bit variant...), tuned as ``plan`` is,
  so that two files' tuned plans are timed side by side (the ``x plan`` column).

Prints, per way, the medians over the rounds of each pass's seconds, requests/s and p50/p99, and
the ratio of each pass's time to onnxruntime's; ``--json`` writes every round's figures.
Run it on a quiet machine (no build, test or other benchmark at the same time) and name the CPU
with the figures.
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
DEFAULT_DIR = Path.home() / ".cache" / "opdispatch" / "bench-models" / "shapes"
WAYS = ("plan", "onnxruntime", "openvino-latency", "openvino-default")


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)


def replay_once(way: str, model: Path, data: Path, store: Path,
                objective: str = "latency", plan: bool = False) -> dict[str, Any]:
    """One way in a process of its own: its replay's JSON (the stored plan of ``model`` when
    ``way`` is ``plan`` or ``plan`` is true, else the library ``way``)."""
    with tempfile.TemporaryDirectory(prefix="shapes-bench-") as tmp:
        out = Path(tmp) / "replay.json"
        cmd = [sys.executable, "-m", "tuner.cli", "run", str(model), "--data", str(data),
               "--store", str(store), "--json", str(out)]
        if not (plan or way == "plan"):
            cmd += ["--library", way]
        else:
            cmd += ["--objective", objective]
        proc = _run(cmd)
        if proc.returncode != 0:
            raise RuntimeError(f"{way}: exit {proc.returncode}: {proc.stderr[-2000:]}")
        return json.loads(out.read_text())


def _median(rounds: list[dict[str, Any]], k: int, key: str) -> float:
    return statistics.median(r["passes"][k][key] for r in rounds)


def table(results: dict[str, list[dict[str, Any]]], plans: dict[str, Path] | None = None) -> str:
    """The medians per way and the ratios to onnxruntime (first pass, p99) and to the faster
    library (second pass), as a markdown table; with ways of other files' plans (``plans``),
    the second pass also as a ratio to ``plan``'s."""
    plans = plans or {}
    base = results.get("onnxruntime")
    libs = [w for w in results if w != "plan" and w not in plans]
    best2 = min((_median(results[w], 1, "seconds") for w in libs), default=None)
    own = _median(results["plan"], 1, "seconds") if plans and results.get("plan") else None
    rows = ["| way | first pass s | x onnxruntime | p50 ms | p99 ms | p99 x onnxruntime | "
            "second pass s | x onnxruntime | x faster library | " + ("x plan | " if own else "")
            + "plan load s | peak RSS MB |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if own else "") + "---:|---:|"]
    for way, rounds in results.items():
        first, second = _median(rounds, 0, "seconds"), _median(rounds, 1, "seconds")
        p99 = _median(rounds, 0, "p99_ms")
        r1 = f"{first / _median(base, 0, 'seconds'):.2f}" if base else "-"
        r2 = f"{second / _median(base, 1, 'seconds'):.2f}" if base else "-"
        rp = f"{p99 / _median(base, 0, 'p99_ms'):.2f}" if base else "-"
        rb = f"{second / best2:.2f}" if best2 else "-"
        loads = [r.get("load_s") for r in rounds if r.get("load_s") is not None]
        load = f"{statistics.median(loads):.2f}" if loads else "-"
        rss = [r.get("max_rss_mb") for r in rounds if r.get("max_rss_mb") is not None]
        peak = f"{statistics.median(rss):.0f}" if rss else "-"
        rx = f"{second / own:.2f} | " if own else ""
        rows.append(f"| {way} | {first:.3f} | {r1} | {_median(rounds, 0, 'p50_ms'):.2f} | "
                    f"{p99:.2f} | {rp} | {second:.3f} | {r2} | {rb} | {rx}{load} | {peak} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_DIR / "minilm_dyn.onnx")
    parser.add_argument("--data", type=Path, default=DEFAULT_DIR / "minilm_requests")
    parser.add_argument("--ways", default=",".join(WAYS[:3]),
                        help=f"among {', '.join(WAYS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tune-budget", type=float, default=None, metavar="S")
    parser.add_argument("--tune-shape", default="input_ids=1x128")
    parser.add_argument("--tune-args", default="", metavar="'ARGS'",
                        help="more options for opdispatch tune (e.g. '--warm-max-shapes 701')")
    parser.add_argument("--tune-accuracy", default=None, metavar="METRIC:BUDGET",
                        help="tune with this accuracy budget on the requests (a range plan may "
                             "then take reduced precision per bucket)")
    parser.add_argument("--store", type=Path, default=None,
                        help="the plan store (default: a new one in a temporary folder)")
    parser.add_argument("--plan-of", action="append", default=[], metavar="NAME=PATH",
                        help="also replay the tuned plan of another file of the model as way NAME")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    plans: dict[str, Path] = {}
    for spec in args.plan_of:
        name, sep, path = spec.partition("=")
        if not sep or not name or name in WAYS or name in plans:
            parser.error(f"--plan-of takes NAME=PATH with a new way's name, received {spec!r}")
        plans[name] = Path(path).expanduser()
    for path in (args.model, args.data, *plans.values()):
        if not path.exists():
            parser.error(f"{path} does not exist: run python bench/models/shapes_models.py first")
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    unknown = sorted(set(ways) - set(WAYS))
    if unknown:
        parser.error(f"unknown ways {unknown}; known: {', '.join(WAYS)}")
    if plans and "plan" not in ways:
        ways.insert(0, "plan")
    ways += list(plans)
    models = {w: plans.get(w, args.model) for w in ways}
    with tempfile.TemporaryDirectory(prefix="shapes-store-") as tmp:
        store = args.store or Path(tmp) / "plans.sqlite"
        summaries: dict[str, str] = {}
        for way in (w for w in ways if args.tune_budget is not None and (w == "plan" or w in plans)):
            cmd = [sys.executable, "-m", "tuner.cli", "tune", str(models[way]), "--shape",
                   args.tune_shape, "--budget", f"{args.tune_budget:g}", "--store", str(store),
                   "--no-progress"]
            if ".." in args.tune_shape:  # a range plan samples the requests' shapes
                cmd += ["--data", str(args.data)]
            if args.tune_accuracy:
                cmd += ["--accuracy", args.tune_accuracy]
            cmd += args.tune_args.split()
            proc = _run(cmd)
            if proc.returncode != 0:
                raise SystemExit(f"tuning failed: {proc.stderr[-2000:]}")
            summaries[way] = proc.stdout.strip().splitlines()[-1]
            print(proc.stdout[-3000:], flush=True)
            print(f"{way} tuned at {args.tune_shape} within {args.tune_budget:g} s: {summaries[way]}",
                  flush=True)
        objective = "latency"
        if args.tune_accuracy:
            sys.path.insert(0, str(ROOT))
            from tuner.accuracy.data import data_digest

            objective = f"latency+accuracy={args.tune_accuracy},data={data_digest(args.data)}"
        results: dict[str, list[dict[str, Any]]] = {w: [] for w in ways}
        for k in range(args.rounds):
            order = ways if k % 2 == 0 else list(reversed(ways))  # alternating
            for way in order:
                got = replay_once(way, models[way], args.data, store, objective, plan=way in plans)
                results[way].append(got)
                p1, p2 = got["passes"]
                print(f"round {k + 1} {way}: first pass {p1['seconds']:.3f} s, second pass "
                      f"{p2['seconds']:.3f} s, p99 {p1['p99_ms']:.2f} ms", flush=True)
    first = next(iter(results.values()))[0]["passes"][0]
    print(f"\n{_cpu()}, {os.cpu_count()} cores; {first['requests']} requests of {first['shapes']} "
          f"shapes ({args.data}); medians of {args.rounds} round(s), each way in a process of "
          f"its own" + (f"; plan tuned at {args.tune_shape} within {args.tune_budget:g} s"
                        if summaries else "; the plan untuned"))
    print(table(results, plans))
    if args.json:
        args.json.write_text(json.dumps({"cpu": _cpu(), "tuned": summaries, "rounds": results},
                                        indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
