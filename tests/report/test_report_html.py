"""The HTML report: one self-contained file that headless Chromium opens without console
errors, with the graph (Graphviz SVG, or the built-in drawing) and the matplotlib chart.

How console errors are caught: Debian's chromium is started with ``--headless --no-sandbox
--disable-gpu --enable-logging=stderr --v=0``; with logging on stderr, Chromium writes every
console message of the page (``console.log``/``console.error``, uncaught exceptions) as a line
``[pid:tid:date:INFO:CONSOLE:LINE] "message", source: URL (LINE)``. The report has no script,
so any ``:CONSOLE`` line is a failure; a control page with a ``console.error`` and an
uncaught exception proves the check sees them with the installed Chromium. ``--dump-dom``
gives the DOM after parsing (the SVG and the chart image must be there) and ``--screenshot``
writes a PNG (kept in the test's tmp folder, copied to ``$OPDISPATCH_TEST_ARTIFACTS`` when
that is set). Skipped, saying so, when no chromium is installed (CI installs it).
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tuner.report import (
    build_report,
    builtin_graph_svg,
    graph_dot,
    graph_svg,
    render_html,
    time_chart_svg,
)

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser",
                                                       "google-chrome")) if p), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium); the "
                             "HTML report is not opened in a browser")
SVG = "{http://www.w3.org/2000/svg}"


def chromium(tmp_path: Path, page: Path, *extra: str) -> subprocess.CompletedProcess:
    assert CHROMIUM is not None
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
           "--v=0", f"--user-data-dir={tmp_path / 'chromium-profile'}", "--hide-scrollbars",
           *extra, page.resolve().as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def console_lines(res: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ":CONSOLE" in ln]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def keep(path: Path) -> None:
    folder = os.environ.get("OPDISPATCH_TEST_ARTIFACTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(folder) / path.name)


@needs_chromium
def test_console_check_sees_errors(tmp_path):
    page = tmp_path / "control.html"
    page.write_text('<!DOCTYPE html><html><head><meta charset="utf-8"><title>c</title></head>'
                    '<body><script>console.error("control-error"); notDefined();</script>'
                    "</body></html>")
    lines = console_lines(chromium(tmp_path, page, "--dump-dom"))
    assert any("control-error" in ln for ln in lines), lines
    assert any("notDefined" in ln for ln in lines), lines


@needs_chromium
def test_html_opens_in_chromium_without_console_errors(tuned, tmp_path):
    page = tmp_path / f"{tuned.name}.html"
    res = subprocess.run([sys.executable, "-m", "tuner.cli", "report", str(tuned.model),
                          "--store", str(tuned.store), "--format", "html", "-o", str(page)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    text = page.read_text()
    # one self-contained file: nothing fetched from elsewhere, no scripts
    assert not re.search(r'(src|href)="(?!data:|#)', text)
    assert "<script" not in text
    shot = tmp_path / f"report-{tuned.name}.png"
    res = chromium(tmp_path, page, f"--screenshot={shot}", "--window-size=1400,2400")
    assert shot.is_file(), res.stderr[-2000:]
    assert console_lines(res) == []
    assert png_size(shot) == (1400, 2400)
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one
    keep(shot)
    res = chromium(tmp_path, page, "--dump-dom")
    assert console_lines(res) == []
    dom = res.stdout
    assert '<div class="drawing" id="graph"><svg' in dom
    assert 'id="chart"' in dom and "data:image/svg+xml;base64," in dom
    for node in tuned.graph.nodes[:20]:
        assert node.name in dom


def test_html_parts_are_well_formed(transformer, monkeypatch):
    rep = transformer.report()
    html = render_html(rep)
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    chart = re.search(r'src="data:image/svg\+xml;base64,([^"]+)"', html)
    assert chart is not None
    root = ET.fromstring(base64.b64decode(chart.group(1)))
    assert root.tag == f"{SVG}svg"
    # the built-in drawing: a box per node, a diamond per run-time converter
    svg = ET.fromstring(builtin_graph_svg(rep))
    titles = [t.text or "" for t in svg.iter(f"{SVG}title")]
    for node in transformer.graph.nodes:
        assert any(t.startswith(f"{node.name} (") for t in titles), node.name
    runtime = [c for c in rep.plan.conversions if not c.at_build]
    assert len(list(svg.iter(f"{SVG}polygon"))) == len(runtime)
    # Graphviz, when installed
    dot = graph_dot(rep)
    assert dot.startswith("digraph plan {")
    drawn, engine = graph_svg(rep)
    ET.fromstring(drawn)
    assert engine == ("graphviz" if shutil.which("dot") else "built-in")
    drawn, engine = graph_svg(rep, use_dot=False)
    assert engine == "built-in"
    # without matplotlib the chart falls back to a built-in SVG, and says so
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    fallback, engine = time_chart_svg(rep)
    assert engine.startswith("built-in") and "opdispatch[report]" in engine
    ET.fromstring(fallback)


def test_converters_are_marked_in_the_drawing(resnet50):
    rep = resnet50.report()
    if not any(not c.at_build for c in rep.plan.conversions):
        # the tuned plan may need no conversion (e.g. one onnxruntime region); the native-first
        # untuned plan converts between nchw8c/nchw16c/nhwc and the standard layout
        from dispatch.heuristic import heuristic_plan

        plan = heuristic_plan(resnet50.graph, resnet50.registry, ["native", "numpy"])
        rep = build_report(plan, resnet50.graph, store=resnet50.store, registry=resnet50.registry)
    runtime = [c for c in rep.plan.conversions if not c.at_build]
    assert runtime, "the resnet50 plan should convert some tensors between layouts"
    dot = graph_dot(rep)
    assert dot.count("shape=\"diamond\"") == len(runtime)
    for c in runtime:
        assert f"{c.src}→{c.dst}" in dot
