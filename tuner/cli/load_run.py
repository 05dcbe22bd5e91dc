"""``opdispatch run MODEL --concurrency N [--duration S] [--library SETUP]``: a model under
load, measured as OpenVINO's ``benchmark_app`` does (N requests in flight from N threads, each
sending the next as soon as the last returned; throughput and latency percentiles over a fixed
window: :func:`tuner.throughput.load.run_load`), for the stored plan or for a plain library set up as its
users set it up (:mod:`tuner.throughput.library_load`), so that anyone can check a throughput claim.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.cli.args import UsageError, positive_int

if TYPE_CHECKING:
    from dispatch.objective import Objective

#: the measured window when ``--duration`` is not given, seconds
DEFAULT_WINDOW_S = 10.0


def add_arguments(r: argparse.ArgumentParser) -> None:
    """The load options of ``opdispatch run``."""
    r.add_argument("--accuracy", default=None, metavar="METRIC:BUDGET",
                   help="run the plan tuned with this accuracy objective on --data (tune --accuracy)")
    r.add_argument("--data", default=None, metavar="FILE.npz",
                   help="with --accuracy: the data the plan was tuned on (its digest names the plan)")
    r.add_argument("--concurrency", type=positive_int, default=None, metavar="N",
                   help="measure under load: N requests in flight from N threads for --duration "
                        f"seconds (default {DEFAULT_WINDOW_S:g}); prints throughput and p50/p90/p99. "
                        "Runs the stored plan of --objective, by default throughput@n=N (else the "
                        "latency plan, said so)")
    r.add_argument("--library", default=None, metavar="SETUP",
                   help="with --concurrency: measure a plain library instead of the plan "
                        "(onnxruntime, onnxruntime-per-request, openvino-latency, "
                        "openvino-throughput)")


def objective_for(args: argparse.Namespace) -> Objective:
    """The objective of the stored plan ``opdispatch run`` uses (``--objective``, else
    ``throughput@n=N`` with ``--concurrency N``, else latency; ``--accuracy`` on ``--data`` in
    place of any accuracy part)."""
    from dispatch.errors import ArgumentError
    from dispatch.objective import AccuracyTarget, Objective, parse_accuracy

    accuracy, data = getattr(args, "accuracy", None), getattr(args, "data", None)
    if (accuracy is None) != (data is None):
        raise UsageError("--accuracy METRIC:BUDGET and --data FILE.npz go together: the plan was "
                         "tuned for that budget on that data")
    try:
        objective = Objective.parse(str(args.objective)) if args.objective is not None else (
            Objective("throughput", concurrency=args.concurrency) if args.concurrency
            else Objective())
        if accuracy is not None:
            from tuner.accuracy.data import data_digest
            from tuner.tune_types import TuningError

            try:
                metric, budget = parse_accuracy(accuracy)
                objective = objective.replace(
                    accuracy=AccuracyTarget(metric, budget, data_digest(data)))
            except TuningError as exc:
                raise UsageError(str(exc)) from None
    except ArgumentError as exc:
        raise UsageError(str(exc)) from None
    return objective.resolved()


def check(args: argparse.Namespace) -> None:
    """Refuse option combinations that make no sense, saying why."""
    if args.library is not None and args.concurrency is None:
        raise UsageError("--library measures a plain library under load: give --concurrency N too")
    if args.concurrency is not None and (args.runs is not None or args.output):
        raise UsageError("--concurrency measures for --duration seconds; --runs and --output "
                         "go with single runs")


def window(args: argparse.Namespace) -> float:
    return float(args.duration) if args.duration is not None else DEFAULT_WINDOW_S


def run_library(args: argparse.Namespace, given: Mapping[str, np.ndarray]) -> int:
    """``--library SETUP --concurrency N``: the plain library under load."""
    from tuner.throughput.library_load import SETUPS, measure_library, random_feeds

    if args.library not in SETUPS:
        raise UsageError(f"unknown --library {args.library!r}; known set-ups: "
                         + "; ".join(f"{k} ({v})" for k, v in SETUPS.items()))
    feeds = dict(random_feeds(args.model))
    unknown = sorted(set(given) - set(feeds))
    if unknown:
        raise UsageError(f"--input names {unknown}, which are not inputs of the model; its "
                         f"inputs are {sorted(feeds)}")
    feeds.update(given)
    result = measure_library(args.model, args.library, args.concurrency, window(args), feeds=feeds)
    return _report(args, f"plain {args.library}: {SETUPS[args.library]}", result)


def run_plan(args: argparse.Namespace, sess: Any, feeds: Mapping[str, np.ndarray], note: str) -> int:
    """``--concurrency N``: the session's plan under load, from N threads (a plan tuned to
    run requests in batches: in batches, :func:`tuner.throughput.batch.session_load`)."""
    from tuner.throughput.batch import session_load

    human = sys.stderr if args.json == "-" else sys.stdout
    print(sess.describe(), file=human)
    if note:
        print(note, file=human)
    result = session_load(sess, feeds, args.concurrency, window(args), warmup_s=0.5)
    serving = sess.plan.serving_config()
    how = serving.label() if serving is not None else "one executor, called from every thread"
    return _report(args, f"plan ({sess.plan_source}, objective {sess.objective}): {how}", result)


def _report(args: argparse.Namespace, what: str, result: Any) -> int:
    human = sys.stderr if args.json == "-" else sys.stdout
    print(f"{what}\n{result.describe()}", file=human)
    if args.json:
        text = json.dumps({"model": args.model, "what": what, **result.to_dict()}, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
            print(f"results written to {args.json}")
    if result.errors:
        print(f"opdispatch run: error: {result.errors} request(s) failed: {result.error}",
              file=sys.stderr)
        return 1
    return 0
