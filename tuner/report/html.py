"""A report as one self-contained HTML page. :func:`render_html` writes the summary, the plan graph
(an inline SVG, see :mod:`tuner.report.drawing`), the time chart (an SVG embedded as a data
URI), the steps with their rejected candidates folded, and the plans validated end to end; no
scripts and no external resources, so the file opens anywhere without console errors.
"""

from __future__ import annotations

import base64
import html
from typing import Any

from tuner.report.data import ReportData, fmt_delta, fmt_ms, fmt_share
from tuner.report.drawing import CONVERTER_COLOUR, backend_colour, graph_svg, time_chart_svg
from tuner.report.library import LIBRARY_MARK, is_library_source
from tuner.report.render import library_legend, summary_rows, validated_rows

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


#: rejected candidates listed per node in the HTML steps table (the best first; all with
#: ``details``): a ResNet-50 node has up to ~20, and the report must stay under 1 MB
HTML_ALTERNATIVES = 5


def _td(x: Any, num: bool = False) -> str:
    return f'<td class="num">{html.escape(str(x))}</td>' if num else f"<td>{html.escape(str(x))}</td>"


def render_html(rep: ReportData, *, details: bool = False) -> str:
    """One self-contained HTML file: summary, the plan graph (Graphviz SVG or built-in),
    the time chart (matplotlib SVG, embedded as a data URI), the step, validation and
    rejection tables (``details``: each rejection with the whole alternative it stands for).
    No scripts, no external resources."""
    e = html.escape
    title = f"Plan report: {rep.plan.graph}"
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{e(title)}</h1>", '<h2>Summary</h2><table class="summary">']
    parts += [f"<tr><th>{e(k)}</th>{_td(v)}</tr>" for k, v in summary_rows(rep.summary)]
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
    legend_lib = library_legend(rep).lstrip("; ")
    if legend_lib:
        parts.append(f'<p class="muted" id="library-times">{e(legend_lib)}</p>')
    parts.append("<h2>Steps</h2><table><tr>" + "".join(
        f"<th>{e(h)}</th>" for h in ("#", "node", "op", "shapes", "implementation", "settings", "backend",
                                     "layouts in → out", "median ms", "spread", "share",
                                     "runner-up", "runner-up ms", "delta ms", "rejected")) + "</tr>")
    for r in rep.table.itertuples(index=False):
        alts = rep.alternatives.get(r.name, []) if r.kind == "node" else []
        rej = ""
        if alts:
            shown = alts if details else alts[:HTML_ALTERNATIVES]
            items = "".join(f"<li><b>{e(a.impl)}</b> ({e(a.backend)}): {e(a.verdict)} — "
                            f"{e(a.reason)}"
                            + (f" <span class=\"muted\">[{e(a.details)}]</span>"
                               if details and a.details else "") + "</li>" for a in shown)
            if len(shown) < len(alts):  # the rest: `opdispatch explain --node`, or --details
                items += (f"<li class=\"muted\">and {len(alts) - len(shown)} more: opdispatch "
                          f"explain MODEL --node {e(r.name)}, or --details</li>")
            rej = f"<details><summary>{len(alts)}</summary><ul>{items}</ul></details>"
        cls = ' class="conv"' if r.kind == "converter" else ""
        idx = "" if r.kind == "converter" else str(r.step)
        parts.append(
            f"<tr{cls}>{_td(idx, True)}{_td(r.name)}{_td(r.op)}{_td(r.shapes)}{_td(r.impl)}"
            f"{_td(r.settings)}{_td(r.backend)}{_td(f'{r.layouts_in} → {r.layouts_out}')}"
            f"{_td(fmt_ms(r.median_ms) + (LIBRARY_MARK if is_library_source(r.time_source) else ''), True)}"
            f"{_td(fmt_ms(r.spread_ms), True)}"
            f"{_td(fmt_share(r.share), True)}{_td(r.runner_up)}{_td(fmt_ms(r.runner_up_ms), True)}"
            f"{_td(fmt_delta(r.runner_up_delta_ms), True)}<td>{rej}</td></tr>")
    parts.append("</table>")
    if rep.summary.get("validated"):
        rows = validated_rows(rep)
        parts.append("<h2>Plans validated end to end</h2><table><tr>"
                     + "".join(f"<th>{e(h)}</th>" for h in rows[0]) + "</tr>")
        for r in rows[1:]:
            parts.append("<tr>" + "".join(_td(c, 2 <= k <= 4) for k, c in enumerate(r)) + "</tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
