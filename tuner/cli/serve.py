"""``opdispatch serve``: tuned plans over the Open Inference Protocol (:mod:`tuner.serve`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tuner.cli.args import UsageError, parse_shape, store_path


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        import kserve  # noqa: F401
    except ImportError:
        raise UsageError("opdispatch serve needs the serving extra: pip install "
                         "'opdispatch[serve]' (the kserve model server)") from None
    from tuner.serve.repository import discover, settings_from
    from tuner.serve.runner import ModelRunner
    from tuner.serve.server import serve

    shapes = serve_shapes(args.shape or [])
    base = settings_from({"objective": args.objective, "allow_untuned": args.allow_untuned or None,
                          "shapes": shapes or None, "max_batch_size": args.max_batch_size,
                          "max_queue_delay_ms": args.max_queue_delay_ms,
                          "max_queue": args.max_queue, "tune_budget_s": args.tune_budget_s,
                          "accuracy": args.accuracy, "data": args.data})
    specs = discover(args.targets, base)
    store = store_path(args.store) if args.store else None
    grpc = None if args.grpc_port == 0 else args.grpc_port
    where = (f"on Ray Serve ({args.ray_address or 'a local Ray cluster'}), " if args.ray else "")
    print(f"opdispatch serve: {len(specs)} model(s) {where}on http://{args.host}:{args.http_port}"
          + (f" and grpc {args.host}:{grpc}" if grpc else ""), file=sys.stderr, flush=True)
    if args.ray:
        try:
            from tuner.serve.ray_app import serve_on_ray
        except ImportError:
            raise UsageError("opdispatch serve --ray needs Ray Serve: pip install "
                             "'opdispatch[ray]'") from None
        serve_on_ray(specs, address=args.ray_address, store=store, bundle=args.bundle,
                     replicas=args.replicas, max_replicas=args.max_replicas,
                     replica_cpus=args.replica_cpus, host=args.host, http_port=args.http_port,
                     grpc_port=grpc, max_body_bytes=int(args.max_body_mb * (1 << 20)),
                     grace_s=args.grace_s)
        return 0
    if args.bundle:
        from tuner.serve.ray_app import local_store

        store = local_store(args.bundle, store)
    runners = [ModelRunner(spec, store) for spec in specs]
    serve(runners, host=args.host, http_port=args.http_port, grpc_port=grpc,
          max_body_bytes=int(args.max_body_mb * (1 << 20)), grace_s=args.grace_s,
          on_loaded=_print_loaded)
    return 0


def serve_shapes(texts: Any) -> dict[str, list[Any]]:
    """The ``--shape`` options: concrete shapes (``NAME=1x128``), or a shape range
    (``NAME=1x1..512``: every shape inside it is served on its range plan)."""
    from tuner.cli.range_tune import range_shapes

    ranged = range_shapes(texts)
    if ranged is not None:
        return ranged
    return dict(parse_shape(text) for text in texts)


def _print_loaded(runners: Any) -> None:
    for r in runners:
        if r.ready:
            info = r.plan_info
            served = (f", every shape in {info['shape_range']} ({info.get('range_axes')})"
                      if info.get("shape_range") else "")
            print(f"  {r.name}: ready ({info.get('plan_source')} plan {info.get('plan_id') or ''}"
                  f"{served}, {info.get('concurrency', 1)} request(s) at once, batch sizes "
                  f"{info.get('batch_sizes', [1])})", file=sys.stderr, flush=True)
        else:
            print(f"  {r.name}: NOT READY: {r.reason}", file=sys.stderr, flush=True)


def cmd_fleet_tune(args: argparse.Namespace) -> int:
    """Tune a model once per node kind of a Ray cluster; one bundle of all the plans."""
    import json
    from pathlib import Path

    from tuner.cli.args import parse_shape_sets, regular_file

    model = regular_file(args.model, "model")
    shape_sets = parse_shape_sets(args.shape or [])
    if shape_sets == [{}]:
        shape_sets = []
    try:
        from tuner.fleet import fleet_tune
    except ImportError:
        raise UsageError("opdispatch plans fleet-tune needs Ray: pip install 'opdispatch[ray]'"
                         ) from None
    bundle, kinds = fleet_tune(model, address=args.ray_address, shape_sets=shape_sets,
                               objective=args.objective, budget_s=args.budget,
                               cpus=args.cpus)
    Path(args.output).write_text(json.dumps(bundle, indent=1))
    print(f"tuned {model.name} on {len(kinds)} kind(s) of node; {len(bundle['plans'])} plan(s) "
          f"written to {args.output}")
    for kind in kinds:
        print(f"  {kind.digest[:16]}: {kind.summary}; {len(kind.nodes)} node(s), tuned on "
              f"{kind.nodes[0][:12]}")
    return 0


def add_fleet_parser(psub: Any) -> None:
    """Register ``opdispatch plans fleet-tune`` (under ``plans``)."""
    q = psub.add_parser("fleet-tune", help="tune a model once per kind of node of a Ray "
                                           "cluster and write the plans as one bundle")
    q.add_argument("model", metavar="MODEL.onnx")
    q.add_argument("-o", "--output", required=True, metavar="BUNDLE.json", help="bundle to write")
    q.add_argument("--ray-address", default=None,
                   help="Ray cluster (default: RAY_ADDRESS, else a local one)")
    q.add_argument("--shape", action="append", metavar="NAME=1x128",
                   help="input shapes to tune (as for opdispatch tune)")
    q.add_argument("--objective", default="latency", help="plan objective (default latency)")
    q.add_argument("--budget", type=float, default=60.0,
                   help="tuning budget per shape and node kind, seconds (default 60)")
    q.add_argument("--cpus", type=float, default=1.0,
                   help="CPUs Ray reserves for each tuning task (default 1)")
    q.set_defaults(fn=cmd_fleet_tune)


def add_parser(sub: Any) -> None:
    """Register ``opdispatch serve``."""
    q = sub.add_parser(
        "serve", help="serve models over the Open Inference Protocol (KServe v2: HTTP/REST and "
                      "gRPC) from their stored plans")
    q.add_argument("targets", nargs="+", metavar="REPOSITORY|MODEL",
                   help="a model repository (one folder per model, optional numbered versions "
                        "and config.toml), model folders, or .onnx files")
    q.add_argument("--store", default=None, help="plan store (default: configured)")
    q.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    q.add_argument("--http-port", type=int, default=8080, help="HTTP/REST port (default 8080)")
    q.add_argument("--grpc-port", type=int, default=8081, help="gRPC port (default 8081; 0: no gRPC)")
    q.add_argument("--objective", default=None,
                   help="objective of the stored plans (default latency; e.g. throughput@n=4)")
    q.add_argument("--accuracy", default=None, metavar="METRIC:BUDGET",
                   help="with --data: serve the plans tuned for this accuracy objective on that "
                        "data (tune --accuracy); config.toml: accuracy = ..., data = ...")
    q.add_argument("--data", default=None, metavar="FILE.npz",
                   help="with --accuracy: the samples the plans were tuned on (their digest names them)")
    q.add_argument("--allow-untuned", action="store_true",
                   help="serve a model without a stored plan for this machine on its untuned "
                        "plan (the metadata says so) instead of reporting it not ready")
    q.add_argument("--shape", action="append", metavar="NAME=1x128",
                   help="input shape served at batch 1, for models with symbolic dimensions; a "
                        "dimension may be a range LO..HI (NAME=1x1..512): every shape inside it "
                        "is served on the range plan tuned for it (opdispatch tune MODEL --shape "
                        "NAME=1x1..512)")
    q.add_argument("--max-batch-size", type=int, default=None,
                   help="dynamic batching: group up to this many batch-1 requests (default: the batch "
                        "size the plan was tuned with, else 1: off)")
    q.add_argument("--max-queue-delay-ms", type=float, default=None,
                   help="how long a request waits for others to batch with (default 2)")
    q.add_argument("--max-queue", type=int, default=None,
                   help="requests admitted at once per model; more get 503 (default 64)")
    q.add_argument("--max-body-mb", type=float, default=64.0,
                   help="largest request body accepted, in MiB (default 64)")
    q.add_argument("--grace-s", type=float, default=30.0,
                   help="on SIGTERM, how long requests in flight may take to finish (default 30)")
    q.add_argument("--tune-budget-s", type=float, default=None,
                   help="tune a model with no plan for this machine first (seconds per shape) "
                        "instead of reporting it not ready")
    q.add_argument("--bundle", default=None, metavar="PLANS.json",
                   help="plans to serve from, as written by 'opdispatch plans export' or "
                        "'fleet-tune' (imported into a store of the server's own)")
    ray = q.add_argument_group("Ray Serve (pip install 'opdispatch[ray]')")
    ray.add_argument("--ray", action="store_true",
                     help="run each model as a Ray Serve deployment behind this server")
    ray.add_argument("--ray-address", default=None,
                     help="Ray cluster to join (default: start a local one)")
    ray.add_argument("--replicas", type=int, default=1, help="replicas per model (default 1)")
    ray.add_argument("--max-replicas", type=int, default=None,
                     help="autoscale from --replicas up to this many on queued requests")
    ray.add_argument("--replica-cpus", type=float, default=1.0,
                     help="CPUs Ray reserves for each replica (default 1)")
    q.set_defaults(fn=cmd_serve)
