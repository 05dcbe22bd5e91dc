"""The ``opdispatch`` command line.

User errors (bad files, unknown names, unsupported models, ``run --require-plan`` without a
stored plan) print one clear message and exit with status 2, without a traceback; internal
failures keep their traceback. The ``plans`` commands live in :mod:`tuner.cli.plans`,
``report``/``explain``/``profile`` in :mod:`tuner.cli.reports`, the shared argument helpers in
:mod:`tuner.cli.args`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import tuner.cli.generate_cli as generate_cli
import tuner.cli.load_run as load_run
from dispatch.errors import OpDispatchError
from tuner.cli.args import (
    EXIT_INTERNAL_ERROR,
    EXIT_USER_ERROR,
    UsageError,
    non_negative_int,
    parse_input,
    parse_input_sets,
    parse_shape,
    parse_shape_sets,
    positive_int,
    positive_seconds,
    table,
)


def _random_feed(shape: Sequence[int], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 10, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    raise UsageError(f"cannot make random input of dtype {dtype}; pass it with --input")


def cmd_backends(args: argparse.Namespace) -> int:
    from dispatch.backend import load_registry
    from dispatch.config import Config

    cfg = Config.load({"plugin_path": args.plugin_path})
    reg = load_registry(cfg.plugin_path or None, order=cfg.backend_order)
    rows = [("backend", "status", "version", "layouts", "impls", "origin")]
    for name, st in reg.backends.items():
        status = "available" if st.available else f"unavailable: {st.reason}"
        rows.append((name, status, st.version or "-", ",".join(st.layouts) or "-",
                     str(st.implementations), st.origin))
    print(table(rows, max_width=70))
    unavailable = [(name, st) for name, st in reg.backends.items() if not st.available]
    if unavailable:  # the table cuts long reasons; here they are whole
        print()
        for name, st in unavailable:
            lost = getattr(st, "lost_to", None)
            print(f"{name}: unavailable: {st.reason}" + (f" (lost to {lost!r})" if lost else ""))
    if args.verbose:
        print()
        rows = [("implementation", "op", "backend", "priority", "description")]
        for impl in sorted(reg.implementations, key=lambda i: (i.op, i.backend, i.name)):
            rows.append((impl.name, impl.op, impl.backend, str(impl.priority), impl.doc))
        print(table(rows, max_width=60))
        print()
        rows = [("converter", "from", "to", "backend", "kind")]
        for convs in reg.layouts.converters.values():
            for c in convs:
                rows.append((c.name, c.src, c.dst, c.backend, "direct" if c.direct else "via standard"))
        print(table(rows))
    return 0


def cmd_ops(args: argparse.Namespace) -> int:
    """Every operator some backend implements: its kernels per backend, and the region
    backends (onnxruntime, OpenVINO) that accept it."""
    from dispatch.backend import load_registry
    from dispatch.config import Config
    from dispatch.fusion import REGION_OP
    from dispatch.onnx_import import MIN_OPSET

    cfg = Config.load({"plugin_path": args.plugin_path})
    reg = load_registry(cfg.plugin_path or None, order=cfg.backend_order)
    kernels: dict[str, dict[str, int]] = {}
    for impl in reg.implementations:
        if impl.op != REGION_OP and "+" not in impl.op:
            per = kernels.setdefault(impl.op, {})
            per[impl.backend] = per.get(impl.backend, 0) + 1
    regions = {name: st.backend.region_refusals() for name, st in reg.backends.items()
               if st.available and any(i.backend == name and i.op == REGION_OP for i in reg.implementations)}
    ops = sorted(kernels, key=str.lower)
    if args.op:
        # a name matches its operator in any domain (FastGelu: com.microsoft::FastGelu)
        names = {k: {k.lower(), k.split("::")[-1].lower()} for k in kernels}
        wanted = {o.lower() for o in args.op}
        unknown = sorted(o for o in args.op if not any(o.lower() in n for n in names.values()))
        if unknown:
            raise UsageError(f"no backend implements {', '.join(unknown)}; implemented: {', '.join(ops)}")
        ops = [o for o in ops if names[o] & wanted]
    rows = [("op", "kernels (backend: implementations)", "regions")]
    for op in ops:
        per = kernels[op]
        accepted = [name for name, refused in regions.items()
                    if op not in refused and _region_takes(reg.backends[name].backend, op)]
        rows.append((op, ", ".join(f"{b}: {n}" for b, n in sorted(per.items())),
                     ", ".join(accepted) or "-"))
    print(table(rows, max_width=70))
    fused = sorted({i.op for i in reg.implementations if "+" in i.op})
    domains: dict[str, int] = {}
    for op in ops:
        domain = op.split("::")[0] if "::" in op else ""
        domains[domain] = domains.get(domain, 0) + 1
    others = "".join(f", {n} of domain {d}" for d, n in sorted(domains.items()) if d)
    print(f"\n{domains.get('', 0)} operator(s) of ONNX's default domain, opsets {MIN_OPSET} to "
          f"{onnx_newest_opset()}{others}; fused patterns: {', '.join(fused) or '(none)'}")
    refusals = {(b, op): why for b, refused in regions.items() for op, why in refused.items()}
    if refusals and args.verbose:
        print("\nnever accepted in a region:")
        for (b, op), why in sorted(refusals.items()):
            print(f"  {b}: {op}: {why}")
    return 0


def _region_takes(backend: object, op: str) -> bool:
    """Whether a region backend's regions may take operator ``op`` (a registry key): every
    one of ONNX's default domain, of other domains only those it names (``region_extra_ops``)."""
    if "::" not in op:
        return True
    extra = getattr(backend, "region_extra_ops", None)
    return callable(extra) and op in extra()


def onnx_newest_opset() -> int:
    """The newest default-domain opset the installed onnx knows (the import accepts up to it)."""
    import onnx.defs

    return int(onnx.defs.onnx_opset_version())


def cmd_config(args: argparse.Namespace) -> int:
    from dispatch.config import Config

    cfg = Config.load()
    print(table([("setting", "value", "source", "meaning"), *cfg.rows()], max_width=70))
    print(f"\nconfig file: {cfg.config_file or cfg.config_note or '(none found)'}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from dispatch.input_shapes import bind
    from dispatch.session import Session

    generate_cli.check(args)
    if args.generate is not None:
        return generate_cli.cmd_run_generate(args)
    shapes = dict(parse_shape(s) for s in args.shape or [])
    given = dict(parse_input(s) for s in args.input or [])
    backends = [b.strip() for b in args.backends.split(",")] if args.backends else None
    t0 = time.perf_counter()
    if args.untuned and args.require_plan:
        raise UsageError("--untuned and --require-plan exclude each other: --untuned ignores "
                         "stored plans, --require-plan insists on one")
    load_run.check(args)
    store = False if args.untuned else args.store
    if load_run.replays(args):
        return load_run.run_replay(args, lambda: Session(
            args.model, backends=backends, input_shapes=shapes or None, store=store,
            objective=load_run.objective_for(args), require_plan=args.require_plan))
    if args.library is not None:
        return load_run.run_library(args, given)
    objective = load_run.objective_for(args)
    sess = Session(args.model, backends=backends, input_shapes=shapes or None, store=store,
                   objective=objective, require_plan=args.require_plan)
    note = ""
    if (args.concurrency and args.objective is None and not args.untuned
            and sess.plan_source not in ("store", "deferred")):
        note = (f"no plan stored for objective {objective} ({sess.plan_note}); running the "
                f"stored latency plan, if any (tune with --objective throughput --concurrency "
                f"{args.concurrency})")
        sess = Session(args.model, backends=backends, input_shapes=shapes or None, store=store)
    load_s = time.perf_counter() - t0
    _warn_broken_plugins(sess.registry)
    rng = np.random.default_rng(args.seed)
    unknown = sorted(set(given) - {i.name for i in sess.get_inputs()})
    if unknown:
        raise UsageError(
            f"--input names {unknown}, which are not inputs of the model; its inputs are "
            f"{[i.name for i in sess.get_inputs()]}"
        )
    # a model with symbolic inputs and no --shape: the --input arrays size the others
    sized = bind(sess.declared, {n: a.shape for n, a in given.items()}) if sess.graph is None else {}
    feeds = {}
    for inp in sess.get_inputs():
        shape = sized.get(inp.name, inp.shape)
        if inp.name not in given and any(not isinstance(d, int) for d in shape):
            raise UsageError(
                f"input {inp.name!r} has symbolic dimensions {inp.shape}; give its shape with "
                f"--shape {inp.name}=" + "x".join(str(d) if isinstance(d, int) else "N" for d in inp.shape)
                + f" (or its values with --input {inp.name}=FILE.npy)")
        feeds[inp.name] = given.pop(inp.name) if inp.name in given else _random_feed(shape, inp.dtype, rng)
    if args.concurrency is not None:
        return load_run.run_plan(args, sess, feeds, note)
    import tuner.cli.bench as bench

    before = sess.load_seconds
    sess.run(None, feeds)  # first run (plans a session whose shapes the feeds decide)
    load_s += sess.load_seconds - before
    times, outputs = bench.timed_runs(lambda: sess.run(None, feeds), runs=args.runs,
                                      duration_s=args.duration, warmup=max(0, args.warmup - 1))
    human = sys.stderr if args.json == "-" else sys.stdout  # stdout is the JSON's then
    print(sess.describe(), file=human)
    print(file=human)
    for info, arr in zip(sess.get_outputs(), outputs):
        print(f"output {info.name}: shape {list(arr.shape)} {arr.dtype}  mean "
              f"{float(np.mean(arr)) if arr.size else 0:.6g}", file=human)
    stats = bench.stats(times, bench.batch_of(feeds))
    stages = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in sess.startup.items())
    print(f"\nload+plan {load_s * 1e3:.1f} ms ({stages}); run median {stats['median_ms']:.2f} ms "
          f"over {stats['runs']} run(s)", file=human)
    print(bench.stats_text(stats, max(1, args.warmup)), file=human)
    if args.json:
        bench.write_json(args.json, bench.results(
            args.model, sess, stats, times, warmup=max(1, args.warmup), runs=args.runs,
            duration_s=args.duration, load_ms=load_s * 1e3, feeds=feeds))
        if args.json != "-":
            print(f"results written to {args.json}")
    if args.output:
        out = Path(args.output)
        out.mkdir(parents=True, exist_ok=True)
        for info, arr in zip(sess.get_outputs(), outputs):
            safe = info.name.replace("/", "_").replace("\\", "_")
            np.save(out / f"{safe}.npy", arr)
        (out / "plan.json").write_text(sess.plan.to_json())
        print(f"outputs and plan.json written to {out}/")
    return 0


def _warn_broken_plugins(registry) -> None:
    """One warning line per plugin-folder backend that failed to load (a typo in the folder,
    a module that does not import): the run goes on without it, and says so."""
    for label, status in registry.backends.items():
        if status.origin.startswith("plugin") and not status.available:
            warnings.warn(f"plugin backend {label} ({status.origin}) is unavailable: "
                          f"{status.reason}", RuntimeWarning, stacklevel=2)


def cmd_tune(args: argparse.Namespace) -> int:
    from dispatch.config import Config
    from dispatch.input_shapes import format_shapes
    from tuner.cli.range_tune import cmd_tune_range, range_shapes
    from tuner.tune import TuneOptions, tune

    generate_cli.check(args)
    if args.generate is not None:
        return generate_cli.cmd_tune_generate(args)
    spec, source = range_shapes(args.shape or []), "the --shape options"
    if spec is None and not args.shape and not args.inputs:
        from tuner.cli.range_tune import model_range

        found = model_range(args.model)
        if found is not None:
            spec, source = found.spec, found.source
    if spec is not None:
        return cmd_tune_range(args, spec, source)
    shape_sets = parse_shape_sets(args.shape or [])
    input_sets = parse_input_sets(args.inputs or [])
    if input_sets and (args.shape or []):
        raise UsageError("--inputs sets the shapes being tuned (those of its arrays); give "
                         "either --inputs or --shape, not both")
    by_shapes: dict[tuple, list[dict[str, np.ndarray]]] = {}
    for feeds in input_sets:  # one plan per input shape: each tuned on its own inputs
        key = tuple(sorted((k, tuple(v.shape)) for k, v in feeds.items()))
        by_shapes.setdefault(key, []).append(feeds)
    if input_sets:
        shape_sets = [{k: list(shape) for k, shape in key} for key in by_shapes]
    backends = [b.strip() for b in args.backends.split(",")] if args.backends else None
    config = Config.load({"store_path": args.store})
    budget = args.budget if args.budget is not None else config.tune_budget_s
    if args.objective != "throughput" and (args.concurrency or args.max_latency_ms):
        raise UsageError("--concurrency and --max-latency-ms go with --objective throughput, "
                         f"not --objective {args.objective}")
    opts = TuneOptions(
        budget_s=budget / len(shape_sets),
        objective=args.objective,
        memory_cap_bytes=args.memory_cap,
        concurrency=args.concurrency,
        max_latency_ms=args.max_latency_ms,
        top_k=args.top_k if args.top_k is not None else config.tune_top_k,
        backends=backends,
        progress=not args.no_progress,
        allow_nonstrict_nan=args.allow_nonstrict_nan,
        nonfinite_guard=not args.no_nonfinite_guard,
        accuracy=args.accuracy,
        accuracy_data=args.data,
    )
    if args.data is not None and args.accuracy is None:
        raise UsageError("--data goes with --accuracy METRIC:BUDGET (e.g. --accuracy cosine:0.999)")
    from dispatch.backend import load_registry

    registry = load_registry(config.plugin_path or None, order=config.backend_order)
    _warn_broken_plugins(registry)
    several = len(shape_sets) > 1
    from tuner.tune import objective_key

    print(f"tuning {args.model} (budget {budget:.0f} s"
          + (f", {opts.budget_s:.0f} s for each of {len(shape_sets)} input shapes" if several else "")
          + f", objective {objective_key(opts)}, store {config.store_path})", flush=True)
    failed = []
    for k, shapes in enumerate(shape_sets):
        if several:
            print(f"\n[{k + 1}/{len(shape_sets)}] input shapes {format_shapes(shapes)}", flush=True)
        given = list(by_shapes.values())[k] if input_sets else []
        result = tune(args.model, options=dataclasses.replace(opts, inputs=tuple(given)),
                      input_shapes=shapes or None, config=config, registry=registry,
                      log=lambda msg: print(msg, flush=True))
        print(result.summary())
        if result.plan_id is None:
            failed.append(f"{format_shapes(shapes) or 'the model'}: {result.store_error}")
    if failed:
        print("opdispatch tune: error: the tuned plan could not be stored: " + "; ".join(failed),
              file=sys.stderr)
        return EXIT_USER_ERROR
    return 0


def cmd_example(args: argparse.Namespace) -> int:
    import onnx

    from dispatch.zoo import light_model

    model = light_model(args.name, seed=args.seed)
    out = Path(args.output or f"{args.name}.onnx")
    onnx.save(model, str(out))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB): the {args.name} architecture from the "
          f"onnx package with seeded random weights (seed {args.seed})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from dispatch.zoo import LIGHT_MODELS
    from tuner.cli.plans import add_parser as add_plans_parser
    from tuner.cli.reports import add_parsers as add_report_parsers
    from tuner.cli.serve import add_parser as add_serve_parser

    p = argparse.ArgumentParser(prog="opdispatch",
                                description="Tuning-driven operator dispatcher for ONNX models.")
    from dispatch import __version__

    p.add_argument("--version", action="version", version=f"opdispatch {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("backends", help="list backends, their availability, layouts and implementations")
    b.add_argument("-v", "--verbose", action="store_true",
                   help="also list every implementation and converter")
    b.add_argument("--plugin-path", default=None, help="folders with plugin backends (os.pathsep-separated)")
    b.set_defaults(fn=cmd_backends)

    o = sub.add_parser("ops", help="list every supported operator with the backends that run it")
    o.add_argument("op", nargs="*", help="only these operators (case-insensitive)")
    o.add_argument("-v", "--verbose", action="store_true",
                   help="also list the operators region backends never accept, with why")
    o.add_argument("--plugin-path", default=None, help="folders with plugin backends (os.pathsep-separated)")
    o.set_defaults(fn=cmd_ops)

    c = sub.add_parser("config", help="print the effective configuration and where each value came from")
    c.set_defaults(fn=cmd_config)

    r = sub.add_parser("run", help="run a model with its stored (tuned) plan, else the untuned one, "
                                   "and show what ran where")
    r.add_argument("model", help="path of an .onnx model")
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="an input array (default: random)")
    r.add_argument("--shape", action="append", metavar="NAME=1x3x224x224", help="static shape for an input")
    r.add_argument("--output", metavar="DIR", help="write outputs (.npy) and the plan (JSON) here")
    r.add_argument("--backends", help="allowed backends in priority order, e.g. native,numpy")
    r.add_argument("--runs", "--repeat", dest="runs", type=positive_int, default=None, metavar="N",
                   help="timed runs (default 5 unless --duration; with --duration: at least N)")
    r.add_argument("--duration", type=positive_seconds, default=None, metavar="SECONDS",
                   help="time runs until this many seconds have passed (with --runs: until both "
                        "are reached)")
    r.add_argument("--warmup", type=non_negative_int, default=1, metavar="N",
                   help="untimed runs first (default 1; at least one is made: the first run "
                        "also plans)")
    r.add_argument("--json", metavar="FILE", default=None,
                   help="write the statistics (mean, median, p90, p95, p99, min, max, "
                        "throughput), every timed run, the plan's source and the inputs as JSON "
                        "('-' for stdout)")
    r.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    r.add_argument("--store", default=None, help="plan store to take a tuned plan from (default: configured)")
    r.add_argument("--objective", default=None,
                   help="objective of the stored plan to use (default latency; with "
                        "--concurrency N, throughput@n=N)")
    load_run.add_arguments(r)
    generate_cli.add_arguments(r, run=True)
    r.add_argument("--untuned", action="store_true", help="ignore stored plans; run the heuristic plan")
    r.add_argument("--require-plan", action="store_true",
                   help="fail (exit 2) unless the store holds a plan tuned for this model on this "
                        "machine and software, saying why none matched")
    r.set_defaults(fn=cmd_run)

    t = sub.add_parser("tune", help="tune a model on this machine and store the plan")
    t.add_argument("model", help="path of an .onnx model")
    t.add_argument("--budget", type=positive_seconds, default=None, metavar="SECONDS",
                   help="bound on the whole tuning run (default: the configured tune_budget_s)")
    t.add_argument("--store", default=None, help="plan store (default: the configured store_path)")
    t.add_argument("--objective", choices=["latency", "memory", "throughput"], default="latency",
                   help="latency or memory of one request at a time; throughput: inferences per "
                        "second with --concurrency requests in flight, as a server runs the model "
                        "(the plan stores its serving configuration: streams, threads)")
    t.add_argument("--concurrency", type=positive_int, default=None, metavar="N",
                   help="with --objective throughput: requests in flight (default: one per "
                        "configured thread)")
    t.add_argument("--max-latency-ms", type=positive_seconds, default=None, metavar="MS",
                   help="with --objective throughput: the p99 latency bound in milliseconds; a "
                        "configuration over it is rejected")
    t.add_argument("--accuracy", default=None, metavar="METRIC:BUDGET",
                   help="let regions compute in reduced precision (int8, bf16) where the metric on "
                        "--data stays within the budget: cosine:0.999 (worst sample's cosine to "
                        "float32), max-rel:1e-2, top1:0.01 (drop in top-1 agreement). Half the "
                        "samples are searched on, half held out; a plan over budget on the held-out "
                        "half is never stored. Without --data, float32 only")
    t.add_argument("--data", default=None, metavar="FILE.npz",
                   help="with --accuracy: your samples, an .npz of arrays named like the model's "
                        "inputs (first axis = samples) or a folder of them; with a shape range "
                        "(--shape NAME=1x1..512): requests of mixed shapes, sampled")
    t.add_argument("--memory-cap", type=positive_int, default=None, metavar="BYTES",
                   help="with --objective latency: the fastest plan whose peak memory fits")
    t.add_argument("--top-k", type=positive_int, default=None, help="plans validated end to end (default 3)")
    t.add_argument("--backends", help="backends the tuner may use (default: every available one)")
    t.add_argument("--inputs", action="append", metavar="FILE.npz",
                   help="representative inputs: an .npz of arrays named like the model's inputs "
                        "(numpy.savez), one set per file; repeat it or name a folder of them. "
                        "Plans are timed on the first and must match the reference on each "
                        "(a model whose If branches or output lengths follow the data: give "
                        "inputs that take each); the arrays' shapes are the shapes tuned. "
                        "Default: seeded random inputs")
    t.add_argument("--shape", action="append", metavar="NAME=1x128",
                   help="input shape to tune; repeat it, list values (NAME=1,4x128) or give a "
                        "range (NAME=1x16:128:16) to tune several shapes in one run, each in an "
                        "equal share of the budget; inputs sharing symbolic dimensions with "
                        "the ones given are sized from them. A dimension LO..HI "
                        "(NAME=1x1..512) tunes one range plan for every shape in it, cut into "
                        "measured buckets (with --data REQUESTS: their shapes are sampled)")
    t.add_argument("--warm-limit", type=float, default=None, metavar="S",
                   help="with a shape range: the most seconds the plan may spend when loaded "
                        "running its ways once at shapes a request would otherwise meet first "
                        "(default 15; 0: none)")
    t.add_argument("--warm-max-shapes", type=int, default=None, metavar="N",
                   help="with a shape range: the most shapes warmed when the plan loads "
                        "(default 1024; each costs the library's per-shape state in memory)")
    t.add_argument("--allow-nonstrict-nan", action="store_true",
                   help="let the plan differ from the reference on NaN/Inf inputs (e.g. oneDNN's "
                        "Relu(NaN) = 0), with no guard; by default the plan puts NaN and Inf "
                        "where the reference does (a fast plan that differs there is guarded: "
                        "requests holding NaN or Inf run a plan that agrees). The plan is stored "
                        "under the objective OBJECTIVE+nonstrict-nan: run it with --objective "
                        "latency+nonstrict-nan")
    t.add_argument("--no-nonfinite-guard", action="store_true",
                   help="no guarded plans: candidates and plans that differ from the reference "
                        "on NaN/Inf inputs are rejected instead")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    generate_cli.add_arguments(t, run=False)
    t.set_defaults(fn=cmd_tune)

    add_plans_parser(sub)
    add_report_parsers(sub)
    add_serve_parser(sub)

    e = sub.add_parser("example", help="write an example model (onnx's light architectures, random weights)")
    e.add_argument("name", choices=LIGHT_MODELS)
    e.add_argument("-o", "--output", help="output path (default NAME.onnx)")
    e.add_argument("--seed", type=int, default=0)
    e.set_defaults(fn=cmd_example)
    return p


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line on stderr (``opdispatch: warning: ...``), not ``file:line:``."""
    text = str(message)
    text = text[len("opdispatch: "):] if text.startswith("opdispatch: ") else text
    print(f"opdispatch: warning: {text}", file=file or sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``opdispatch`` command. User errors (bad models, inputs, stores, paths) print one
    ``opdispatch CMD: error: ...`` line and return 2; anything else is a bug: one line saying
    so (``OPDISPATCH_DEBUG=1`` shows the traceback) and exit 70."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command = " ".join(c for c in (args.command, getattr(args, "plans_command", None)) if c)
    warnings.showwarning = _show_warning
    try:
        return int(args.fn(args) or 0)
    except OpDispatchError as exc:
        print(f"opdispatch {command}: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as exc:  # files and folders named by the user: missing, not writable, ...
        if isinstance(exc, BrokenPipeError):
            return 0
        where = f": {exc.filename}" if exc.filename else ""
        print(f"opdispatch {command}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_USER_ERROR
    except MemoryError:
        print(f"opdispatch {command}: error: out of memory", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as exc:
        if os.environ.get("OPDISPATCH_DEBUG"):
            raise
        print(f"opdispatch {command}: internal error: {type(exc).__name__}: {exc} (a bug: "
              f"OPDISPATCH_DEBUG=1 shows the traceback; please report it)", file=sys.stderr)
        return EXIT_INTERNAL_ERROR
    except KeyboardInterrupt:
        print("opdispatch: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
