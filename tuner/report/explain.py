"""Explaining one node: every candidate for it, the chosen one first, and why each lost.
:func:`explain_node` lists the chosen step and every alternative covering the node (fused
patterns and regions included) with its measurement and verdict; :func:`render_explain` renders
it as text (with the node's shapes, attributes, step and input conversions), markdown, csv or
json.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from dispatch.errors import known
from tuner.plan_lookup import ReportError
from tuner.report.data import (
    VERDICTS,
    ReportData,
    fmt_delta,
    fmt_ms,
    node_shapes,
    nodes_label,
    records,
)
from tuner.report.render import aligned, markdown_table


def explain_node(rep: ReportData, node: str) -> pd.DataFrame:
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
             "delta_ms": 0.0, "reason": step.why, "details": _reference_note(plan, node)}]
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
                         "delta_ms": a.delta_ms, "reason": a.reason, "details": a.details})
    df = pd.DataFrame(rows)
    order = {v: i for i, v in enumerate(("chosen", *VERDICTS))}
    df["_o"] = df["verdict"].map(lambda v: order.get(v, 99))
    df = df.sort_values(["_o", "median_ms"], kind="stable", na_position="last").drop(columns="_o")
    df["samples"] = df["samples"].astype("Int64")
    return df.reset_index(drop=True)


def _reference_note(plan, node: str) -> str:
    """What ``node`` was checked against, when not the numpy reference (issue 52)."""
    if node in (plan.provenance or {}).get("reference_from_onnxruntime", ()):
        return ("reference: onnxruntime's own result (no numpy reference implements this "
                "operator); onnxruntime's candidates for it are not independently validated")
    return ""


#: Candidates ``explain`` lists one by one by default (the chosen one and the best measured
#: ones); the rest are counted by verdict (``--details``: every one, with the whole breakdown).
EXPLAIN_SHOWN = 8


def render_explain(rep: ReportData, node: str, fmt: str = "text", *, details: bool = False,
                   width: int | None = None) -> str:
    """:func:`explain_node` as text (with the node's context; fitted to ``width``, default the
    terminal's), markdown, csv or json. By default the text and markdown list the chosen
    candidate and the best :data:`EXPLAIN_SHOWN` others one by one and count the rest by
    verdict; ``details``: every candidate, every column, with the whole alternative each
    stands for."""
    df = explain_node(rep, node)
    if not details:
        df = df.drop(columns="details")
    if fmt == "csv":
        return df.to_csv(index=False)
    if fmt == "json":
        return json.dumps({"node": node, "candidates": records(df)}, indent=2, allow_nan=False,
                          default=str) + "\n"
    plan, graph = rep.plan, rep.graph
    k = next(i for i, s in enumerate(plan.steps) if node in s.nodes)
    step = plan.steps[k]
    head = [f"node {node}" + (f" ({graph.node(node).op_type})" if graph is not None else "")
            + f" of {plan.graph}"]
    if graph is not None:
        n = graph.node(node)
        head.append(f"  shapes: {node_shapes(n)}")
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
    shown, rest = df, df.iloc[0:0]
    if not details and len(df) > EXPLAIN_SHOWN + 1:
        shown, rest = df.iloc[: EXPLAIN_SHOWN + 1], df.iloc[EXPLAIN_SHOWN + 1:]
    if details:
        rows = [["implementation", "backend", "covers", "layouts in -> out", "median ms", "spread",
                 "samples", "verdict", "delta ms", "reason", "details"]]
        numeric: tuple[int, ...] = (4, 5, 6, 8)
        for r in shown.itertuples(index=False):
            rows.append([r.impl, r.backend, r.covers,
                         f"{r.layouts_in or '-'} -> {r.layouts_out or '-'}", fmt_ms(r.median_ms),
                         fmt_ms(r.spread_ms), "-" if r.samples is pd.NA else str(r.samples),
                         r.verdict, fmt_delta(r.delta_ms), r.reason, r.details or "-"])
    else:
        rows = [["implementation", "backend", "covers", "median ms", "verdict", "delta ms",
                 "reason"]]
        numeric = (3, 5)
        for r in shown.itertuples(index=False):
            rows.append([r.impl, r.backend, r.covers, fmt_ms(r.median_ms), r.verdict,
                         fmt_delta(r.delta_ms), r.reason])
    more = []
    if len(rest):
        for verdict, group in rest.groupby("verdict", sort=False):
            impls = list(dict.fromkeys(group["impl"]))
            names = ", ".join(impls[:3]) + (", ..." if len(impls) > 3 else "")
            more.append(f"  + {len(group)} more {verdict}: {names}")
        more.append("  (--details lists every candidate with its reason and measurements)")
    if fmt == "markdown":
        return ("\n".join(f"- {h.strip()}" for h in head) + "\n\n" + markdown_table(rows, numeric)
                + "\n" + "".join(f"\n- {m.strip()}" for m in more) + ("\n" if more else ""))
    if fmt != "text":
        raise ReportError(f"unknown explain format {fmt!r}; expected text, markdown, csv or json")
    count = (f"{len(df)} candidate(s)" + (f", the best {len(shown)} listed" if len(rest) else ""))
    if details:
        body = aligned(rows, max_width=400, numeric=numeric)
    else:  # one line per candidate and its reason wrapped under it: fits any terminal
        import textwrap

        from tuner.report.render import terminal_width

        fit = width or terminal_width()
        lines = []
        for r in shown.itertuples(index=False):
            delta = f", {fmt_delta(r.delta_ms)} ms" if r.verdict != "chosen" and r.delta_ms == r.delta_ms \
                and r.delta_ms is not None else ""
            lines += textwrap.wrap(f"{r.verdict.upper() if r.verdict == 'chosen' else r.verdict}: "
                                   f"{r.impl} ({r.backend}, covers {r.covers}, "
                                   f"{fmt_ms(r.median_ms)} ms{delta})", fit,
                                   initial_indent="  ", subsequent_indent="      ",
                                   break_long_words=False, break_on_hyphens=False)
            lines += textwrap.wrap(r.reason, fit, initial_indent="      ",
                                   subsequent_indent="      ", break_long_words=False,
                                   break_on_hyphens=False)
        for m in more:
            lines += textwrap.wrap(m.strip(), fit, initial_indent="  ", subsequent_indent="      ",
                                   break_long_words=False, break_on_hyphens=False)
        body, more = "\n".join(lines), []
    return ("\n".join(head) + f"\n\n{count}:\n" + body + "\n" + "".join(m + "\n" for m in more))
