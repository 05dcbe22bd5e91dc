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

from dispatch.errors import ArgumentError
from dispatch.objective import Objective
from tuner.busy import BUSY_SHARE
from tuner.report.data import ReportData, fmt_bytes, fmt_delta, fmt_ms, fmt_share, is_known
from tuner.report.library import LIBRARY_MARK, is_library_source
from tuner.tables import aligned, terminal_width


def _nonstrict_nan(objective: str) -> bool:
    """Whether the objective a report names lets NaN/Inf differ (``False`` when it is not an
    objective this release reads: the report shows it as it was stored)."""
    try:
        return Objective.parse(objective).nonstrict_nan
    except ArgumentError:
        return False


def summary_rows(s: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A report summary (:attr:`PlanReport.summary`) as (label, text) pairs."""
    rows: list[tuple[str, str]] = [("model", str(s.get("model")))]
    plan_id = s.get("plan_id")
    source = s.get("source")
    rows.append(("plan", (f"id {plan_id} in {s.get('store')}" if plan_id is not None else
                          "not from a plan store") + f"; source {source}"
                 + (f", winner of validation: {s['winner']}" if s.get("winner") else "")))
    objective = str(s.get("objective") or "not known")
    rows.append(("objective", objective + (
        " (NaN/Inf semantics not checked: outputs may be finite where the reference gives NaN "
        "or Inf)" if _nonstrict_nan(objective) else "")))
    if s.get("nonfinite_guard"):
        rows.append(("NaN/Inf guard", f"guarded: NaN/Inf inputs run {s['nonfinite_guard']}"))
    if s.get("serving"):
        rows.append(("serving", str(s["serving"])))
    if s.get("accuracy") or set(s.get("precisions") or {}) - {"float32"}:
        from tuner.accuracy.summary import accuracy_lines

        rows.append(("precision", ", ".join(f"{p}: {n} node(s)"
                                            for p, n in (s.get("precisions") or {}).items())))
        rows.append(("accuracy", "\n".join(line.strip()
                                           for line in accuracy_lines(s.get("accuracy") or {})[:3])))
    final = (s.get("throughput") or {}).get("final")
    if final:
        rows.append(("under load", f"{final['throughput']:.1f} inferences/s with "
                                   f"{final['concurrency']} in flight, p50 {fmt_ms(final['p50_ms'])} ms, "
                                   f"p90 {fmt_ms(final['p90_ms'])} ms, p99 {fmt_ms(final['p99_ms'])} ms "
                                   f"(validated under load by the tuner); "
                                   f"{s['throughput'].get('why') or ''}".rstrip("; ")))
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
    rows.append(("peak memory", fmt_bytes(s.get("peak_bytes"))
                 + f" ({s.get('peak_basis') or 'executor liveness plan'})"
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
        rows.append(("optimiser",
                     f"{opt.get('method')} ({'optimal' if opt.get('optimal') else 'not proven optimal'})"
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


def library_legend(rep: ReportData) -> str:
    """``"; * = ..."``: what the mark on a time from a library's profiler means (``""`` when
    no row has one)."""
    libs = sorted({str(r.backend) for r in rep.table.itertuples(index=False)
                   if is_library_source(r.time_source)})
    if not libs:
        return ""
    return (f"; {LIBRARY_MARK} = per-node time inside a region from the library's own profiler "
            f"({', '.join(libs)}), scaled to the region's measured time")


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
        if is_library_source(r.time_source):
            median += LIBRARY_MARK
        out.append([
            idx, r.name if r.kind == "node" else f"[{r.name}]", r.op, r.shapes, r.impl,
            r.settings or "-", r.backend,
            f"{r.layouts_in or '-'} -> {r.layouts_out}", median, fmt_ms(r.spread_ms),
            fmt_share(r.share), r.runner_up or "", fmt_ms(r.runner_up_ms),
            fmt_delta(r.runner_up_delta_ms), rej,
        ])
    return out


def _validated(rep: ReportData) -> tuple[list[Any], Any, str]:
    """The validated plans of the summary as objects with the fields of a ``PlanCandidate``,
    the winner among them (``None`` when not known) and the objective."""
    from types import SimpleNamespace

    plans = []
    for v in rep.summary.get("validated") or []:
        predicted = v.get("predicted_ms")
        plans.append(SimpleNamespace(
            label=str(v.get("label")), error=v.get("error"), latency_ms=v.get("latency_ms"),
            spread_ms=v.get("spread_ms"), peak_bytes=v.get("peak_bytes"),
            # stored as the optimiser's cost x 1000: seconds -> ms, or bytes for memory
            predicted_s=None if predicted is None else predicted / 1e3))
    winner = next((p for p in plans if p.label == rep.summary.get("winner")), None)
    if winner is not None and winner.error is not None:
        winner = None
    return plans, winner, str(rep.summary.get("objective") or "latency")


def validated_rows(rep: ReportData) -> list[list[str]]:
    """The plans the tuner validated end to end, header first (see
    :func:`tuner.validation_table.validation_rows`: the objective's unit, winner first, the
    margin to the winner)."""
    from tuner.validation_table import validation_rows

    return validation_rows(*_validated(rep))


def why_won_text(rep: ReportData) -> str:
    """``winner LABEL: why`` (``""`` when the winner is not known)."""
    from tuner.validation_table import why_won

    plans, winner, objective = _validated(rep)
    if winner is None:
        return ""
    note = ((rep.summary.get("tuning") or {}).get("winner_note") or "")
    return f"winner {winner.label}: {why_won(plans, winner, objective, note)}"


def _rejection_rows(rep: ReportData, details: bool = False) -> list[list[str]]:
    """Every rejected candidate, header first (``details``: the whole alternative too)."""
    rows = [["node", "implementation", "backend", "verdict", "ms", "delta ms", "reason"]
            + (["details"] if details else [])]
    alts = ([a for n in rep.table["name"] for a in rep.alternatives.get(n, [])]
            if details else [])
    same = len(alts) == len(rep.rejections)
    for k, a in enumerate(rep.rejections.itertuples(index=False)):
        rows.append([a.node, a.impl, a.backend, a.verdict, fmt_ms(a.median_ms),
                     fmt_delta(a.delta_ms), a.reason])
        if details:
            rows[-1].append((alts[k].details if same else "") or "-")
    return rows


def _rejection_lines(rep: ReportData, details: bool, width: int) -> list[str]:
    """Every rejected candidate grouped by node, each wrapped to ``width`` (a table would give
    the reasons a sliver of the terminal and pad every line)."""
    import textwrap

    rows = _rejection_rows(rep, details)[1:]
    out: list[str] = []
    node = None
    for r in rows:
        if r[0] != node:
            node = r[0]
            out.append(f"{node}:")
        ms = f", {r[4]} ms" if r[4] != "-" else ""
        why = r[6] if r[6].lower().startswith(r[3]) else f"{r[3]}: {r[6]}"
        text = f"{r[1]} ({r[2]}{ms}): {why}" + (
            f" [{r[7]}]" if details and r[7] != "-" else "")
        out += textwrap.wrap(text, width, initial_indent="  ", subsequent_indent="      ",
                             break_long_words=False, break_on_hyphens=False)
    return out


#: Columns of the step table a terminal gets by default (``--wide``: every column).
NARROW_STEP_COLUMNS = (0, 1, 4, 6, 8, 10, 13, 14)


def render_text(rep: ReportData, *, rejected: bool = False, wide: bool = False,
                details: bool = False, width: int | None = None) -> str:
    """The report as terminal tables fitted to ``width`` (default: the terminal's) with the main
    columns; ``wide``: every column, nothing wrapped. ``rejected``: every rejected candidate
    too; ``details``: with the whole alternative each stands for."""
    import textwrap

    fit = None if wide else (width or terminal_width())
    parts = [f"Plan report: {rep.plan.graph}", ""]
    srows = summary_rows(rep.summary)
    label = max(len(k) for k, _ in srows)
    for k, v in srows:
        if fit is None:
            parts.append(f"  {k.ljust(label)}  {v}")
        else:
            lines = textwrap.wrap(v, max(20, fit - label - 4), break_long_words=False,
                                  break_on_hyphens=False) or [""]
            parts.append(f"  {k.ljust(label)}  {lines[0]}")
            parts += [" " * (label + 4) + ln for ln in lines[1:]]
    for note in rep.notes:
        parts += textwrap.wrap(f"note: {note}", fit, initial_indent="  ", subsequent_indent="    ",
                               break_long_words=False, break_on_hyphens=False
                               ) if fit else [f"  note: {note}"]
    steps = _step_table_rows(rep)
    if fit is not None:
        counts = ["rejected"] + [str(len(rep.alternatives.get(r.name, []))) if r.kind == "node"
                                 else "" for r in rep.table.itertuples(index=False)]
        steps = [[r[k] for k in NARROW_STEP_COLUMNS[:-1]] + [n] for r, n in zip(steps, counts)]
        steps[0][-2] = "vs runner-up"
        numeric: tuple[int, ...] = (4, 5, 6, 7)
    else:
        numeric = (8, 9, 10, 12, 13)
    heading = ("Steps in execution order (converters in [brackets]; b = converted at build "
               "time; share = of the sum of parts" + ("; --wide for every column" if fit else "")
               + library_legend(rep) + "):")
    parts += ["", *(textwrap.wrap(heading, fit) if fit else [heading]), ""]
    parts.append(aligned(steps, max_width=40, numeric=numeric, width=fit, fixed=(0, 1)))
    if rep.summary.get("validated"):
        parts += ["", "Plans validated end to end by the tuner:", ""]
        parts.append(aligned(validated_rows(rep), max_width=60, width=fit))
        if why_won_text(rep):
            parts += ["", *(textwrap.wrap(why_won_text(rep), fit) if fit else [why_won_text(rep)])]
    if (rep.summary.get("throughput") or {}).get("trials"):
        from tuner.throughput.table import throughput_lines

        parts += ["", *throughput_lines(rep.summary["throughput"])[:-2]]
    if rejected and len(rep.rejections):
        parts += ["", "Rejected candidates (listed at the first node each covers):", ""]
        if fit is None:
            parts.append(aligned(_rejection_rows(rep, details), max_width=200, numeric=(4, 5)))
        else:
            parts += _rejection_lines(rep, details, fit)
    return "\n".join(parts) + "\n"


def _md(text: Any) -> str:
    """A markdown table cell: ``|`` escaped, on one line."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[Sequence[Any]], numeric: Sequence[int] = ()) -> str:
    """A GitHub-flavoured markdown table (first row: header). Written here rather than by
    tabulate, which pads every cell to its column's widest: thousands of rejection rows with
    one long reason would make the file megabytes of spaces."""
    head = rows[0]
    rule = ["---:" if k in numeric else "---" for k in range(len(head))]
    lines = ["| " + " | ".join(_md(c) for c in head) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(_md(c) for c in r) + " |" for r in rows[1:]]
    return "\n".join(lines)


def render_markdown(rep: ReportData, *, details: bool = False) -> str:
    """The report as markdown: summary, steps, validated plans, every rejected candidate
    (``details``: with the whole alternative each stands for)."""
    parts = [f"# Plan report: {rep.plan.graph}", "", "## Summary", ""]
    parts.append(markdown_table([["", ""], *summary_rows(rep.summary)]))
    if rep.notes:
        parts += [""] + [f"- note: {n}" for n in rep.notes]
    parts += ["", "## Steps", ""] + ([library_legend(rep).lstrip("; "), ""] if library_legend(rep) else [])
    parts.append(markdown_table(_step_table_rows(rep), numeric=(8, 9, 10, 12, 13)))
    if rep.summary.get("validated"):
        parts += ["", "## Plans validated end to end", ""]
        parts.append(markdown_table(validated_rows(rep)))
        if why_won_text(rep):
            parts += ["", why_won_text(rep)]
    if len(rep.rejections):
        parts += ["", "## Rejected candidates", ""]
        parts.append(markdown_table(_rejection_rows(rep, details), numeric=(4, 5)))
    return "\n".join(parts) + "\n"


def render_json(rep: ReportData, *, details: bool = False) -> str:
    """The report as JSON: ``{"summary", "rows", "rejections", "notes"}`` (null = not known).
    ``rows`` are records, one a line (without the ``rejected`` text of the tables: the
    rejections carry it); ``rejections`` (thousands for a large model) are a table,
    ``{"columns": [...], "data": [[...], ...]}`` (pandas' ``split`` orient: ``pd.DataFrame(
    **data["rejections"])`` reads it), one a line, their milliseconds rounded to the
    nanosecond. ``details``: a ``details`` column with the whole alternative of each."""
    data = rep.to_dict()
    columns = list(rep.rejections.columns)
    if details:
        columns.append("details")
        full = [a.details for n in rep.table["name"] for a in rep.alternatives.get(n, [])]
        if len(full) != len(data["rejections"]):
            full = [""] * len(data["rejections"])
        for rec, d in zip(data["rejections"], full):
            rec["details"] = d

    def dump(x: Any) -> str:
        return json.dumps(x, allow_nan=False, default=str, separators=(",", ":"))

    def short(v: Any) -> Any:
        return round(v, 6) if isinstance(v, float) else v

    lines = ["{", f'"summary": {json.dumps(data["summary"], indent=1, allow_nan=False, default=str)},']
    rows = data["rows"]
    lines.append('"rows": [' + ("" if rows else "],"))
    # a row's "rejected" (its rejected candidates joined into one text, for the text tables)
    # repeats "rejections" below: left out here (n_rejected stays), a quarter of the bytes
    lines += [dump({k: v for k, v in r.items() if k != "rejected"})
              + ("," if i < len(rows) - 1 else "") for i, r in enumerate(rows)]
    if rows:
        lines.append("],")
    rej = [[short(r.get(c)) for c in columns] for r in data["rejections"]]
    lines.append(f'"rejections": {{"columns": {dump(columns)}, "data": [' + ("" if rej else "]},"))
    lines += [dump(r) + ("," if i < len(rej) - 1 else "") for i, r in enumerate(rej)]
    if rej:
        lines.append("]},")
    lines.append(f'"notes": {dump(data["notes"])}')
    lines.append("}")
    return "\n".join(lines) + "\n"
