"""Plan reports: what runs where, what it cost, what lost and why.

:func:`build_report` turns a :class:`~dispatch.plan.Plan` (with its graph, the plan store
and the registry) into a :class:`PlanReport`:

- ``table``: a pandas DataFrame, one row per node in execution order (name, op, shapes,
  implementation, backend, layouts, measured median and spread, share of the total, the
  runner-up and its time, every rejected candidate with its reason), with the plan's
  converters as rows of their own (``kind == "converter"``) placed where they run.
- ``rejections``: the same rejections in long form (one row per rejected candidate).
- ``summary``: total measured latency, converter share, time per backend, peak memory,
  speed-up against the heuristic plan and (estimated) against each single-backend plan,
  tuning time, plan key, fingerprints, when and on what machine the plan was tuned.

Every number comes from the plan store: node times are the tuner's measurements of each
step's candidate signature (``measurements`` table, the plan's hardware and software
digests), converter times the measurements under ``convert:{src}->{dst}:{shape}:{dtype}``,
end-to-end latency and peak memory the plan row and its provenance. A number the store does
not hold is reported as not known, never estimated silently; estimates (the sum of isolated
measurements) are labelled as such.

How a rejected candidate is compared: its measured kernel time, completed where it covers
only part of the plan's steps by the fastest measured single-node implementation of each
remaining node, against the plan's kernel time for the same steps (conversions are rows of
their own). "slower" gives the difference; "faster alone" means it was cheaper by kernel time
and lost on the layout conversions it forces or in the whole-plan optimisation and end-to-end
validation (the reason says which where the store tells). Each rejected candidate is listed
on the row of the first node it covers.

Also here: :func:`explain_node` (every candidate for one node), :func:`diff_plans` (per node,
what changed between two plans and why), :func:`profile_trace` (a Chrome-trace / Perfetto
JSON of real runs) and the renderers (text, markdown, csv, json, self-contained html).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import html
import io
import json
import math
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dispatch.errors import OpDispatchError, known
from dispatch.fusion import step_node
from dispatch.plan import Conversion, Plan, PlanStep, Rejected, heuristic_plan
from dispatch.registry import STANDARD

if TYPE_CHECKING:
    from dispatch.graph import Graph, Node, Value
    from dispatch.registry import Registry
    from tuner.candidates import Candidate
    from tuner.fingerprint import PlanKey
    from tuner.store import PlanStore, StoredMeasurement, StoredPlan

#: Output formats of :meth:`PlanReport.render`.
FORMATS = ("text", "markdown", "csv", "json", "html")
#: Columns of :attr:`PlanReport.table`, in order.
COLUMNS = (
    "order", "kind", "step", "name", "op", "step_op", "step_nodes", "shapes", "impl",
    "backend", "layouts_in", "layouts_out", "when", "median_ms", "spread_ms", "samples",
    "share", "time_source", "runner_up", "runner_up_backend", "runner_up_ms",
    "runner_up_delta_ms", "n_rejected", "rejected", "cost_bytes", "why",
)
#: Columns of :attr:`PlanReport.rejections`.
REJECTION_COLUMNS = (
    "node", "step", "impl", "backend", "covers", "verdict", "median_ms", "compare_ms",
    "plan_ms", "delta_ms", "reason",
)
#: Verdicts a rejected candidate can get.
VERDICTS = ("slower", "faster alone", "wrong result", "failed", "unsupported", "not measured",
            "not tried", "backend unavailable", "lost")
#: Fill colours of backends in drawings (others get a colour derived from their name).
BACKEND_COLOURS = {
    "numpy": "#4C72B0",
    "native": "#DD8452",
    "onnxruntime": "#55A868",
    "onednn": "#C44E52",
    "fake": "#937860",
}
CONVERTER_COLOUR = "#F2C14E"
_EXTRA_COLOURS = ("#8172B3", "#DA8BC3", "#64B5CD", "#8C8C8C", "#CCB974", "#2CA02C")
#: Seconds ``dot`` may take to lay out a graph before the built-in drawing is used.
DOT_TIMEOUT_S = 60.0


class ReportError(OpDispatchError):
    """A report, diff, explanation or trace could not be made from what was given."""


# ------------------------------------------------------------------------------------------
# small helpers
# ------------------------------------------------------------------------------------------


def _known(x: Any) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def fmt_ms(x: Any) -> str:
    """Milliseconds as text: 4 decimals, ``-`` when not known."""
    return f"{float(x):.4f}" if _known(x) else "-"


def fmt_delta(x: Any) -> str:
    """A signed millisecond difference, ``-`` when not known."""
    return f"{float(x):+.4f}" if _known(x) else "-"


def fmt_share(x: Any) -> str:
    """A fraction as a percentage with one decimal."""
    return f"{100.0 * float(x):.1f}%" if _known(x) else "-"


def fmt_bytes(x: Any) -> str:
    """Bytes with thousands separators and a MB figure."""
    if not _known(x):
        return "-"
    return f"{int(x):,} B ({int(x) / 1e6:.2f} MB)"


def _shape(v: Value | None) -> str:
    if v is None or v.shape is None:
        return "?"
    return "x".join(str(d) for d in v.shape) or "scalar"


def nodes_label(names: Sequence[str], limit: int = 3) -> str:
    """``A+B+C`` for short node lists, ``A..Z (N nodes)`` for long ones."""
    if len(names) <= limit:
        return "+".join(names)
    return f"{names[0]}..{names[-1]} ({len(names)} nodes)"


def backend_colour(backend: str) -> str:
    """The fill colour of ``backend`` in drawings and charts."""
    if backend in BACKEND_COLOURS:
        return BACKEND_COLOURS[backend]
    digest = int(hashlib.sha256(backend.encode()).hexdigest(), 16)
    return _EXTRA_COLOURS[digest % len(_EXTRA_COLOURS)]


def _verdict_of(reason: str) -> str:
    """The verdict of a rejection reason written by the planner or the tuner."""
    low = reason.lower()
    for prefix, verdict in (("unsupported", "unsupported"), ("wrong result", "wrong result"),
                            ("failed", "failed"), ("not measured", "not measured"),
                            ("not tried", "not tried"), ("backend unavailable", "backend unavailable"),
                            ("lost", "lost")):
        if low.startswith(prefix):
            return verdict
    return "lost"


def _ms(m: StoredMeasurement | None) -> float | None:
    if m is None or m.error is not None or m.median_s is None or not math.isfinite(m.median_s):
        return None
    return float(m.median_s) * 1e3


def _spread_ms(m: StoredMeasurement | None) -> float | None:
    if m is None or m.error is not None or m.spread_s is None:
        return None
    return float(m.spread_s) * 1e3


def conversion_signature(value: Value, src: str, dst: str) -> str:
    """The measurement signature the tuner records a conversion of ``value`` under."""
    assert value.shape is not None and value.dtype is not None
    return (f"convert:{src}->{dst}:{'x'.join(map(str, value.shape))}:"
            f"{np.dtype(value.dtype).str}")


def conversion_label(value: Value, src: str, dst: str, registry: Registry) -> str | None:
    """The candidate label of the converter chain the tuner measures for ``value``."""
    assert value.shape is not None and value.dtype is not None
    try:
        chain = registry.layouts.path(src, dst, value.shape, value.dtype)
    except OpDispatchError:
        return None
    return " > ".join(c.name for c in chain)


def plan_backends(plan: Plan, key: PlanKey | None = None) -> list[str]:
    """The backends the plan was tuned over (its software fingerprint), else those it uses."""
    software = key.software if key is not None else plan.provenance.get("software") or {}
    names = list((software.get("backends") or {}).keys())
    if names:
        return names
    order = plan.provenance.get("backend_order") or (plan.provenance.get("baseline") or {}).get(
        "backend_order")
    return list(order) if order else list(plan.backends_used())


@contextlib.contextmanager
def _opened_store(store: Any) -> Iterator[PlanStore | None]:
    """``store`` as an open PlanStore (a path is opened read-only and closed after)."""
    from tuner.store import PlanStore

    if store is None or store is False:
        yield None
        return
    if isinstance(store, PlanStore):
        yield store
        return
    if isinstance(store, str | os.PathLike):
        path = Path(os.fspath(store)).expanduser()
        if not path.is_file():
            raise ReportError(f"no plan store at {str(path)!r} (reports open it read-only and "
                              f"never create it)")
        with PlanStore(path, readonly=True) as opened:
            yield opened
        return
    raise ReportError(f"store must be a path or a tuner.store.PlanStore, received "
                      f"{type(store).__name__}")


# ------------------------------------------------------------------------------------------
# measurements
# ------------------------------------------------------------------------------------------


class _Measurements:
    """Store lookups under one hardware/software digest pair, cached."""

    def __init__(self, store: PlanStore | None, hw: str | None, sw: str | None,
                 registry: Registry | None) -> None:
        self.store = store
        self.hw = hw
        self.sw = sw
        self.registry = registry
        self._cache: dict[tuple[str, str], StoredMeasurement | None] = {}

    @property
    def usable(self) -> bool:
        return self.store is not None and self.hw is not None and self.sw is not None

    def get(self, sig: str | None, candidate: str) -> StoredMeasurement | None:
        if sig is None or not self.usable:
            return None
        k = (sig, candidate)
        if k not in self._cache:
            assert self.store is not None and self.hw is not None and self.sw is not None
            self._cache[k] = self.store.get_measurement(sig, candidate, self.hw, self.sw)
        return self._cache[k]

    def conversion(self, value: Value, src: str, dst: str,
                   chain: Sequence[str] | None = None) -> StoredMeasurement | None:
        """The measured cost of converting ``value`` from ``src`` to ``dst``: the chain's own
        measurement, else the cheapest chain measured for the same signature."""
        if src == dst or not self.usable or value.shape is None or value.dtype is None:
            return None
        sig = conversion_signature(value, src, dst)
        label = " > ".join(chain) if chain else (
            conversion_label(value, src, dst, self.registry) if self.registry else None)
        hit = self.get(sig, label) if label else None
        if hit is None:
            assert self.store is not None and self.hw is not None and self.sw is not None
            found = [m for m in self.store.measurements_for(sig, self.hw, self.sw) if m.ok]
            hit = found[0] if found else None
        return hit


def step_signature(graph: Graph, registry: Registry, step: PlanStep) -> str | None:
    """The measurement signature of a plan step (as the tuner computed it for its candidate),
    or ``None`` when its implementation is not registered here."""
    from tuner.candidates import signature

    try:
        impl = registry.impl(step.impl)
        node = step_node(graph, step.nodes, step.op)
    except OpDispatchError:
        return None
    return signature(impl, node, step.layouts_in, step.layouts_out)


# ------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------


@dataclass
class Alternative:
    """A candidate that did not win, compared with the plan."""

    node: str
    step: int | None
    impl: str
    backend: str
    covers: tuple[str, ...]
    verdict: str
    reason: str
    median_ms: float | None = None
    spread_ms: float | None = None
    samples: int | None = None
    measured_at: str | None = None
    compare_ms: float | None = None
    plan_ms: float | None = None
    delta_ms: float | None = None
    layouts_in: tuple[str, ...] = ()
    layouts_out: tuple[str, ...] = ()
    signature: str | None = None

    def record(self) -> dict[str, Any]:
        return {
            "node": self.node, "step": self.step, "impl": self.impl, "backend": self.backend,
            "covers": nodes_label(self.covers, 4) if self.covers else "", "verdict": self.verdict,
            "median_ms": self.median_ms, "compare_ms": self.compare_ms, "plan_ms": self.plan_ms,
            "delta_ms": self.delta_ms, "reason": self.reason,
        }


@dataclass
class PlanReport:
    """Everything a report shows (see the module docstring); :meth:`render` formats it."""

    plan: Plan
    graph: Graph | None
    table: pd.DataFrame
    rejections: pd.DataFrame
    summary: dict[str, Any]
    alternatives: dict[str, list[Alternative]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    # -- summary -----------------------------------------------------------------------
    def summary_rows(self) -> list[tuple[str, str]]:
        """The summary as (label, text) pairs; unknown figures say why they are unknown."""
        return summary_rows(self.summary)

    # -- rendering ---------------------------------------------------------------------
    def render(self, fmt: str = "text", *, rejected: bool = False) -> str:
        """The report as ``text`` (aligned terminal tables; ``rejected`` lists every rejected
        candidate too), ``markdown``, ``csv`` (the rows), ``json`` or ``html`` (one
        self-contained file)."""
        if fmt == "text":
            return render_text(self, rejected=rejected)
        if fmt == "markdown":
            return render_markdown(self)
        if fmt == "csv":
            return self.table.to_csv(index=False)
        if fmt == "json":
            return render_json(self)
        if fmt == "html":
            return render_html(self)
        raise ReportError(f"unknown report format {fmt!r}; expected one of {', '.join(FORMATS)}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able data: summary, rows, rejections (NaN as null)."""
        return {
            "summary": _jsonable(self.summary),
            "rows": _records(self.table),
            "rejections": _records(self.rejections),
            "notes": list(self.notes),
        }

    def explain(self, node: str) -> pd.DataFrame:
        """Every candidate for ``node``: see :func:`explain_node`."""
        return explain_node(self, node)


def report(
    plan: Any,
    graph: Graph | None = None,
    *,
    store: Any = None,
    registry: Registry | None = None,
) -> pd.DataFrame:
    """The report table of ``plan`` (a :class:`Plan`, or a ``dispatch.Session``): one row per
    node plus one per converter. See :func:`build_report`."""
    return build_report(plan, graph, store=store, registry=registry).table


def build_report(
    plan: Any,
    graph: Graph | None = None,
    *,
    store: Any = None,
    registry: Registry | None = None,
    stored: StoredPlan | None = None,
    key: PlanKey | None = None,
) -> PlanReport:
    """A :class:`PlanReport` of ``plan``.

    Args:
        plan: a :class:`Plan`, or a ``dispatch.Session`` (its plan, graph, registry and
            plan store are used).
        graph: the graph the plan runs (as imported and simplified); without it there are
            no shapes, candidates or drawings, and times come from the plan itself.
        store: a ``tuner.store.PlanStore`` or the path of one (opened read-only): the
            measurements, the stored plan row and its tuning run.
        registry: the registry (default: every discovered backend) used to compute
            measurement signatures and converter chains.
        stored: the store's row of this plan (found by the plan key when not given).
        key: the plan key whose hardware and software digests the measurements are looked up
            under (default: ``stored``'s key, else the plan's provenance). Give it for an
            untuned plan to use this machine's measurements.
    """
    if not isinstance(plan, Plan) and hasattr(plan, "plan") and hasattr(plan, "graph"):
        session = plan
        plan, graph = session.plan, graph or session.graph
        registry = registry or session.registry
        if store is None and getattr(session, "store_path", None) and os.path.exists(
                session.store_path):
            store = session.store_path
        key = key or getattr(session, "plan_key", None)
    if not isinstance(plan, Plan):
        raise ReportError(f"a report needs a dispatch.plan.Plan or a Session, received "
                          f"{type(plan).__name__}")
    with _opened_store(store) as opened:
        return _Builder(plan, graph, opened, registry, stored, key).build()


class _Builder:
    """Assembles a :class:`PlanReport` (see :func:`build_report`)."""

    def __init__(self, plan: Plan, graph: Graph | None, store: PlanStore | None,
                 registry: Registry | None, stored: StoredPlan | None,
                 key: PlanKey | None) -> None:
        from tuner.fingerprint import hardware_digest, software_digest

        self.plan = plan
        self.graph = graph
        self.store = store
        self.notes: list[str] = []
        if registry is None and graph is not None:
            from dispatch.backend import load_registry

            registry = load_registry()
        self.registry = registry
        prov = plan.provenance or {}
        if stored is None and store is not None and prov.get("plan_key"):
            stored = _stored_by_digest(store, str(prov["plan_key"]))
        self.stored = stored
        self.key = key or (stored.key if stored is not None else None)
        hw = sw = None
        if self.key is not None:
            hw, sw = hardware_digest(self.key.hardware), software_digest(self.key.software)
        elif prov.get("hardware") and prov.get("software"):
            hw, sw = hardware_digest(prov["hardware"]), software_digest(prov["software"])
        self.m = _Measurements(store, hw, sw, registry)
        if store is None:
            self.notes.append("no plan store given: times are the plan's own figures; spreads, "
                              "converter costs and alternatives' times are not known")
        elif hw is None:
            self.notes.append("the plan carries no hardware/software fingerprint: the store's "
                              "measurements cannot be matched to it")
        self.run = None
        if store is not None:
            run_id = stored.run_id if stored is not None else prov.get("tuning_run")
            if run_id is not None:
                self.run = next((r for r in store.runs() if r.id == run_id), None)
        if graph is not None:
            self._check_graph()

    def _check_graph(self) -> None:
        assert self.graph is not None
        planned = [n for s in self.plan.steps for n in s.nodes]
        names = {n.name for n in self.graph.nodes}
        missing = [n.name for n in self.graph.nodes if n.name not in planned]
        extra = [n for n in planned if n not in names]
        if missing or extra:
            raise ReportError(
                f"the plan does not match graph {self.graph.name!r}: graph nodes without a "
                f"step: {missing[:8]}; steps for nodes not in the graph: {extra[:8]}")

    # -- steps ---------------------------------------------------------------------------
    def _step_times(self) -> list[dict[str, Any]]:
        out = []
        for step in self.plan.steps:
            sig = None
            if self.graph is not None and self.registry is not None:
                sig = step_signature(self.graph, self.registry, step)
            m = self.m.get(sig, step.impl)
            if _ms(m) is not None:
                assert m is not None
                out.append({"sig": sig, "median_ms": _ms(m), "spread_ms": _spread_ms(m),
                            "samples": m.samples, "source": "store"})
            elif step.cost_ms is not None:
                out.append({"sig": sig, "median_ms": float(step.cost_ms), "spread_ms": None,
                            "samples": None, "source": "plan"})
            else:
                out.append({"sig": sig, "median_ms": None, "spread_ms": None, "samples": None,
                            "source": "not measured"})
        return out

    def _conversion_times(self) -> list[dict[str, Any]]:
        out = []
        for c in self.plan.conversions:
            rec: dict[str, Any] = {"median_ms": None, "spread_ms": None, "samples": None,
                                   "source": "build time" if c.at_build else "not measured"}
            if not c.at_build and self.graph is not None:
                m = self.m.conversion(self.graph.value(c.value), c.src, c.dst, c.chain)
                if _ms(m) is not None:
                    assert m is not None
                    rec.update(median_ms=_ms(m), spread_ms=_spread_ms(m), samples=m.samples,
                               source="store")
            out.append(rec)
        return out

    # -- alternatives --------------------------------------------------------------------
    def _candidates(self) -> Any:
        if self.graph is None or self.registry is None:
            return None
        from tuner.candidates import enumerate_candidates

        available = self.registry.available_backends()
        wanted = plan_backends(self.plan, self.key)
        allowed = [b for b in wanted if b in available]
        missing = [b for b in wanted if b not in available]
        if missing:
            self.notes.append(f"backend(s) {missing} of the plan are not available here: their "
                              f"candidates are not listed")
        try:
            return enumerate_candidates(self.graph, self.registry, allowed or available)
        except OpDispatchError as exc:
            self.notes.append(f"candidates could not be enumerated: {exc}")
            return None

    def _alternatives(self, times: list[dict[str, Any]]) -> dict[str, list[Alternative]]:
        plan = self.plan
        step_of = {n: k for k, s in enumerate(plan.steps) for n in s.nodes}
        cands = self._candidates()
        out: dict[str, list[Alternative]] = {}
        if cands is None:
            for k, step in enumerate(plan.steps):
                for r in step.rejected:
                    out.setdefault(step.nodes[0], []).append(Alternative(
                        step.nodes[0], k, r.impl, r.backend, (), _verdict_of(r.reason), r.reason))
            return out
        measured: dict[str, tuple[Candidate, StoredMeasurement | None]] = {}
        for c in cands.candidates:
            measured[c.id] = (c, self.m.get(c.signature, c.impl.name))
        best_single: dict[str, tuple[str, float]] = {}
        for c, m in measured.values():
            ms = _ms(m)
            if len(c.nodes) == 1 and ms is not None:
                n = c.nodes[0]
                if n not in best_single or ms < best_single[n][1]:
                    best_single[n] = (c.impl.name, ms)
        chosen = {(s.impl, tuple(s.nodes)) for s in plan.steps}
        produced = self._produced_layouts()
        skipped = bool(self.run and (self.run.stats or {}).get("skipped_budget"))
        for c, m in measured.values():
            if (c.impl.name, tuple(c.nodes)) in chosen:
                continue
            first = c.nodes[0]
            alt = Alternative(first, step_of.get(first), c.impl.name, c.impl.backend, c.nodes,
                              "", "", layouts_in=tuple(c.layouts_in),
                              layouts_out=tuple(c.layouts_out), signature=c.signature)
            if m is not None:
                alt.samples, alt.measured_at = m.samples, m.created_at
            if m is None:
                alt.verdict = "not measured"
                alt.reason = ("not measured: the tuning budget was spent before it" if skipped
                              else "not measured on this machine and software")
            elif m.error is not None:
                alt.verdict = "wrong result" if m.error.startswith("wrong") else "failed"
                alt.reason = m.error
            else:
                alt.median_ms, alt.spread_ms = _ms(m), _spread_ms(m)
                self._compare(alt, c, step_of, times, best_single, produced)
            out.setdefault(first, []).append(alt)
        for node, rejected in cands.rejected.items():
            for r in rejected:
                out.setdefault(node, []).append(Alternative(
                    node, step_of.get(node), r.impl, r.backend, (node,), "unsupported",
                    r.reason.removeprefix("unsupported: ")))
        # what the planner recorded that the enumeration here does not know (another
        # machine's backends, the heuristic's "not tried" ones)
        known_impls = {(a.node, a.impl) for alts in out.values() for a in alts}
        enumerated = {c.impl.name for c in cands.candidates}
        for k, step in enumerate(plan.steps):
            for r in step.rejected:
                if r.impl in enumerated or (step.nodes[0], r.impl) in known_impls:
                    continue
                if any((n, r.impl) in known_impls for n in step.nodes):
                    continue
                out.setdefault(step.nodes[0], []).append(Alternative(
                    step.nodes[0], k, r.impl, r.backend, (), _verdict_of(r.reason), r.reason))
                known_impls.add((step.nodes[0], r.impl))
        for alts in out.values():
            alts.sort(key=lambda a: (VERDICTS.index(a.verdict) if a.verdict in VERDICTS else 99,
                                     a.compare_ms if a.compare_ms is not None else math.inf,
                                     a.impl))
        return out

    def _produced_layouts(self) -> dict[str, str]:
        assert self.graph is not None
        produced = {v.name: STANDARD for v in self.graph.inputs}
        for step in self.plan.steps:
            node = step_node(self.graph, step.nodes, step.op)
            for v, lay in zip(node.outputs, step.layouts_out):
                produced[v.name] = lay
        return produced

    def _wanted_layouts(self) -> dict[str, set[str]]:
        """Value -> the layouts the plan's steps (and the graph outputs) read it in; cached."""
        cached = getattr(self, "_wanted", None)
        if cached is not None:
            return cached
        assert self.graph is not None
        wanted: dict[str, set[str]] = {v.name: {STANDARD} for v in self.graph.outputs}
        for step in self.plan.steps:
            node = step_node(self.graph, step.nodes, step.op)
            for v, lay in zip(node.inputs, step.layouts_in):
                if v is not None and not v.is_const:
                    wanted.setdefault(v.name, set()).add(lay)
        self._wanted: dict[str, set[str]] | None = wanted
        return wanted

    def _compare(self, alt: Alternative, c: Candidate, step_of: Mapping[str, int],
                 times: list[dict[str, Any]], best_single: Mapping[str, tuple[str, float]],
                 produced: Mapping[str, str]) -> None:
        plan = self.plan
        steps = sorted({step_of[n] for n in c.nodes if n in step_of})
        covered = [n for k in steps for n in plan.steps[k].nodes]
        rest = [n for n in covered if n not in c.nodes]
        plan_parts = [times[k]["median_ms"] for k in steps]
        assert alt.median_ms is not None
        if any(p is None for p in plan_parts):
            alt.verdict = "lost"
            alt.reason = (f"{fmt_ms(alt.median_ms)} ms; the plan's time for the same nodes is "
                          f"not known")
            return
        plan_ms = float(sum(plan_parts))
        fill = [(n, *best_single[n]) for n in rest if n in best_single]
        if len(fill) < len(rest):
            lacking = [n for n in rest if n not in best_single]
            alt.verdict = "lost"
            alt.plan_ms = plan_ms
            alt.reason = (f"covers {nodes_label(c.nodes)} in {fmt_ms(alt.median_ms)} ms; not "
                          f"comparable: no measured single-node implementation for "
                          f"{nodes_label(lacking)}")
            return
        compare = alt.median_ms + sum(ms for _, _, ms in fill)
        alt.compare_ms, alt.plan_ms = compare, plan_ms
        alt.delta_ms = compare - plan_ms
        pct = 100.0 * alt.delta_ms / plan_ms if plan_ms > 0 else 0.0
        same = not rest and len(steps) == 1
        if same:
            what = ""
        else:
            parts = [f"{fmt_ms(alt.median_ms)} ms for {nodes_label(c.nodes)}"]
            parts += [f"{ms:.4f} ms for {n} by {impl}" for n, impl, ms in fill]
            labels = [nodes_label(plan.steps[k].nodes) for k in steps]
            where = ", ".join(labels) if len(labels) <= 3 else (
                f"{', '.join(labels[:2])}, ... ({len(labels)} steps)")
            total = f" = {fmt_ms(compare)} ms" if fill else ""
            what = (f"{' + '.join(parts)}{total} vs {fmt_ms(plan_ms)} ms for the plan's "
                    f"step(s) {where}: ")
        if alt.delta_ms >= 0:
            alt.verdict = "slower"
            alt.reason = f"{what}slower by {alt.delta_ms:.4f} ms ({pct:+.0f}%)"
            return
        alt.verdict = "faster alone"
        why = self._why_faster_lost(c, plan.steps[steps[0]], times[steps[0]]["median_ms"],
                                    alt.median_ms, produced) if same else None
        alt.reason = (f"{what}faster by kernel time alone by {-alt.delta_ms:.4f} ms ({pct:+.0f}%); "
                      + (why or self._lost_whole_plan()))

    def _lost_whole_plan(self) -> str:
        winner = (self.plan.provenance or {}).get("winner")
        if winner and winner != "optimum":
            return (f"this plan is the {winner!r} plan, which beat the optimiser's optimum "
                    f"end to end")
        return "lost on the layout conversions it forces or in the whole-plan optimisation"

    def _why_faster_lost(self, c: Candidate, step: PlanStep, step_ms: float, alt_ms: float,
                         produced: Mapping[str, str]) -> str | None:
        """Conversions the candidate would force in place of the chosen step (neighbours as
        planned) against those the chosen step forces."""
        assert self.graph is not None
        wanted = self._wanted_layouts()
        node = step_node(self.graph, step.nodes, step.op)

        def forced(lin: Sequence[str], lout: Sequence[str]) -> tuple[float | None, list[str]]:
            total, what = 0.0, []
            for v, lay in zip(node.inputs, lin):
                if v is None or v.is_const:
                    continue
                src = produced.get(v.name, STANDARD)
                if src != lay:
                    ms = _ms(self.m.conversion(v, src, lay))
                    if ms is None:
                        return None, [f"{v.name} {src}->{lay} (not measured)"]
                    total += ms
                    what.append(f"{v.name} {src}->{lay} {ms:.4f} ms")
            for v, lay in zip(node.outputs, lout):
                for dst in sorted(wanted.get(v.name, set()) - {lay}):
                    ms = _ms(self.m.conversion(v, lay, dst))
                    if ms is None:
                        return None, [f"{v.name} {lay}->{dst} (not measured)"]
                    total += ms
                    what.append(f"{v.name} {lay}->{dst} {ms:.4f} ms")
            return total, what

        alt_conv, alt_what = forced(c.layouts_in, c.layouts_out)
        own_conv, own_what = forced(step.layouts_in, step.layouts_out)
        if alt_conv is None or own_conv is None:
            unknown = alt_what if alt_conv is None else own_what
            return f"its conversion costs are not known ({', '.join(unknown)})"
        alt_total, own_total = alt_ms + alt_conv, step_ms + own_conv
        if alt_total > own_total:
            return (f"lost on layout conversions: it needs {alt_conv:.4f} ms "
                    f"({', '.join(alt_what) or 'none'}) where the chosen one needs "
                    f"{own_conv:.4f} ms ({', '.join(own_what) or 'none'}): "
                    f"{alt_total - own_total:.4f} ms slower in place")
        return (f"cheaper in place too ({alt_total:.4f} vs {own_total:.4f} ms with conversions); "
                + self._lost_whole_plan())

    # -- rows ----------------------------------------------------------------------------
    def build(self) -> PlanReport:
        plan, graph = self.plan, self.graph
        times = self._step_times()
        conv_times = self._conversion_times()
        alts = self._alternatives(times)
        kernel_ms = [t["median_ms"] for t in times]
        run_conv_ms = [t["median_ms"] for c, t in zip(plan.conversions, conv_times) if not c.at_build]
        total_parts = None
        if all(x is not None for x in kernel_ms) and all(x is not None for x in run_conv_ms):
            total_parts = float(sum(kernel_ms) + sum(run_conv_ms))  # type: ignore[arg-type]
        by_node = {n.name: n for n in graph.nodes} if graph is not None else {}
        step_inputs = self._step_input_layouts()
        emitted: set[int] = set()
        rows: list[dict[str, Any]] = []

        def add_conversion(k: int) -> None:
            c, t = plan.conversions[k], conv_times[k]
            emitted.add(k)
            v = graph.value(c.value) if graph is not None else None
            rows.append({
                "kind": "converter", "step": pd.NA, "name": f"convert {c.value} {c.src}->{c.dst}",
                "op": "Converter", "step_op": "Converter", "step_nodes": ", ".join(c.consumers),
                "shapes": _shape(v), "impl": " > ".join(c.chain),
                "backend": self._converter_backend(c), "layouts_in": c.src, "layouts_out": c.dst,
                "when": "build" if c.at_build else "run", "median_ms": t["median_ms"],
                "spread_ms": t["spread_ms"], "samples": t["samples"],
                "share": _share(t["median_ms"], total_parts) if not c.at_build else None,
                "time_source": t["source"], "runner_up": "", "runner_up_backend": "",
                "runner_up_ms": None, "runner_up_delta_ms": None, "n_rejected": 0,
                "rejected": "", "cost_bytes": c.cost_bytes,
                "why": ("converted once when the executor is built" if c.at_build else
                        f"{c.src} produced, {c.dst} wanted by {', '.join(c.consumers)}"),
            })

        for k, c in enumerate(plan.conversions):
            if c.at_build:
                add_conversion(k)
        by_target = {(c.value, c.dst): k for k, c in enumerate(plan.conversions) if not c.at_build}
        for s, step in enumerate(plan.steps):
            for value, lay in step_inputs.get(s, []):
                k = by_target.get((value, lay))
                if k is not None and k not in emitted:
                    add_conversion(k)
            t = times[s]
            runner = self._runner_up(step, s, alts, t["median_ms"])
            for j, name in enumerate(step.nodes):
                node = by_node.get(name)
                mine = alts.get(name, [])
                first = j == 0
                rows.append({
                    "kind": "node", "step": s, "name": name,
                    "op": node.op_type if node is not None else (step.op if len(step.nodes) == 1 else ""),
                    "step_op": step.op, "step_nodes": nodes_label(step.nodes),
                    "shapes": _node_shapes(node), "impl": step.impl, "backend": step.backend,
                    "layouts_in": ",".join(step.layouts_in), "layouts_out": ",".join(step.layouts_out),
                    "when": "run",
                    "median_ms": t["median_ms"] if first else None,
                    "spread_ms": t["spread_ms"] if first else None,
                    "samples": t["samples"] if first else None,
                    "share": _share(t["median_ms"], total_parts) if first else None,
                    "time_source": t["source"] if first else f"in step {s} ({step.nodes[0]})",
                    "runner_up": runner[0] if first else "",
                    "runner_up_backend": runner[1] if first else "",
                    "runner_up_ms": runner[2] if first else None,
                    "runner_up_delta_ms": runner[3] if first else None,
                    "n_rejected": len(mine),
                    "rejected": " | ".join(rejection_text(a) for a in mine),
                    "cost_bytes": None, "why": step.why,
                })
        for k in range(len(plan.conversions)):
            if k not in emitted:
                add_conversion(k)
        table = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "order"])
        table.insert(0, "order", range(len(table)))
        for col in ("step", "samples", "n_rejected"):
            table[col] = table[col].astype("Int64")
        for col in ("median_ms", "spread_ms", "share", "runner_up_ms", "runner_up_delta_ms",
                    "cost_bytes"):
            table[col] = pd.to_numeric(table[col], errors="coerce").astype("float64")
        rej = [a.record() for n in (r["name"] for r in rows if r["kind"] == "node")
               for a in alts.get(n, [])]
        rejections = pd.DataFrame(rej, columns=list(REJECTION_COLUMNS))
        rejections["step"] = rejections["step"].astype("Int64")
        for col in ("median_ms", "compare_ms", "plan_ms", "delta_ms"):
            rejections[col] = pd.to_numeric(rejections[col], errors="coerce").astype("float64")
        summary = self._summary(table, times, conv_times, total_parts)
        return PlanReport(plan, graph, table, rejections, summary, alts, list(self.notes))

    def _converter_backend(self, c: Conversion) -> str:
        if self.registry is not None and c.chain:
            with contextlib.suppress(OpDispatchError):
                return self.registry.layouts.converter(c.chain[0]).backend
        return ""

    def _step_input_layouts(self) -> dict[int, list[tuple[str, str]]]:
        if self.graph is None:
            return {}
        out: dict[int, list[tuple[str, str]]] = {}
        for s, step in enumerate(self.plan.steps):
            node = step_node(self.graph, step.nodes, step.op)
            out[s] = [(v.name, lay) for v, lay in zip(node.inputs, step.layouts_in) if v is not None]
        return out

    def _runner_up(self, step: PlanStep, s: int, alts: Mapping[str, list[Alternative]],
                   step_ms: float | None) -> tuple[str, str, float | None, float | None]:
        """The fastest measured alternative over exactly this step's nodes (completed by
        single-node implementations where it covers part of them)."""
        best: Alternative | None = None
        nodes = set(step.nodes)
        for n in step.nodes:
            for a in alts.get(n, []):
                if a.compare_ms is None or not a.covers or not set(a.covers) <= nodes:
                    continue
                if best is None or a.compare_ms < best.compare_ms:  # type: ignore[operator]
                    best = a
        # an alternative starting before this step but covering only its nodes is listed at
        # its first node, which is in this step by construction
        if best is None:
            return "", "", None, None
        label = best.impl if set(best.covers) == nodes else f"{best.impl} (+ single-node impls)"
        delta = best.compare_ms - step_ms if step_ms is not None else None  # type: ignore[operator]
        return label, best.backend, best.compare_ms, delta

    # -- summary ---------------------------------------------------------------------------
    def _summary(self, table: pd.DataFrame, times: list[dict[str, Any]],
                 conv_times: list[dict[str, Any]], total_parts: float | None) -> dict[str, Any]:
        plan, prov, stored = self.plan, self.plan.provenance or {}, self.stored
        validated = list(prov.get("validated") or [])
        winner_label = prov.get("winner") or (stored.notes.get("winner") if stored else None)
        win = next((v for v in validated if v.get("label") == winner_label), None)
        latency = stored.latency_ms if stored is not None and stored.latency_ms is not None else (
            win.get("latency_ms") if win else None)
        spread = win.get("spread_ms") if win else None
        peak = stored.peak_bytes if stored is not None and stored.peak_bytes is not None else (
            win.get("peak_bytes") if win else None)
        nodes = table[table["kind"] == "node"]
        convs = table[(table["kind"] == "converter") & (table["when"] == "run")]
        kernel_known = all(t["median_ms"] is not None for t in times)
        conv_known = all(t["median_ms"] is not None for c, t in zip(plan.conversions, conv_times)
                         if not c.at_build)
        per_backend: dict[str, float | None] = {}
        steps_per_backend: dict[str, int] = {}
        for step, t in zip(plan.steps, times):
            steps_per_backend[step.backend] = steps_per_backend.get(step.backend, 0) + 1
            prev = per_backend.get(step.backend, 0.0)
            per_backend[step.backend] = None if prev is None or t["median_ms"] is None else prev + t["median_ms"]
        conv_ms = float(convs["median_ms"].sum()) if conv_known else None
        s: dict[str, Any] = {
            "model": plan.graph,
            "plan_id": stored.id if stored is not None else None,
            "source": prov.get("source", "unknown"),
            "winner": winner_label,
            "objective": prov.get("objective") or (self.key.objective if self.key else None),
            "plan_key": (self.key.digest() if self.key is not None else prov.get("plan_key")),
            "model_fingerprint": self.key.model if self.key is not None else None,
            "inputs": self.key.inputs if self.key is not None else None,
            "hardware": (self.key.hardware if self.key is not None else prov.get("hardware")),
            "software": (self.key.software if self.key is not None else prov.get("software")),
            "hardware_digest": self.m.hw, "software_digest": self.m.sw,
            "tuned_at": prov.get("tuned_at"),
            "stored_at": stored.created_at if stored is not None else None,
            "imported_at": stored.notes.get("imported_at") if stored is not None else None,
            "latency_ms": latency, "latency_spread_ms": spread, "peak_bytes": peak,
            "latency_basis": "validated end to end (median of runs)" if latency is not None else None,
            "steps": len(plan.steps), "nodes": len(nodes),
            "conversions_run": len(convs),
            "conversions_build": int(sum(1 for c in plan.conversions if c.at_build)),
            "kernels_ms": float(sum(t["median_ms"] for t in times)) if kernel_known else None,
            "converters_ms": conv_ms,
            "sum_of_parts_ms": total_parts,
            "converter_share": (conv_ms / total_parts) if conv_ms is not None and total_parts else None,
            "time_per_backend_ms": per_backend,
            "steps_per_backend": steps_per_backend,
            "nodes_per_backend": plan.backends_used(),
            "optimizer": prov.get("optimizer"),
            "validated": validated,
            "tuning": self._tuning(),
            "vs_heuristic": self._vs_heuristic(validated, winner_label, latency),
            "vs_single_backend": self._vs_single_backends(total_parts),
            "store": str(self.store.path) if self.store is not None else None,
        }
        return s

    def _tuning(self) -> dict[str, Any] | None:
        r = self.run
        if r is None:
            return None
        stats = r.stats or {}
        return {"run_id": r.id, "status": r.status, "started_at": r.started_at,
                "finished_at": r.finished_at, "budget_s": r.budget_s,
                "tuning_s": stats.get("tuning_s"), "measured": stats.get("measured"),
                "reused": stats.get("reused"), "skipped_budget": stats.get("skipped_budget"),
                "conversions_measured": stats.get("conversions_measured"),
                "conversions_estimated": stats.get("conversions_estimated"),
                "wrong": stats.get("wrong"), "candidates": stats.get("candidates")}

    def _vs_heuristic(self, validated: list[dict[str, Any]], winner: str | None,
                      latency: float | None) -> dict[str, Any]:
        heur = next((v for v in validated if str(v.get("label", "")).startswith("untuned")), None)
        if heur is None:
            why = ("this plan is not a tuned plan" if (self.plan.provenance or {}).get("source") != "tuned"
                   else "the tuner's validation did not record the heuristic plan")
            return {"speedup": None, "heuristic_ms": None, "note": f"not known: {why}"}
        if heur.get("error") or heur.get("latency_ms") is None:
            return {"speedup": None, "heuristic_ms": None,
                    "note": f"not known: the heuristic plan failed validation ({heur.get('error')})"}
        if latency is None:
            return {"speedup": None, "heuristic_ms": heur["latency_ms"],
                    "note": "not known: this plan's end-to-end latency is not recorded"}
        note = "measured end to end by the tuner's validation, interleaved"
        if winner == heur.get("label"):
            note += "; the heuristic plan itself won"
        return {"speedup": float(heur["latency_ms"]) / float(latency),
                "heuristic_ms": float(heur["latency_ms"]), "note": note}

    def _vs_single_backends(self, own_parts: float | None) -> dict[str, dict[str, Any]]:
        """Each single-backend plan's estimated time: the sum of the store's isolated
        measurements of its steps and run-time conversions (never run end to end)."""
        out: dict[str, dict[str, Any]] = {}
        if self.graph is None or self.registry is None:
            return out
        available = self.registry.available_backends()
        for b in plan_backends(self.plan, self.key):
            if b not in available:
                out[b] = {"estimated_ms": None, "speedup": None,
                          "note": "not known: the backend is not available here"}
                continue
            try:
                single = heuristic_plan(self.graph, self.registry, [b])
            except OpDispatchError as exc:
                first = str(exc).splitlines()[0].split(". Allowed backends")[0]
                out[b] = {"estimated_ms": None, "speedup": None,
                          "note": f"cannot run the whole model alone: {first[:300]}"}
                continue
            total, missing = 0.0, 0
            for step in single.steps:
                ms = _ms(self.m.get(step_signature(self.graph, self.registry, step), step.impl))
                if ms is None:
                    missing += 1
                else:
                    total += ms
            conv_missing = 0
            for c in single.conversions:
                if c.at_build:
                    continue
                ms = _ms(self.m.conversion(self.graph.value(c.value), c.src, c.dst, c.chain))
                if ms is None:
                    conv_missing += 1
                else:
                    total += ms
            if missing or conv_missing:
                out[b] = {"estimated_ms": None, "speedup": None, "steps": len(single.steps),
                          "note": f"not known: {missing} of {len(single.steps)} step(s) and "
                                  f"{conv_missing} conversion(s) of the {b}-only plan were never "
                                  f"measured here"}
                continue
            out[b] = {"estimated_ms": total, "steps": len(single.steps),
                      "speedup": total / own_parts if own_parts else None,
                      "note": "estimated: sum of isolated measurements, against this plan's sum "
                              "of parts (not run end to end)"}
        return out


def rejection_text(a: Alternative) -> str:
    """``impl (backend): verdict: reason`` (the verdict once when the reason starts with it)."""
    if a.reason.lower().startswith(a.verdict):
        return f"{a.impl} ({a.backend}): {a.reason}"
    return f"{a.impl} ({a.backend}): {a.verdict}: {a.reason}"


def _levels(ids: Sequence[str], edges: Sequence[tuple[str, str, str]]) -> dict[str, int]:
    """Longest-path level of each box (Kahn's order; a box in a cycle keeps level 0)."""
    preds: dict[str, set[str]] = {i: set() for i in ids}
    succs: dict[str, set[str]] = {i: set() for i in ids}
    for a, b, _ in edges:
        preds[b].add(a)
        succs[a].add(b)
    waiting = {i: len(p) for i, p in preds.items()}
    level = dict.fromkeys(ids, 0)
    ready = [i for i in ids if waiting[i] == 0]
    while ready:
        i = ready.pop()
        for j in succs[i]:
            level[j] = max(level[j], level[i] + 1)
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.append(j)
    return level


def _share(ms: float | None, total: float | None) -> float | None:
    if ms is None or not total:
        return None
    return float(ms) / float(total)


def _node_shapes(node: Node | None) -> str:
    if node is None:
        return ""
    ins = [_shape(v) for v in node.inputs if v is not None and not v.is_const]
    outs = [_shape(v) for v in node.outputs]
    return f"{', '.join(ins) or '-'} -> {', '.join(outs)}"


def _stored_by_digest(store: PlanStore, digest: str) -> StoredPlan | None:
    rows = list(store.db.query("SELECT id FROM plans WHERE key_digest = ?", [digest]))
    return store.plan_by_id(int(rows[0]["id"])) if rows else None


def _jsonable(data: Any) -> Any:
    if isinstance(data, Mapping):
        return {str(k): _jsonable(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_jsonable(v) for v in data]
    if isinstance(data, float | np.floating):
        return float(data) if math.isfinite(float(data)) else None
    if isinstance(data, np.integer):
        return int(data)
    if data is pd.NA:
        return None
    return data


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for rec in df.astype(object).to_dict("records"):
        out.append({k: (None if (v is pd.NA or (isinstance(v, float) and math.isnan(v))) else
                        _jsonable(v)) for k, v in rec.items()})
    return out


# ------------------------------------------------------------------------------------------
# summary as text
# ------------------------------------------------------------------------------------------


def summary_rows(s: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A report summary (:attr:`PlanReport.summary`) as (label, text) pairs."""
    rows: list[tuple[str, str]] = [("model", str(s.get("model")))]
    plan_id = s.get("plan_id")
    source = s.get("source")
    rows.append(("plan", (f"id {plan_id} in {s.get('store')}" if plan_id is not None else
                          "not from a plan store") + f"; source {source}"
                 + (f", winner of validation: {s['winner']}" if s.get("winner") else "")))
    rows.append(("objective", str(s.get("objective") or "not known")))
    lat = s.get("latency_ms")
    rows.append(("total latency", f"{fmt_ms(lat)} ms (spread {fmt_ms(s.get('latency_spread_ms'))}),"
                                  f" {s.get('latency_basis')}" if lat is not None
                 else "not known: no end-to-end validation recorded for this plan"))
    parts = s.get("sum_of_parts_ms")
    rows.append(("sum of parts", f"{fmt_ms(parts)} ms = kernels {fmt_ms(s.get('kernels_ms'))} ms + "
                                 f"converters {fmt_ms(s.get('converters_ms'))} ms (isolated "
                                 f"measurements)" if parts is not None
                 else "not known: some steps or conversions were never measured"))
    share = s.get("converter_share")
    rows.append(("converter share", f"{fmt_share(share)} of the sum of parts "
                                    f"({s.get('conversions_run')} run-time, "
                                    f"{s.get('conversions_build')} build-time conversions)"
                 if share is not None else "not known"))
    per = s.get("time_per_backend_ms") or {}
    steps = s.get("steps_per_backend") or {}
    nodes = s.get("nodes_per_backend") or {}
    rows.append(("time per backend", "; ".join(
        f"{b}: {fmt_ms(ms)} ms, {steps.get(b, 0)} step(s), {nodes.get(b, 0)} node(s)"
        for b, ms in per.items()) or "-"))
    rows.append(("peak memory", fmt_bytes(s.get("peak_bytes")) + " (executor liveness plan)"
                 if _known(s.get("peak_bytes")) else "not known"))
    vh = s.get("vs_heuristic") or {}
    rows.append(("vs heuristic plan", f"{vh['speedup']:.2f}x ({fmt_ms(vh.get('heuristic_ms'))} ms; "
                                      f"{vh.get('note')})" if vh.get("speedup") is not None
                 else str(vh.get("note", "not known"))))
    for b, v in (s.get("vs_single_backend") or {}).items():
        if v.get("estimated_ms") is not None:
            sp = f"{v['speedup']:.2f}x" if v.get("speedup") is not None else "speed-up not known"
            text = f"{sp} (~{fmt_ms(v['estimated_ms'])} ms; {v.get('note')})"
        else:
            text = str(v.get("note"))
        rows.append((f"vs {b}-only plan", text))
    opt = s.get("optimizer") or {}
    if opt:
        predicted = opt.get("predicted_s")
        rows.append(("optimiser", f"{opt.get('method')} ({'optimal' if opt.get('optimal') else 'not proven optimal'})"
                                  + (f", predicted {predicted * 1e3:.4f} ms" if predicted is not None else "")))
    tun = s.get("tuning")
    if tun:
        took = tun.get("tuning_s")
        rows.append(("tuning", f"run {tun['run_id']} {tun['status']}: "
                               + (f"{took:.1f} s" if took is not None else "time not known")
                               + (f" (budget {tun['budget_s']:g} s)" if tun.get("budget_s") else "")
                               + f", {tun.get('measured')} measured, {tun.get('reused')} reused, "
                                 f"{tun.get('skipped_budget')} skipped over budget"
                               + (f", {tun['conversions_estimated']} converter cost(s) estimated "
                                  f"from bandwidth (not stored, so shown as not measured)"
                                  if tun.get("conversions_estimated") else "")
                               + f", started {tun.get('started_at')}"))
    else:
        rows.append(("tuning", "not known: the tuning run is not in this store (an imported or "
                               "untuned plan)" if source != "tuned" or plan_id is not None
                     else "not known: no plan store given"))
    rows.append(("tuned at", str(s.get("tuned_at") or "not known")
                 + (f"; stored {s['stored_at']}" if s.get("stored_at") else "")
                 + (f"; imported {s['imported_at']}" if s.get("imported_at") else "")))
    hw = s.get("hardware") or {}
    if hw:
        rows.append(("machine", f"{hw.get('cpu_model') or '?'} ({hw.get('arch')}, {hw.get('system')}), "
                                f"{hw.get('physical_cores')} physical / {hw.get('logical_cores')} "
                                f"logical core(s), {hw.get('threads')} thread(s), ISA "
                                f"{', '.join(hw.get('isa') or []) or '-'}"
                                + (f", GPU {', '.join(hw['gpus'])}" if hw.get("gpus") else "")))
    else:
        rows.append(("machine", "not known"))
    sw = s.get("software") or {}
    if sw:
        rows.append(("software", "; ".join(f"{v}" for v in (sw.get("backends") or {}).values())
                                 + f"; opdispatch {sw.get('opdispatch')}, plan format "
                                   f"{sw.get('plan_format')}"))
    rows.append(("plan key", str(s.get("plan_key") or "not known")))
    if s.get("model_fingerprint"):
        rows.append(("model fingerprint", f"{s['model_fingerprint']} (inputs {s.get('inputs')})"))
    rows.append(("fingerprints", f"hardware {s.get('hardware_digest') or '-'}, software "
                                 f"{s.get('software_digest') or '-'}"))
    return rows


# ------------------------------------------------------------------------------------------
# text and markdown
# ------------------------------------------------------------------------------------------

def aligned(rows: Sequence[Sequence[Any]], *, max_width: int = 48,
            numeric: Sequence[int] = ()) -> str:
    """An aligned terminal table: header, a rule, the rows; ``numeric`` columns right-aligned;
    cells longer than ``max_width`` are cut, except in the last column."""
    if not rows:
        return ""
    cells = [[str(c) for c in r] for r in rows]
    ncol = len(cells[0])
    widths = [min(max_width, max(len(r[k]) for r in cells)) for k in range(ncol)]
    widths[-1] = max(len(r[-1]) for r in cells)

    def fit(text: str, k: int) -> str:
        text = text if len(text) <= widths[k] else text[: widths[k] - 1] + "…"
        return text.rjust(widths[k]) if k in numeric else text.ljust(widths[k])

    lines = ["  ".join(fit(c, k) for k, c in enumerate(cells[0])).rstrip(),
             "  ".join("-" * (w if k < ncol - 1 else min(w, max(max_width, len(cells[0][k]))))
                       for k, w in enumerate(widths))]
    lines += ["  ".join(fit(c, k) for k, c in enumerate(r)).rstrip() for r in cells[1:]]
    return "\n".join(lines)


def _step_table_rows(rep: PlanReport) -> list[list[str]]:
    header = ["#", "node", "op", "shapes", "implementation", "backend", "layouts in -> out",
              "median ms", "spread", "share", "runner-up", "runner-up ms", "delta ms", "rejected"]
    out = [header]
    for r in rep.table.itertuples(index=False):
        if r.kind == "converter":
            rej = ""
            idx = "b" if r.when == "build" else ""
        else:
            counts: dict[str, int] = {}
            for a in rep.alternatives.get(r.name, []):
                counts[a.verdict] = counts.get(a.verdict, 0) + 1
            rej = ", ".join(f"{n} {v}" for v, n in counts.items()) if counts else "-"
            idx = str(r.step)
        median = fmt_ms(r.median_ms) if r.kind == "converter" or _known(r.median_ms) or not str(
            r.time_source).startswith("in step") else f"(step {r.step})"
        out.append([
            idx, r.name if r.kind == "node" else f"[{r.name}]", r.op, r.shapes, r.impl, r.backend,
            f"{r.layouts_in or '-'} -> {r.layouts_out}", median, fmt_ms(r.spread_ms),
            fmt_share(r.share), r.runner_up or "", fmt_ms(r.runner_up_ms),
            fmt_delta(r.runner_up_delta_ms), rej,
        ])
    return out


def render_text(rep: PlanReport, *, rejected: bool = False) -> str:
    """The report as aligned terminal tables (``rejected``: every rejected candidate too)."""
    parts = [f"Plan report: {rep.plan.graph}", ""]
    srows = rep.summary_rows()
    width = max(len(k) for k, _ in srows)
    parts += [f"  {k.ljust(width)}  {v}" for k, v in srows]
    for note in rep.notes:
        parts.append(f"  note: {note}")
    parts += ["", "Steps in execution order (converters in [brackets]; b = converted at build "
                  "time; share = of the sum of parts):", ""]
    parts.append(aligned(_step_table_rows(rep), max_width=40, numeric=(7, 8, 9, 11, 12)))
    validated = rep.summary.get("validated") or []
    if validated:
        parts += ["", "Plans validated end to end by the tuner:", ""]
        vrows = [["plan", "predicted ms", "latency ms", "spread", "peak bytes", "result"]]
        for v in validated:
            vrows.append([str(v.get("label")), fmt_ms(v.get("predicted_ms")),
                          fmt_ms(v.get("latency_ms")), fmt_ms(v.get("spread_ms")),
                          f"{v['peak_bytes']:,}" if v.get("peak_bytes") is not None else "-",
                          ("winner" if v.get("label") == rep.summary.get("winner") else "ok")
                          if not v.get("error") else str(v["error"])])
        parts.append(aligned(vrows, max_width=60, numeric=(1, 2, 3, 4)))
    if rejected and len(rep.rejections):
        parts += ["", "Rejected candidates (listed at the first node each covers):", ""]
        rrows = [["node", "implementation", "backend", "verdict", "ms", "delta ms", "reason"]]
        for a in rep.rejections.itertuples(index=False):
            rrows.append([a.node, a.impl, a.backend, a.verdict, fmt_ms(a.median_ms),
                          fmt_delta(a.delta_ms), a.reason])
        parts.append(aligned(rrows, max_width=200, numeric=(4, 5)))
    return "\n".join(parts) + "\n"


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[Sequence[Any]], numeric: Sequence[int] = ()) -> str:
    """A GitHub-flavoured markdown table (first row: header)."""
    head = rows[0]
    rule = ["---:" if k in numeric else "---" for k in range(len(head))]
    lines = ["| " + " | ".join(_md(c) for c in head) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(_md(c) for c in r) + " |" for r in rows[1:]]
    return "\n".join(lines)


def render_markdown(rep: PlanReport) -> str:
    """The report as markdown: summary, steps, validated plans, every rejected candidate."""
    parts = [f"# Plan report: {rep.plan.graph}", "", "## Summary", ""]
    parts.append(markdown_table([["", ""], *rep.summary_rows()]))
    if rep.notes:
        parts += [""] + [f"- note: {n}" for n in rep.notes]
    parts += ["", "## Steps", ""]
    parts.append(markdown_table(_step_table_rows(rep), numeric=(7, 8, 9, 11, 12)))
    validated = rep.summary.get("validated") or []
    if validated:
        parts += ["", "## Plans validated end to end", ""]
        vrows = [["plan", "predicted ms", "latency ms", "spread", "peak bytes", "result"]]
        for v in validated:
            vrows.append([str(v.get("label")), fmt_ms(v.get("predicted_ms")),
                          fmt_ms(v.get("latency_ms")), fmt_ms(v.get("spread_ms")),
                          f"{v['peak_bytes']:,}" if v.get("peak_bytes") is not None else "-",
                          v.get("error") or "ok"])
        parts.append(markdown_table(vrows, numeric=(1, 2, 3, 4)))
    if len(rep.rejections):
        parts += ["", "## Rejected candidates", ""]
        rrows = [["node", "implementation", "backend", "verdict", "ms", "delta ms", "reason"]]
        for a in rep.rejections.itertuples(index=False):
            rrows.append([a.node, a.impl, a.backend, a.verdict, fmt_ms(a.median_ms),
                          fmt_delta(a.delta_ms), a.reason])
        parts.append(markdown_table(rrows, numeric=(4, 5)))
    return "\n".join(parts) + "\n"


def render_json(rep: PlanReport) -> str:
    """The report as JSON: ``{"summary", "rows", "rejections", "notes"}`` (null = not known)."""
    return json.dumps(rep.to_dict(), indent=2, allow_nan=False, default=str) + "\n"


# ------------------------------------------------------------------------------------------
# drawings
# ------------------------------------------------------------------------------------------


@dataclass
class _Drawing:
    """The plan graph as boxes and arrows, shared by the Graphviz and built-in drawings."""

    nodes: list[dict[str, Any]]  # id, label, kind (node|input|output|convert), backend, step, title
    edges: list[tuple[str, str, str]]  # src id, dst id, tensor label
    clusters: list[tuple[int, str, list[str]]]  # step, label, node ids


def _drawing(rep: PlanReport) -> _Drawing:
    graph, plan = rep.graph, rep.plan
    assert graph is not None
    ids: dict[str, str] = {}
    nodes: list[dict[str, Any]] = []
    step_of = {n: k for k, s in enumerate(plan.steps) for n in s.nodes}
    times = rep.table[rep.table["kind"] == "node"].set_index("name")
    for v in graph.inputs:
        ids[f"in:{v.name}"] = f"i{len(ids)}"
        nodes.append({"id": ids[f"in:{v.name}"], "label": f"{v.name}\n{_shape(v)}", "kind": "input",
                      "backend": "", "title": f"graph input {v.name} {_shape(v)}"})
    for n in graph.nodes:
        k = step_of[n.name]
        step = plan.steps[k]
        ids[n.name] = f"n{len(ids)}"
        ms = times.loc[n.name, "median_ms"] if n.name in times.index else None
        timing = f"\n{fmt_ms(ms)} ms" if _known(ms) else ""
        nodes.append({"id": ids[n.name], "label": f"{n.name}\n{n.op_type} · {step.backend}{timing}",
                      "kind": "node", "backend": step.backend, "step": k,
                      "title": f"{n.name} ({n.op_type}) step {k}: {step.impl} [{step.backend}] "
                               f"{','.join(step.layouts_in)} -> {','.join(step.layouts_out)}"})
    conv_id: dict[tuple[str, str], str] = {}
    conv_ms = rep.table[rep.table["kind"] == "converter"].set_index("name")["median_ms"]
    for c in plan.conversions:
        if c.at_build:
            continue
        cid = f"c{len(conv_id)}"
        conv_id[(c.value, c.dst)] = cid
        label = f"convert:{c.value} {c.src}->{c.dst}"
        ms = conv_ms.get(f"convert {c.value} {c.src}->{c.dst}")
        nodes.append({"id": cid, "label": f"{c.src}→{c.dst}" + (f"\n{fmt_ms(ms)} ms" if _known(ms) else ""),
                      "kind": "convert", "backend": "", "title": f"{label} via {' > '.join(c.chain)}"})
    producers = graph.producers()
    edges: list[tuple[str, str, str]] = []
    seen_conv_edge: set[str] = set()

    def source(value: str) -> str | None:
        p = producers.get(value)
        if p is not None:
            return ids[p.name]
        return ids.get(f"in:{value}")

    wanted: dict[tuple[int, str], str] = {}
    for k, step in enumerate(plan.steps):
        sn = step_node(graph, step.nodes, step.op)
        for v, lay in zip(sn.inputs, step.layouts_in):
            if v is not None:
                wanted[(k, v.name)] = lay
    for n in graph.nodes:
        k = step_of[n.name]
        for v in n.inputs:
            if v is None or v.is_const:
                continue
            src = source(v.name)
            if src is None:
                continue
            lay = wanted.get((k, v.name))
            cid = conv_id.get((v.name, lay)) if lay is not None else None
            if cid is not None:
                if cid not in seen_conv_edge:
                    edges.append((src, cid, v.name))
                    seen_conv_edge.add(cid)
                edges.append((cid, ids[n.name], v.name))
            else:
                edges.append((src, ids[n.name], v.name))
    for v in graph.outputs:
        oid = f"o{len(nodes)}"
        nodes.append({"id": oid, "label": f"{v.name}\n{_shape(v)}", "kind": "output",
                      "backend": "", "title": f"graph output {v.name} {_shape(v)}"})
        src = source(v.name)
        cid = conv_id.get((v.name, STANDARD))
        if cid is not None and src is not None:
            if cid not in seen_conv_edge:
                edges.append((src, cid, v.name))
                seen_conv_edge.add(cid)
            edges.append((cid, oid, v.name))
        elif src is not None:
            edges.append((src, oid, v.name))
    clusters = [(k, f"step {k}: {s.impl}", [ids[n] for n in s.nodes])
                for k, s in enumerate(plan.steps) if len(s.nodes) > 1]
    return _Drawing(nodes, edges, clusters)


def _dot_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def graph_dot(rep: PlanReport) -> str:
    """The plan graph in the Graphviz DOT language: nodes filled by backend, fused steps and
    regions as clusters, run-time converters as yellow diamonds on the edges they convert."""
    d = _drawing(rep)
    lines = ["digraph plan {", '  graph [rankdir=TB, fontname="Helvetica", fontsize=10, '
             'nodesep=0.25, ranksep=0.3];',
             '  node [fontname="Helvetica", fontsize=9, style="rounded,filled", shape=box, '
             'margin="0.08,0.03"];', '  edge [color="#777777", arrowsize=0.6];']
    in_cluster = {nid for _, _, ids in d.clusters for nid in ids}
    by_id = {n["id"]: n for n in d.nodes}

    def node_line(n: dict[str, Any]) -> str:
        attrs = {"label": n["label"], "tooltip": n["title"]}
        if n["kind"] == "node":
            attrs.update(fillcolor=backend_colour(n["backend"]), fontcolor="white")
        elif n["kind"] == "convert":
            attrs.update(shape="diamond", fillcolor=CONVERTER_COLOUR, style="filled", fontsize="8")
        else:
            attrs.update(shape="ellipse", fillcolor="white", style="filled")
        body = ", ".join(f'{k}="{_dot_text(str(v))}"' for k, v in attrs.items())
        return f"  {n['id']} [{body}];"

    for k, label, ids in d.clusters:
        backend = by_id[ids[0]]["backend"]
        lines.append(f'  subgraph cluster_{k} {{ label="{_dot_text(label)}"; style="dashed,rounded"; '
                     f'color="{backend_colour(backend)}"; fontsize=9;')
        lines += ["  " + node_line(by_id[i]) for i in ids]
        lines.append("  }")
    lines += [node_line(n) for n in d.nodes if n["id"] not in in_cluster]
    lines += [f'  {a} -> {b} [tooltip="{_dot_text(t)}"];' for a, b, t in d.edges]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _strip_xml_prolog(svg: str) -> str:
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def graph_svg(rep: PlanReport, *, use_dot: bool | None = None) -> tuple[str, str]:
    """``(svg, engine)``: the plan graph drawn by Graphviz ``dot`` when it is installed (and
    ``use_dot`` is not False), else by the built-in layered drawing."""
    if rep.graph is None:
        return "", "none"
    if use_dot is not False and shutil.which("dot"):
        try:
            res = subprocess.run(["dot", "-Tsvg"], input=graph_dot(rep), capture_output=True,
                                 text=True, timeout=DOT_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired):
            res = None
        if res is not None and res.returncode == 0 and "<svg" in res.stdout:
            return _strip_xml_prolog(res.stdout), "graphviz"
    return builtin_graph_svg(rep), "built-in"


def builtin_graph_svg(rep: PlanReport) -> str:
    """A layered drawing of the plan graph without Graphviz: each box one level below its
    lowest input, converters as diamonds, multi-node steps outlined."""
    d = _drawing(rep)
    level = _levels([n["id"] for n in d.nodes], d.edges)
    rows: dict[int, list[dict[str, Any]]] = {}
    for n in d.nodes:
        rows.setdefault(level[n["id"]], []).append(n)
    bw, bh, gx, gy = 170, 44, 24, 26
    width = max(len(r) for r in rows.values()) * (bw + gx) + gx
    height = (max(rows) + 1) * (bh + gy) + gy
    pos: dict[str, tuple[float, float]] = {}
    for lv, items in rows.items():
        offset = (width - len(items) * (bw + gx) + gx) / 2
        for j, n in enumerate(items):
            pos[n["id"]] = (offset + j * (bw + gx), gy + lv * (bh + gy))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" '
           f'font-size="10">',
           '<defs><marker id="odarrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" '
           'markerHeight="6" orient="auto"><path d="M0,0L10,5L0,10z" fill="#777"/></marker></defs>']
    for a, b, t in d.edges:
        (x1, y1), (x2, y2) = pos[a], pos[b]
        out.append(f'<line x1="{x1 + bw / 2:.1f}" y1="{y1 + bh:.1f}" x2="{x2 + bw / 2:.1f}" '
                   f'y2="{y2:.1f}" stroke="#777" stroke-width="1" marker-end="url(#odarrow)">'
                   f'<title>{html.escape(t)}</title></line>')
    for _, label, ids in d.clusters:
        xs = [pos[i][0] for i in ids]
        ys = [pos[i][1] for i in ids]
        backend = next(n["backend"] for n in d.nodes if n["id"] == ids[0])
        out.append(f'<rect x="{min(xs) - 6:.1f}" y="{min(ys) - 6:.1f}" width="{max(xs) - min(xs) + bw + 12:.1f}" '
                   f'height="{max(ys) - min(ys) + bh + 12:.1f}" fill="none" stroke="{backend_colour(backend)}" '
                   f'stroke-dasharray="4 3" rx="6"><title>{html.escape(label)}</title></rect>')
    for n in d.nodes:
        x, y = pos[n["id"]]
        title = f"<title>{html.escape(n['title'])}</title>"
        if n["kind"] == "convert":
            cx, cy = x + bw / 2, y + bh / 2
            out.append(f'<polygon points="{cx},{y} {cx + 60},{cy} {cx},{y + bh} {cx - 60},{cy}" '
                       f'fill="{CONVERTER_COLOUR}" stroke="#555">{title}</polygon>')
            colour = "#000"
        elif n["kind"] == "node":
            out.append(f'<rect x="{x}" y="{y}" width="{bw}" height="{bh}" rx="6" '
                       f'fill="{backend_colour(n["backend"])}" stroke="#333">{title}</rect>')
            colour = "#fff"
        else:
            out.append(f'<ellipse cx="{x + bw / 2}" cy="{y + bh / 2}" rx="{bw / 2}" ry="{bh / 2}" '
                       f'fill="#fff" stroke="#333">{title}</ellipse>')
            colour = "#000"
        lines = n["label"].split("\n")
        for j, text in enumerate(lines):
            ty = y + bh / 2 + (j - (len(lines) - 1) / 2) * 12 + 4
            short = text if len(text) <= 30 else text[:29] + "…"
            out.append(f'<text x="{x + bw / 2}" y="{ty:.1f}" text-anchor="middle" '
                       f'fill="{colour}">{html.escape(short)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _chart_data(rep: PlanReport) -> list[tuple[str, float, str]]:
    """(label, ms, colour key) for each step and run-time converter with a known time."""
    out = []
    for r in rep.table.itertuples(index=False):
        if not _known(r.median_ms) or r.when != "run":
            continue
        if r.kind == "node":
            out.append((f"{r.step} {r.step_nodes}", float(r.median_ms), r.backend))
        else:
            out.append((str(r.name), float(r.median_ms), "(converter)"))
    return out


def time_chart_svg(rep: PlanReport) -> tuple[str, str]:
    """``(svg, engine)``: time per step (bars coloured by backend, converters yellow) and time
    per backend, drawn by matplotlib when installed, else by a built-in SVG chart."""
    data = _chart_data(rep)
    if not data:
        return "", "none"
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return _builtin_chart_svg(rep, data), "built-in (matplotlib is not installed: pip install 'opdispatch[report]')"
    colours = [CONVERTER_COLOUR if key == "(converter)" else backend_colour(key) for _, _, key in data]
    n = len(data)
    fig = Figure(figsize=(max(8.0, min(40.0, 0.16 * n + 3)), 6.5), layout="constrained")
    ax, bx = fig.subplots(2, 1, height_ratios=[3, 1])
    ax.bar(range(n), [ms for _, ms, _ in data], color=colours, width=0.8)
    ax.set_ylabel("median ms (isolated measurement)")
    ax.set_title("time per step in execution order")
    step = max(1, n // 40)
    ax.set_xticks(range(0, n, step))
    ax.set_xticklabels([data[k][0][:24] for k in range(0, n, step)], rotation=90, fontsize=6)
    ax.set_xlim(-0.6, n - 0.4)
    per: dict[str, float] = {}
    for _, ms, key in data:
        per[key] = per.get(key, 0.0) + ms
    keys = list(per)
    bx.barh(range(len(keys)), [per[k] for k in keys],
            color=[CONVERTER_COLOUR if k == "(converter)" else backend_colour(k) for k in keys])
    bx.set_yticks(range(len(keys)))
    bx.set_yticklabels(keys, fontsize=8)
    bx.set_xlabel("total ms per backend (sum of isolated measurements)")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=CONVERTER_COLOUR if k == "(converter)" else backend_colour(k), label=k)
                       for k in keys], fontsize=8, loc="best")
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    return _strip_xml_prolog(buf.getvalue()), "matplotlib"


def _builtin_chart_svg(rep: PlanReport, data: list[tuple[str, float, str]]) -> str:
    n = len(data)
    bar, h = 12, 260
    top = max(ms for _, ms, _ in data) or 1.0
    width = n * bar + 60
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h + 40}" '
           f'font-family="Helvetica, Arial, sans-serif" font-size="10">',
           f'<text x="4" y="12">max {top:.4f} ms</text>']
    for k, (label, ms, key) in enumerate(data):
        bh = h * ms / top
        colour = CONVERTER_COLOUR if key == "(converter)" else backend_colour(key)
        out.append(f'<rect x="{50 + k * bar}" y="{20 + h - bh:.1f}" width="{bar - 2}" '
                   f'height="{bh:.1f}" fill="{colour}"><title>{html.escape(label)}: '
                   f'{ms:.4f} ms ({html.escape(key)})</title></rect>')
    out.append("</svg>")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------
# html
# ------------------------------------------------------------------------------------------

_CSS = """
body{font-family:Helvetica,Arial,sans-serif;margin:24px;color:#222;font-size:13px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 6px;
vertical-align:top;text-align:left}th{background:#f3f3f3;position:sticky;top:0}
td.num{text-align:right;font-variant-numeric:tabular-nums}tr.conv td{background:#fff8e1}
.swatch{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle;
border:1px solid #555}.drawing{overflow:auto;max-height:900px;border:1px solid #ddd;padding:6px}
details summary{cursor:pointer}.muted{color:#777}.note{color:#8a5a00}
table.summary td{overflow-wrap:anywhere;max-width:1100px}
"""


def _td(x: Any, num: bool = False) -> str:
    return f'<td class="num">{html.escape(str(x))}</td>' if num else f"<td>{html.escape(str(x))}</td>"


def render_html(rep: PlanReport) -> str:
    """One self-contained HTML file: summary, the plan graph (Graphviz SVG or built-in),
    the time chart (matplotlib SVG, embedded as a data URI), the step, validation and
    rejection tables. No scripts, no external resources."""
    e = html.escape
    title = f"Plan report: {rep.plan.graph}"
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{e(title)}</h1>", '<h2>Summary</h2><table class="summary">']
    parts += [f"<tr><th>{e(k)}</th>{_td(v)}</tr>" for k, v in rep.summary_rows()]
    parts.append("</table>")
    parts += [f'<p class="note">note: {e(n)}</p>' for n in rep.notes]
    backends = sorted({s.backend for s in rep.plan.steps})
    legend = "".join(f'<span class="swatch" style="background:{backend_colour(b)}"></span>{e(b)}'
                     for b in backends)
    legend += f'<span class="swatch" style="background:{CONVERTER_COLOUR}"></span>converter'
    svg, engine = graph_svg(rep)
    parts.append("<h2>Graph</h2>")
    if svg:
        parts.append(f'<p>{legend} <span class="muted">— drawn by {e(engine)}; dashed boxes are '
                     f'fused steps and regions; hover for details</span></p>')
        parts.append(f'<div class="drawing" id="graph">{svg}</div>')
    else:
        parts.append('<p class="muted">not drawn: the report was made without the graph</p>')
    chart, chart_engine = time_chart_svg(rep)
    parts.append("<h2>Time per step</h2>")
    if chart:
        uri = base64.b64encode(chart.encode("utf-8")).decode("ascii")
        parts.append(f'<p class="muted">drawn by {e(chart_engine)}</p>')
        parts.append(f'<img id="chart" alt="time per step by backend" style="max-width:100%" '
                     f'src="data:image/svg+xml;base64,{uri}">')
    else:
        parts.append('<p class="muted">no measured times to chart</p>')
    parts.append("<h2>Steps</h2><table><tr>" + "".join(
        f"<th>{e(h)}</th>" for h in ("#", "node", "op", "shapes", "implementation", "backend",
                                     "layouts in → out", "median ms", "spread", "share",
                                     "runner-up", "runner-up ms", "delta ms", "rejected")) + "</tr>")
    for r in rep.table.itertuples(index=False):
        alts = rep.alternatives.get(r.name, []) if r.kind == "node" else []
        rej = ""
        if alts:
            items = "".join(f"<li><b>{e(a.impl)}</b> ({e(a.backend)}): {e(a.verdict)} — "
                            f"{e(a.reason)}</li>" for a in alts)
            rej = f"<details><summary>{len(alts)}</summary><ul>{items}</ul></details>"
        cls = ' class="conv"' if r.kind == "converter" else ""
        idx = "" if r.kind == "converter" else str(r.step)
        parts.append(
            f"<tr{cls}>{_td(idx, True)}{_td(r.name)}{_td(r.op)}{_td(r.shapes)}{_td(r.impl)}"
            f"{_td(r.backend)}{_td(f'{r.layouts_in} → {r.layouts_out}')}"
            f"{_td(fmt_ms(r.median_ms), True)}{_td(fmt_ms(r.spread_ms), True)}"
            f"{_td(fmt_share(r.share), True)}{_td(r.runner_up)}{_td(fmt_ms(r.runner_up_ms), True)}"
            f"{_td(fmt_delta(r.runner_up_delta_ms), True)}<td>{rej}</td></tr>")
    parts.append("</table>")
    validated = rep.summary.get("validated") or []
    if validated:
        parts.append("<h2>Plans validated end to end</h2><table><tr><th>plan</th><th>predicted ms"
                     "</th><th>latency ms</th><th>spread</th><th>peak bytes</th><th>result</th></tr>")
        for v in validated:
            peak = f"{v['peak_bytes']:,}" if v.get("peak_bytes") is not None else "-"
            parts.append(f"<tr>{_td(v.get('label'))}{_td(fmt_ms(v.get('predicted_ms')), True)}"
                         f"{_td(fmt_ms(v.get('latency_ms')), True)}{_td(fmt_ms(v.get('spread_ms')), True)}"
                         f"{_td(peak, True)}{_td(v.get('error') or 'ok')}</tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# ------------------------------------------------------------------------------------------
# explain one node
# ------------------------------------------------------------------------------------------


def explain_node(rep: PlanReport, node: str) -> pd.DataFrame:
    """Every candidate for ``node`` (the chosen one first): implementation, backend, nodes
    covered, layouts, measurement (median, spread, samples, when measured), verdict and why.
    Candidates covering ``node`` among others (fused patterns, regions) are included."""
    plan = rep.plan
    names = [n for s in plan.steps for n in s.nodes]
    if node not in names:
        raise ReportError(f"node {node!r} is not in the plan of {plan.graph!r} (nodes removed or "
                          f"folded when the model was simplified are not planned); nodes: "
                          f"{known(names, limit=30)}")
    k = next(i for i, s in enumerate(plan.steps) if node in s.nodes)
    step = plan.steps[k]
    first = rep.table[(rep.table["kind"] == "node") & (rep.table["step"] == k)].iloc[0]
    rows = [{"impl": step.impl, "backend": step.backend, "covers": nodes_label(step.nodes, 4),
             "layouts_in": ",".join(step.layouts_in), "layouts_out": ",".join(step.layouts_out),
             "median_ms": first["median_ms"], "spread_ms": first["spread_ms"],
             "samples": first["samples"], "measured_at": None, "verdict": "chosen",
             "delta_ms": 0.0, "reason": step.why}]
    seen = {(step.impl, tuple(step.nodes))}
    for alts in rep.alternatives.values():
        for a in alts:
            covers = a.covers or ((a.node,) if a.node == node else ())
            if node not in covers or (a.impl, tuple(covers)) in seen:
                continue
            seen.add((a.impl, tuple(covers)))
            rows.append({"impl": a.impl, "backend": a.backend, "covers": nodes_label(covers, 4),
                         "layouts_in": ",".join(a.layouts_in), "layouts_out": ",".join(a.layouts_out),
                         "median_ms": a.median_ms, "spread_ms": a.spread_ms, "samples": a.samples,
                         "measured_at": a.measured_at, "verdict": a.verdict,
                         "delta_ms": a.delta_ms, "reason": a.reason})
    df = pd.DataFrame(rows)
    order = {v: i for i, v in enumerate(("chosen", *VERDICTS))}
    df["_o"] = df["verdict"].map(lambda v: order.get(v, 99))
    df = df.sort_values(["_o", "median_ms"], kind="stable", na_position="last").drop(columns="_o")
    df["samples"] = df["samples"].astype("Int64")
    return df.reset_index(drop=True)


def render_explain(rep: PlanReport, node: str, fmt: str = "text") -> str:
    """:func:`explain_node` as text (with the node's context), markdown, csv or json."""
    df = explain_node(rep, node)
    if fmt == "csv":
        return df.to_csv(index=False)
    if fmt == "json":
        return json.dumps({"node": node, "candidates": _records(df)}, indent=2, allow_nan=False,
                          default=str) + "\n"
    plan, graph = rep.plan, rep.graph
    k = next(i for i, s in enumerate(plan.steps) if node in s.nodes)
    step = plan.steps[k]
    head = [f"node {node}" + (f" ({graph.node(node).op_type})" if graph is not None else "")
            + f" of {plan.graph}"]
    if graph is not None:
        n = graph.node(node)
        head.append(f"  shapes: {_node_shapes(n)}")
        attrs = ", ".join(f"{a}={v!r}" for a, v in sorted(n.attrs.items()) if not isinstance(v, np.ndarray))
        if attrs:
            head.append(f"  attributes: {attrs[:300]}")
    head.append(f"  runs in step {k} ({nodes_label(step.nodes)}): {step.impl} on {step.backend}, "
                f"layouts {','.join(step.layouts_in) or '-'} -> {','.join(step.layouts_out)}")
    convs = rep.table[(rep.table["kind"] == "converter")
                      & rep.table["step_nodes"].str.split(", ").map(lambda c: "+".join(step.nodes) in c)]
    for c in convs.itertuples(index=False):
        head.append(f"  input conversion: {c.name} by {c.impl} ({fmt_ms(c.median_ms)} ms, {c.when} time)")
    head.append(f"  why: {step.why}")
    rows = [["implementation", "backend", "covers", "layouts in -> out", "median ms", "spread",
             "samples", "verdict", "delta ms", "reason"]]
    for r in df.itertuples(index=False):
        rows.append([r.impl, r.backend, r.covers, f"{r.layouts_in or '-'} -> {r.layouts_out or '-'}",
                     fmt_ms(r.median_ms), fmt_ms(r.spread_ms),
                     "-" if r.samples is pd.NA else str(r.samples), r.verdict,
                     fmt_delta(r.delta_ms), r.reason])
    if fmt == "markdown":
        return "\n".join(f"- {h.strip()}" for h in head) + "\n\n" + markdown_table(rows, (4, 5, 6, 8)) + "\n"
    if fmt != "text":
        raise ReportError(f"unknown explain format {fmt!r}; expected text, markdown, csv or json")
    return "\n".join(head) + f"\n\n{len(df)} candidate(s):\n" + aligned(
        rows, max_width=400, numeric=(4, 5, 6, 8)) + "\n"


# ------------------------------------------------------------------------------------------
# diff of two plans
# ------------------------------------------------------------------------------------------


@dataclass
class PlanSide:
    """One plan of a diff: the plan, a label, and (when known) its key and measured figures."""

    plan: Plan
    label: str
    key: PlanKey | None = None
    latency_ms: float | None = None
    peak_bytes: int | None = None

    def backends(self) -> dict[str, str]:
        sw = self.key.software if self.key is not None else self.plan.provenance.get("software") or {}
        return dict(sw.get("backends") or {})


@dataclass
class PlanDiff:
    """Per node, what changed between two plans and why (see :func:`diff_plans`)."""

    a: PlanSide
    b: PlanSide
    rows: pd.DataFrame
    key_changes: list[str]
    conversions_only_a: list[str]
    conversions_only_b: list[str]

    @property
    def changed_nodes(self) -> list[str]:
        """Nodes whose implementation, layouts or step grouping differ (or that only one plan
        has), in the order of plan A then plan B."""
        return [str(n) for n in self.rows.loc[self.rows["changed"], "node"]]

    def render(self, fmt: str = "text", *, all_nodes: bool = False) -> str:
        """The diff as ``text``, ``markdown``, ``csv`` or ``json``; only changed nodes unless
        ``all_nodes``."""
        rows = self.rows if all_nodes else self.rows[self.rows["changed"]]
        if fmt == "csv":
            return rows.to_csv(index=False)
        if fmt == "json":
            return json.dumps({"a": self._side(self.a), "b": self._side(self.b),
                               "key_changes": self.key_changes, "changed_nodes": self.changed_nodes,
                               "conversions_only_a": self.conversions_only_a,
                               "conversions_only_b": self.conversions_only_b,
                               "rows": _records(rows)}, indent=2, allow_nan=False, default=str) + "\n"
        a, b = self.a, self.b
        head = [f"A: {a.label} — {self._side_line(a)}", f"B: {b.label} — {self._side_line(b)}"]
        if a.latency_ms is not None and b.latency_ms is not None:
            d = b.latency_ms - a.latency_ms
            head.append(f"latency (validated end to end): {fmt_ms(a.latency_ms)} -> "
                        f"{fmt_ms(b.latency_ms)} ms ({d:+.4f} ms, {100 * d / a.latency_ms:+.1f}%)")
        head.append("what differs in the keys: " + ("; ".join(self.key_changes) or "nothing"))
        n_changed = len(self.changed_nodes)
        head.append(f"{n_changed} of {len(self.rows)} node(s) changed; conversions only in A: "
                    f"{len(self.conversions_only_a)}, only in B: {len(self.conversions_only_b)}")
        table = [["node", "change", "A", "A ms", "B", "B ms", "delta ms", "why"]]
        for r in rows.itertuples(index=False):
            table.append([r.node, r.change or "-", r.a_choice, fmt_ms(r.a_step_ms), r.b_choice,
                          fmt_ms(r.b_step_ms), fmt_delta(r.delta_ms), r.why])
        extra = []
        if self.conversions_only_a or self.conversions_only_b:
            extra.append("")
            extra += [f"conversion only in A: {c}" for c in self.conversions_only_a]
            extra += [f"conversion only in B: {c}" for c in self.conversions_only_b]
        if fmt == "markdown":
            return ("\n".join(f"- {h}" for h in head) + "\n\n" + markdown_table(table, (3, 5, 6))
                    + "\n" + "\n".join(f"- {x}" for x in extra if x) + "\n")
        if fmt != "text":
            raise ReportError(f"unknown diff format {fmt!r}; expected text, markdown, csv or json")
        body = aligned(table, max_width=70, numeric=(3, 5, 6)) if len(table) > 1 else "(no node changed)"
        return "\n".join(head) + "\n\n" + body + "\n" + "\n".join(extra) + ("\n" if extra else "")

    @staticmethod
    def _side_line(side: PlanSide) -> str:
        used = ", ".join(f"{b}: {n}" for b, n in side.plan.backends_used().items())
        prov = side.plan.provenance or {}
        return (f"{prov.get('source', '?')} plan, objective {prov.get('objective', '?')}, "
                f"backends allowed {sorted(side.backends()) or '?'}, used {used}")

    @staticmethod
    def _side(side: PlanSide) -> dict[str, Any]:
        return {"label": side.label, "latency_ms": side.latency_ms, "peak_bytes": side.peak_bytes,
                "backends": side.backends(), "backends_used": side.plan.backends_used(),
                "plan_key": side.key.digest() if side.key is not None else
                side.plan.provenance.get("plan_key")}


def _choice(step: PlanStep | None) -> str:
    if step is None:
        return "(not in plan)"
    grouping = f" [{nodes_label(step.nodes)}]" if len(step.nodes) > 1 else ""
    return (f"{step.impl} ({step.backend}; {','.join(step.layouts_in) or '-'} -> "
            f"{','.join(step.layouts_out)}){grouping}")


def _key_for_diff(side: PlanSide) -> PlanKey | None:
    from tuner.fingerprint import PlanKey

    if side.key is not None:
        return side.key
    prov = side.plan.provenance or {}
    if not prov.get("hardware") or not prov.get("software"):
        return None
    return PlanKey(model="", inputs="", hardware=dict(prov["hardware"]),
                   software=dict(prov["software"]), objective=str(prov.get("objective", "")))


def diff_plans(a: PlanSide | Plan, b: PlanSide | Plan) -> PlanDiff:
    """Per node: the step each plan runs it in, what changed (implementation, backend, layouts,
    grouping into fused steps or regions), the step times, and why — backends one side could
    not use, backend versions that changed, what each plan's tuner said about the other's
    choice, the heuristic plan winning validation. Nodes are matched by name."""
    sa = a if isinstance(a, PlanSide) else PlanSide(a, "A")
    sb = b if isinstance(b, PlanSide) else PlanSide(b, "B")
    step_a = {n: s for s in sa.plan.steps for n in s.nodes}
    step_b = {n: s for s in sb.plan.steps for n in s.nodes}
    order = list(step_a) + [n for n in step_b if n not in step_a]
    ka, kb = _key_for_diff(sa), _key_for_diff(sb)
    key_changes: list[str] = []
    if ka is not None and kb is not None:
        key_changes = [c for c in ka.explain_difference(kb)
                       if not (sa.key is None or sb.key is None) or not c.startswith(("model", "inputs"))]
    be_a, be_b = sa.backends(), sb.backends()
    rows = []
    for n in order:
        x, y = step_a.get(n), step_b.get(n)
        change: list[str] = []
        if x is None or y is None:
            change.append("only in A" if y is None else "only in B")
        else:
            if x.impl != y.impl:
                change.append("backend" if x.backend != y.backend else "implementation")
            if (x.layouts_in, x.layouts_out) != (y.layouts_in, y.layouts_out):
                change.append("layouts")
            if sorted(x.nodes) != sorted(y.nodes):
                change.append("grouping")
        why: list[str] = []
        if change and x is not None and y is not None:
            why = _why_changed(x, y, sa, sb, be_a, be_b)
        first_a = x is not None and x.nodes[0] == n
        first_b = y is not None and y.nodes[0] == n
        a_ms = x.cost_ms if x is not None and first_a else None
        b_ms = y.cost_ms if y is not None and first_b else None
        delta = (b_ms - a_ms) if a_ms is not None and b_ms is not None else None
        rows.append({"node": n, "changed": bool(change), "change": ", ".join(change),
                     "a_choice": _choice(x), "a_impl": x.impl if x else None,
                     "a_backend": x.backend if x else None, "a_step_ms": a_ms,
                     "b_choice": _choice(y), "b_impl": y.impl if y else None,
                     "b_backend": y.backend if y else None, "b_step_ms": b_ms,
                     "delta_ms": delta, "why": "; ".join(why)})
    df = pd.DataFrame(rows, columns=["node", "changed", "change", "a_choice", "a_impl",
                                     "a_backend", "a_step_ms", "b_choice", "b_impl", "b_backend",
                                     "b_step_ms", "delta_ms", "why"])
    for col in ("a_step_ms", "b_step_ms", "delta_ms"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    df["changed"] = df["changed"].astype(bool)

    def conv_set(p: Plan) -> set[str]:
        return {f"{c.value} {c.src}->{c.dst}{' (build time)' if c.at_build else ''}"
                for c in p.conversions}

    ca, cb = conv_set(sa.plan), conv_set(sb.plan)
    return PlanDiff(sa, sb, df, key_changes, sorted(ca - cb), sorted(cb - ca))


def _rejection(step: PlanStep, impl: str) -> Rejected | None:
    return next((r for r in step.rejected if r.impl == impl), None)


def _why_changed(x: PlanStep, y: PlanStep, sa: PlanSide, sb: PlanSide,
                 be_a: Mapping[str, str], be_b: Mapping[str, str]) -> list[str]:
    why: list[str] = []
    if be_a and y.backend not in be_a:
        why.append(f"{y.backend} was not among A's backends ({', '.join(sorted(be_a))})")
    if be_b and x.backend not in be_b:
        why.append(f"{x.backend} was not among B's backends ({', '.join(sorted(be_b))})")
    for backend in sorted({x.backend, y.backend}):
        va, vb = be_a.get(backend), be_b.get(backend)
        if va and vb and va != vb:
            why.append(f"{backend} changed: {va} -> {vb}")
    r = _rejection(x, y.impl)
    if r is not None:
        why.append(f"A's tuner rejected {y.impl}: {r.reason}")
    r = _rejection(y, x.impl)
    if r is not None:
        why.append(f"B's tuner rejected {x.impl}: {r.reason}")
    for side in (sa, sb):
        winner = (side.plan.provenance or {}).get("winner")
        if winner and winner != "optimum":
            why.append(f"{side.label} is the {winner!r} plan, which won validation")
    if x.cost_ms is not None and y.cost_ms is not None and not why:
        why.append(f"measured {x.cost_ms:.4f} ms in A, {y.cost_ms:.4f} ms in B")
    return why or ["not recorded by either plan"]


# ------------------------------------------------------------------------------------------
# profile: a Chrome trace of real runs
# ------------------------------------------------------------------------------------------


def profile_trace(
    graph: Graph,
    plan: Plan,
    registry: Registry,
    *,
    runs: int = 5,
    warmup: int = 1,
    seed: int = 0,
    feeds: Mapping[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """Run ``plan`` ``runs`` times (after ``warmup`` untimed runs) on seeded random inputs
    (or ``feeds``) and return a Chrome-trace / Perfetto JSON object: one complete event
    (``ph: "X"``, ``ts``/``dur`` in microseconds) per node step and per converter in every run,
    one track (``tid``) per backend named by metadata events, and one "runs" track with an
    event per whole run. A call's start is its run's start plus the durations of the calls
    before it (the executor times each call; the loop between calls is not traced)."""
    from dispatch.executor import Executor
    from tuner.measure import random_input

    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ReportError(f"runs must be a positive integer, received {runs!r}")
    try:
        ex = Executor(graph, plan, registry)
    except OpDispatchError as exc:
        raise ReportError(f"the plan cannot be built on this machine: {exc}") from None
    if feeds is None:
        rng = np.random.default_rng(seed)
        feeds = {v.name: random_input(v, rng) for v in graph.inputs}
    for _ in range(max(0, warmup)):
        ex.run(feeds)
    kernel_steps = iter(range(len(plan.steps)))
    call_step = [next(kernel_steps) if c.kind == "kernel" else None for c in ex.calls]
    tracks: dict[str, int] = {}
    for c in ex.calls:
        tracks.setdefault(c.backend or "(converter)", len(tracks) + 1)
    pid = 1
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
         "args": {"name": f"opdispatch {plan.graph}"}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "runs"}},
        {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": 0}},
    ]
    for name, tid in tracks.items():
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"name": name}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"sort_index": tid}})
    origin = time.perf_counter()
    per_call: list[list[float]] = [[] for _ in ex.calls]
    walls = []
    for run in range(runs):
        timings: list[float] = []
        t0 = time.perf_counter()
        ex.run(feeds, timings=timings)
        wall = time.perf_counter() - t0
        walls.append(wall)
        start_us = (t0 - origin) * 1e6
        events.append({"name": f"run {run}", "cat": "run", "ph": "X", "pid": pid, "tid": 0,
                       "ts": round(start_us, 3), "dur": round(wall * 1e6, 3),
                       "args": {"run": run, "calls": len(timings)}})
        at = start_us
        for k, (call, dur) in enumerate(zip(ex.calls, timings)):
            per_call[k].append(dur)
            s = call_step[k]
            args: dict[str, Any] = {"run": run, "impl": call.impl, "backend": call.backend}
            if s is not None:
                step = plan.steps[s]
                args.update(step=s, op=step.op, nodes=step.nodes[:20], n_nodes=len(step.nodes),
                            layouts_in=step.layouts_in, layouts_out=step.layouts_out)
                name = nodes_label(step.nodes)
            else:
                name = call.label
            events.append({"name": name, "cat": "converter" if call.kind == "convert" else "node",
                           "ph": "X", "pid": pid, "tid": tracks[call.backend or "(converter)"],
                           "ts": round(at, 3), "dur": round(dur * 1e6, 3), "args": args})
            at += dur * 1e6
    calls = []
    for k, call in enumerate(ex.calls):
        s = call_step[k]
        calls.append({"label": nodes_label(plan.steps[s].nodes) if s is not None else call.label,
                      "kind": call.kind, "step": s, "impl": call.impl, "backend": call.backend,
                      "median_ms": float(np.median(per_call[k])) * 1e3})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"model": plan.graph, "runs": runs, "warmup": warmup, "seed": seed,
                      "plan_key": (plan.provenance or {}).get("plan_key"),
                      "median_run_ms": float(np.median(walls)) * 1e3,
                      "peak_bytes": int(ex.memory.peak_bytes), "calls": calls},
    }


# ------------------------------------------------------------------------------------------
# finding the plan of a model (command line)
# ------------------------------------------------------------------------------------------


@dataclass
class LocatedPlan:
    """A model's graph and the plan a report, explanation or profile is about."""

    graph: Graph
    registry: Registry
    plan: Plan
    key: PlanKey
    stored: StoredPlan | None
    backends: list[str]
    note: str


def locate_plan(
    model: Any,
    store: PlanStore | None,
    *,
    objective: str = "latency",
    backends: Sequence[str] | None = None,
    plan_id: int | None = None,
    untuned: bool = False,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    registry: Registry | None = None,
) -> LocatedPlan:
    """The plan of ``model`` in ``store``: the one stored under the key a Session on this
    machine would look up (``objective``, ``backends`` as for ``opdispatch tune``), or plan
    ``plan_id`` (which must be a plan of this model), or with ``untuned`` the heuristic plan
    (its measurements are looked up under this machine's key). A miss raises
    :class:`ReportError` saying why no stored plan matched."""
    from dispatch.backend import load_registry
    from dispatch.config import Config
    from dispatch.session import parse_objective
    from tuner.fingerprint import model_fingerprint
    from tuner.tune import load_graph, plan_key

    parse_objective(objective)
    config = Config.load()
    registry = registry or load_registry(config.plugin_path or None)
    available = registry.available_backends()
    if backends:
        unknown = [b for b in backends if b not in available]
        if unknown:
            raise ReportError(f"backends {unknown} are not available here; available: {available}")
        allowed = list(backends)
    else:  # as the tuner orders them: the configured order first, then the rest
        allowed = [b for b in config.backend_order if b in available]
        allowed += [b for b in available if b not in allowed]
    if plan_id is not None and untuned:
        raise ReportError("give a plan id or --untuned, not both")
    graph = load_graph(model, registry, allowed, input_shapes)
    key = plan_key(graph, registry, allowed, objective)
    if untuned:
        plan = heuristic_plan(graph, registry, allowed)
        return LocatedPlan(graph, registry, plan, key, None, allowed,
                           f"the untuned (heuristic) plan over {allowed}")
    if store is None:
        raise ReportError("a plan store is needed to find the tuned plan (or use --untuned)")
    if plan_id is not None:
        stored = store.plan_by_id(plan_id)
        fp = model_fingerprint(graph)
        if stored.key.model != fp:
            raise ReportError(
                f"plan {plan_id} in {store.path} is for another model (model fingerprint "
                f"{stored.key.model[:12]}, this model's is {fp[:12]}); "
                f"`opdispatch plans list --model MODEL` lists this model's plans")
        note = f"plan {plan_id} from {store.path}"
        reasons = stored.key.explain_difference(key)
        if reasons:
            note += f" (not usable here as is: {'; '.join(reasons)})"
        return LocatedPlan(graph, registry, stored.plan(), stored.key, stored,
                           list((stored.key.software.get("backends") or {}).keys()), note)
    stored = store.get_plan(key)
    if stored is None:
        reasons = store.why_not(key) or ["this model was never tuned with this store"]
        raise ReportError(
            f"no plan in {store.path} for this model, machine, software, backends {allowed} and "
            f"objective {objective}: {'; '.join(' '.join(r.split()) for r in reasons)}; tune it "
            f"with `opdispatch tune MODEL --store {store.path}`, or pick a stored plan with --plan "
            f"ID (see `opdispatch plans list`), or report the untuned plan with --untuned")
    return LocatedPlan(graph, registry, stored.plan(), stored.key, stored, allowed,
                       f"plan {stored.id} from {store.path}")
