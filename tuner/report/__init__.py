"""Plan reports: what runs where, what it cost, what lost and why. :func:`build_report` turns
a :class:`~dispatch.plan.Plan` (with its graph, the plan store and the registry) into a
:class:`PlanReport`: ``table``, one row per node in execution order (shapes, implementation,
backend, layouts, measured median and spread, share of the total, the runner-up, every
rejected candidate with its reason) with the plan's converters as rows of their own where
they run; ``rejections``, one row per rejected candidate; ``summary``, the plan's figures as a
whole. Every number comes from the plan store (the tuner's measurements under the plan's
hardware and software digests, the plan row and its tuning run); a number the store does not
hold is reported as not known, and estimates are labelled as such. Also here:
:func:`explain_node` (every candidate for one node), :func:`diff_plans` (what changed between
two plans and why), :func:`profile_trace` (a Chrome-trace / Perfetto JSON of real runs),
:func:`locate_plan` (the plan a command reports on, from :mod:`tuner.plan_lookup`) and the
renderers (text, markdown, csv, json, one self-contained html file). The modules, each
importing only those before it: ``data``, ``sources``, ``alternatives``, ``summary``,
``render``, ``drawing``, ``html``, ``explain``, ``diff``, ``trace``, ``table``.
"""

from __future__ import annotations

from tuner.plan_lookup import LocatedPlan, ReportError, locate_plan
from tuner.report.alternatives import rejection_text
from tuner.report.data import (
    COLUMNS,
    FORMATS,
    REJECTION_COLUMNS,
    VERDICTS,
    Alternative,
    ReportData,
    fmt_bytes,
    fmt_delta,
    fmt_ms,
    fmt_share,
    nodes_label,
)
from tuner.report.diff import PlanDiff, PlanSide, diff_plans
from tuner.report.drawing import (
    BACKEND_COLOURS,
    CONVERTER_COLOUR,
    DOT_TIMEOUT_S,
    backend_colour,
    builtin_graph_svg,
    graph_dot,
    graph_svg,
    time_chart_svg,
)
from tuner.report.explain import explain_node, render_explain
from tuner.report.html import render_html
from tuner.report.render import (
    aligned,
    markdown_table,
    render_json,
    render_markdown,
    render_text,
    summary_rows,
)
from tuner.report.sources import (
    conversion_label,
    conversion_signature,
    plan_backends,
    step_signature,
)
from tuner.report.table import PlanReport, build_report, report
from tuner.report.trace import profile_trace

__all__ = [
    "BACKEND_COLOURS",
    "COLUMNS",
    "CONVERTER_COLOUR",
    "DOT_TIMEOUT_S",
    "FORMATS",
    "REJECTION_COLUMNS",
    "VERDICTS",
    "Alternative",
    "LocatedPlan",
    "PlanDiff",
    "PlanReport",
    "PlanSide",
    "ReportData",
    "ReportError",
    "aligned",
    "backend_colour",
    "build_report",
    "builtin_graph_svg",
    "conversion_label",
    "conversion_signature",
    "diff_plans",
    "explain_node",
    "fmt_bytes",
    "fmt_delta",
    "fmt_ms",
    "fmt_share",
    "graph_dot",
    "graph_svg",
    "locate_plan",
    "markdown_table",
    "nodes_label",
    "plan_backends",
    "profile_trace",
    "rejection_text",
    "render_explain",
    "render_html",
    "render_json",
    "render_markdown",
    "render_text",
    "report",
    "step_signature",
    "summary_rows",
    "time_chart_svg",
]
