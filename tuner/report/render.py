"""Reports as text: aligned terminal tables, markdown and JSON. :func:`summary_rows` turns the
summary figures into (label, text) lines, saying why a figure is not known; :func:`aligned` and
:func:`markdown_table` lay out tables (also used by the explanations and diffs);
:func:`render_text`, :func:`render_markdown` and :func:`render_json` render a whole report
(summary, steps with converters in execution order, the plans validated end to end, the rejected
candidates).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.busy import BUSY_SHARE
from tuner.report.data import ReportData, fmt_bytes, fmt_delta, fmt_ms, fmt_share, is_known


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
                 if is_known(s.get("peak_bytes")) else "not known"))
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
                               + (f", {tun['skipped_alternatives']} alternative plan(s) not optimised"
                                  if tun.get("skipped_alternatives") else "")
                               + (f", not validated (budget): {', '.join(tun['skipped_validation'])}"
                                  if tun.get("skipped_validation") else "")
                               + (f", machine busy: other processes took {tun['others_cpu_share']:.0%} "
                                  f"of its CPU time" if (tun.get("others_cpu_share") or 0) >= BUSY_SHARE
                                  else "")
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


def _step_table_rows(rep: ReportData) -> list[list[str]]:
    """The steps and converters in execution order, header first."""
    header = ["#", "node", "op", "shapes", "implementation", "settings", "backend",
              "layouts in -> out",
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
        median = fmt_ms(r.median_ms) if r.kind == "converter" or is_known(r.median_ms) or not str(
            r.time_source).startswith("in step") else f"(step {r.step})"
        out.append([
            idx, r.name if r.kind == "node" else f"[{r.name}]", r.op, r.shapes, r.impl,
            r.settings or "-", r.backend,
            f"{r.layouts_in or '-'} -> {r.layouts_out}", median, fmt_ms(r.spread_ms),
            fmt_share(r.share), r.runner_up or "", fmt_ms(r.runner_up_ms),
            fmt_delta(r.runner_up_delta_ms), rej,
        ])
    return out


def _validated_rows(rep: ReportData, *, mark_winner: bool) -> list[list[str]]:
    """The plans the tuner validated end to end, header first; the result is the error, else
    ``ok`` (``winner`` for the plan that won, with ``mark_winner``)."""
    rows = [["plan", "predicted ms", "latency ms", "spread", "peak bytes", "result"]]
    for v in rep.summary.get("validated") or []:
        if v.get("error"):
            result = str(v["error"])
        elif mark_winner and v.get("label") == rep.summary.get("winner"):
            result = "winner"
        else:
            result = "ok"
        rows.append([str(v.get("label")), fmt_ms(v.get("predicted_ms")),
                     fmt_ms(v.get("latency_ms")), fmt_ms(v.get("spread_ms")),
                     f"{v['peak_bytes']:,}" if v.get("peak_bytes") is not None else "-", result])
    return rows


def _rejection_rows(rep: ReportData) -> list[list[str]]:
    """Every rejected candidate, header first."""
    rows = [["node", "implementation", "backend", "verdict", "ms", "delta ms", "reason"]]
    for a in rep.rejections.itertuples(index=False):
        rows.append([a.node, a.impl, a.backend, a.verdict, fmt_ms(a.median_ms),
                     fmt_delta(a.delta_ms), a.reason])
    return rows


def render_text(rep: ReportData, *, rejected: bool = False) -> str:
    """The report as aligned terminal tables (``rejected``: every rejected candidate too)."""
    parts = [f"Plan report: {rep.plan.graph}", ""]
    srows = summary_rows(rep.summary)
    width = max(len(k) for k, _ in srows)
    parts += [f"  {k.ljust(width)}  {v}" for k, v in srows]
    for note in rep.notes:
        parts.append(f"  note: {note}")
    parts += ["", "Steps in execution order (converters in [brackets]; b = converted at build "
                  "time; share = of the sum of parts):", ""]
    parts.append(aligned(_step_table_rows(rep), max_width=40, numeric=(8, 9, 10, 12, 13)))
    if rep.summary.get("validated"):
        parts += ["", "Plans validated end to end by the tuner:", ""]
        parts.append(aligned(_validated_rows(rep, mark_winner=True), max_width=60,
                             numeric=(1, 2, 3, 4)))
    if rejected and len(rep.rejections):
        parts += ["", "Rejected candidates (listed at the first node each covers):", ""]
        parts.append(aligned(_rejection_rows(rep), max_width=200, numeric=(4, 5)))
    return "\n".join(parts) + "\n"


def _md(text: Any) -> str:
    """A markdown table cell: ``|`` escaped, on one line."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[Sequence[Any]], numeric: Sequence[int] = ()) -> str:
    """A GitHub-flavoured markdown table (first row: header)."""
    head = rows[0]
    rule = ["---:" if k in numeric else "---" for k in range(len(head))]
    lines = ["| " + " | ".join(_md(c) for c in head) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(_md(c) for c in r) + " |" for r in rows[1:]]
    return "\n".join(lines)


def render_markdown(rep: ReportData) -> str:
    """The report as markdown: summary, steps, validated plans, every rejected candidate."""
    parts = [f"# Plan report: {rep.plan.graph}", "", "## Summary", ""]
    parts.append(markdown_table([["", ""], *summary_rows(rep.summary)]))
    if rep.notes:
        parts += [""] + [f"- note: {n}" for n in rep.notes]
    parts += ["", "## Steps", ""]
    parts.append(markdown_table(_step_table_rows(rep), numeric=(8, 9, 10, 12, 13)))
    if rep.summary.get("validated"):
        parts += ["", "## Plans validated end to end", ""]
        parts.append(markdown_table(_validated_rows(rep, mark_winner=False), numeric=(1, 2, 3, 4)))
    if len(rep.rejections):
        parts += ["", "## Rejected candidates", ""]
        parts.append(markdown_table(_rejection_rows(rep), numeric=(4, 5)))
    return "\n".join(parts) + "\n"


def render_json(rep: ReportData) -> str:
    """The report as JSON: ``{"summary", "rows", "rejections", "notes"}`` (null = not known)."""
    return json.dumps(rep.to_dict(), indent=2, allow_nan=False, default=str) + "\n"
