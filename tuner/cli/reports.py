"""``opdispatch report``, ``opdispatch explain`` and ``opdispatch profile``.

Each finds the model's plan the way a production Session would (the plan stored under the key
of this machine, software, backends and objective), or the stored plan ``--plan ID`` of the
same model, or with ``--untuned`` the heuristic plan; the store is opened read-only and never
created. The heavy lifting is in :mod:`tuner.report`, imported only when a command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatch.errors import OpDispatchError
from tuner.cli.args import non_negative_int, parse_shape, positive_int, store_path

if TYPE_CHECKING:
    from tuner.report import LocatedPlan
    from tuner.store import PlanStore


#: ``--format`` choices (kept here so that building the parser imports no pandas).
REPORT_FORMATS = ("text", "markdown", "csv", "json", "html")
EXPLAIN_FORMATS = ("text", "markdown", "csv", "json")


class ReportUsageError(OpDispatchError):
    """A ``report``/``explain``/``profile`` argument could not be understood."""


@contextlib.contextmanager
def _located(args: argparse.Namespace) -> Iterator[tuple[LocatedPlan, PlanStore | None]]:
    """The plan the arguments name, with the store it came from (open while in use)."""
    from tuner.report import locate_plan
    from tuner.store import PlanStore

    model = Path(args.model)
    if not model.is_file():
        raise ReportUsageError(f"model {args.model!r} does not exist (expected an .onnx file)")
    shapes = dict(parse_shape(s) for s in args.shape or [])
    backends = [b.strip() for b in args.backends.split(",") if b.strip()] if args.backends else None
    path = store_path(args.store)
    store = None
    if Path(path).is_file():
        store = PlanStore(path, readonly=True)
    elif not args.untuned:
        raise ReportUsageError(
            f"no plan store at {path} (tune the model first: `opdispatch tune {args.model} "
            f"--store {path}`, or use --untuned for the heuristic plan)")
    try:
        located = locate_plan(str(model), store, objective=args.objective, backends=backends,
                              plan_id=args.plan, untuned=args.untuned,
                              input_shapes=shapes or None)
        yield located, store
    finally:
        if store is not None:
            store.close()


def _write(text: str, output: str | None, what: str) -> None:
    if output is None or output == "-":
        sys.stdout.write(text)
        return
    out = Path(output)
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ReportUsageError(f"cannot write {what} to {str(out)!r}: {exc}") from None
    print(f"{what} written to {out}", file=sys.stderr)


def _report(args: argparse.Namespace) -> Any:
    from tuner.report import build_report

    with _located(args) as (located, store):
        rep = build_report(located.plan, located.graph, store=store, registry=located.registry,
                           stored=located.stored, key=located.key)
        rep.notes.insert(0, located.note)
        return rep, located


def _range_report(args: argparse.Namespace) -> str | None:
    """The report of the model's range plans when the arguments name some (a range in
    ``--shape``, ``--plan`` of a range plan, or a symbolic model with range plans stored and
    no ``--shape``), else ``None``."""
    from tuner.cli.range_tune import range_shapes
    from tuner.report.range_report import RANGE_FORMATS, range_report_data, render_range_report
    from tuner.shapes.tune_range import RANGE_PREFIX, model_family, stored_range_plans
    from tuner.store import PlanStore

    spec = range_shapes(args.shape or [])
    path = store_path(args.store)
    if (args.shape and spec is None) or args.untuned or not Path(path).is_file():
        return None
    with PlanStore(path, readonly=True) as store:
        if args.plan is not None:
            chosen = [p for p in store.all_plans() if p.id == args.plan
                      and p.key.inputs.startswith(RANGE_PREFIX)]
            if not chosen:
                return None
        else:
            from dispatch.errors import OpDispatchError
            from dispatch.input_shapes import declared_in_file
            from dispatch.shape_range import ShapeRange
            from tuner.shapes.tune_range import model_family

            try:
                family = model_family(args.model)
            except OpDispatchError:
                return None
            chosen = stored_range_plans(store, family)
            if spec is not None:
                try:
                    text = ShapeRange.bind(declared_in_file(args.model), spec).text()
                except OpDispatchError as exc:
                    raise ReportUsageError(str(exc)) from None
                stored = [p.key.inputs[len(RANGE_PREFIX):] for p in chosen]
                chosen = [p for p in chosen if p.key.inputs == RANGE_PREFIX + text]
                if not chosen:
                    raise ReportUsageError(
                        f"no range plan in {path} for {text}; ranges stored for this model: "
                        + (" | ".join(stored) or "none (opdispatch tune MODEL --shape "
                                                   "NAME=1x1..512)"))
            if not chosen:
                return None
    if args.format not in RANGE_FORMATS:
        raise ReportUsageError(f"a range plan's report comes as {', '.join(RANGE_FORMATS)}; "
                               f"received --format {args.format}")
    return render_range_report([range_report_data(p.id, p.key, p.plan().range_plan(),
                                                  p.created_at) for p in chosen], args.format)


def cmd_report(args: argparse.Namespace) -> int:
    """The report of the model's plan in the chosen format."""
    ranged = _range_report(args)
    if ranged is not None:
        _write(ranged, args.output, f"{args.format} report")
        return 0
    rep, _ = _report(args)
    if args.format == "html" and args.output is None:
        raise ReportUsageError("--format html writes a file: give -o REPORT.html")
    _write(rep.render(args.format, rejected=args.rejected or args.details, details=args.details,
                      wide=args.wide), args.output, f"{args.format} report")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    """Every candidate for one node, its measurements, and why it won or lost."""
    from tuner.report import render_explain

    rep, _ = _report(args)
    _write(render_explain(rep, args.node, args.format, details=args.details), args.output,
           "explanation")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    """A Chrome-trace / Perfetto JSON of real runs of the plan."""
    from tuner.report import aligned, fmt_ms, profile_trace

    if args.runs < 1:
        raise ReportUsageError(f"--runs expects a positive number of runs, received {args.runs}")
    rep, located = _report(args)
    trace = profile_trace(located.graph, located.plan, located.registry, runs=args.runs,
                          warmup=args.warmup, seed=args.seed)
    out = Path(args.output or f"{Path(args.model).stem}.trace.json")
    try:
        out.write_text(json.dumps(trace, allow_nan=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise ReportUsageError(f"cannot write the trace to {str(out)!r}: {exc}") from None
    other = trace["otherData"]
    tuned = {}
    for r in rep.table.itertuples(index=False):
        if r.kind == "node" and r.median_ms == r.median_ms:
            tuned[int(r.step)] = r.median_ms
        elif r.kind == "converter" and r.when == "run":
            tuned[r.name] = r.median_ms
    calls = sorted(other["calls"], key=lambda c: -c["median_ms"])
    rows = [["call", "kind", "implementation", "backend", "in plan ms", "tuner ms"]]
    for c in calls[: args.top]:
        key = c["step"] if c["step"] is not None else c["label"]
        rows.append([c["label"], c["kind"], c["impl"], c["backend"], fmt_ms(c["median_ms"]),
                     fmt_ms(tuned.get(key))])
    print(f"{located.note}: {args.runs} run(s), median {other['median_run_ms']:.3f} ms, peak "
          f"{other['peak_bytes']:,} bytes; {len(trace['traceEvents'])} trace events written to "
          f"{out} (open in https://ui.perfetto.dev or chrome://tracing)")
    print(f"\nslowest {min(args.top, len(calls))} of {len(calls)} call(s) (median in the plan vs "
          f"the tuner's isolated measurement):")
    print(aligned(rows, max_width=50, numeric=(4, 5)))
    return 0


# ------------------------------------------------------------------------------------------
# parsers
# ------------------------------------------------------------------------------------------


def _plan_args(q: argparse.ArgumentParser) -> None:
    q.add_argument("model", help="path of an .onnx model")
    q.add_argument("--store", default=None, help="plan store (default: the configured store_path)")
    q.add_argument("--objective", default="latency",
                   help="objective of the stored plan: latency, memory or latency@cap=BYTES")
    q.add_argument("--backends", help="the backends the plan was tuned with, if not every "
                                      "available one (e.g. numpy,native)")
    q.add_argument("--plan", type=int, default=None, metavar="ID",
                   help="a stored plan of this model by id (see `opdispatch plans list`), e.g. "
                        "one tuned on another machine")
    q.add_argument("--untuned", action="store_true",
                   help="the heuristic (untuned) plan, with this machine's stored measurements")
    q.add_argument("--shape", action="append", metavar="NAME=1x3x224x224",
                   help="static shape for an input")


def add_parsers(sub: Any) -> None:
    """Add ``report``, ``explain`` and ``profile`` to the ``opdispatch`` subparsers ``sub``."""
    q = sub.add_parser("report", help="what runs where, what it cost, what lost and why (text, "
                                      "markdown, csv, json or one self-contained html file)")
    _plan_args(q)
    q.add_argument("--format", choices=REPORT_FORMATS, default="text")
    q.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout "
                                                          "(required for html)")
    q.add_argument("--rejected", action="store_true",
                   help="text format: also list every rejected candidate with its reason")
    q.add_argument("--details", action="store_true",
                   help="each rejected candidate with the whole alternative it stands for (every "
                        "term of its cost), not only the one-line reason (text: implies --rejected)")
    q.add_argument("--wide", action="store_true",
                   help="text format: every column, nothing wrapped (default: the main columns, "
                        "fitted to the terminal)")
    q.set_defaults(fn=cmd_report)

    q = sub.add_parser("explain", help="every candidate for one node, its measurements, and why "
                                       "it won or lost")
    _plan_args(q)
    q.add_argument("--node", required=True, metavar="NAME", help="node name (see `report`)")
    q.add_argument("--format", choices=EXPLAIN_FORMATS, default="text")
    q.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    q.add_argument("--details", action="store_true",
                   help="every candidate one by one, every column, with the whole alternative "
                        "each stands for (default: the chosen one and the best few, the rest "
                        "counted by verdict)")
    q.set_defaults(fn=cmd_explain)

    q = sub.add_parser("profile", help="run the plan and write a Chrome-trace / Perfetto JSON: "
                                       "one event per node step and converter, one track per "
                                       "backend")
    _plan_args(q)
    q.add_argument("-o", "--output", default=None, metavar="TRACE.json",
                   help="trace to write (default: MODEL.trace.json in the current folder)")
    q.add_argument("--runs", type=int, default=5, help="traced runs (default 5)")
    q.add_argument("--warmup", type=non_negative_int, default=1, help="untraced runs first (default 1)")
    q.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    q.add_argument("--top", type=positive_int, default=15, help="slowest calls printed (default 15)")
    q.set_defaults(fn=cmd_profile)
