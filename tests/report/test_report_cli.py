"""``opdispatch report``, ``explain`` and ``profile`` in subprocesses: every format, the numbers
of the stored plan, one-line user errors (exit 2, no traceback), and a Chrome trace of real
runs with one track per backend."""

from __future__ import annotations

import io
import itertools
import json
import subprocess
import sys

import pandas as pd
import pytest

from tuner.report import explain_node, fmt_ms


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True,
                          text=True, timeout=300)


def ok(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, (res.stdout, res.stderr)
    return res.stdout


def one_line_error(res: subprocess.CompletedProcess, *messages: str) -> str:
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    for message in messages:
        assert message in lines[0], lines[0]
    return lines[0]


def test_report_text_for_both_architectures(tuned):
    out = ok(cli("report", str(tuned.model), "--store", str(tuned.store)))
    rep = tuned.report()
    assert out.startswith(f"Plan report: {tuned.graph.name}")
    lines = out.splitlines()
    for node in tuned.graph.nodes:
        assert any(f" {node.name} " in ln for ln in lines), node.name
    assert f"{fmt_ms(rep.summary['latency_ms'])} ms" in out
    assert rep.summary["plan_key"] in out
    # the steps table is aligned: every row of it has the header's column starts
    start = next(k for k, ln in enumerate(lines) if ln.startswith("#  ") or ln.startswith("#   "))
    rule = lines[start + 1]
    assert set(rule.replace(" ", "")) == {"-"}


def test_report_formats(small, tmp_path):
    rep = small.report()
    store, model = str(small.store), str(small.model)
    md = ok(cli("report", model, "--store", store, "--format", "markdown"))
    assert md.startswith("# Plan report") and "| --- |" in md.replace("| ---: |", "| --- |")
    assert "## Rejected candidates" in md
    csv = ok(cli("report", model, "--store", store, "--format", "csv"))
    df = pd.read_csv(io.StringIO(csv), float_precision="round_trip")  # pandas 2 parses faster, not exactly
    assert list(df["name"]) == list(rep.table["name"])
    assert df["median_ms"].fillna(-1).tolist() == rep.table["median_ms"].fillna(-1).tolist()
    data = json.loads(ok(cli("report", model, "--store", store, "--format", "json")))
    assert data["summary"]["latency_ms"] == small.stored().latency_ms
    assert [r["name"] for r in data["rows"]] == list(rep.table["name"])
    out = tmp_path / "r.json"
    res = cli("report", model, "--store", store, "--format", "json", "-o", str(out))
    assert res.returncode == 0 and json.loads(out.read_text()) == data
    full = ok(cli("report", model, "--store", store, "--rejected"))
    assert "Rejected candidates" in full
    for impl in rep.rejections["impl"]:
        assert impl in full


def test_report_user_errors(small, tmp_path):
    model, store = str(small.model), str(small.store)
    one_line_error(cli("report", model, "--store", str(tmp_path / "none.sqlite")),
                   "no plan store at")
    one_line_error(cli("report", str(tmp_path / "none.onnx"), "--store", store), "does not exist")
    one_line_error(cli("report", model, "--store", store, "--format", "html"), "-o")
    one_line_error(cli("report", model, "--store", store, "--plan", "999"), "no plan with id 999")
    one_line_error(cli("report", model, "--store", store, "--backends", "numpy"),
                   "no plan in", "--plan ID", "--untuned")
    one_line_error(cli("report", model, "--store", store, "--objective", "speed"),
                   "unknown objective")
    one_line_error(cli("explain", model, "--store", store, "--node", "nope"),
                   "'nope' is not in the plan", "Conv_1")
    one_line_error(cli("profile", model, "--store", store, "-o", str(tmp_path / "t.json"),
                       "--runs", "0"), "--runs")


def test_report_of_another_plan_and_of_the_untuned_plan(small, resnet50):
    out = ok(cli("report", str(small.model), "--store", str(small.store), "--plan",
                 str(small.result.plan_id)))
    assert f"plan {small.result.plan_id} from" in out
    # a plan of another model is refused
    one_line_error(cli("report", str(resnet50.model), "--store", str(small.store), "--plan",
                       str(small.result.plan_id)), "another model")
    out = ok(cli("report", str(small.model), "--store", str(small.store), "--untuned"))
    assert "untuned (heuristic) plan" in out and "source heuristic" in out


def test_explain_lists_every_candidate(small):
    rep = small.report()
    expected = explain_node(rep, "Conv_1")
    assert expected.iloc[0]["verdict"] == "chosen"
    assert expected.iloc[0]["impl"] == small.result.plan.step_for("Conv_1").impl
    # --details: every candidate on a line of its own (by default the best few, the rest counted)
    out = ok(cli("explain", str(small.model), "--store", str(small.store), "--node", "Conv_1",
                 "--details"))
    assert f"{len(expected)} candidate(s)" in out
    for r in expected.itertuples():
        line = next(ln for ln in out.splitlines()
                    if ln.startswith(r.impl + " ") and f" {r.covers} " in ln and r.verdict in ln)
        assert fmt_ms(r.median_ms) in line
    data = json.loads(ok(cli("explain", str(small.model), "--store", str(small.store),
                             "--node", "Conv_1", "--format", "json")))
    assert [c["impl"] for c in data["candidates"]] == list(expected["impl"])
    verdicts = {c["verdict"] for c in data["candidates"]}
    assert "chosen" in verdicts and "unsupported" in verdicts
    # every candidate covering the node is there: the enumeration's and the rejected ones
    from tuner.candidates import enumerate_candidates

    cands = enumerate_candidates(small.graph, small.registry)
    assert {c.impl.name for c in cands.for_node("Conv_1")} <= set(expected["impl"])
    assert {r.impl for r in cands.rejected["Conv_1"]} <= set(expected["impl"])


@pytest.mark.parametrize("which", ["small", "transformer"])
def test_profile_writes_a_chrome_trace(which, request, tmp_path):
    tuned = request.getfixturevalue(which)
    plan = tuned.result.plan
    out = tmp_path / "trace.json"
    text = ok(cli("profile", str(tuned.model), "--store", str(tuned.store), "-o", str(out),
                  "--runs", "3"))
    assert "trace events written" in text
    trace = json.loads(out.read_text())
    events = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    complete = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in complete)
    runs = [e for e in complete if e["cat"] == "run"]
    assert len(runs) == 3 and names[runs[0]["tid"]] == "runs"
    nodes = [e for e in complete if e["cat"] == "node"]
    convs = [e for e in complete if e["cat"] == "converter"]
    run_convs = [c for c in plan.conversions if not c.at_build]
    assert len(nodes) == 3 * len(plan.steps)
    assert len(convs) == 3 * len(run_convs)
    for e in nodes:  # one track per backend, named after it
        assert names[e["tid"]] == e["args"]["backend"] == plan.steps[e["args"]["step"]].backend
    assert {names[e["tid"]] for e in nodes} == set(plan.backends_used())
    # within a run the events follow one another on the time line
    for run in runs:
        inside = sorted((e for e in nodes + convs if e["args"]["run"] == run["args"]["run"]),
                        key=lambda e: e["ts"])
        for a, b in itertools.pairwise(inside):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3
        assert inside[0]["ts"] >= run["ts"] - 1e-3


def test_building_the_parser_imports_no_pandas_or_matplotlib():
    code = ("import sys, tuner.cli\n"
            "tuner.cli.build_parser()\n"
            "heavy = [m for m in ('pandas', 'matplotlib', 'tuner.report') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
