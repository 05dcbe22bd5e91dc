"""Plan bundles: the JSON files that carry tuned plans between machines of the same kind
(:meth:`BundleTransfer.export_plans`, :meth:`BundleTransfer.import_plans`), data only. It owns
the bundle format (:data:`BUNDLE_FORMAT`, :data:`BUNDLE_VERSION`), its JSON Schema
(:data:`BUNDLE_SCHEMA`, checked with ``jsonschema``'s Draft 2020-12 validator) and
:func:`validate_bundle`, which turns the first schema violation into a one-line
:class:`BundleError` and then checks what a schema cannot say: a ``key_digest`` matching its
key, no key twice, a valid plan, a readable timestamp."""

from __future__ import annotations

import functools
import json
import math
import reprlib
import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from dispatch.errors import OpDispatchError
from dispatch.plan import Plan
from tuner.fingerprint import FINGERPRINT_VERSION, PlanKey, opdispatch_version
from tuner.store.errors import BundleError, StoreError
from tuner.store.plans import PlanQueries
from tuner.store.rows import StoredPlan, _dump, _now, _parse_time

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator

#: The ``format`` field of a plan bundle (:meth:`BundleTransfer.export_plans`).
BUNDLE_FORMAT = "opdispatch-plan-bundle"
#: The bundle format version written; a bundle of another version is refused on import.
BUNDLE_VERSION = 1
#: How deeply objects and arrays may nest in a bundle (an exported one nests about 8 deep).
MAX_DEPTH = 32

#: The shape of a bundle. Each ``description`` is what an error message says was expected
#: there. ``integer`` and ``number`` are Python's ``int`` and finite ``float`` (never
#: ``bool``; ``1.0`` is no integer); the bounds are what SQLite and ``float`` can hold.
#: Falsy ``notes`` (``null``, ``false``, ``0``, ``""``, ``[]``) mean no notes.
BUNDLE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "opdispatch plan bundle",
    "description": f'a JSON object with "format": "{BUNDLE_FORMAT}"',
    "type": "object",
    "required": ["format", "version", "plans"],
    "additionalProperties": False,
    "properties": {
        "format": {"const": BUNDLE_FORMAT},
        "version": {"type": "integer", "const": BUNDLE_VERSION, "description": "an integer"},
        "fingerprint_version": {"const": FINGERPRINT_VERSION},
        "exported_at": {"type": ["string", "null"], "description": "an ISO timestamp"},
        "opdispatch": {"type": ["string", "null"], "description": "a version string"},
        "plans": {
            "type": "array",
            "description": "an array of plans",
            "items": {
                "type": "object",
                "description": "an object",
                "required": ["key", "plan"],
                "additionalProperties": False,
                "properties": {
                    "id": {
                        "type": ["integer", "null"],
                        "description": "the plan's id where it was exported, or null",
                        "minimum": -(2**63),
                        "maximum": 2**63 - 1,
                    },
                    "key": {
                        "type": "object",
                        "description": "an object",
                        "required": ["model", "inputs", "hardware", "software", "objective"],
                        "properties": {
                            "model": {"type": "string", "description": "a string"},
                            "inputs": {"type": "string", "description": "a string"},
                            "hardware": {"type": "object", "description": "an object"},
                            "software": {"type": "object", "description": "an object"},
                            "objective": {"type": "string", "description": "a string"},
                        },
                        "additionalProperties": False,
                    },
                    "key_digest": {"description": "key.digest() when exported (checked after)"},
                    "plan": {"type": "object", "description": "a plan object"},
                    "latency_ms": {
                        "type": ["number", "null"],
                        "description": "a number or null",
                        "minimum": -sys.float_info.max,
                        "maximum": sys.float_info.max,
                    },
                    "peak_bytes": {
                        "type": ["integer", "null"],
                        "description": "an integer or null",
                        "minimum": -(2**63),
                        "maximum": 2**63 - 1,
                    },
                    "created_at": {"type": ["string", "null"], "description": "an ISO timestamp"},
                    "notes": {
                        "anyOf": [{"type": "object"}, {"enum": [None, False, 0, "", []]}],
                        "description": "an object",
                    },
                },
            },
        },
    },
}


class BundleTransfer(PlanQueries):
    """Export and import of plan bundles for a :class:`~tuner.store.PlanStore`."""

    def export_plans(self, ids: Iterable[int] | None = None) -> dict[str, Any]:
        """A JSON-able bundle of the plans ``ids`` (every plan when ``None``) with their keys,
        to ship with a model to other machines of the same kind (:meth:`import_plans`).

        Data only (no pickle): ``{"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION,
        "fingerprint_version", "exported_at", "opdispatch", "plans": [{"key": {model, inputs,
        hardware, software, objective}, "key_digest", "plan", "latency_ms", "peak_bytes",
        "created_at", "notes", "id"}]}``. Tuning runs and measurements stay behind. Raises
        :class:`StoreError` naming the stored ids when an id is unknown.
        """
        if ids is None:
            chosen = sorted(self.all_plans(), key=lambda p: p.id)
        else:
            seen: dict[int, StoredPlan] = {}
            for plan_id in ids:
                if isinstance(plan_id, bool) or not isinstance(plan_id, int):
                    raise StoreError(
                        f"export_plans expects integer plan ids, received {plan_id!r}")
                if plan_id not in seen:
                    seen[plan_id] = self.plan_by_id(plan_id)
            chosen = list(seen.values())
        return {
            "format": BUNDLE_FORMAT,
            "version": BUNDLE_VERSION,
            "fingerprint_version": FINGERPRINT_VERSION,
            "exported_at": _now(),
            "opdispatch": opdispatch_version(),
            "plans": [
                {
                    "id": p.id,
                    "key": {"model": p.key.model, "inputs": p.key.inputs,
                            "hardware": p.key.hardware, "software": p.key.software,
                            "objective": p.key.objective},
                    "key_digest": p.key.digest(),
                    "plan": json.loads(p.plan_json),
                    "latency_ms": p.latency_ms,
                    "peak_bytes": p.peak_bytes,
                    "created_at": p.created_at,
                    "notes": p.notes,
                }
                for p in chosen
            ],
        }

    def import_plans(self, bundle: Mapping[str, Any]) -> list[int]:
        """Insert the plans of a bundle written by :meth:`export_plans`; returns their ids
        here, in bundle order. A plan stored under the same key is replaced (as by
        :meth:`put_plan`). The whole bundle is validated first and inserted in one
        transaction: a malformed bundle raises :class:`BundleError` saying which field is
        wrong, and nothing is imported. Imported plans keep their creation time; their notes
        record ``imported_at``; they belong to no tuning run here."""
        entries = validate_bundle(bundle)
        now = _now()
        with self._write("import_plans"):
            return [
                self._upsert_plan(
                    e["key"], e["plan_json"], latency_ms=e["latency_ms"],
                    peak_bytes=e["peak_bytes"], created_at=e["created_at"] or now, run_id=None,
                    notes={**e["notes"], "imported_at": now})
                for e in entries
            ]


# ------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------


def validate_bundle(bundle: Any) -> list[dict[str, Any]]:
    """Check a plan bundle (format, version, and every entry's key parts, plan, numbers, times
    and notes); raises :class:`BundleError` naming the first wrong field (``plans[2].key.
    hardware: expected an object, received an array``). Returns the entries as
    ``{"key": PlanKey, "plan_json", "latency_ms", "peak_bytes", "created_at", "notes"}``.
    A value too large or too deeply nested to read is refused the same way."""
    try:
        deep = _too_deep(bundle)
        if deep is not None:
            raise BundleError(f"malformed plan bundle: {_where(deep)}: nested deeper than "
                              f"{MAX_DEPTH} levels (a plan bundle is shallow JSON data)")
        errors = list(_validator().iter_errors(bundle))
        if errors:
            raise BundleError(_refusal(min(errors, key=_position)))
        return _entries(bundle)
    except (RecursionError, ValueError) as exc:  # an integer too long to print, or nesting
        detail = str(exc).split(";")[0][:100]     # deeper than Python recurses
        raise BundleError(
            f"malformed plan bundle: expected plain JSON data, received a value too large or "
            f"nested too deeply to read ({type(exc).__name__}: {detail})") from None


def _too_deep(value: Any, limit: int | None = None) -> tuple[str | int, ...] | None:
    """The path of the first value nested deeper than ``limit`` (:data:`MAX_DEPTH`) levels
    of objects and arrays in ``value``, else ``None`` (walked without recursion)."""
    limit = MAX_DEPTH if limit is None else limit
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict | list):
            if len(path) >= limit:
                return path
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            stack.extend((v, (*path, k)) for k, v in pairs)
    return None


def _entries(bundle: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries of a bundle that passed :data:`BUNDLE_SCHEMA`, after the checks the schema
    cannot make."""
    entries: list[dict[str, Any]] = []
    first_of: dict[str, int] = {}
    for k, item in enumerate(bundle["plans"]):
        at = f"plans[{k}]"
        raw_key = item["key"]
        key = PlanKey(model=raw_key["model"], inputs=raw_key["inputs"],
                      hardware=raw_key["hardware"], software=raw_key["software"],
                      objective=raw_key["objective"])
        digest = key.digest()
        stated = item.get("key_digest")
        if stated is not None and stated != digest:
            raise BundleError(
                f"malformed plan bundle: {at}.key_digest does not match {at}.key (the key was "
                f"edited after export; drop key_digest to import an edited key)")
        if digest in first_of:
            raise BundleError(f"malformed plan bundle: {at} has the same key as "
                              f"plans[{first_of[digest]}]")
        first_of[digest] = k
        try:
            plan_json = Plan.from_dict(item["plan"]).to_json()
        except OpDispatchError as exc:
            raise BundleError(f"malformed plan bundle: {at}.plan: {exc}") from None
        except (OverflowError, RecursionError) as exc:  # e.g. a version of Infinity
            raise BundleError(f"malformed plan bundle: {at}.plan: {type(exc).__name__}: "
                              f"{exc}") from None
        created = item.get("created_at")
        if created is not None:
            try:
                _parse_time(created)
            except ValueError:
                raise BundleError(f"malformed plan bundle: {at}.created_at: expected an ISO "
                                  f"timestamp, received {_short(created)}") from None
        notes = item.get("notes") or {}
        _dump(notes)  # plain data: refused here rather than halfway through an import
        latency = item.get("latency_ms")
        entries.append({
            "key": key, "plan_json": plan_json,
            "latency_ms": None if latency is None else float(latency),
            "peak_bytes": item.get("peak_bytes"), "created_at": created, "notes": notes,
        })
    return entries


def _is_integer(checker: object, value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(checker: object, value: object) -> bool:
    """A JSON number: NaN and the infinities, which Python's ``json`` reads, are none."""
    return _is_integer(checker, value) or (isinstance(value, float) and math.isfinite(value))


@functools.cache
def _validator() -> Validator:
    """The Draft 2020-12 validator of :data:`BUNDLE_SCHEMA` (imported on first use)."""
    from jsonschema import Draft202012Validator, validators

    types = Draft202012Validator.TYPE_CHECKER.redefine_many(
        {"integer": _is_integer, "number": _is_number})
    cls = validators.extend(Draft202012Validator, type_checker=types)
    cls.check_schema(BUNDLE_SCHEMA)
    return cls(BUNDLE_SCHEMA)


def _field_order(schema: Mapping[str, Any], order: dict[str, int]) -> dict[str, int]:
    """Every property name of ``schema`` -> its place, in the order the schema lists them."""
    for name, sub in schema.get("properties", {}).items():
        order.setdefault(name, len(order))
        _field_order(sub, order)
    if "items" in schema:
        _field_order(schema["items"], order)
    return order


_FIELD_ORDER = _field_order(BUNDLE_SCHEMA, {})


def _missing(error: ValidationError) -> str:
    """The first property a ``required`` error finds missing."""
    return next(n for n in error.validator_value if n not in error.instance)


def _position(error: ValidationError) -> tuple[tuple[int, ...], int]:
    """Where ``error`` stands in the order a bundle is read (field by field in the schema's
    order, plan by plan; a value's type before its contents; unknown key fields last), so
    that the first wrong field is the one reported."""
    path = [*error.absolute_path]
    if error.validator == "required":
        path.append(_missing(error))
    ranks = [p if isinstance(p, int) else _FIELD_ORDER.get(p, len(_FIELD_ORDER)) for p in path]
    if error.validator == "additionalProperties":
        ranks.append(len(_FIELD_ORDER))
    return tuple(ranks), 0 if error.validator in ("type", "required") else 1


def _refusal(error: ValidationError) -> str:
    """The one-line message for a schema violation: where, what was expected, what was
    received."""
    path: tuple[str | int, ...] = tuple(error.absolute_path)
    value, schema = error.instance, error.schema
    if error.validator == "required":
        name = _missing(error)
        path, value, schema = (*path, name), None, schema["properties"][name]
    if path == ("format",):
        return (f"not a plan bundle: \"format\" is {_short(value)}, expected {BUNDLE_FORMAT!r} "
                f"(write one with `opdispatch plans export` or PlanStore.export_plans)")
    if path == ("version",) and error.validator == "const":
        newer = " (written by a newer opdispatch)" if value > BUNDLE_VERSION else ""
        return (f"plan bundle format version {_short(value)} is not supported{newer}; "
                f"this opdispatch reads version {BUNDLE_VERSION}")
    if path == ("fingerprint_version",):
        return (f"the plan bundle was written with fingerprint version {_short(value)}, this "
                f"opdispatch computes version {FINGERPRINT_VERSION}: its plans could never "
                f"match here")
    where = _where(path)
    if error.validator == "additionalProperties":
        extra = sorted(set(value) - set(schema["properties"]), key=str)
        return f"malformed plan bundle: {where}: unknown field(s) {extra}"
    expected = schema["description"]
    if error.validator in ("minimum", "maximum"):
        bound = "at least" if error.validator == "minimum" else "at most"
        expected = f"{expected} ({bound} {error.validator_value})"
    got = "nothing (missing or null)" if value is None else f"{_kind(value)} {_short(value)}"
    return f"malformed plan bundle: {where}: expected {expected}, received {got}"


def _where(path: tuple[str | int, ...]) -> str:
    """``()`` -> ``the bundle``, ``("plans",)`` -> ``"plans"``, ``("plans", 0, "key")`` ->
    ``plans[0].key``."""
    if not path:
        return "the bundle"
    if len(path) == 1:
        return f'"{path[0]}"'
    text = str(path[0]) + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path[1:])
    return text if len(text) <= 120 else text[:117] + "..."


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float) and not math.isfinite(value):
        return "a non-finite number"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxlong, _REPR.maxother = 3, 60, 60, 60


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters; never fails on a value too deep or an
    integer too long to print."""
    try:
        text = _REPR.repr(value)
    except ValueError:  # an integer beyond sys.get_int_max_str_digits()
        text = ("<an integer too long to print>" if isinstance(value, int)
                else f"<{_kind(value)} holding an integer too long to print>")
    return text if len(text) <= limit else text[: limit - 3] + "..."
