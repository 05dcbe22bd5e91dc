"""Drawings of a report: the plan graph and the time chart, as SVG. The plan graph (boxes filled by
backend, fused steps and regions outlined, run-time converters as diamonds on the edges they
convert) is laid out by Graphviz ``dot`` when it is installed (:func:`graph_dot` writes its
input), else drawn by :func:`builtin_graph_svg`, a plain layered drawing (each box one row below
its lowest input). The time chart (time per step and per backend) is drawn by matplotlib when
installed, else as plain SVG bars.
"""

from __future__ import annotations

import hashlib
import html
import io
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dispatch.fusion import step_node
from dispatch.registry import STANDARD
from tuner.report.data import ReportData, fmt_ms, is_known, shape_text
from tuner.report.library import LIBRARY_MARK, is_library_source

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


def backend_colour(backend: str) -> str:
    """The fill colour of ``backend`` in drawings and charts."""
    if backend in BACKEND_COLOURS:
        return BACKEND_COLOURS[backend]
    digest = int(hashlib.sha256(backend.encode()).hexdigest(), 16)
    return _EXTRA_COLOURS[digest % len(_EXTRA_COLOURS)]


@dataclass
class _Drawing:
    """The plan graph as boxes and arrows, shared by the Graphviz and built-in drawings."""

    nodes: list[dict[str, Any]]  # id, label, kind (node|input|output|convert), backend, step, title
    edges: list[tuple[str, str, str]]  # src id, dst id, tensor label
    clusters: list[tuple[int, str, list[str]]]  # step, label, node ids


def _drawing(rep: ReportData) -> _Drawing:
    graph, plan = rep.graph, rep.plan
    assert graph is not None
    ids: dict[str, str] = {}
    nodes: list[dict[str, Any]] = []
    step_of = {n: k for k, s in enumerate(plan.steps) for n in s.nodes}
    times = rep.table[rep.table["kind"] == "node"].set_index("name")
    for v in graph.inputs:
        ids[f"in:{v.name}"] = f"i{len(ids)}"
        nodes.append({"id": ids[f"in:{v.name}"], "label": f"{v.name}\n{shape_text(v)}", "kind": "input",
                      "backend": "", "title": f"graph input {v.name} {shape_text(v)}"})
    for n in graph.nodes:
        k = step_of[n.name]
        step = plan.steps[k]
        ids[n.name] = f"n{len(ids)}"
        ms = times.loc[n.name, "median_ms"] if n.name in times.index else None
        mark = LIBRARY_MARK if n.name in times.index and is_library_source(
            times.loc[n.name, "time_source"]) else ""
        timing = f"\n{fmt_ms(ms)} ms{mark}" if is_known(ms) else ""
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
        nodes.append({"id": cid,
                      "label": f"{c.src}→{c.dst}" + (f"\n{fmt_ms(ms)} ms" if is_known(ms) else ""),
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
        nodes.append({"id": oid, "label": f"{v.name}\n{shape_text(v)}", "kind": "output",
                      "backend": "", "title": f"graph output {v.name} {shape_text(v)}"})
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


def graph_dot(rep: ReportData) -> str:
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


def graph_svg(rep: ReportData, *, use_dot: bool | None = None) -> tuple[str, str]:
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


#: Box width and height, horizontal and vertical gaps of the built-in drawing, in pixels.
_BOX_W, _BOX_H, _GAP_X, _GAP_Y = 170, 44, 24, 26


def builtin_graph_svg(rep: ReportData) -> str:
    """A layered drawing of the plan graph without Graphviz: each box one level below its
    lowest input, converters as diamonds, multi-node steps outlined."""
    d = _drawing(rep)
    pos, width, height = _layered(d)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" '
           f'font-size="10">',
           '<defs><marker id="odarrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" '
           'markerHeight="6" orient="auto"><path d="M0,0L10,5L0,10z" fill="#777"/></marker></defs>']
    for a, b, t in d.edges:
        (x1, y1), (x2, y2) = pos[a], pos[b]
        out.append(f'<line x1="{x1 + _BOX_W / 2:.1f}" y1="{y1 + _BOX_H:.1f}" '
                   f'x2="{x2 + _BOX_W / 2:.1f}" y2="{y2:.1f}" stroke="#777" stroke-width="1" '
                   f'marker-end="url(#odarrow)"><title>{html.escape(t)}</title></line>')
    backend_of = {n["id"]: n["backend"] for n in d.nodes}
    for _, label, ids in d.clusters:
        xs, ys = [pos[i][0] for i in ids], [pos[i][1] for i in ids]
        out.append(f'<rect x="{min(xs) - 6:.1f}" y="{min(ys) - 6:.1f}" '
                   f'width="{max(xs) - min(xs) + _BOX_W + 12:.1f}" '
                   f'height="{max(ys) - min(ys) + _BOX_H + 12:.1f}" fill="none" '
                   f'stroke="{backend_colour(backend_of[ids[0]])}" stroke-dasharray="4 3" '
                   f'rx="6"><title>{html.escape(label)}</title></rect>')
    for n in d.nodes:
        out += _box_svg(n, *pos[n["id"]])
    out.append("</svg>")
    return "\n".join(out)


def _layered(d: _Drawing) -> tuple[dict[str, tuple[float, float]], int, int]:
    """The top-left corner of each box (one row per level, rows centred) and the size of
    the drawing."""
    level = _levels([n["id"] for n in d.nodes], d.edges)
    rows: dict[int, list[str]] = {}
    for n in d.nodes:
        rows.setdefault(level[n["id"]], []).append(n["id"])
    width = max(len(r) for r in rows.values()) * (_BOX_W + _GAP_X) + _GAP_X
    height = (max(rows) + 1) * (_BOX_H + _GAP_Y) + _GAP_Y
    pos: dict[str, tuple[float, float]] = {}
    for lv, ids in rows.items():
        offset = (width - len(ids) * (_BOX_W + _GAP_X) + _GAP_X) / 2
        for j, i in enumerate(ids):
            pos[i] = (offset + j * (_BOX_W + _GAP_X), _GAP_Y + lv * (_BOX_H + _GAP_Y))
    return pos, width, height


def _box_svg(n: dict[str, Any], x: float, y: float) -> list[str]:
    """One box of the built-in drawing: a diamond (converter), a box filled by backend
    (node) or an ellipse (graph input or output), with its label lines centred."""
    cx, cy = x + _BOX_W / 2, y + _BOX_H / 2
    title = f"<title>{html.escape(n['title'])}</title>"
    if n["kind"] == "convert":
        shape = (f'<polygon points="{cx},{y} {cx + 60},{cy} {cx},{y + _BOX_H} {cx - 60},{cy}" '
                 f'fill="{CONVERTER_COLOUR}" stroke="#555">{title}</polygon>')
    elif n["kind"] == "node":
        shape = (f'<rect x="{x}" y="{y}" width="{_BOX_W}" height="{_BOX_H}" rx="6" '
                 f'fill="{backend_colour(n["backend"])}" stroke="#333">{title}</rect>')
    else:
        shape = (f'<ellipse cx="{cx}" cy="{cy}" rx="{_BOX_W / 2}" ry="{_BOX_H / 2}" '
                 f'fill="#fff" stroke="#333">{title}</ellipse>')
    colour = "#fff" if n["kind"] == "node" else "#000"
    lines = n["label"].split("\n")
    out = [shape]
    for j, text in enumerate(lines):
        ty = cy + (j - (len(lines) - 1) / 2) * 12 + 4
        short = text if len(text) <= 30 else text[:29] + "…"
        out.append(f'<text x="{cx}" y="{ty:.1f}" text-anchor="middle" '
                   f'fill="{colour}">{html.escape(short)}</text>')
    return out


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


def _chart_data(rep: ReportData) -> list[tuple[str, float, str]]:
    """(label, ms, colour key) for each step and run-time converter with a known time."""
    out = []
    for r in rep.table.itertuples(index=False):
        if not is_known(r.median_ms) or r.when != "run":
            continue
        if r.kind == "node" and is_library_source(r.time_source):
            out.append((f"{r.step} {r.name}{LIBRARY_MARK}", float(r.median_ms), r.backend))
        elif r.kind == "node":
            out.append((f"{r.step} {r.step_nodes}", float(r.median_ms), r.backend))
        else:
            out.append((str(r.name), float(r.median_ms), "(converter)"))
    return out


def time_chart_svg(rep: ReportData) -> tuple[str, str]:
    """``(svg, engine)``: time per step (bars coloured by backend, converters yellow) and time
    per backend, drawn by matplotlib when installed, else by a built-in SVG chart."""
    data = _chart_data(rep)
    if not data:
        return "", "none"
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return _builtin_chart_svg(data), ("built-in (matplotlib is not installed: "
                                          "pip install 'opdispatch[report]')")
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


def _builtin_chart_svg(data: list[tuple[str, float, str]]) -> str:
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
