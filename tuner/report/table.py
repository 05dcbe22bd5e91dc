"""Building a plan report: :func:`build_report` and :class:`PlanReport`. :func:`build_report`
gathers the :class:`~tuner.report.sources.Sources` of a plan, times its steps and converters,
compares the candidates that lost (:mod:`tuner.report.alternatives`) and assembles the table
(one row per node in execution order, converters as rows of their own where they run), the
rejections in long form and the summary (:mod:`tuner.report.summary`). :class:`PlanReport` is
the result, with its renderings (:mod:`tuner.report.render`, :mod:`tuner.report.html`) and
:meth:`PlanReport.explain` (:mod:`tuner.report.explain`).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from dispatch.errors import OpDispatchError
from dispatch.fusion import step_node
from dispatch.plan import Conversion, Plan
from tuner.plan_lookup import ReportError
from tuner.report.alternatives import find_alternatives, rejection_brief, runner_up
from tuner.report.data import (
    COLUMNS,
    FORMATS,
    REJECTION_COLUMNS,
    ReportData,
    node_shapes,
    nodes_label,
    shape_text,
    share_of,
)
from tuner.report.dynamic import graph_notes
from tuner.report.explain import explain_node
from tuner.report.html import render_html
from tuner.report.library import (
    memory_figures,
    node_times,
    profile_note,
    region_profiles,
    source_text,
)
from tuner.report.render import render_json, render_markdown, render_text, summary_rows
from tuner.report.sources import Sources, opened_store
from tuner.report.summary import summarise

if TYPE_CHECKING:
    from dispatch.graph import Graph
    from dispatch.registry import Registry
    from tuner.fingerprint import PlanKey
    from tuner.store import StoredPlan


@dataclass
class PlanReport(ReportData):
    """Everything a report shows (see :mod:`tuner.report`); :meth:`render` formats it."""

    # -- summary -----------------------------------------------------------------------
    def summary_rows(self) -> list[tuple[str, str]]:
        """The summary as (label, text) pairs; unknown figures say why they are unknown."""
        return summary_rows(self.summary)

    # -- rendering ---------------------------------------------------------------------
    def render(self, fmt: str = "text", *, rejected: bool = False, details: bool = False,
               wide: bool = False, width: int | None = None) -> str:
        """The report as ``text`` (terminal tables fitted to ``width``, default the terminal's;
        ``wide``: every column; ``rejected`` lists every rejected candidate too), ``markdown``,
        ``csv`` (the rows), ``json`` or ``html`` (one self-contained file). A rejected
        candidate's reason is one bounded sentence; ``details`` adds the whole alternative it
        stands for (text with ``rejected``, markdown, json, html)."""
        if fmt == "text":
            return render_text(self, rejected=rejected, details=details, wide=wide, width=width)
        if fmt == "markdown":
            return render_markdown(self, details=details)
        if fmt == "csv":
            return self.table.to_csv(index=False)
        if fmt == "json":
            return render_json(self, details=details)
        if fmt == "html":
            return render_html(self, details=details)
        raise ReportError(f"unknown report format {fmt!r}; expected one of {', '.join(FORMATS)}")

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
    profile_regions: bool = True,
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
        profile_regions: profile library regions the plan carries no profile of, here (a
            session built and run a few times per region, cached per process), for their
            per-node times and library memory (:mod:`tuner.report.library`).
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
    with opened_store(store) as opened:
        return _build(Sources(plan, graph, opened, registry, stored, key), profile_regions)


def _build(src: Sources, profile_regions: bool = True) -> PlanReport:
    """The report of ``src``'s plan (see :func:`build_report`)."""
    plan, graph = src.plan, src.graph
    times = src.step_times()
    profiles = region_profiles(src, profile_regions)
    conv_times = src.conversion_times()
    alts = find_alternatives(src, times)
    kernel_ms = [t["median_ms"] for t in times]
    run_conv_ms = [t["median_ms"] for c, t in zip(plan.conversions, conv_times) if not c.at_build]
    total_parts = None
    if all(x is not None for x in kernel_ms) and all(x is not None for x in run_conv_ms):
        total_parts = float(sum(kernel_ms) + sum(run_conv_ms))  # type: ignore[arg-type]
    by_node = {n.name: n for n in graph.nodes} if graph is not None else {}
    step_inputs = _step_input_layouts(src)
    emitted: set[int] = set()
    rows: list[dict[str, Any]] = []

    def add_conversion(k: int) -> None:
        c, t = plan.conversions[k], conv_times[k]
        emitted.add(k)
        v = graph.value(c.value) if graph is not None else None
        rows.append({
            "kind": "converter", "step": pd.NA, "name": f"convert {c.value} {c.src}->{c.dst}",
            "op": "Converter", "step_op": "Converter", "step_nodes": ", ".join(c.consumers),
            "shapes": shape_text(v), "impl": " > ".join(c.chain), "settings": "",
            "backend": _converter_backend(src, c), "layouts_in": c.src, "layouts_out": c.dst,
            "when": "build" if c.at_build else "run", "median_ms": t["median_ms"],
            "spread_ms": t["spread_ms"], "samples": t["samples"],
            "share": share_of(t["median_ms"], total_parts) if not c.at_build else None,
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
        runner = runner_up(step, alts, t["median_ms"])
        prof = profiles.get(s)
        lib = node_times(prof, t["median_ms"]) if prof is not None else {}
        if prof is not None:
            src.notes.append(profile_note(s, prof, t["median_ms"]))
        for j, name in enumerate(step.nodes):
            node = by_node.get(name)
            mine = alts.get(name, [])
            first = j == 0
            ms = lib[name] if name in lib else (t["median_ms"] if first else None)
            rows.append({
                "kind": "node", "step": s, "name": name,
                "op": node.op_type if node is not None else (step.op if len(step.nodes) == 1 else ""),
                "step_op": step.op, "step_nodes": nodes_label(step.nodes),
                "shapes": node_shapes(node), "impl": step.impl,
                "settings": _settings_text(src, step.impl), "backend": step.backend,
                "layouts_in": ",".join(step.layouts_in), "layouts_out": ",".join(step.layouts_out),
                "when": "run",
                "median_ms": ms,
                "spread_ms": t["spread_ms"] if first else None,
                "samples": t["samples"] if first else None,
                "share": share_of(ms, total_parts),
                "time_source": (source_text(prof, t["median_ms"], name) if prof is not None else
                                t["source"] if first else f"in step {s} ({step.nodes[0]})"),
                "runner_up": runner[0] if first else "",
                "runner_up_backend": runner[1] if first else "",
                "runner_up_ms": runner[2] if first else None,
                "runner_up_delta_ms": runner[3] if first else None,
                "n_rejected": len(mine),
                "rejected": " | ".join(rejection_brief(a) for a in mine),
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
    summary = summarise(src, table, times, conv_times, total_parts)
    memory = memory_figures(src, summary.get("peak_bytes"), profiles)
    summary.update(peak_liveness_bytes=memory.get("liveness_bytes", summary.get("peak_bytes")),
                   peak_bytes=memory["peak_bytes"],
                   peak_basis=memory.get("basis"), memory=memory)
    notes = list(src.notes) + (graph_notes(graph) if graph is not None else [])
    return PlanReport(plan, graph, table, rejections, summary, alts, notes)


def _settings_text(src: Sources, impl: str) -> str:
    """The library settings ``impl`` builds its kernels with (``key=value``, comma separated),
    as its registration names them; ``""`` for none or when the registry does not know it."""
    if src.registry is None:
        return ""
    try:
        settings = src.registry.impl(impl).settings
    except OpDispatchError:
        return ""
    return ",".join(f"{k}={v}" for k, v in sorted(settings.items()))


def _converter_backend(src: Sources, c: Conversion) -> str:
    """The backend of the first converter of ``c``'s chain (``""`` when not known here)."""
    if src.registry is not None and c.chain:
        with contextlib.suppress(OpDispatchError):
            return src.registry.layouts.converter(c.chain[0]).backend
    return ""


def _step_input_layouts(src: Sources) -> dict[int, list[tuple[str, str]]]:
    """Step -> (value, layout) of each input the step reads."""
    if src.graph is None:
        return {}
    out: dict[int, list[tuple[str, str]]] = {}
    for s, step in enumerate(src.plan.steps):
        node = step_node(src.graph, step.nodes, step.op)
        out[s] = [(v.name, lay) for v, lay in zip(node.inputs, step.layouts_in) if v is not None]
    return out
