"""The tools' output corpus, side by side with onnxruntime on the same file (issue 52): each model
of ``tests/models/tools/manifest.json`` (the committed small ones; ``--real`` adds the real-weight
MiniLM variants when ``make_tools_corpus.py --bench`` has written them) tuned into the bench's own
store, then replayed by its stored plan and by a plain onnxruntime session, each way in a process
of its own, ways alternating by round.

    python bench/tools_bench.py [--rounds 3] [--budget 20] [--requests 200] [--json out.json]
    python bench/tools_bench.py --models bert_opt,cnn_static_qop --real

Each way is one ``opdispatch run MODEL --data REQUESTS --json FILE`` process (:mod:`tuner.replay`;
``--library onnxruntime`` for the plain session: default session options, intra-op threads =
usable cores, as a user runs the file). The requests: ``--requests`` seeded feeds of the
manifest's shape (``make_tools_corpus.make_feeds``), one shape per model, so the second pass is
the steady state. The plan is tuned at that shape with ``opdispatch tune --budget``.

Prints per model the medians over the rounds of the second pass (seconds, p50 ms) of both ways,
the ratio plan / onnxruntime, and the plan's summary line from ``opdispatch tune``. Run it on a
quiet machine (no build, test or other benchmark at the same time) and name the CPU with the
figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make ``bench`` and ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.shapes_bench import ROOT, _cpu, _run, replay_once
from tests.models.tools.make_tools_corpus import make_feeds

TOOLS = ROOT / "tests" / "models" / "tools"
WAYS = ("plan", "onnxruntime")


def corpus(real: bool) -> dict[str, dict[str, Any]]:
    """The manifest's models that exist here: the committed ones, and with ``real`` the
    real-weight ones in the user's cache."""
    models = json.loads((TOOLS / "manifest.json").read_text())["models"]
    out = {}
    for name, entry in models.items():
        path = TOOLS / entry["file"] if entry["committed"] else Path(os.path.expanduser(entry["file"]))
        if (entry["committed"] or real) and path.exists():
            out[name] = {**entry, "path": path}
    return out


def write_requests(entry: dict[str, Any], n: int, folder: Path) -> tuple[Path, list[str]]:
    """``n`` seeded requests of the manifest's shape as one ``.npz`` (first axis = requests) and
    the ``--shape`` options of that shape."""
    feeds = [make_feeds(entry["inputs"], entry.get("dims", {}), seed) for seed in range(n)]
    path = folder / "requests.npz"
    np.savez(path, **{k: np.stack([f[k] for f in feeds]) for k in feeds[0]})
    shapes = [f"{k}={'x'.join(str(d) for d in v.shape)}" for k, v in feeds[0].items()]
    return path, shapes


def tune(model: Path, shapes: list[str], budget: float, store: Path) -> str:
    """Tune ``model`` at ``shapes`` into ``store``; the tuner's last line (the winner)."""
    cmd = [sys.executable, "-m", "tuner.cli", "tune", str(model), "--budget", f"{budget:g}",
           "--store", str(store), "--no-progress"]
    for s in shapes:
        cmd += ["--shape", s]
    proc = _run(cmd)
    if proc.returncode != 0:
        raise RuntimeError(f"tuning {model.name} failed: {proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""


def _median(rounds: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r["passes"][1][key] for r in rounds)


def table(results: dict[str, dict[str, list[dict[str, Any]]]], tuned: dict[str, str]) -> str:
    """One markdown row per model: second-pass medians of both ways and their ratio."""
    rows = ["| model | plan s | onnxruntime s | plan / onnxruntime | plan p50 ms | onnxruntime p50 ms "
            "| tuned |", "|---|---:|---:|---:|---:|---:|---|"]
    for name, ways in results.items():
        plan, ort = _median(ways["plan"], "seconds"), _median(ways["onnxruntime"], "seconds")
        rows.append(f"| {name} | {plan:.3f} | {ort:.3f} | {plan / ort:.2f} | "
                    f"{_median(ways['plan'], 'p50_ms'):.3f} | "
                    f"{_median(ways['onnxruntime'], 'p50_ms'):.3f} | {tuned[name][:90]} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma-separated names (default: all present)")
    parser.add_argument("--real", action="store_true",
                        help="add the real-weight MiniLM variants (make_tools_corpus.py --bench)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=20.0, metavar="S")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    models = corpus(args.real)
    wanted = [m.strip() for m in args.models.split(",") if m.strip()] or list(models)
    unknown = sorted(set(wanted) - set(models))
    if unknown:
        parser.error(f"unknown or absent models {unknown}; present: {', '.join(models)}")
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    tuned: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="tools-bench-") as tmp:
        store = Path(tmp) / "plans.sqlite"
        for name in wanted:
            entry = models[name]
            folder = Path(tmp) / name
            folder.mkdir()
            data, shapes = write_requests(entry, args.requests, folder)
            tuned[name] = tune(entry["path"], shapes, args.budget, store)
            print(f"{name}: tuned at {' '.join(shapes)}: {tuned[name]}", flush=True)
            results[name] = {w: [] for w in WAYS}
            for k in range(args.rounds):
                for way in WAYS if k % 2 == 0 else tuple(reversed(WAYS)):  # alternating
                    got = replay_once(way, entry["path"], data, store)
                    results[name][way].append(got)
                    print(f"  round {k + 1} {way}: second pass {got['passes'][1]['seconds']:.3f} s",
                          flush=True)
    print(f"\n{_cpu()}, {os.cpu_count()} cores; {args.requests} requests per model, one shape each; "
          f"medians of {args.rounds} round(s) of the second pass, each way in a process of its own; "
          f"plans tuned within {args.budget:g} s")
    print(table(results, tuned))
    if args.json:
        args.json.write_text(json.dumps({"cpu": _cpu(), "tuned": tuned, "results": results},
                                        indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
