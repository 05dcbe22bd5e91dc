"""``opdispatch plans``: list, show, export, import, prune and diff the plans of a plan store.

Every subcommand takes ``--store PATH`` (default: the configured ``store_path``). Reading
commands (list, show, export, diff) open the store read-only and never create it. Bundles are
the JSON written by :meth:`tuner.store.PlanStore.export_plans`: data only, validated on import.
``plans diff A B`` compares two plans, each given as a plan id in the store, a plan JSON file
(``plans show ID --json``, ``run --output DIR``'s plan.json), a bundle holding one plan, or
``BUNDLE.json#ID`` for one plan of a bundle: plans from two machines or two software versions
are compared by exporting them.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatch.errors import OpDispatchError
from tuner.cli.args import parse_shape, read_json, store_path, table

if TYPE_CHECKING:
    from dispatch.registry import Registry
    from tuner.store import PlanStore, StoredPlan

#: Characters of a model fingerprint shown in tables.
FP_PREFIX = 12


class PlansUsageError(OpDispatchError):
    """A ``plans`` argument could not be understood or names something that does not exist."""


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------


def _open(arg: str | None, *, readonly: bool) -> PlanStore:
    """The store at ``--store`` (or the configured one); a missing store is a user error."""
    from tuner.store import PlanStore

    path = store_path(arg)
    try:
        os.stat(path)
        missing = False
    except (FileNotFoundError, NotADirectoryError):
        missing = True
    except OSError:  # unreachable: opening it says why
        missing = False
    if missing:
        raise PlansUsageError(
            f"no plan store at {path} (tune a model with `opdispatch tune MODEL --store {path}` "
            f"or import a bundle with `opdispatch plans import BUNDLE --store {path}`)"
        )
    return PlanStore(path, readonly=readonly)


def _registry() -> Registry:
    from dispatch.backend import load_registry
    from dispatch.config import Config

    return load_registry(Config.load().plugin_path or None)


def _backends_used(stored: StoredPlan) -> str:
    try:
        used = stored.plan().backends_used()
    except OpDispatchError as exc:
        return f"(unreadable plan: {exc})"
    return ",".join(f"{b}:{n}" for b, n in used.items()) or "-"


def _created(stored: StoredPlan) -> str:
    return stored.created_at[:19].replace("T", " ")


def _latency(stored: StoredPlan) -> str:
    return "-" if stored.latency_ms is None else f"{stored.latency_ms:.3f}"


def _model_fp(model: str, shapes: Sequence[str] | None) -> str:
    """The model fingerprint of an .onnx file, as the tuner computes it here."""
    from tuner.fingerprint import model_fingerprint
    from tuner.tune import load_graph

    registry = _registry()
    input_shapes = dict(parse_shape(s) for s in shapes or [])
    graph = load_graph(model, registry, registry.available_backends(), input_shapes or None)
    return model_fingerprint(graph)


def _plans_of_model(store: Any, model: str, shapes: Sequence[str] | None) -> list[StoredPlan]:
    """The stored plans of an .onnx file: those of its fingerprint at the ``--shape`` shapes;
    for a model with symbolic inputs given no shapes, those of every shape it was tuned for
    (its family: the structure with the input shapes left open)."""
    from dispatch.errors import SymbolicShapeError
    from tuner.tune import load_graph

    try:
        return store.plans_for_model(_model_fp(model, shapes))
    except SymbolicShapeError as exc:
        if shapes or not exc.inputs:
            raise
        # any concrete shape gives the family: every open dimension set to 1
        ones = {inp.name: [d if isinstance(d, int) else 1 for d in (inp.dims or ())]
                for inp in exc.inputs}
        registry = _registry()
        graph = load_graph(model, registry, registry.available_backends(), ones)
        return store.plans_for_family(graph.family)


def _here(stored: StoredPlan, registry: Registry, hardware: dict[str, Any]) -> str:
    from tuner.plan_lookup import usable_here

    ok, why = usable_here(stored, registry, hardware)
    return ("yes" + (f" ({why})" if why else "")) if ok else f"no: {why}"


# ------------------------------------------------------------------------------------------
# commands
# ------------------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    """A table of the stored plans, newest first."""
    from tuner.fingerprint import hardware_fingerprint

    with _open(args.store, readonly=True) as store:
        plans = _plans_of_model(store, args.model, args.shape) if args.model else store.all_plans()
        if not plans:
            what = f" for {args.model}" if args.model else ""
            print(f"no plans{what} in {store.path}")
            return 0
        registry, hardware = _registry(), hardware_fingerprint()
        rows = [("id", "model", "inputs", "objective", "latency_ms", "created (UTC)",
                 "backends used", "usable here")]
        for p in plans:
            rows.append((str(p.id), _model_name(p), p.key.inputs, p.key.objective,
                         _latency(p), _created(p), _backends_used(p),
                         _here(p, registry, hardware)))
        print(table(rows, max_width=48))
        print(f"\n{len(plans)} plan(s) in {store.path}")
    return 0


def _model_name(p: Any) -> str:
    """The file the plan was tuned from (its name, as the user gave it to ``tune``) and the
    model fingerprint's prefix; the prefix alone for plans that do not record the file."""
    try:
        source = (p.plan().provenance or {}).get("model_file")
    except Exception:  # an unreadable plan is listed as such by its other columns
        source = None
    fp = p.key.model[:FP_PREFIX]
    return f"{Path(source).name} ({fp})" if isinstance(source, str) and source else fp


def cmd_show(args: argparse.Namespace) -> int:
    """One plan: its key, what the tuner measured, its provenance and its steps."""
    from tuner.fingerprint import hardware_fingerprint

    with _open(args.store, readonly=True) as store:
        p = store.plan_by_id(args.id)
        if args.json:
            print(p.plan_json)
            return 0
        plan = p.plan()
        run = next((r for r in store.runs(p.key.model) if r.id == p.run_id), None)
        registry = _registry()
        hw = p.key.hardware
        sw = p.key.software
        rows: list[tuple[str, str]] = [
            ("store", str(store.path)),
            ("model", p.key.model),
            *([("model file", str(plan.provenance["model_file"]))]
              if isinstance((plan.provenance or {}).get("model_file"), str) else []),
            ("inputs", p.key.inputs),
            ("objective", p.key.objective),
            ("key digest", p.key.digest()),
            ("latency", "-" if p.latency_ms is None else f"{p.latency_ms:.3f} ms"),
            ("peak memory", "-" if p.peak_bytes is None else f"{p.peak_bytes:,} bytes"),
            ("created", p.created_at),
        ]
        if run is not None:
            budget = "-" if run.budget_s is None else f"{run.budget_s:g} s"
            rows.append(("tuning run", f"{run.id}: {run.status}, budget {budget}, started "
                                       f"{run.started_at}"))
        if "imported_at" in p.notes:
            rows.append(("imported", str(p.notes["imported_at"])))
        backends = sw.get("backends")
        rows += [
            ("hardware", f"{hw.get('cpu_model') or '?'} ({hw.get('arch')}), "
                         f"{hw.get('threads')} thread(s), ISA {_joined(hw.get('isa')) or '-'}"
                         + (f", GPU {_joined(hw['gpus'])}" if hw.get("gpus") else "")),
            ("software", ", ".join(f"{v}" for v in (backends.values() if isinstance(backends, dict) else []))
                         + f"; opdispatch {sw.get('opdispatch')}, plan format {sw.get('plan_format')}"),
            ("usable here", _here(p, registry, hardware_fingerprint())),
        ]
        prov = plan.provenance
        if prov:
            opt = prov.get("optimizer") if isinstance(prov.get("optimizer"), dict) else {}
            parts = [f"source {prov.get('source', '?')}"]
            if prov.get("tuned_at"):
                parts.append(f"tuned {prov['tuned_at']}")
            if opt.get("method"):
                parts.append(f"optimiser {opt['method']}"
                             + (" (optimal)" if opt.get("optimal") else " (not proven optimal)"))
            winner = prov.get("winner", p.notes.get("winner"))
            if winner:
                parts.append(f"winner: {winner}")
            rows.append(("provenance", ", ".join(parts)))
        width = max(len(k) for k, _ in rows)
        print(f"plan {p.id}")
        for k, v in rows:
            print(f"  {k.ljust(width)}  {v}")
        validated = [v for v in prov.get("validated") or [] if isinstance(v, dict)]
        if validated:
            print("\nvalidated end to end:")
            vrows = [("plan", "predicted ms", "latency ms", "peak bytes", "result")]
            for v in validated:
                vrows.append((str(v.get("label")), _num(v.get("predicted_ms")),
                              _num(v.get("latency_ms")), _num(v.get("peak_bytes"), "{:,.0f}"),
                              v.get("error") or "ok"))
            print(table(vrows, max_width=60))
        print(f"\nsteps ({len(plan.steps)}), backends used: {_backends_used(p)}")
        print(plan.describe())
    return 0


def _num(value: Any, fmt: str = "{:.3f}") -> str:
    """A number of a stored plan's provenance; anything else as (short) text."""
    if value is None:
        return "-"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return fmt.format(value)
    return str(value)[:40]


def _joined(values: Any) -> str:
    """A list of a stored fingerprint, comma-separated; anything else as (short) text."""
    if isinstance(values, list | tuple):
        return ",".join(str(v) for v in values)
    return "" if values is None else str(values)[:40]


def cmd_export(args: argparse.Namespace) -> int:
    """Write a JSON bundle of the chosen plans (all by default)."""
    if args.ids and args.model:
        raise PlansUsageError("give plan ids or --model, not both")
    with _open(args.store, readonly=True) as store:
        if args.model:
            ids: list[int] | None = [p.id for p in _plans_of_model(store, args.model, args.shape)]
            if not ids:
                raise PlansUsageError(
                    f"no plan for {args.model} in "
                    f"{store.path}; tune it first with `opdispatch tune {args.model} --store "
                    f"{store.path}`")
        else:
            ids = list(args.ids) or None
        bundle = store.export_plans(ids)
        if not bundle["plans"]:
            raise PlansUsageError(f"{store.path} holds no plans to export")
    out = Path(args.output)
    try:
        out.write_text(json.dumps(bundle, indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        raise PlansUsageError(f"cannot write {str(out)!r}: {exc}") from None
    shown = ", ".join(str(p["id"]) for p in bundle["plans"])
    print(f"exported {len(bundle['plans'])} plan(s) (ids {shown}) to {out}")
    return 0


def _stored_plan_json(store: Any, digest: str) -> str | None:
    """The plan JSON stored under key ``digest``, else ``None``."""
    rows = list(store.db.query("SELECT plan_json FROM plans WHERE key_digest = ?", [digest]))
    return str(rows[0]["plan_json"]) if rows else None


def cmd_import(args: argparse.Namespace) -> int:
    """Insert the plans of a bundle into the store (created if missing)."""
    from tuner.fingerprint import hardware_fingerprint
    from tuner.store import PlanStore, validate_bundle

    src = Path(args.bundle)
    bundle = read_json(src, "plan bundle")
    entries = validate_bundle(bundle)  # before the store is opened (and perhaps created)
    with PlanStore(store_path(args.store)) as store:
        before = [_stored_plan_json(store, e["key"].digest()) for e in entries]
        ids = store.import_plans(bundle)
        registry, hardware = _registry(), hardware_fingerprint()
        same = sum(1 for e, old in zip(entries, before) if old == e["plan_json"])
        replaced = sum(1 for e, old in zip(entries, before) if old is not None and old != e["plan_json"])
        new = len(ids) - same - replaced
        print(f"imported {new} new plan(s)"
              + (f", replaced {replaced} stored under the same key" if replaced else "")
              + f"; {same} already in the store; from {src} into {store.path}")
        unusable = 0
        for plan_id in ids:
            p = store.plan_by_id(plan_id)
            here = _here(p, registry, hardware)
            unusable += here != "yes"
            print(f"  plan {p.id}: model {p.key.model[:FP_PREFIX]}, {p.key.inputs}, "
                  f"{p.key.objective}; usable here: {here}")
        if unusable:
            print(f"{unusable} imported plan(s) were tuned on other hardware or software and will "
                  f"not be used on this machine")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    """Delete stale plans (another machine or software) and/or plans older than N days."""
    from tuner.fingerprint import hardware_fingerprint
    from tuner.store import stale_reasons

    if args.older_than is None and not args.stale:
        raise PlansUsageError(
            "give --stale and/or --older-than DAYS (nothing would be removed)")
    if args.older_than is not None and args.older_than < 0:
        raise PlansUsageError(f"--older-than expects days >= 0, received {args.older_than:g}")
    stale = None
    if args.stale:
        registry, hardware = _registry(), hardware_fingerprint()

        def stale(p: StoredPlan) -> list[str]:
            return stale_reasons(p, registry, hardware)

    with _open(args.store, readonly=False) as store:
        removed = store.prune_plans(older_than_days=args.older_than, stale=stale,
                                    dry_run=args.dry_run)
        verb = "would remove" if args.dry_run else "removed"
        for r in removed:
            p = r.plan
            print(f"{verb} plan {p.id} (model {p.key.model[:FP_PREFIX]}, {p.key.inputs}, "
                  f"{p.key.objective}, created {_created(p)}): {'; '.join(r.reasons)}")
        kept = len(store.all_plans())
        print(f"{verb} {len(removed)} plan(s) from {store.path}; {kept} kept")
    return 0


def _plan_side(arg: str, store_arg: str | None, stores: dict[str, PlanStore]) -> Any:
    """A ``plans diff`` operand: a plan id in ``--store``, a plan JSON file, a bundle with one
    plan, or ``BUNDLE.json#ID`` for the plan with that id in a bundle of several."""
    from dispatch.plan import Plan
    from tuner.fingerprint import PlanKey
    from tuner.report import PlanSide
    from tuner.store import validate_bundle

    if arg.isdigit():
        if "store" not in stores:
            stores["store"] = _open(store_arg, readonly=True)
        stored = stores["store"].plan_by_id(int(arg))
        return PlanSide(stored.plan(), f"plan {stored.id}", stored.key, stored.latency_ms,
                        stored.peak_bytes)
    path, _, wanted = arg.partition("#")
    src = Path(path)
    if not src.exists():
        raise PlansUsageError(
            f"{arg!r} is neither a plan id (an integer) nor an existing file (a plan JSON, a "
            f"bundle, or BUNDLE.json#ID)")
    data = read_json(src, "plan or plan bundle")
    if isinstance(data, dict) and "format" in data:
        validate_bundle(data)
        entries = data["plans"]
        if wanted:
            if not wanted.isdigit():
                raise PlansUsageError(f"{arg!r}: expected BUNDLE.json#ID with an integer ID")
            entries = [e for e in entries if e.get("id") == int(wanted)]
            if not entries:
                ids = ", ".join(str(e.get("id")) for e in data["plans"])
                raise PlansUsageError(f"{path!r} holds no plan with id {wanted}; its ids: {ids}")
        elif len(entries) != 1:
            ids = ", ".join(str(e.get("id")) for e in entries)
            raise PlansUsageError(f"{path!r} holds {len(entries)} plans (ids {ids}); pick one "
                                  f"with {path}#ID")
        e = entries[0]
        k = e["key"]
        key = PlanKey(model=k["model"], inputs=k["inputs"], hardware=k["hardware"],
                      software=k["software"], objective=k["objective"])
        label = f"{src.name}#{e.get('id')}" if e.get("id") is not None else src.name
        return PlanSide(Plan.from_dict(e["plan"]), label, key, e.get("latency_ms"),
                        e.get("peak_bytes"))
    if wanted:
        raise PlansUsageError(f"{arg!r}: #ID selects a plan of a bundle, and {path!r} is a plan")
    if not isinstance(data, dict):
        raise PlansUsageError(f"{path!r} is not a plan (a JSON object), received "
                              f"{type(data).__name__}")
    try:
        plan = Plan.from_dict(data)
    except (OverflowError, RecursionError, ValueError) as exc:
        raise PlansUsageError(f"{path!r} is not a plan ({type(exc).__name__}: "
                              f"{str(exc)[:100]})") from None
    validated = plan.provenance.get("validated")
    win = (next((v for v in validated if isinstance(v, dict)
                 and v.get("label") == plan.provenance.get("winner")), {})
           if isinstance(validated, list) else {})
    return PlanSide(plan, src.name, None, win.get("latency_ms"), win.get("peak_bytes"))


def cmd_diff(args: argparse.Namespace) -> int:
    """Per node, what changed between two plans and why, with the time deltas."""
    from tuner.report import diff_plans

    stores: dict[str, PlanStore] = {}
    try:
        a = _plan_side(args.a, args.store, stores)
        b = _plan_side(args.b, args.store, stores)
    finally:
        for s in stores.values():
            s.close()
    if a.label == b.label:
        a.label, b.label = f"A ({a.label})", f"B ({b.label})"
    text = diff_plans(a, b).render(args.format, all_nodes=args.all)
    if args.output:
        try:
            Path(args.output).write_text(text)
        except OSError as exc:
            raise PlansUsageError(f"cannot write {args.output!r}: {exc}") from None
        print(f"diff written to {args.output}")
    else:
        print(text, end="")
    return 0


# ------------------------------------------------------------------------------------------
# parser
# ------------------------------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    """Add ``plans`` and its subcommands to the ``opdispatch`` subparsers ``sub``."""
    p = sub.add_parser("plans", help="list, show, export, import, prune and diff stored plans")
    psub = p.add_subparsers(dest="plans_command", required=True)

    def store_arg(q: argparse.ArgumentParser) -> None:
        q.add_argument("--store", default=None, help="plan store (default: the configured store_path)")

    def model_args(q: argparse.ArgumentParser, what: str) -> None:
        q.add_argument("--model", metavar="MODEL.onnx", help=f"only {what} the plans of this model")
        q.add_argument("--shape", action="append", metavar="NAME=1x3x224x224",
                       help="static shape for an input of --model")

    q = psub.add_parser("list", help="a table of the stored plans")
    store_arg(q)
    model_args(q, "list")
    q.set_defaults(fn=cmd_list)

    q = psub.add_parser("show", help="a plan's key, steps and provenance")
    q.add_argument("id", type=int, help="plan id (see plans list)")
    q.add_argument("--json", action="store_true", help="print the plan as JSON")
    store_arg(q)
    q.set_defaults(fn=cmd_show)

    q = psub.add_parser("export", help="write plans and their keys to a JSON bundle")
    q.add_argument("ids", nargs="*", type=int, metavar="ID", help="plan ids (default: every plan)")
    model_args(q, "export")
    q.add_argument("-o", "--output", required=True, metavar="BUNDLE.json", help="bundle to write")
    store_arg(q)
    q.set_defaults(fn=cmd_export)

    q = psub.add_parser("import", help="insert the plans of a JSON bundle")
    q.add_argument("bundle", metavar="BUNDLE.json")
    store_arg(q)
    q.set_defaults(fn=cmd_import)

    q = psub.add_parser("diff", help="per node, what changed between two plans and why, with "
                                     "the time deltas")
    q.add_argument("a", metavar="A", help="plan id in --store, a plan JSON file, or a bundle "
                                          "(BUNDLE.json#ID picks one of several)")
    q.add_argument("b", metavar="B", help="the same for the second plan")
    q.add_argument("--all", action="store_true", help="list every node, not only those that changed")
    q.add_argument("--format", choices=["text", "markdown", "csv", "json"], default="text")
    q.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    store_arg(q)
    q.set_defaults(fn=cmd_diff)

    q = psub.add_parser("prune", help="delete stale or old plans, printing what was removed")
    q.add_argument("--stale", action="store_true",
                   help="plans whose hardware or software fingerprint does not match this machine")
    q.add_argument("--older-than", type=float, metavar="DAYS", help="plans created more than DAYS ago")
    q.add_argument("--dry-run", action="store_true", help="print what would be removed; remove nothing")
    store_arg(q)
    q.set_defaults(fn=cmd_prune)

    from tuner.cli.serve import add_fleet_parser

    add_fleet_parser(psub)
