"""Reports a person can read (issue 18): a rejected candidate's reason is one bounded sentence
(what it would have cost, by how much it lost, the step that weighs most), never a whole
alternative plan; the whole breakdown stays available with ``details``; every format of a
tuned resnet50 plan stays under 1 MB and ``explain`` of any node under 10 KB; the text report
fits the terminal unless ``--wide``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pandas as pd

from tuner.report import render_explain
from tuner.report.alternatives import REASON_LIMIT, _Finder
from tuner.report.data import Alternative

MB = 1_000_000


def cli(*args: str, columns: int = 100) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True,
                          text=True, timeout=300, env=env)


def _finder(n: int) -> tuple[_Finder, list[dict]]:
    """A finder over a plan of one fused step covering nodes n0..n{n-1} (no store needed)."""
    nodes = [f"n{k}" for k in range(n)]
    step = SimpleNamespace(nodes=nodes, impl="Fused.big", op="Fused")
    f = object.__new__(_Finder)
    f.plan = SimpleNamespace(steps=[step], provenance={})
    times = [{"median_ms": 5.0}]
    return f, times


def test_a_candidate_completed_by_many_nodes_gets_a_bounded_reason():
    f, times = _finder(200)
    cand = SimpleNamespace(nodes=("n0",), layouts_in=(), layouts_out=(), signature="s")
    alt = Alternative("n0", 0, "Conv.x", "native", ("n0",), "", "", median_ms=4.0)
    best = {f"n{k}": ("Relu.native.std", 0.14) for k in range(1, 200)}
    f._compare(alt, cand, {f"n{k}": 0 for k in range(200)}, times, best, {})
    assert alt.verdict == "slower"
    assert "slower by" in alt.reason and len(alt.reason) <= 300, alt.reason
    # what it would cost, the plan's cost, and the largest filler by name
    assert "31.8600 vs 5.0000 ms" in alt.reason and "Relu.native.std" in alt.reason
    assert alt.reason.count(" by Relu.native.std") == 1
    # the whole alternative, term by term, on request
    assert alt.details.count("by Relu.native.std") == 199


def test_reports_of_a_tuned_resnet50_stay_small(resnet50):
    rep = resnet50.report()
    assert (rep.rejections["reason"].str.len() <= REASON_LIMIT).all()
    for fmt in ("html", "markdown", "csv", "json", "text"):
        text = rep.render(fmt, rejected=True, width=100)
        assert len(text.encode()) <= MB, (fmt, len(text))
    data = json.loads(rep.render("json"))
    back = pd.DataFrame(**data["rejections"])  # pandas' split orient
    assert list(back["impl"]) == list(rep.rejections["impl"])
    assert list(back["reason"]) == list(rep.rejections["reason"])
    json.loads(rep.render("json", details=True))
    for node in [n for s in rep.plan.steps for n in s.nodes]:
        text = render_explain(rep, node, width=100)
        assert len(text.encode()) <= 10_000, (node, len(text))


def test_explain_lists_the_best_and_counts_the_rest(resnet50):
    rep = resnet50.report()
    node = max(rep.alternatives, key=lambda n: len(rep.alternatives[n]))
    short = render_explain(rep, node, width=100)
    full = render_explain(rep, node, details=True)
    assert "--details lists every candidate" in short
    for a in rep.alternatives[node]:
        assert a.impl in full


def test_text_report_fits_the_terminal_unless_wide(small):
    model, store = str(small.model), str(small.store)
    res = cli("report", model, "--store", store, columns=90)
    assert res.returncode == 0, res.stderr
    # every line fits but those holding a 64-digit fingerprint, which is never cut
    assert max(len(ln) for ln in res.stdout.splitlines()
               if not re.search("[0-9a-f]{64}", ln)) <= 90
    wide = cli("report", model, "--store", store, "--wide", columns=90)
    assert wide.returncode == 0, wide.stderr
    assert max(len(ln) for ln in wide.stdout.splitlines()) > 90
    details = cli("report", model, "--store", store, "--details", "--format", "json")
    assert details.returncode == 0, details.stderr
    rej = json.loads(details.stdout)["rejections"]
    assert rej["columns"][-1] == "details" and all(len(r) == len(rej["columns"]) for r in rej["data"])
