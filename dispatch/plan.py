"""Plans: which implementation runs each node, in which layouts, with which converters.

A :class:`Plan` is pure data (JSON, never pickle). Each :class:`PlanStep` covers one node (or,
for fused implementations, a connected set of nodes) and names one implementation with its
concrete layouts. Each :class:`Conversion` changes one tensor to one target layout, once,
shared by every consumer that wants that layout. This module owns the data and its JSON form,
checked field by field on the way in; plans are built by :mod:`dispatch.heuristic` (the untuned
plan) and the tuner, both through :mod:`dispatch.plan_assembly`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dispatch.errors import PlanError, known

PLAN_FORMAT_VERSION = 1


@dataclass
class Rejected:
    """A candidate that did not win, and why."""

    impl: str
    backend: str
    reason: str


@dataclass
class PlanStep:
    """One implementation bound to one node (or a fused set of nodes)."""

    nodes: list[str]
    op: str
    impl: str
    backend: str
    layouts_in: list[str]
    layouts_out: list[str]
    why: str = ""
    rejected: list[Rejected] = field(default_factory=list)
    cost_ms: float | None = None
    #: ``None``: computed in the model's own precision (float32). Else the reduced precision
    #: its implementation computes in and what it needs to be rebuilt exactly, e.g.
    #: ``{"dtype": "bf16"}`` or ``{"dtype": "int8", "scheme": "qdq", "ranges": {...}}``
    #: (chosen by accuracy-objective tuning: :mod:`tuner.accuracy`); absent from the JSON of
    #: float32 steps, so that float32 plans read and write as before
    precision: dict[str, Any] | None = None


@dataclass
class Conversion:
    """Convert tensor ``value`` from layout ``src`` to ``dst`` through ``chain`` (converter
    names), once for all of ``consumers``. ``at_build`` conversions apply to constants and run
    once when the executor is built, never per inference."""

    value: str
    src: str
    dst: str
    chain: list[str]
    consumers: list[str]
    cost_bytes: float = 0.0
    at_build: bool = False


@dataclass
class Plan:
    """A complete assignment for a graph."""

    graph: str
    steps: list[PlanStep]
    conversions: list[Conversion]
    provenance: dict[str, Any] = field(default_factory=dict)
    version: int = PLAN_FORMAT_VERSION
    #: the non-finite guard: a plan that agrees with the reference on NaN/Inf inputs, run
    #: instead of this one for any request whose float inputs hold a NaN or an infinity
    #: (:mod:`dispatch.guard`); ``None`` (and absent from older plans' JSON): no guard
    nonfinite_fallback: Plan | None = None
    #: how the plan serves concurrent requests (:class:`dispatch.serving.ServingConfig` as a
    #: JSON object), set by throughput tuning; ``None`` (and absent from older plans' JSON):
    #: one executor, one request at a time on every core
    serving: dict[str, Any] | None = None
    #: a range plan (:class:`dispatch.range_plan.RangePlan` as a JSON object): the plan of a
    #: shape range, its buckets run by whole-model ways, with no steps of its own; ``None``
    #: (and absent from the JSON): a plan of concrete shapes
    shapes: dict[str, Any] | None = None
    #: a generation plan (:class:`dispatch.generation.plan.GenerationPlan` as a JSON object):
    #: the step ways of a decoder's prompt and token steps; ``None`` (and absent from the JSON)
    #: for every other plan
    generation: dict[str, Any] | None = None

    def generation_plan(self) -> Any:
        """The plan's :class:`~dispatch.generation.plan.GenerationPlan`, else ``None``."""
        if self.generation is None:
            return None
        from dispatch.generation.plan import GenerationPlan

        return GenerationPlan.from_dict(self.generation)

    def range_plan(self) -> Any:
        """The plan's :class:`~dispatch.range_plan.RangePlan`, else ``None``."""
        if self.shapes is None:
            return None
        from dispatch.range_plan import RangePlan

        return RangePlan.from_dict(self.shapes)

    def serving_config(self) -> Any:
        """The plan's :class:`~dispatch.serving.ServingConfig`, else ``None``."""
        if self.serving is None:
            return None
        from dispatch.serving import ServingConfig

        return ServingConfig.from_dict(self.serving)

    # -- lookup ------------------------------------------------------------------------
    def step_for(self, node: str) -> PlanStep:
        for s in self.steps:
            if node in s.nodes:
                return s
        raise PlanError(
            f"the plan assigns no implementation to node {node!r}; planned nodes: "
            f"{known(n for s in self.steps for n in s.nodes)}"
        )

    def backends_used(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for s in self.steps:
            counts[s.backend] = counts.get(s.backend, 0) + len(s.nodes)
        return counts

    # -- serialisation -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for optional in ("shapes", "generation"):
            if data.get(optional) is None:
                data.pop(optional, None)
        for plan in (data, data.get("nonfinite_fallback") or {}):
            for step in plan.get("steps", ()):
                if step.get("precision") is None:
                    step.pop("precision", None)
        return data

    def precisions(self) -> dict[str, int]:
        """Nodes per precision their steps compute in (``float32`` for steps without one)."""
        counts: dict[str, int] = {}
        for s in self.steps:
            p = s.precision or {}
            left = len(p.get("exclude") or ())  # left out of the reduced precision, in the rest's
            for dtype, n in ((str(p.get("dtype", "float32")), len(s.nodes) - left),
                             (str(p.get("inference_precision", "float32")), left)):
                if n:
                    counts[dtype] = counts.get(dtype, 0) + n
        return counts

    def precision_boundaries(self) -> list[str]:
        """The conversions into or out of a reduced-precision layout (:mod:`layouts.precision`),
        as ``value src->dst``: where the plan changes a tensor's precision between steps."""
        from layouts.precision import PRECISION_LAYOUTS

        return [f"{c.value} {c.src}->{c.dst}" for c in self.conversions
                if c.src in PRECISION_LAYOUTS or c.dst in PRECISION_LAYOUTS]

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    def guard_label(self) -> str | None:
        """What runs NaN/Inf requests when the plan is guarded (the fallback's validation
        label), else ``None``."""
        fb = self.nonfinite_fallback
        if fb is None:
            return None
        return str(fb.provenance.get("label") or "a plan that agrees with the reference")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, nested: bool = False) -> Plan:
        """A plan from its JSON data; anything but the plan's own structure of plain JSON
        values (unknown or missing fields, wrong types) raises :class:`PlanError`. A
        ``nonfinite_fallback`` is a plan of the same form, itself without a fallback."""
        where = "plan: nonfinite_fallback" if nested else "plan"
        if not isinstance(data, Mapping):
            raise PlanError(f"a plan must be a JSON object, received {type(data).__name__}")
        try:
            version = int(data.get("version", -1))
            if version != PLAN_FORMAT_VERSION:
                raise PlanError(
                    f"plan format version {version} is not supported; expected {PLAN_FORMAT_VERSION}"
                )
            _data_fields(data, cls, "plan")
            if not isinstance(data["graph"], str):
                raise PlanError(f"plan: graph must be a string, received {type(data['graph']).__name__}")
            provenance = data.get("provenance", {})
            if not isinstance(provenance, dict):
                raise PlanError(
                    f"plan: provenance must be a JSON object, received {type(provenance).__name__}"
                )
            steps = []
            for k, s in enumerate(_data_list(data["steps"], "plan: steps")):
                _data_fields(s, PlanStep, f"plan step {k}")
                rejected = [
                    Rejected(**_data_fields(r, Rejected, f"plan step {k}, rejected {j}"))
                    for j, r in enumerate(_data_list(s.get("rejected", []), f"plan step {k}: rejected"))
                ]
                steps.append(PlanStep(**{**s, "rejected": rejected}))
            convs = [
                Conversion(**_data_fields(c, Conversion, f"plan conversion {k}"))
                for k, c in enumerate(_data_list(data["conversions"], "plan: conversions"))
            ]
            fallback = data.get("nonfinite_fallback")
            if fallback is not None:
                if nested:
                    raise PlanError(f"{where}: a fallback plan cannot have a fallback of its own")
                fallback = cls.from_dict(fallback, nested=True)
            serving = data.get("serving")
            if serving is not None:
                if nested:
                    raise PlanError(f"{where}: a fallback plan has no serving configuration")
                from dispatch.serving import ServingConfig

                serving = ServingConfig.from_dict(serving).to_dict()
            shapes = data.get("shapes")
            if shapes is not None:
                if nested:
                    raise PlanError(f"{where}: a fallback plan has no shape range")
                from dispatch.range_plan import RangePlan
                shapes = RangePlan.from_dict(shapes).to_dict()
            generation = data.get("generation")
            if generation is not None:
                if nested:
                    raise PlanError(f"{where}: a fallback plan has no generation plan")
                from dispatch.generation.plan import GenerationPlan
                generation = GenerationPlan.from_dict(generation).to_dict()
            return cls(data["graph"], steps, convs, dict(provenance), version, fallback, serving,
                       shapes, generation)
        except PlanError as exc:
            if nested and not str(exc).startswith(where):
                raise PlanError(f"{where}: {exc}") from None
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"malformed {where}: {type(exc).__name__}: {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError(f"a plan must be JSON: {exc}") from None
        if not isinstance(data, dict):
            raise PlanError(f"a plan must be a JSON object, received {type(data).__name__}")
        return cls.from_dict(data)

    def describe(self) -> str:
        """A compact text table: node, op, implementation, backend, layouts (a range plan:
        its buckets)."""
        ranged = self.range_plan()
        if ranged is not None:
            return ranged.describe()
        rows = [("node", "op", "implementation", "backend", "layouts in -> out")]
        for s in self.steps:
            rows.append(
                (
                    step_label(s.nodes),
                    s.op,
                    s.impl,
                    s.backend,
                    f"{','.join(s.layouts_in) or '-'} -> {','.join(s.layouts_out)}",
                )
            )
        for c in self.conversions:
            rows.append(
                (
                    f"[convert {c.value}]",
                    "Converter",
                    " > ".join(c.chain),
                    "build time" if c.at_build else "run time",
                    f"{c.src} -> {c.dst}",
                )
            )
        widths = [min(48, max(len(r[k]) for r in rows)) for k in range(5)]
        table = "\n".join(
            "  ".join(col[: widths[k]].ljust(widths[k]) for k, col in enumerate(r)).rstrip()
            for r in rows
        )
        guard = self.guard_label()
        if guard is not None:
            table += f"\nguarded: NaN/Inf inputs run {guard}"
        serving = self.serving_config()
        if serving is not None:
            table += f"\nserving: {serving.label()} (tuned for {serving.concurrency} requests in flight)"
        precisions = self.precisions()
        if set(precisions) != {"float32"}:
            table += "\nprecision: " + ", ".join(f"{p} {n} node(s)" for p, n in precisions.items())
            boundaries = self.precision_boundaries()
            if boundaries:
                table += "; converted at the edges: " + ", ".join(boundaries)
            held = (self.provenance.get("accuracy") or {}).get("held_out") or {}
            acc = self.provenance.get("accuracy") or {}
            if held:
                table += (f"; {acc.get('metric')} {held.get('figure'):.5g} on "
                          f"{acc.get('data', {}).get('held_out')} held-out samples "
                          f"(budget {acc.get('budget'):g})")
        return table


#: JSON types allowed per field of the plan's dataclasses (anything else is rejected)
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "nodes": (list,), "op": (str,), "impl": (str,), "backend": (str,), "layouts_in": (list,),
    "layouts_out": (list,), "why": (str,), "rejected": (list,), "cost_ms": (int, float, type(None)),
    "value": (str,), "src": (str,), "dst": (str,), "chain": (list,), "consumers": (list,),
    "cost_bytes": (int, float), "at_build": (bool,), "reason": (str,), "graph": (str,),
    "steps": (list,), "conversions": (list,), "provenance": (dict,), "version": (int,),
    "nonfinite_fallback": (dict, type(None)), "serving": (dict, type(None)),
    "precision": (dict, type(None)), "shapes": (dict, type(None)),
    "generation": (dict, type(None)),
}
#: list fields whose items must be strings
_STRING_LISTS = {"nodes", "layouts_in", "layouts_out", "chain", "consumers"}


def _data_list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise PlanError(f"{where} must be a JSON list, received {type(value).__name__}")
    return value


@functools.cache
def _field_names(kind: type) -> tuple[frozenset[str], frozenset[str]]:
    """``(all, required)`` field names of dataclass ``kind``."""
    from dataclasses import MISSING, fields

    return (frozenset(f.name for f in fields(kind)),
            frozenset(f.name for f in fields(kind)
                      if f.default is MISSING and f.default_factory is MISSING))


def _data_fields(data: Any, kind: type, where: str) -> Any:
    """Check that ``data`` is a JSON object holding exactly the fields of dataclass ``kind``
    (the optional ones may be absent) with plain JSON values of the expected types."""
    if not isinstance(data, dict):
        raise PlanError(f"{where} must be a JSON object, received {type(data).__name__}")
    names, required = _field_names(kind)
    unknown = sorted(set(data) - names)
    missing = sorted(required - set(data))
    if unknown or missing:
        raise PlanError(
            f"{where}: unknown field(s) {unknown}, missing field(s) {missing}; expected the "
            f"fields {sorted(names)}"
        )
    for key, value in data.items():
        allowed = _FIELD_TYPES.get(key)
        if allowed is None:
            continue
        bad = not isinstance(value, allowed) or (bool not in allowed and isinstance(value, bool))
        if not bad and key in _STRING_LISTS:
            bad = not all(isinstance(x, str) for x in value)
        if bad:
            want = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
            what = "a list of strings" if key in _STRING_LISTS else want
            raise PlanError(f"{where}: field {key!r} must be {what}, received {value!r:.80}")
    return data


def step_label(nodes: Sequence[str]) -> str:
    """How a step's nodes are shown: ``a+b+c`` for a few, ``a..z (N nodes)`` for a region."""
    if len(nodes) <= 3:
        return "+".join(nodes)
    return f"{nodes[0]}..{nodes[-1]} ({len(nodes)} nodes)"
