"""``opdispatch tune MODEL --shape input_ids=1x1..512``: a shape range tuned in measured
buckets (:mod:`tuner.shapes.tune_range`); ``--data REQUESTS`` gives requests of mixed shapes
(as ``opdispatch run --data`` replays them) whose shapes are sampled."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tuner.cli.args import EXIT_USER_ERROR, UsageError

if TYPE_CHECKING:
    from tuner.shapes.default_range import ModelRange


def range_shapes(texts: Sequence[str]) -> dict[str, list[Any]] | None:
    """The ``--shape`` options as a range spec (input -> dimensions, ``"LO..HI"`` kept as
    text), or ``None`` when none of them gives a range ``LO..HI``."""
    if not any(".." in t for t in texts):
        return None
    spec: dict[str, list[Any]] = {}
    for text in texts:
        name, sep, dims = text.rpartition("=")
        if not sep or not name or not dims:
            raise UsageError(f"--shape expects NAME=DIMxDIMx..., a dimension a size or a range "
                             f"LO..HI (e.g. input_ids=1x1..512); received {text!r}")
        if name in spec:
            raise UsageError(f"--shape gives input {name!r} twice; a range plan takes one range "
                             f"per input (LO..HI)")
        spec[name] = [d if ".." in d else _size(d, text) for d in dims.lower().split("x")]
    return spec


def model_range(model: str) -> ModelRange | None:
    """For ``tune MODEL`` without ``--shape``: the range a model with symbolic inputs implies
    (:mod:`tuner.shapes.default_range`), printed with its source; ``None`` for a model without
    symbolic inputs or one that implies none (the concrete tuning says what to give)."""
    import onnx

    from dispatch.input_shapes import declared_inputs, is_dynamic
    from tuner.shapes.default_range import range_from_model

    try:
        proto = onnx.load(model, load_external_data=False)
    except Exception:  # the tuner's own loading says what is wrong with the file
        return None
    declared = declared_inputs(proto)
    if not is_dynamic(declared):
        return None
    found = range_from_model(proto, declared)
    if found is None:
        return None
    print(f"no --shape given: tuning the range read from {found.source} (give --shape "
          f"NAME=1x1..N to choose another)", flush=True)
    return found


def _size(text: str, arg: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"--shape {arg!r}: with a range, a dimension is a size like 128 or a "
                         f"range LO..HI like 1..512 (no lists or steps); received {text!r}") from None


def cmd_tune_range(args: argparse.Namespace, spec: dict[str, list[Any]],
                   source: str = "the --shape options") -> int:
    """Tune the range ``spec`` and print the buckets."""
    from dispatch.backend import load_registry
    from dispatch.config import Config
    from dispatch.errors import ArgumentError, OpDispatchError
    from dispatch.input_shapes import declared_in_file
    from dispatch.objective import AccuracyTarget, Objective, parse_accuracy
    from tuner.accuracy.data import data_digest
    from tuner.replay import ReplayError, read_requests
    from tuner.shapes.tune_range import tune_range

    if args.inputs or args.memory_cap:
        raise UsageError("a shape range is tuned for latency from whole-model library "
                         "sessions, sampling the shapes of --data; --inputs and --memory-cap go "
                         "with concrete shapes (NAME=1x128)")
    if args.accuracy is not None and args.data is None:
        raise UsageError("--accuracy checks each bucket's reduced precision on your requests of "
                         "its sizes: give them with --data REQUESTS")
    if args.warm_max_shapes is not None and args.warm_max_shapes < 0:
        raise UsageError(f"--warm-max-shapes takes a count >= 0, received {args.warm_max_shapes}")
    if args.warm_limit is not None and not args.warm_limit >= 0:
        raise UsageError(f"--warm-limit takes seconds >= 0 (0: warm nothing), received "
                         f"{args.warm_limit:g}")
    config = Config.load({"store_path": args.store})
    budget = args.budget if args.budget is not None else config.tune_budget_s
    registry = load_registry(config.plugin_path or None, order=config.backend_order)
    backends = [b.strip() for b in args.backends.split(",")] if args.backends else None
    requests = []
    if args.data is not None:
        try:
            requests = read_requests(args.data, declared_in_file(args.model))
        except (ReplayError, ArgumentError) as exc:
            raise UsageError(str(exc)) from None
    try:
        objective = Objective(args.objective, concurrency=args.concurrency,
                              p99_ms=args.max_latency_ms)
        if args.accuracy is not None:
            metric, limit = parse_accuracy(args.accuracy)
            objective = objective.replace(
                accuracy=AccuracyTarget(metric, limit, data_digest(args.data)))
    except (ArgumentError, OpDispatchError) as exc:
        raise UsageError(str(exc)) from None
    print(f"tuning {args.model} over a shape range (budget {budget:.0f} s, objective "
          f"{objective}, store {config.store_path})", flush=True)
    try:
        result = tune_range(args.model, spec, budget_s=budget, objective=objective,
                            backends=backends, requests=requests, config=config,
                            registry=registry, log=lambda msg: print(msg, flush=True),
                            range_from=source,
                            **({} if args.warm_limit is None else
                               {"warm_limit_s": args.warm_limit}),
                            **({} if args.warm_max_shapes is None else
                               {"warm_max_shapes": args.warm_max_shapes}))
    except ArgumentError as exc:
        raise UsageError(str(exc)) from None
    print(result.summary())
    if result.plan_id is None:
        print(f"opdispatch tune: error: the range plan could not be stored: {result.store_error}",
              file=sys.stderr)
        return EXIT_USER_ERROR
    return 0
