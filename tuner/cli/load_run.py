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
from collections.abc import Callable, Mapping
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
    r.add_argument("--data", default=None, metavar="REQUESTS",
                   help="replay these requests one at a time, twice (first pass: every shape new "
                        "to the process; second: every shape seen), and print throughput and "
                        "p50/p90/p99 per pass, for the plan or, with --library onnxruntime or "
                        "openvino-latency, a plain library: an .npz of arrays named like the "
                        "inputs (first axis = requests) or a folder of them, one file per shape. "
                        "With --accuracy: the data the plan was tuned on (its digest names the "
                        "plan)")
    r.add_argument("--concurrency", type=positive_int, default=None, metavar="N",
                   help="measure under load: N requests in flight from N threads for --duration "
                        f"seconds (default {DEFAULT_WINDOW_S:g}); prints throughput and p50/p90/p99. "
                        "Runs the stored plan of --objective, by default throughput@n=N (else the "
                        "latency plan, said so)")
    r.add_argument("--library", default=None, metavar="SETUP",
                   help="with --concurrency or --data: measure a plain library instead of the "
                        "plan (under load: onnxruntime, onnxruntime-per-request, openvino-latency, "
                        "openvino-throughput; a replay: onnxruntime, openvino-latency)")


def objective_for(args: argparse.Namespace) -> Objective:
    """The objective of the stored plan ``opdispatch run`` uses (``--objective``, else
    ``throughput@n=N`` with ``--concurrency N``, else latency; ``--accuracy`` on ``--data`` in
    place of any accuracy part)."""
    from dispatch.errors import ArgumentError
    from dispatch.objective import AccuracyTarget, Objective, parse_accuracy

    accuracy, data = getattr(args, "accuracy", None), getattr(args, "data", None)
    if accuracy is not None and data is None:
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
    if replays(args):
        if args.concurrency is not None or args.runs is not None or args.output or args.input:
            raise UsageError("--data replays its requests one at a time, twice; --concurrency, "
                             "--runs, --output and --input go with runs of one set of feeds")
        return
    if args.library is not None and args.concurrency is None:
        raise UsageError("--library measures a plain library under load: give --concurrency N "
                         "too (or replay requests through it: give --data REQUESTS)")
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


def _write_json(args: argparse.Namespace, payload: dict[str, Any]) -> None:
    """``--json FILE`` (``-``: standard output): the figures for machines."""
    if not args.json:
        return
    text = json.dumps(payload, indent=2)
    if args.json == "-":
        print(text)
        return
    with open(args.json, "w") as f:
        f.write(text + "\n")
    print(f"results written to {args.json}")


def _report(args: argparse.Namespace, what: str, result: Any) -> int:
    human = sys.stderr if args.json == "-" else sys.stdout
    print(f"{what}\n{result.describe()}", file=human)
    _write_json(args, {"model": args.model, "what": what, **result.to_dict()})
    if result.errors:
        print(f"opdispatch run: error: {result.errors} request(s) failed: {result.error}",
              file=sys.stderr)
        return 1
    return 0


def _max_rss_mb() -> float:
    """The process's peak resident memory so far, in MB (Linux reports kB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def replays(args: argparse.Namespace) -> bool:
    """Whether ``opdispatch run`` replays ``--data`` (given without ``--accuracy``)."""
    return getattr(args, "data", None) is not None and getattr(args, "accuracy", None) is None


def run_replay(args: argparse.Namespace, session: Callable[[], Any]) -> int:
    """``--data REQUESTS``: the requests replayed one at a time, twice, on the plan
    (``session()`` makes the Session) or with ``--library`` a plain library
    (:mod:`tuner.replay`)."""
    from dispatch.errors import ArgumentError, OpDispatchError
    from dispatch.input_shapes import declared_in_file
    from tuner.replay import LIBRARIES, library_call, pass_dicts, read_requests, replay

    human = sys.stderr if args.json == "-" else sys.stdout
    sess = None
    try:
        if args.library is not None:
            if args.library not in LIBRARIES:
                raise UsageError(f"unknown --library {args.library!r} for a replay; known: "
                                 + "; ".join(f"{k} ({v})" for k, v in LIBRARIES.items()))
            requests = read_requests(args.data, declared_in_file(args.model))
            call = library_call(args.model, args.library)
            what = f"plain {args.library}: {LIBRARIES[args.library]}"
        else:
            sess = session()
            requests = read_requests(args.data, sess.declared)
            if sess.graph is None:  # symbolic inputs: loaded for the first request's shapes,
                # before the clock starts, as a library's session is built before it
                sess.for_shapes({k: v.shape for k, v in requests[0].items()})
            run = sess.run
            call = lambda feeds: run(None, feeds)  # noqa: E731
            what = (f"plan ({sess.plan_source}, objective {sess.objective}, loaded in "
                    f"{sess.load_seconds:.2f} s): {sess.plan_note}")
    except ArgumentError as exc:
        raise UsageError(str(exc)) from None
    except OpDispatchError as exc:
        raise UsageError(str(exc)) from None
    passes = replay(call, requests)
    if sess is not None and sess.plan is not None:  # symbolic inputs: the first shape's plan
        print(sess.describe(), file=human)
    print(f"{what}\n" + "\n".join(p.describe() for p in passes), file=human)
    _write_json(args, {"model": args.model, "what": what, "data": str(args.data),
                       "load_s": None if sess is None else round(sess.load_seconds, 4),
                       "max_rss_mb": round(_max_rss_mb(), 1),
                       "passes": pass_dicts(passes)})
    failed = [p for p in passes if p.errors]
    if failed:
        print(f"opdispatch run: error: {failed[0].errors} request(s) failed: {failed[0].error}",
              file=sys.stderr)
        return 1
    return 0

